"""Pure buffer operations: ``add``, ``sample``, ``update_priorities``, ``set_priorities``, ``record_sample``.

All are jittable (``batch_size`` static) and return new states. Eager calls validate their inputs and
raise ``ValueError`` naming the problem; under ``jit`` the documented fallbacks apply.

Formulas (``N`` = number of valid items, i.e. filled slots with stored priority > 0):

- proportional: ``P(i) = p_i / Σ_k p_k`` with stored ``p_i = (|δ_i| + ε)^α``;
- rank: ``P(i) = rank(i)^(-α) / Σ_{r=1..N} r^(-α)``, ``rank`` 1 = largest ``|δ| + ε`` (ties: lower slot first);
- weights (``weights.py``): ``w_i = min(1, (m_ref / m_i)^β)``, ``m_ref = min{m_j : m_j >= κ·m_max}`` with ``m_i``
  the item's sampling mass (proportional: its leaf; rank: ``rank(i)^(-α)``), over the valid items, and ``κ`` =
  ``init(weight_floor=...)``; so ``κ^β <= w_i <= 1`` and, for ``κ = 0`` (or no item below ``κ·m_max``),
  Schaul et al.'s ``(N·P(i))^(-β) / max_j (N·P(j))^(-β) = (P_min / P(i))^β``;
- duplicates in one ``update_priorities`` / ``set_priorities``: the LARGEST new value of a slot is
  stored (replacing the old one even if that was larger); the running max covers the stored values;
- staleness decay (``staleness.py``, ``init(decay=..., decay_rate=r)``): ``p_i`` above is the stored priority
  times ``r^(n_i)`` (``"sampled"``) or ``r^(age_i)`` (``"age"``); ``add`` and ``set_priorities`` refresh an
  item (``n_i = 0``, ``age_i = 0``), ``update_priorities`` does not.
- whole groups (``sample(group_size=n)``): group ``k`` is slots ``k·n .. k·n+n−1``, drawn with
  ``P(g) = m_g / Σ m``, ``m_g = Σ_{i∈g} m_i`` (a leaf is drawn as above and its whole group taken: ``B/n`` draws
  give ``B`` rows). Row ``i`` of a drawn group carries ``s_i = n·m_i / m_g`` (``Sample.group_share``): then
  ``(B/n)·P(g)·s_i = B·P(i)`` for every row, so a loss weighted by ``s_i·w_i`` has the expected gradient of ``B``
  item draws weighted by ``w_i`` (equal masses: ``s_i = 1``; a row of mass 0, e.g. filtered out, gets 0).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.parallel.host import to_host
from jaxppo.parallel.mesh import batch_divisor
from jaxppo.replay import staleness
from jaxppo.replay import tree as tree_lib
from jaxppo.replay.sampling import stratified_descent
from jaxppo.replay.weights import per_weights, reference_mass
from jaxppo.replay.state import (ReplayState, Sample, constrain, is_concrete, leading_sharding, leaf_name,
                                 replicated_sharding, stored_priority)


# --------------------------------------------------------------------------------------------- helpers
def _batch_len(name: str, x: Any) -> int:
    shape = np.shape(x)
    if len(shape) != 1:
        raise ValueError(f"replay {name} must be 1-D [B], got shape {shape}")
    return shape[0]


def _check_finite(name: str, x: Any) -> None:
    if is_concrete(x) and not bool(np.all(np.isfinite(to_host(x)))):
        raise ValueError(f"replay {name} contains NaN or inf values")


@jax.jit
def _write_priorities(state: ReplayState, indices: jax.Array, stored: jax.Array) -> ReplayState:
    return staleness.write(state, indices, stored, reset=False)


def _check_indices(state: ReplayState, indices: Any) -> None:
    if is_concrete(indices, state.size):
        idx = np.asarray(to_host(indices))
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"replay indices must be integers, got dtype {idx.dtype}")
        size = int(to_host(state.size))
        bad = (idx < 0) | (idx >= size)
        if bad.any():
            raise ValueError(f"replay indices {idx[bad][:5].tolist()} are not filled slots "
                             f"(valid: 0..{size - 1}, buffer size {size})")


_stored_priority = jax.jit(stored_priority)


@functools.partial(jax.jit, static_argnames="refresh")
def _set_stored(state: ReplayState, indices: jax.Array, priorities: jax.Array, refresh: bool) -> ReplayState:
    stored = jnp.maximum(jnp.nan_to_num(jnp.asarray(priorities, jnp.float32), nan=0.0, posinf=0.0), 0.0)
    return staleness.write(state, indices, stored, reset=refresh)


_record = jax.jit(staleness.record_counts)


@jax.jit
def _add_core(state: ReplayState, new_storage: Any, stored: jax.Array) -> ReplayState:
    b = stored.shape[0]
    pos = (state.insert_pos + jnp.arange(b, dtype=jnp.int32)) % state.capacity
    storage = jax.tree.map(lambda buf, v: constrain(buf.at[pos].set(v), leading_sharding(state.mesh, v.ndim)),
                           state.storage, new_storage)
    shard = leading_sharding(state.mesh, 1)
    base = constrain(state.base_priorities.at[pos].set(stored), shard)
    counts = constrain(state.sample_count.at[pos].set(0), shard)
    refreshed = constrain(state.refresh_step.at[pos].set(state.clock), shard)
    if state.decay == "none":
        pr = base
    else:
        pr = constrain(state.priorities.at[pos].set(
            staleness.leaf_values(state, stored, counts[pos], refreshed[pos])), shard)
    tree = constrain(tree_lib.build(pr, state.layout), replicated_sharding(state.mesh))
    return state.replace(
        storage=storage, priorities=pr, tree=tree, base_priorities=base, sample_count=counts,
        refresh_step=refreshed,
        max_priority=jnp.maximum(state.max_priority, jnp.max(stored)),
        insert_pos=(state.insert_pos + b) % state.capacity,
        size=jnp.minimum(state.size + b, state.capacity).astype(jnp.int32),
    )


# ------------------------------------------------------------------------------------------------- API
def update_priorities(state: ReplayState, indices: jax.Array, td_abs: jax.Array) -> ReplayState:
    """Store ``p = (|δ| + ε)^α`` (rank-based: ``|δ| + ε``) for ``indices`` and update the running max.

    ``indices`` int ``[B]`` filled slots (from :func:`sample`), ``td_abs`` ``[B]`` the fresh ``|δ|`` of each.
    Duplicate indices: the LARGEST of their new priorities is stored (deterministic, order-free). Under ``jit``,
    indices outside ``0..size-1`` are ignored and non-finite ``|δ|`` get the running maximum; eager
    calls raise ``ValueError`` for both.
    """
    b = _batch_len("indices", indices)
    if _batch_len("td_abs", td_abs) != b:
        raise ValueError(f"replay update_priorities: indices has {b} entries but td_abs has {np.shape(td_abs)[0]}")
    _check_indices(state, indices)
    _check_finite("td_abs", td_abs)
    return _write_priorities(state, indices, _stored_priority(state, td_abs))


def set_priorities(state: ReplayState, indices: jax.Array, priorities: jax.Array, *,
                   refresh: bool = True) -> ReplayState:
    """Write STORED priorities directly (no ``ε``, no exponent): ``0`` switches an item off.

    Use it to mask or scale items by a filter (e.g. PF-PPO weights times the current priorities).
    Values must be finite and ``>= 0``; duplicates: the largest value wins; the running max is updated.
    ``refresh=True`` (the trainer's prepare pass) also resets the items' staleness (``staleness.py``):
    ``n_i = 0``, ``refresh_step_i = clock``; ``refresh=False`` keeps it (the decay applies to the new value).
    """
    b = _batch_len("indices", indices)
    if _batch_len("priorities", priorities) != b:
        raise ValueError(f"replay set_priorities: indices has {b} entries but priorities has "
                         f"{np.shape(priorities)[0]}")
    _check_indices(state, indices)
    _check_finite("priorities", priorities)
    if is_concrete(priorities) and bool(np.any(to_host(priorities) < 0)):
        raise ValueError("replay set_priorities: stored priorities must be >= 0")
    return _set_stored(state, jnp.asarray(indices), jnp.asarray(priorities), bool(refresh))


def record_sample(state: ReplayState, indices: jax.Array, td_abs: jax.Array | None = None) -> ReplayState:
    """Record one training step's draw for the staleness decay (``staleness.py``) and, optionally, its priorities.

    ``n_i += 1`` for each occurrence of ``i`` in ``indices``, ``clock += 1``; with ``td_abs`` the fresh
    priorities are stored exactly as :func:`update_priorities` stores them (no staleness reset), in the same
    tree update. ``"sampled"`` decay rewrites the drawn items' leaves to ``b_i · r^(n_i)``; ``"age"`` rebases
    its leaves when due. With ``decay="none"`` only the counters move (and ``td_abs`` is stored), so
    ``record_sample(s, idx, td)`` then equals ``update_priorities(s, idx, td)`` in every priority and tree
    value. Call it once per step after :func:`sample` with the indices actually trained on. Under ``jit``
    indices outside ``0..size-1`` are ignored and non-finite ``|δ|`` get the running maximum; eager calls
    raise ``ValueError`` for both.
    """
    b = _batch_len("indices", indices)
    _check_indices(state, indices)
    base = None
    if td_abs is not None:
        if _batch_len("td_abs", td_abs) != b:
            raise ValueError(f"replay record_sample: indices has {b} entries but td_abs has "
                             f"{np.shape(td_abs)[0]}")
        _check_finite("td_abs", td_abs)
        base = _stored_priority(state, td_abs)
    return _record(state, jnp.asarray(indices), base)


def _check_structure(storage: Any, items: Any) -> tuple[list, list]:
    """``(item leaves, buffer leaves)`` as ``[(path, leaf)]``; ``ValueError`` naming the differing paths when the
    two pytrees differ in structure."""
    got = jax.tree_util.tree_flatten_with_path(items)[0]
    want = jax.tree_util.tree_flatten_with_path(storage)[0]
    if jax.tree.structure(items) == jax.tree.structure(storage):
        return got, want
    have, need = [leaf_name(p) for p, _ in got], [leaf_name(p) for p, _ in want]
    missing = [n for n in need if n not in set(have)]
    extra = [n for n in have if n not in set(need)]
    if missing or extra:
        raise ValueError(f"replay add: the items' structure differs from the buffer's; missing {sorted(missing)}, "
                         f"unexpected {sorted(extra)} (buffer leaves: {need})")
    raise ValueError("replay add: the items' structure differs from the buffer's (same leaf paths, other "
                     f"containers): got {jax.tree.structure(items)}, the buffer stores "
                     f"{jax.tree.structure(storage)}")


def add(state: ReplayState, items: Any, priorities: jax.Array | None = None) -> ReplayState:
    """Write a batch of items into the ring buffer at ``insert_pos`` (wrapping around).

    ``items``: a pytree with the buffer's structure (``init``'s ``example_item``: same containers, keys and
    fields), each leaf ``[b, ...]`` with the stored per-item shape and ``b <= capacity``; leaves are cast to
    the stored dtypes (``same_kind`` casts only). A structure mismatch is a ``ValueError`` naming the missing
    and unexpected leaf paths. ``priorities``: optional ``|δ|`` per item (stored as in
    :func:`update_priorities`); by default every new item gets the running maximum priority. Overwritten slots
    get the new item's priority.
    """
    got, want = _check_structure(state.storage, items)
    sizes = {leaf_name(p): (np.shape(v)[0] if np.ndim(v) else None) for p, v in got}
    b_set = set(sizes.values())
    if len(b_set) != 1 or None in b_set:
        raise ValueError(f"replay add: all items need the same leading batch size, got {sizes}")
    b = b_set.pop()
    if b < 1 or b > state.capacity:
        raise ValueError(f"replay add: batch of {b} items; must be 1..capacity ({state.capacity})")
    new_leaves = []
    for (path, v), (_, buf) in zip(got, want):
        x, key = jnp.asarray(v), leaf_name(path)
        if x.shape[1:] != buf.shape[1:]:
            raise ValueError(f"replay add: item {key!r} has per-item shape {x.shape[1:]}, "
                             f"the buffer stores {buf.shape[1:]}")
        if not jnp.can_cast(x.dtype, buf.dtype, casting="same_kind"):
            raise ValueError(f"replay add: item {key!r} has dtype {x.dtype}, cannot store it as {buf.dtype}")
        new_leaves.append(x.astype(buf.dtype))
    new_storage = jax.tree.unflatten(jax.tree.structure(state.storage), new_leaves)

    if priorities is None:
        stored = jnp.broadcast_to(state.max_priority, (b,))
    else:
        if _batch_len("priorities", priorities) != b:
            raise ValueError(f"replay add: {b} items but {np.shape(priorities)[0]} priorities")
        _check_finite("priorities", priorities)
        stored = _stored_priority(state, priorities)
    return _add_core(state, new_storage, stored)


def sample(state: ReplayState, key: jax.Array, batch_size: int, *, beta: float | jax.Array,
           group_size: int = 1) -> Sample:
    """Stratified prioritized sample of ``batch_size`` items (with replacement across strata).

    ``group_size = n > 1``: ``batch_size / n`` stratified draws of whole groups (slots ``k·n .. k·n+n−1``; module
    docstring), rows in group order (``n`` consecutive rows per group), with ``Sample.group_share``.

    Returns :class:`Sample` with ``indices``, ``items``, exact ``probs`` ``P(i)`` and ``weights``
    ``w_i = min(1, (m_ref / m_i)^β)`` (module docstring, ``weights.py``). Items with stored priority 0 are never drawn.
    Eager calls raise ``ValueError`` for an empty buffer and for ``batch_size > size`` (draws are with
    replacement, so this is a guard against misconfiguration, not a limitation); under ``jit`` neither
    is checked and an empty buffer returns ``probs == weights == 0``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"replay sample: batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    if is_concrete(beta):
        bv = float(to_host(beta))
        if not 0.0 <= bv <= 1.0:
            raise ValueError(f"replay sample: beta must be in [0, 1], got {bv}")
    if is_concrete(state.tree) and not bool(to_host(state.tree)[0].max(initial=0.0) > 0):
        raise ValueError("replay sample: the buffer holds no item with a positive priority (empty buffer?)")
    if is_concrete(state.size) and batch_size > int(to_host(state.size)):
        raise ValueError(f"replay sample: batch_size={batch_size} exceeds the number of filled slots "
                         f"(size={int(to_host(state.size))}); add more items or sample a smaller batch")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"replay sample: group_size must be a positive integer, got {group_size!r}")
    if batch_size % group_size or state.capacity % group_size:
        raise ValueError(f"replay sample: batch_size={batch_size} and capacity={state.capacity} must be "
                         f"multiples of group_size={group_size} (whole groups of consecutive slots)")
    return _sample_core(state, key, jnp.asarray(beta, jnp.float32), batch_size, int(group_size))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _sample_core(state: ReplayState, key: jax.Array, beta: jax.Array, batch_size: int, group_size: int = 1) -> Sample:
    rep = replicated_sharding(state.mesh)
    layout = state.layout

    if state.prioritization == "proportional":
        leaves, tree = state.priorities, state.tree
        m_ref = reference_mass(leaves, leaves > 0, state.weight_floor)
    else:
        raw = constrain(state.priorities, rep)
        order = jnp.argsort(-raw, stable=True).astype(jnp.int32)     # rank 1 first; ties: lower slot
        n_valid = jnp.sum(raw > 0)
        ranks = jnp.arange(1, raw.shape[0] + 1, dtype=jnp.float32)
        leaves = jnp.where(ranks <= n_valid, ranks ** (-jnp.float32(state.alpha)), 0.0)   # mass by rank
        tree = tree_lib.build(leaves, layout)
        m_ref = reference_mass(leaves, leaves > 0, state.weight_floor)

    def rows_of(l, nodes):
        f = layout.fanouts[l]
        if l == 0:
            return constrain(leaves.reshape(-1, f)[nodes], rep)
        return layout.level(tree, l)[0].reshape(-1, f)[nodes]

    top = layout.level(tree, layout.depth)[0]
    n = group_size
    pos, total, m = stratified_descent(top, rows_of, layout.depth, key, batch_size // n)
    indices = pos if state.prioritization == "proportional" else order[pos]
    share = jnp.ones_like(m)
    if n > 1:   # whole groups: every row of the drawn leaf's group, with its own mass (module docstring)
        indices = ((indices // n)[:, None] * n + jnp.arange(n, dtype=indices.dtype)[None, :]).reshape(-1)
        if state.prioritization == "proportional":
            m = leaves[indices]
        else:
            rank_pos = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
            m = leaves[rank_pos[indices]]
        m_g = jnp.repeat(m.reshape(-1, n).sum(-1), n)
        share = jnp.where(m_g > 0, n * m / jnp.where(m_g > 0, m_g, 1.0), 0.0)
        m_draw = m_g
    else:
        m_draw = m

    ok = (total > 0) & (m_draw > 0)
    probs = jnp.where(ok, m_draw / jnp.where(total > 0, total, 1.0), 0.0)
    weights = jnp.where(ok, per_weights(m, m_ref, beta), 0.0)       # 0 for a row of mass 0 (per_weights)
    if state.mesh is not None and batch_size % batch_divisor(state.mesh) == 0:
        def shard(x):       # the minibatch goes out split over the batch axes, like the train step wants it
            return constrain(x, leading_sharding(state.mesh, x.ndim))
    else:
        def shard(x):
            return constrain(x, rep)
    items = jax.tree.map(lambda v: shard(v[indices]), state.storage)
    return Sample(indices=shard(indices), items=items, probs=shard(probs), weights=shard(weights),
                  group_share=shard(share))
