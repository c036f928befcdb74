"""Behaviour-policy importance weights for offline PPO (detached; verl rollout-IS style).

With ``l_t = clip(target_logp_t - behaviour_logp_t, -20, 20)`` on valid tokens (0 on padding):

* ``level="token"``:     ``rho_bt = exp(l_bt)``
* ``level="sequence"``:  ``rho_b = exp(clip(sum_t m_bt l_bt, -20, 20))``          (product of ratios)
* ``level="geometric"``: ``rho_b = exp(sum_t m_bt l_bt / max(n_b, 1))``           (geometric mean)

then, in this order:

1. ``mode="mask"``: ``w = rho * [lower <= rho <= threshold]`` (``lower`` defaults to ``1 / threshold``),
   decided on the RAW ratio ``rho`` (so the cap rule below never rescues a ratio outside the band).
2. ``cap_rule=True`` (the source article): ``w > 1.5 -> 1.2``.
3. ``mode="truncate"`` (TIS): ``w = min(w, threshold)`` (after the cap, as before).
4. ``veto`` (optional floor): a sequence with any valid token ratio ``exp(l_t) < veto`` gets ``w = 0``.
5. ``w = stop_gradient(w) * mask`` — sequence weights are broadcast over ``T``; padding is 0.

So with ``mode="mask"`` and the cap rule, ``w = 0`` outside ``[lower, threshold]``, ``1.2`` for
``1.5 < rho <= threshold`` and ``rho`` otherwise; with ``mode="truncate"``, ``min(cap(rho), threshold)``.

Metrics over the *units* (valid tokens for ``token``; sequences with at least one valid token otherwise):
``ess`` = Kish effective sample size over N, ``(sum w)^2 / (N sum w^2)`` in ``(0, 1]`` (0 if every weight
is 0), ``weight_mean``, ``weight_max``, ``clipped_frac`` (share of units whose weight steps 1-3 changed),
``veto_frac`` (share of valid sequences vetoed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_choice, check_ndim, check_same_shape, check_scalar_range, compute_dtype
from jaxppo.ops.constants import LOG_RATIO_CLAMP

LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "mask")
CAP_ABOVE = 1.5
CAP_TO = 1.2


def _kish_ess(w: jax.Array, units: jax.Array) -> jax.Array:
    n = jnp.sum(units)
    s1 = jnp.sum(jnp.where(units, w, 0))
    s2 = jnp.sum(jnp.where(units, jnp.square(w), 0))
    return jnp.where(s2 > 0, jnp.square(s1) / (jnp.maximum(n, 1) * jnp.where(s2 > 0, s2, 1)), 0.0)


def importance_weights(target_logp: jax.Array, behaviour_logp: jax.Array, mask: jax.Array, *, level: str,
                       mode: str, threshold: float, lower: float | None = None, veto: float | None = None,
                       cap_rule: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Detached importance weights ``[B, T]`` of ``pi_target / mu_behaviour`` (formulas in the module doc)."""
    check_choice("level", level, LEVELS)
    check_choice("mode", mode, MODES)
    check_ndim("target_logp", target_logp, 2)
    check_same_shape(target_logp=target_logp, behaviour_logp=behaviour_logp, mask=mask)
    check_scalar_range("threshold", threshold, gt=0.0)
    if mode == "truncate" and lower is not None:
        raise ValueError("lower is only used with mode='mask' (truncation has no lower bound); got "
                         f"lower={lower!r} with mode='truncate'")
    if mode == "mask":
        if lower is None:
            lower = 1.0 / threshold
        check_scalar_range("lower", lower, ge=0.0)
        if not isinstance(lower, jax.core.Tracer) and not isinstance(threshold, jax.core.Tracer):
            if float(lower) > float(threshold):
                raise ValueError(f"lower={float(lower)} must be <= threshold={float(threshold)}")
    if veto is not None:
        check_scalar_range("veto", veto, gt=0.0)
    if not isinstance(cap_rule, bool):
        raise TypeError(f"cap_rule must be a bool, got {type(cap_rule).__name__}")

    dtype = compute_dtype(target_logp, behaviour_logp)
    valid = jnp.asarray(mask) != 0
    m = valid.astype(dtype)
    log_ratio = jnp.clip(jnp.asarray(target_logp, dtype) - jnp.asarray(behaviour_logp, dtype),
                         -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_ratio = jnp.where(valid, log_ratio, 0)
    row_valid = jnp.any(valid, axis=-1)

    if level == "token":
        rho = jnp.exp(log_ratio)
        units = valid
    else:
        total = jnp.sum(log_ratio, axis=-1, keepdims=True)
        if level == "sequence":
            log_w = jnp.clip(total, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        else:
            log_w = total / jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1)
        rho = jnp.exp(log_w)  # [B, 1]
        units = row_valid[:, None]

    w = rho
    if mode == "mask":              # the band is decided by the raw ratio, before the cap rule
        w = jnp.where((rho >= lower) & (rho <= threshold), w, 0)
    if cap_rule:
        w = jnp.where(w > CAP_ABOVE, jnp.asarray(CAP_TO, dtype), w)
    if mode == "truncate":
        w = jnp.minimum(w, threshold)
    if veto is not None:
        vetoed = jnp.any(valid & (log_ratio < jnp.log(jnp.asarray(veto, dtype))), axis=-1, keepdims=True)
        w = jnp.where(vetoed, 0, w)
        veto_frac = jnp.sum(vetoed[:, 0] & row_valid) / jnp.maximum(jnp.sum(row_valid), 1)
    else:
        veto_frac = jnp.zeros((), dtype)
    changed = w != rho

    w = jax.lax.stop_gradient(w)
    n_units = jnp.maximum(jnp.sum(units), 1)
    metrics = {
        "ess": _kish_ess(w, units).astype(dtype),
        "weight_mean": (jnp.sum(jnp.where(units, w, 0)) / n_units).astype(dtype),
        "weight_max": jnp.max(jnp.where(units, w, 0), initial=0.0).astype(dtype),
        "clipped_frac": (jnp.sum(changed & units) / n_units).astype(dtype),
        "veto_frac": veto_frac.astype(dtype),
    }
    weights = jnp.broadcast_to(w, m.shape) * m
    return weights, jax.tree.map(jax.lax.stop_gradient, metrics)
