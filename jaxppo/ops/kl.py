"""KL estimators (Schulman's k1/k2/k3, ``abs``, straight-through ``+`` forms) and the adaptive KL coefficient.

With ``d = logp - ref_logp`` (per token, samples from the policy):

* ``k1`` / ``kl``:  ``d``
* ``abs``:          ``|d|``
* ``k2`` / ``mse``: ``0.5 * d**2``
* ``k3`` / ``low_var_kl``: ``clip(exp(-d') + d' - 1, -10, 10)`` with ``d' = clip(d, -20, 20)``,
  i.e. ``ratio - log ratio - 1`` for ``ratio = ref/pi``.
* ``<base>+`` (``k1+``, ``k3+``, ...): the value of ``<base>`` with the gradient of ``k2``
  (``k2 - stop_gradient(k2) + stop_gradient(base)``); ``k2+`` is ``k2``.

``adaptive_kl_update`` is the adaptive controller of Ziegler et al. (2019), a pure function of the coefficient
(the trainer keeps it in ``TrainState.kl_coef``; a fixed controller is no update):
``coef <- coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_choice, check_same_shape, check_scalar_range, compute_dtype
from jaxppo.ops.constants import LOG_RATIO_CLAMP

#: value clamp of k3 (as verl)
K3_VALUE_CLAMP = 10.0

_BASE = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_KINDS = tuple(_BASE) + tuple(f"{k}+" for k in _BASE)


def _forward(d: jax.Array, base: str) -> jax.Array:
    if base == "k1":
        return d
    if base == "abs":
        return jnp.abs(d)
    if base == "k2":
        return 0.5 * jnp.square(d)
    neg = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log(ref/pi)
    return jnp.clip(jnp.exp(neg) - neg - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str) -> jax.Array:
    """Per-token KL estimate of ``kind`` (see the module docstring); same shape as the inputs."""
    check_choice("kind", kind, KL_KINDS)
    check_same_shape(logp=logp, ref_logp=ref_logp)
    dtype = compute_dtype(logp, ref_logp)
    d = jnp.asarray(logp, dtype) - jnp.asarray(ref_logp, dtype)
    straight_through = kind.endswith("+")
    base = _BASE[kind[:-1] if straight_through else kind]
    value = _forward(d, base)
    if not straight_through or base == "k2":
        return value
    k2 = 0.5 * jnp.square(d)
    return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)


def adaptive_kl_update(coef: Any, current_kl: Any, n_steps: Any, *, target: Any, horizon: Any) -> jax.Array:
    """``coef * (1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon)``."""
    check_scalar_range("target", target, gt=0.0)
    check_scalar_range("horizon", horizon, gt=0.0)
    check_scalar_range("n_steps", n_steps, ge=0.0)
    coef = jnp.asarray(coef, jnp.float32)
    err = jnp.clip(jnp.asarray(current_kl, jnp.float32) / target - 1.0, -0.2, 0.2)
    return coef * (1.0 + err * jnp.asarray(n_steps, jnp.float32) / horizon)
