"""A wide sum/min tree over the leaf priorities, stored as one flat array.

The leaves (``priorities``, length ``top·Π fanouts``) are grouped into rows of ``fanouts[0]``; each row
is one node of level 1, whose value is the row's sum (and, separately, the smallest positive value in
the row, ``+inf`` if none). Level 2 groups level-1 nodes by ``fanouts[1]``, and so on up to the top
level of ``top`` nodes (≤ ~128). A few levels of fanout ≤ 16 instead of a binary tree keep the number of
XLA operations per step small, which is what a step costs on CPU (``benchmarks/replay.py``).

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

MAX_FANOUT_BITS = 4     # fanout <= 16 per lower level (a [B, f] x [f, f] prefix matmul per level);
                        # measured on CPU: 8-16 wide levels beat 32 wide ones (benchmarks/README.md)
TOP_BITS = 7            # top level of <= ~128 nodes (one shared row)


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
    """Fanouts for ``capacity`` leaves: about ``log2(capacity) - 7`` bits spread evenly over levels of
    at most ``MAX_FANOUT_BITS`` (4) bits each, the top level taking the rest (≤ ~128 nodes, rounded up
    to a multiple of ``shards`` so the leaves split evenly over the mesh). ``leaf_fanout`` (a power of
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


def row_sum(rows: jax.Array) -> jax.Array:
    """Sum over the last axis (a power of two) by pairwise halving: ``x[..., :f/2] + x[..., f/2:]``.

    A fixed summation order made of elementwise adds, so the result does not depend on how XLA
    vectorises a reduction for a given shape or sharding (1 and 8 devices give bit-identical trees),
    and ``build`` and ``refresh`` agree exactly.
    """
    f = rows.shape[-1]
    if f & (f - 1):
        return jnp.sum(rows, axis=-1)
    while f > 1:
        f //= 2
        rows = rows[..., :f] + rows[..., f:]
    return rows[..., 0]


def _row_stats(rows: jax.Array, positive_min_of: jax.Array | None = None) -> jax.Array:
    """``[2, ...]``: sum over the last axis, and min of the positive entries (of ``positive_min_of``)."""
    s = row_sum(rows)
    mins = jnp.where(rows > 0, rows, jnp.inf) if positive_min_of is None else positive_min_of
    return jnp.stack([s, jnp.min(mins, axis=-1)])


def build(leaves: jax.Array, layout: TreeLayout) -> jax.Array:
    """The full tree ``[2, M]`` of ``leaves`` (O(N); used by ``add`` and rank-based sampling)."""
    levels = []
    cur = _row_stats(leaves.reshape(-1, layout.fanouts[0]))
    levels.append(cur)
    for f in layout.fanouts[1:]:
        sums = cur[0].reshape(-1, f)
        mins = cur[1].reshape(-1, f)
        cur = jnp.stack([row_sum(sums), jnp.min(mins, axis=-1)])
        levels.append(cur)
    return jnp.concatenate(levels, axis=1)


def refresh(tree: jax.Array, leaves: jax.Array, indices: jax.Array, layout: TreeLayout) -> jax.Array:
    """Recompute, level by level, every ancestor of the leaves ``indices`` ``[B]`` from its children.

    Repeated ancestors get identical values, so the scatters are deterministic.
    """
    node = indices
    for l, f in enumerate(layout.fanouts):
        node = node // f
        if l == 0:
            stats = _row_stats(leaves.reshape(-1, f)[node])                    # [2, B]
        else:
            child = layout.level(tree, l).reshape(2, -1, f)[:, node]          # [2, B, f]
            stats = jnp.stack([row_sum(child[0]), jnp.min(child[1], axis=-1)])
        tree = tree.at[:, layout.offsets[l] + node].set(stats)
    return tree


def total_and_min(tree: jax.Array, layout: TreeLayout) -> tuple[jax.Array, jax.Array]:
    """``(Σ leaves, min positive leaf)`` read off the top level (``+inf`` min when no leaf is positive)."""
    top = layout.level(tree, layout.depth)
    return jnp.sum(top[0]), jnp.min(top[1])
