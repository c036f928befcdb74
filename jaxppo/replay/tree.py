"""A wide sum/min tree over the leaf priorities, stored as one flat array.

The leaves (``priorities``, length ``top·Π fanouts``) are grouped into rows of ``fanouts[0]``; each row
is one node of level 1, whose value is the row's sum (and, separately, the smallest positive value in
the row, ``+inf`` if none). Level 2 groups level-1 nodes by ``fanouts[1]``, and so on up to the top
level of ``top`` nodes (≤ 8 unless the mesh needs more shards). Levels of fanout ≤ 8 instead of a
binary tree keep the number of XLA kernels per step small, which is what a step costs on CPU
(``benchmarks/replay.py``): each level is one gather and one small reduction in ``sample``.

``tree`` is float32 ``[2, M]``: row 0 the sums, row 1 the positive minima, of levels ``1..L``
concatenated (level 1 first). Nodes are always recomputed exactly from their children (never updated
by deltas), so the tree never drifts from the leaves and repeated updates of one node are
deterministic.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

MAX_FANOUT_BITS = 3     # fanout <= 8 per level: XLA:CPU runs the per-level row reduction of the
                        # descent well up to 8 wide (benchmarks/README.md, "replay")
TOP_BITS = 3            # top level of <= 8 nodes (more levels of 8 beat a wide top row)
REBUILD_BELOW = 1024    # `refresh` rebuilds whole every level whose children number at most this


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """Static shape of the tree: ``fanouts`` (leaf rows first) and the number of ``top`` nodes."""

    fanouts: tuple[int, ...]
    top: int

    @property
    def depth(self) -> int:
        return len(self.fanouts)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Nodes per level, leaves (level 0) to top (level ``depth``)."""
        sizes = [self.top * math.prod(self.fanouts)]
        for f in self.fanouts:
            sizes.append(sizes[-1] // f)
        return tuple(sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start of level ``l`` (``1..depth``) in the flat tree, at index ``l - 1``."""
        out, acc = [], 0
        for n in self.sizes[1:]:
            out.append(acc)
            acc += n
        return tuple(out)

    @property
    def num_nodes(self) -> int:
        return sum(self.sizes[1:])

    def level(self, tree: jax.Array, l: int) -> jax.Array:
        """``[2, n_l]`` sums and minima of internal level ``l >= 1``."""
        o = self.offsets[l - 1]
        return tree[:, o:o + self.sizes[l]]


def auto_layout(capacity: int, shards: int = 1, leaf_fanout: int | None = None) -> TreeLayout:
    """Fanouts for ``capacity`` leaves: about ``log2(capacity) - TOP_BITS`` bits spread evenly over
    levels of at most ``MAX_FANOUT_BITS`` (3) bits each, the top level taking the rest (≤ 8 nodes,
    rounded up to a multiple of ``shards`` so the leaves split evenly over the mesh). ``leaf_fanout`` (a power of
    two) overrides the leaf row size.
    """
    bits = max(0, math.ceil(math.log2(max(capacity, 1))))
    lower = max(1, bits - TOP_BITS)
    if leaf_fanout is not None:
        lf = int(math.log2(leaf_fanout))
        rest = max(0, lower - lf)
        n_rest = math.ceil(rest / MAX_FANOUT_BITS) if rest else 0
        fan_bits = [lf] + [rest // n_rest + (1 if i < rest % n_rest else 0) for i in range(n_rest)]
    else:
        n = math.ceil(lower / MAX_FANOUT_BITS)
        fan_bits = [lower // n + (1 if i < lower % n else 0) for i in range(n)]
    fanouts = tuple(2 ** b for b in fan_bits)
    top = -(-capacity // math.prod(fanouts))
    top = -(-top // shards) * shards
    return TreeLayout(fanouts=fanouts, top=top)


def _halving(rows: jax.Array, op) -> jax.Array:
    f = rows.shape[-1]
    while f > 1:
        f //= 2
        rows = op(rows[..., :f], rows[..., f:])
    return rows[..., 0]


def row_sum(rows: jax.Array) -> jax.Array:
    """Sum over the last axis (a power of two) by pairwise halving: ``x[..., :f/2] + x[..., f/2:]``.

    A fixed summation order made of elementwise adds, so the result does not depend on how XLA
    vectorises a reduction for a given shape or sharding (1 and 8 devices give bit-identical trees),
    and ``build`` and ``refresh`` agree exactly.
    """
    f = rows.shape[-1]
    return jnp.sum(rows, axis=-1) if f & (f - 1) else _halving(rows, jnp.add)


def row_min(rows: jax.Array) -> jax.Array:
    """Minimum over the last axis by pairwise halving (elementwise, so it fuses; exact in any order)."""
    f = rows.shape[-1]
    return jnp.min(rows, axis=-1) if f & (f - 1) else _halving(rows, jnp.minimum)


def _leaf_mins(leaves: jax.Array) -> jax.Array:
    """Leaves as candidates for the positive minimum: ``+inf`` where a leaf is 0."""
    return jnp.where(leaves > 0, leaves, jnp.inf)


def _group_stats(sums: jax.Array, mins: jax.Array) -> jax.Array:
    """``[2, ...]`` node stats from the ``[..., f]`` sums and positive minima of its children."""
    return jnp.stack([row_sum(sums), row_min(mins)])


def _levels_above(sums: jax.Array, mins: jax.Array, fanouts: tuple[int, ...]) -> jax.Array:
    """Every level above a level with stats ``(sums, mins)``, grouped by ``fanouts``, concatenated
    (lowest first) as in the flat tree."""
    out = []
    for f in fanouts:
        cur = _group_stats(sums.reshape(-1, f), mins.reshape(-1, f))
        out.append(cur)
        sums, mins = cur[0], cur[1]
    return jnp.concatenate(out, axis=1)


def build(leaves: jax.Array, layout: TreeLayout) -> jax.Array:
    """The full tree ``[2, M]`` of ``leaves`` (O(N); used by ``add`` and rank-based sampling)."""
    return _levels_above(leaves, _leaf_mins(leaves), layout.fanouts)


def refresh(tree: jax.Array, leaves: jax.Array, indices: jax.Array, layout: TreeLayout) -> jax.Array:
    """Recompute every ancestor of the leaves ``indices`` ``[B]`` from its children, bottom-up.

    Large levels: each touched node is recomputed from its gathered children and scattered back
    (repeated ancestors get identical values, so the scatters are deterministic). From the first
    level whose children number at most ``REBUILD_BELOW`` up, the levels are rebuilt whole from the
    level below and written with one slice update: on CPU that is cheaper than a gather, a reduction
    and a scatter per level. Either way the tree equals ``build(leaves)`` bit for bit (same fixed
    summation order).
    """
    node = indices
    for l, f in enumerate(layout.fanouts):        # level l + 1 from level l (l = 0: the leaves)
        if layout.sizes[l] <= REBUILD_BELOW:
            below = (leaves, _leaf_mins(leaves)) if l == 0 else tuple(layout.level(tree, l))
            tail = _levels_above(*below, layout.fanouts[l:])
            return jax.lax.dynamic_update_slice(tree, tail, (0, layout.offsets[l]))
        node = node // f
        if l == 0:
            rows = leaves.reshape(-1, f)[node]                                  # [B, f]
            stats = _group_stats(rows, _leaf_mins(rows))
        else:
            child = layout.level(tree, l).reshape(2, -1, f)[:, node]          # [2, B, f]
            stats = _group_stats(child[0], child[1])
        tree = tree.at[:, layout.offsets[l] + node].set(stats)
    return tree


def total_and_min(tree: jax.Array, layout: TreeLayout) -> tuple[jax.Array, jax.Array]:
    """``(Σ leaves, min positive leaf)`` read off the top level (``+inf`` min when no leaf is positive)."""
    top = layout.level(tree, layout.depth)
    return jnp.sum(top[0]), jnp.min(top[1])
