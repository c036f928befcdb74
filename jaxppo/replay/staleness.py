"""Staleness decay of replay priorities: an item's sampling priority shrinks as its data is reused or ages.

An item's *refresh* is the moment its prepared arrays and priority were recomputed from scratch: ``add`` and
``set_priorities`` (the trainer's prepare pass, every ``replay.refresh_every`` steps). Between refreshes,
``update_priorities`` re-estimates the priority from a fresh ``|δ|`` but the item's data (advantages, old
log-probs) stays the same, so it does NOT reset the staleness. With ``b_i`` the stored (undecayed) priority
(``state.base_priorities``) and ``r = replay.decay.rate`` in ``(0, 1]``:

- ``decay="none"``:    ``p_i = b_i``;
- ``decay="sampled"``: ``p_i = b_i · r^(n_i)``, ``n_i`` = times item ``i`` was drawn since its refresh
  (``state.sample_count``, counted by :func:`record_sample`, duplicates in one batch counted each time);
- ``decay="age"``:     ``p_i = b_i · r^(age_i) = b_i · exp(-age_i / τ)`` with ``τ = -1 / ln r``,
  ``age_i = clock - refresh_step_i`` (``clock`` = number of :func:`record_sample` calls, one per step).

Sampling uses ``P(i) = p_i / Σ_k p_k`` (proportional; rank-based: ranks of ``p_i``) and the PER weights of
that distribution, so the importance weights correct for the decay as well.

Exactness and cost. The tree leaves (``state.priorities``) always hold the decayed values, and every write
recomputes the touched tree nodes from their children, so the tree stays exact. ``"sampled"``: a draw is a
priority write of the ``B`` drawn items (``O(B·depth)``). ``"age"``: between refreshes every age grows by
one per step, a common factor ``r`` that cancels in ``P(i)`` and in the weights; so the leaves store
``b_i · r^(ref - refresh_step_i)`` relative to a reference clock ``ref`` (``state.decay_ref``), which gives
exactly ``P(i) ∝ b_i · r^(age_i)`` at any clock with no per-step work. When ``clock - ref`` reaches
:func:`rebase_period` (where ``r^-(clock - ref)`` would pass ``2^16``) the leaves are recomputed at
``ref = clock`` and the tree rebuilt (``O(N)``, once per period). A decayed leaf that would underflow to 0
is kept at the smallest normal float32, so a decayed item is never switched off (0 still means "never
sample").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.replay import tree as tree_lib
from jaxppo.replay.state import ReplayState, constrain, leading_sharding, replicated_sharding

TINY = float(np.finfo(np.float32).tiny)
REBASE_GROWTH_BITS = 16          # "age": leaves may grow by at most 2^16 before a rebase


def rebase_period(rate: float) -> int:
    """Clock ticks between two ``"age"`` rebases: the largest ``K >= 1`` with ``rate^-K <= 2^16``."""
    if rate >= 1.0:
        return 2 ** 30
    return max(1, min(2 ** 30, int(math.floor(REBASE_GROWTH_BITS * math.log(2.0) / -math.log(rate)))))


def decay_factor(state: ReplayState, sample_count: jax.Array, refresh_step: jax.Array,
                 decay_ref: jax.Array | None = None) -> jax.Array:
    """Per-slot factor the leaves carry: 1, ``r^n`` (sampled) or ``r^(ref - refresh_step)`` (age)."""
    rate = jnp.float32(state.decay_rate)
    if state.decay == "sampled":
        return rate ** sample_count.astype(jnp.float32)
    if state.decay == "age":
        ref = state.decay_ref if decay_ref is None else decay_ref
        return rate ** (ref - refresh_step).astype(jnp.float32)
    return jnp.ones(sample_count.shape, jnp.float32)


def leaf_values(state: ReplayState, base: jax.Array, sample_count: jax.Array, refresh_step: jax.Array,
                decay_ref: jax.Array | None = None) -> jax.Array:
    """Decayed leaf values ``b · factor`` (``b`` itself with ``decay="none"``); a positive ``b`` whose product
    underflows to 0 is kept at the smallest normal float32."""
    if state.decay == "none":
        return base
    leaf = base * decay_factor(state, sample_count, refresh_step, decay_ref)
    return jnp.where((base > 0) & ~(leaf > 0), jnp.float32(TINY), leaf)


def ages(state: ReplayState) -> jax.Array:
    """``age_i = clock - refresh_step_i`` per slot (meaningful for filled slots)."""
    return state.clock - state.refresh_step


def write(state: ReplayState, indices: jax.Array, base: jax.Array, *, reset: bool) -> ReplayState:
    """Store undecayed priorities ``base`` ``[B]`` for ``indices`` and their decayed leaves; refresh the tree.

    Duplicates: the LARGEST new value of a slot wins (order-free). Indices outside ``0..size-1`` are
    dropped. ``reset=True`` (a refresh): ``n_i = 0`` and ``refresh_step_i = clock`` for the written slots.
    The running maximum covers the written ``base`` values (what new items get).
    """
    indices = jnp.asarray(indices, jnp.int32)
    n = state.priorities.shape[0]
    shard = leading_sharding(state.mesh, 1)
    valid = (indices >= 0) & (indices < state.size)
    target = jnp.where(valid, indices, n)                                     # n: out of bounds, dropped
    # clear then scatter-max: order-independent, so duplicates resolve deterministically (largest wins).
    # (``0·base`` rather than a constant 0 orders every read of the old values before the clearing scatter,
    # so XLA updates the donated buffer in place; the values are finite here, so this is exactly 0.)
    if state.decay == "none":
        pr = state.priorities.at[target].set(0.0 * base, mode="drop").at[target].max(base, mode="drop")
        pr = constrain(pr, shard)
        new = state.replace(priorities=pr, base_priorities=pr)
    else:
        b = state.base_priorities.at[target].set(0.0 * base, mode="drop").at[target].max(base, mode="drop")
        b = constrain(b, shard)
        new = state.replace(base_priorities=b)
    if reset:
        new = new.replace(
            sample_count=constrain(new.sample_count.at[target].set(0, mode="drop"), shard),
            refresh_step=constrain(new.refresh_step.at[target].set(new.clock, mode="drop"), shard))
    new = _rewrite_leaves(new, indices, target) if state.decay != "none" else _refresh_tree(new, indices)
    new_max = jnp.max(jnp.where(valid, base, 0.0), initial=0.0)
    return new.replace(max_priority=jnp.maximum(state.max_priority, new_max))


def _refresh_tree(state: ReplayState, indices: jax.Array) -> ReplayState:
    n = state.priorities.shape[0]
    tree = tree_lib.refresh(state.tree, state.priorities, jnp.clip(indices, 0, n - 1), state.layout)
    return state.replace(tree=constrain(tree, replicated_sharding(state.mesh)))


def _rewrite_leaves(state: ReplayState, indices: jax.Array, target: jax.Array) -> ReplayState:
    """Recompute the decayed leaves of ``target`` (``n`` = dropped) from base, counts and refresh steps."""
    n = state.priorities.shape[0]
    safe = jnp.clip(target, 0, n - 1)
    vals = leaf_values(state, state.base_priorities[safe], state.sample_count[safe], state.refresh_step[safe])
    pr = constrain(state.priorities.at[target].set(vals, mode="drop"), leading_sharding(state.mesh, 1))
    return _refresh_tree(state.replace(priorities=pr), indices)


def rebase(state: ReplayState) -> ReplayState:
    """``"age"``: recompute every leaf at ``ref = clock`` and rebuild the tree (the sampling distribution is
    unchanged up to round-off; only the common scale of the leaves moves)."""
    ref = state.clock
    filled = jnp.arange(state.priorities.shape[0]) < state.size
    leaves = jnp.where(filled, leaf_values(state, state.base_priorities, state.sample_count, state.refresh_step,
                                           ref), 0.0)
    leaves = constrain(leaves, leading_sharding(state.mesh, 1))
    tree = constrain(tree_lib.build(leaves, state.layout), replicated_sharding(state.mesh))
    return state.replace(priorities=leaves, tree=tree, decay_ref=ref)


def record_counts(state: ReplayState, indices: jax.Array, base: jax.Array | None) -> ReplayState:
    """Traced core of :func:`jaxppo.replay.record_sample`: ``n_i += 1`` per occurrence of ``i`` in ``indices``,
    ``clock += 1``, the fresh ``base`` (optional) stored without a reset, the drawn leaves rewritten
    (``"sampled"``) and an ``"age"`` rebase when due."""
    indices = jnp.asarray(indices, jnp.int32)
    n = state.priorities.shape[0]
    valid = (indices >= 0) & (indices < state.size)
    target = jnp.where(valid, indices, n)
    counts = constrain(state.sample_count.at[target].add(1, mode="drop"), leading_sharding(state.mesh, 1))
    state = state.replace(sample_count=counts, clock=state.clock + 1)
    if base is not None:
        state = write(state, indices, base, reset=False)
    elif state.decay == "sampled":
        state = _rewrite_leaves(state, indices, target)
    if state.decay == "age":
        period = rebase_period(state.decay_rate)
        state = jax.lax.cond(state.clock - state.decay_ref >= period, rebase, lambda s: s, state)
    return state
