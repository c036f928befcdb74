"""Loss aggregation and the PPO policy / value losses (verl ``core_algos`` numerics).

All inputs are ``[B, T]`` with ``mask`` 1 on response tokens. Aggregation modes, with
``n_b = sum_t m_bt``, ``S_b = sum_t m_bt * l_bt`` and ``K`` = number of rows with ``n_b > 0``
(fully masked rows are excluded from every sequence mean):

* ``token-mean``:              ``sum_b S_b / (sum_b n_b + 1e-8)``
* ``seq-mean-token-sum``:      ``sum_{b: n_b>0} S_b / K``
* ``seq-mean-token-mean``:     ``sum_{b: n_b>0} (S_b / (n_b + 1e-8)) / K``
* ``seq-mean-token-sum-norm``: ``sum_{b: n_b>0} S_b / K / T`` with ``T = mask.shape[-1]`` (verl's default
  ``loss_scale_factor``, the horizon; a constant normaliser in the style of Dr. GRPO).

An all-empty mask gives 0 in every mode (verl would divide by zero).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import (check_choice, check_floating, check_ndim, check_same_shape, check_scalar_range,
                                compute_dtype)
from jaxppo.ops.constants import LOG_RATIO_CLAMP
from jaxppo.ops.masked import masked_mean

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(loss: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Reduce a ``[B, T]`` loss matrix to a scalar with one of ``AGG_MODES`` (formulas in the module doc)."""
    check_choice("mode", mode, AGG_MODES)
    check_ndim("loss", loss, 2)
    check_same_shape(loss=loss, mask=mask)
    dtype = compute_dtype(loss)
    loss = jnp.asarray(loss, dtype)
    valid = jnp.asarray(mask) != 0
    m = valid.astype(dtype)
    if mode == "token-mean":
        return masked_mean(loss, m)
    seq_sum = jnp.sum(jnp.where(valid, loss, 0), axis=-1)
    n = jnp.sum(m, axis=-1)
    nonempty = n > 0
    k = jnp.maximum(jnp.sum(nonempty.astype(dtype)), 1.0)
    if mode == "seq-mean-token-mean":
        seq_sum = seq_sum / (n + 1e-8)
    out = jnp.sum(jnp.where(nonempty, seq_sum, 0)) / k
    if mode == "seq-mean-token-sum-norm":
        out = out / loss.shape[-1]
    return out


def _check_weights(weights: Any, shape: tuple[int, ...]) -> jax.Array:
    w = jnp.asarray(weights)
    b, t = shape
    if w.shape not in ((b, t), (b, 1)):
        raise ValueError(f"weights must have shape [B, T]={[b, t]} or [B, 1]={[b, 1]}, got {list(w.shape)}")
    check_floating("weights", w)
    return jax.lax.stop_gradient(w)


def policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0, agg: str = "token-mean",
                weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO clipped surrogate with asymmetric clip and dual clip (verl ``compute_policy_loss``).

    ``k = clip(logp - old_logp, -20, 20)``, ``r = exp(k)``, ``A`` = advantages::

        l1 = -A r ;  l2 = -A clip(r, 1 - clip_low, 1 + clip_high) ;  l = max(l1, l2)
        for A < 0:  l = min(l, -A clip_c)                          (dual clip)
        loss = agg(w * l, mask)        (w: optional detached weights [B, T] or [B, 1])

    Metrics: ``pg_clipfrac = mean_m[l2 > l1]``, ``pg_clipfrac_lower = mean_m[(max(l1, l2) > -A c) & (A < 0)]``,
    ``ppo_kl = mean_m(-k)``, and ``pg_zero_grad_frac = mean_m[A = 0 or l2 > l1 or (A < 0 and max(l1, l2) > -A c)
    or w = 0]``: the share of tokens whose loss term has no gradient (zero advantage, the clipped or dual-clipped
    branch selected, a zero weight such as a masked importance ratio).
    """
    check_choice("agg", agg, AGG_MODES)
    check_ndim("logp", logp, 2)
    check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    check_scalar_range("clip_low", clip_low, ge=0.0, lt=1.0)
    check_scalar_range("clip_high", clip_high, ge=0.0)
    check_scalar_range("clip_c", clip_c, gt=1.0)
    dtype = compute_dtype(logp, old_logp, advantages)
    logp, old_logp, adv = (jnp.asarray(x, dtype) for x in (logp, old_logp, advantages))
    m = (jnp.asarray(mask) != 0).astype(dtype)

    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = jnp.maximum(l1, l2)
    l3 = -adv * clip_c
    negative = adv < 0
    per_token = jnp.where(negative, jnp.minimum(clipped, l3), clipped)
    zero_grad = (adv == 0) | (l2 > l1) | ((clipped > l3) & negative)
    if weights is not None:
        w = _check_weights(weights, logp.shape).astype(dtype)
        per_token = per_token * w
        zero_grad = zero_grad | (w == 0)
    loss = aggregate(per_token, m, agg)
    metrics = {
        "pg_clipfrac": masked_mean((l2 > l1).astype(dtype), m),
        "pg_clipfrac_lower": masked_mean(((clipped > l3) & negative).astype(dtype), m),
        "ppo_kl": masked_mean(-log_ratio, m),
        "pg_zero_grad_frac": masked_mean(zero_grad.astype(dtype), m),
    }
    return loss, metrics


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
               clip: float = 0.5, agg: str = "token-mean",
               weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped value loss (verl ``compute_value_loss``)::

        v_c = clip(v, v_old - clip, v_old + clip)
        loss = 0.5 * agg(w * max((v - R)^2, (v_c - R)^2), mask)

    ``weights`` (optional, detached, ``[B, T]`` or ``[B, 1]``) e.g. PER weights. Metrics:
    ``vf_clipfrac = mean_m[(v_c - R)^2 > (v - R)^2]``.
    """
    check_choice("agg", agg, AGG_MODES)
    check_ndim("values", values, 2)
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    check_scalar_range("clip", clip, ge=0.0)
    dtype = compute_dtype(values, old_values, returns)
    v, v_old, ret = (jnp.asarray(x, dtype) for x in (values, old_values, returns))
    m = (jnp.asarray(mask) != 0).astype(dtype)
    v_clipped = jnp.clip(v, v_old - clip, v_old + clip)
    l1 = jnp.square(v - ret)
    l2 = jnp.square(v_clipped - ret)
    per_token = jnp.maximum(l1, l2)
    if weights is not None:
        per_token = per_token * _check_weights(weights, v.shape).astype(dtype)
    loss = 0.5 * aggregate(per_token, m, agg)
    return loss, {"vf_clipfrac": masked_mean((l2 > l1).astype(dtype), m)}
