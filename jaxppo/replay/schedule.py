"""PER importance-sampling exponent schedule: β annealed linearly from β0 to 1."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _check(beta0, total_steps) -> None:
    if not isinstance(beta0, jax.core.Tracer) and not 0.0 <= float(beta0) <= 1.0:
        raise ValueError(f"replay.beta0 must be in [0, 1], got {beta0!r}")
    if not isinstance(total_steps, jax.core.Tracer) and (not np.isfinite(float(total_steps))
                                                         or float(total_steps) < 1):
        raise ValueError(f"replay.beta_steps (total_steps) must be >= 1, got {total_steps!r}")


def linear_beta(step, beta0: float, total_steps) -> jax.Array:
    """``β(step) = β0 + (1 - β0)·clip(step / total_steps, 0, 1)`` (float32; jittable in ``step``)."""
    _check(beta0, total_steps)
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / jnp.asarray(total_steps, jnp.float32), 0.0, 1.0)
    return jnp.float32(beta0) + (1.0 - jnp.float32(beta0)) * frac


def beta_schedule(beta0: float, total_steps: int) -> Callable[[jax.Array], jax.Array]:
    """``step -> linear_beta(step, beta0, total_steps)`` (an optax-style schedule)."""
    _check(beta0, total_steps)
    return lambda step: linear_beta(step, beta0, total_steps)
