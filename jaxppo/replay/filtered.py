"""PF-PPO filter weights under prioritized replay: the PER correction undoes only the priority part.

Notation: ``f_i >= 0`` the PF-PPO filter weight of item ``i`` (``|s_i|^k`` for ``pow``, 0/1 for the filters,
1 without PF-PPO), ``q_i`` its priority mass without the filter: ``(|δ_i| + ε)^α`` (proportional) or the
rank mass ``rank(i)^(-α)`` (rank), ``P_prio(i) = q_i / Σ_{f_j>0} q_j``.

Goal: the expected gradient share of item ``i`` per step, ``E[count_i · w_i] ∝ P(i)·w_i``, is
``∝ f_i · P_prio(i)^(1−β)``: at ``β = 0`` priorities and filter both shape the batch, at ``β = 1`` the
priority is fully corrected and the filter preference ``∝ f_i`` survives. (Storing ``(|δ|·f + ε)^α`` and
correcting for the whole sampling distribution, as before, gave ``∝ (p_i f_i)^{α(1−β)}``: uniform at β = 1.)

- proportional: the buffer stores ``f_i · q_i`` (:func:`filtered_stored_priority`), so it samples with
  ``P(i) = f_i q_i / Σ_j f_j q_j``; the loss weights (:func:`filtered_weights`) are the PER weights of the
  priority part alone, ``w_i = min(1, (q_ref / q_i)^β)`` with ``q_ref = min{q_j : q_j >= κ·q_max}`` over
  ``f_j > 0`` (``weights.py``; ``κ = 0``: ``(N·P_prio(i))^(−β) / max_j (N·P_prio(j))^(−β) = (q_min / q_i)^β``),
  ``q_i = stored_i / f_i``. Then ``P(i)·w_i ∝ f_i q_i^(1−β)`` for every item with ``q_i >= κ·q_max``, and
  ``κ^β <= w_i <= 1``.
- rank: the buffer stores ``|δ_i| + ε`` for ``f_i > 0`` (0 otherwise), so it samples with ``P_prio`` (the
  rank distribution has no multiplicative slot for ``f``); the loss weights are the sampler's PER weights
  times ``f_i / max_j f_j``: ``P(i)·w_i ∝ P_prio(i)^(1−β) · f_i``.

Items with ``f_i = 0`` are stored as 0 and never sampled. With 0/1 filters both forms reduce to plain PER
over the kept items.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.replay.state import ReplayState, Sample, stored_priority
from jaxppo.replay.weights import per_weights, reference_mass


def filtered_stored_priority(state: ReplayState, td_abs: jax.Array, filter_w: jax.Array) -> jax.Array:
    """Stored value of items with fresh ``|δ|`` and filter weights ``f`` (``[B]`` each), for
    :func:`jaxppo.replay.set_priorities`: ``f·(|δ|+ε)^α`` (proportional) or ``(|δ|+ε)·[f>0]`` (rank); 0 where
    ``f = 0``. Non-finite ``|δ|`` get the running maximum as in ``stored_priority``."""
    f = jnp.asarray(filter_w, jnp.float32)
    base = stored_priority(state, td_abs)
    if state.prioritization == "proportional":
        return jnp.where(f > 0, f * base, 0.0)
    return jnp.where(f > 0, base, 0.0)


def filtered_weights(state: ReplayState, sample: Sample, filter_w: jax.Array, beta: jax.Array | float) -> jax.Array:
    """Loss weights ``[B]`` of ``sample`` (drawn from ``state`` holding :func:`filtered_stored_priority` values)
    such that ``P(i)·w_i ∝ f_i·P_prio(i)^(1−β)`` (module docstring). ``filter_w`` ``[capacity]`` is the filter
    weight of every slot (the same array the stored values were built from)."""
    f_all = jnp.asarray(filter_w, jnp.float32)
    f = f_all[sample.indices]
    if state.prioritization == "rank":
        f_max = jnp.max(f_all)
        return sample.weights * jnp.where(f_max > 0, f / jnp.where(f_max > 0, f_max, 1.0), 0.0)
    cap = f_all.shape[0]
    pr = state.priorities[:cap]
    kept = (f_all > 0) & (pr > 0) & (jnp.arange(cap) < state.size)
    q_ref = reference_mass(jnp.where(kept, pr / jnp.where(kept, f_all, 1.0), 0.0), kept, state.weight_floor)
    pi = state.priorities[sample.indices]
    ok = (f > 0) & (pi > 0)
    q = jnp.where(ok, pi / jnp.where(ok, f, 1.0), 1.0)
    return jnp.where(ok, per_weights(q, q_ref, beta), 0.0)
