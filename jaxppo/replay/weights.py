"""PER importance weights with a relative floor: the weighting that cannot collapse.

Notation: ``m_i > 0`` the sampling mass of valid item ``i`` (proportional: its priority ``(|δ_i|+ε)^α`` times any
staleness decay; rank: ``rank(i)^(-α)``), ``P(i) = m_i / Σ_k m_k``, ``m_max`` the largest mass over the valid items,
``β`` the correction exponent and ``κ`` (``weight_floor``, ``0 <= κ <= 1``).

    w_i = min(1, (m_ref / m_i)^β),      m_ref = min{ m_j : j valid, m_j >= κ · m_max }

Why. Schaul et al.'s weight ``(N·P(i))^(-β)`` divided by its largest value over the buffer is
``(m_min / m_i)^β``: ONE item at the priority floor (``|δ| = 0``, e.g. a GRPO/RLOO group whose responses all got
the same reward, stored as ``ε^α``) sets ``m_min ≈ ε^α`` and scales every informative item's weight by about
``(ε^α / m_i)^β`` (``1e-4`` at ``β = 1``, ``ε = 1e-6``, ``α = 0.6``), while the KL and entropy terms keep their
size: the policy stops moving. Here the normalizing item is the least likely one among those whose mass is at
least ``κ`` times the largest; items below ``κ·m_max`` do not take part. So:

- bound: ``m_ref >= κ·m_max >= κ·m_i``, so every sampled item has ``κ^β <= w_i <= 1``, whatever fraction of the
  buffer sits at the floor (the property tests check it with 0%..99% of the items at ``ε``);
- exact correction where it matters: between any two items with mass ``>= κ·m_max`` the ratio
  ``w_i / w_j = (m_j / m_i)^β = (P(j) / P(i))^β`` is Schaul's, and their weights are exactly the classic weights of
  a buffer without the items below ``κ·m_max``; those (the floor items, drawn with probability
  ``< κ·m_max / Σ m`` each, rarely) get weight 1 instead of a larger one: truncated importance weights, as the
  behaviour-side TIS truncates ``π/μ`` (bounded variance, a bias on the rarely drawn items only);
- ``κ = 0`` is the classic ``(m_min / m_i)^β``, and so is any ``κ <= m_min / m_max`` (no item more than ``1/κ``
  times less likely than the likeliest): weights are unchanged there.

Zero-advantage items stay in the buffer at the absolute floor ``ε`` (sampled rarely, weight 1, zero policy
gradient); to drop them instead use ``pf_ppo.filter=dynamic_sampling`` (DAPO's filter: groups whose scores are
all equal are stored with priority 0 and never drawn).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: ``κ``: every sampled item's PER weight is at least ``κ^β`` (``replay.weight_floor``).
DEFAULT_WEIGHT_FLOOR = 0.1


def reference_mass(mass: jax.Array, valid: jax.Array, weight_floor: float) -> jax.Array:
    """``m_ref = min{m_j : valid_j, m_j >= κ·m_max}`` over ``mass`` (module docstring); ``+inf`` when no item is
    valid. ``mass`` / ``valid`` same shape (any), ``κ = weight_floor``."""
    mass = jnp.asarray(mass, jnp.float32)
    m_max = jnp.max(jnp.where(valid, mass, 0.0))
    keep = valid & (mass >= jnp.float32(weight_floor) * m_max)
    return jnp.min(jnp.where(keep, mass, jnp.inf))


def per_weights(mass: jax.Array, m_ref: jax.Array, beta: jax.Array | float) -> jax.Array:
    """``w = min(1, (m_ref / mass)^β)`` (module docstring; ``m_ref`` from :func:`reference_mass`); 0 where
    ``mass <= 0`` (never sampled) or ``m_ref`` is not finite (empty buffer)."""
    mass = jnp.asarray(mass, jnp.float32)
    m_ref = jnp.asarray(m_ref, jnp.float32)
    ok = (mass > 0) & jnp.isfinite(m_ref)
    w = (jnp.where(ok, m_ref, 1.0) / jnp.where(ok, mass, 1.0)) ** jnp.asarray(beta, jnp.float32)
    return jnp.where(ok, jnp.minimum(w, 1.0), 0.0)


def check_weight_floor(weight_floor: float) -> float:
    """``κ`` as a float in ``[0, 1]``; ``ValueError`` naming it otherwise."""
    try:
        k = float(weight_floor)
    except (TypeError, ValueError):
        raise ValueError(f"replay weight_floor must be a number in [0, 1], got {weight_floor!r}") from None
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"replay weight_floor must be in [0, 1], got {weight_floor!r}")
    return k
