"""Stratified sampling by descending the wide sum tree (``tree.py``).

With the top level's sums ``S`` and total ``T = Σ S``, ``[0, T)`` is cut into ``B`` strata
``[b_j, b_{j+1})``, ``b_j = j·T/B`` (``b_B = T``); stratum ``j`` draws one point
``u_j = b_j + U_j·(b_{j+1} - b_j)``, ``U_j ~ U[0, 1)``. At every level the child whose cumulative
interval ``[c_{s-1}, c_s)`` contains the residual point is chosen and the residual becomes
``u - c_{s-1}``, down to a leaf: so ``P(leaf i) = p_i / T``.

Precision: the residual is carried as a pair ``hi + lo`` and reduced with an exact two-sum, so it
keeps the precision of each level's scale rather than the total's (a plain float32 point at ``T``
scale would misplace mass of ~``T·2^-24``: several percent of an average item at 1M items).

Zero mass is never chosen: a child is the first one with POSITIVE mass whose inclusive prefix exceeds
the residual (the within-row prefix is computed in floating point and is monotone only up to round-off, so the
mass test matters in round-off cases only), and the residual is clamped into ``[0, mass of the child)``.

Speed (XLA:CPU, where a step costs about one microsecond per kernel): each level is one gather of the
``[B, f]`` child rows and ONE variadic reduction that picks the child and reads its mass and prefix
(``_choose_rows``); the random points and the final indices are forced into buffers so that XLA does
not fuse their producers into (and recompute them in) every consumer.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.replay import rng
from jaxppo.replay.tree import TOP_BITS, row_sum


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``s = fl(a + b)`` and the exact error ``e`` with ``a + b = s + e`` (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _below(x: jax.Array) -> jax.Array:
    return jnp.where(x > 0, jnp.nextafter(x, jnp.zeros_like(x)), x)


PREFIX_SCAN_MAX = 16      # rows up to this width: log-step scan (fuses); wider: one triangular matmul


def _prefix(rows: jax.Array) -> jax.Array:
    """Inclusive prefix sums along the last axis.

    Narrow rows (``f <= PREFIX_SCAN_MAX``, the default tree): ``log2 f`` shifted adds (Hillis-Steele),
    elementwise, so XLA fuses them into the consumer; wider rows (a ``leaf_fanout`` override, a top
    widened for many shards): one matmul with a constant upper-triangular matrix. Either result is
    monotone only up to round-off; callers allow for that.
    """
    f = rows.shape[-1]
    if f <= PREFIX_SCAN_MAX:
        shift = 1
        while shift < f:
            pad = jnp.zeros(rows.shape[:-1] + (shift,), rows.dtype)
            rows = rows + jnp.concatenate([pad, rows[..., :-shift]], axis=-1)
            shift *= 2
        return rows
    tri = np.triu(np.ones((f, f), np.float32))          # a compile-time constant, not rebuilt per call
    return jnp.matmul(rows, tri, precision=jax.lax.Precision.HIGHEST)


def _residual(hi, lo, start, mass):
    """``(hi + lo) - start`` kept as a pair (exact two-sum), clamped into ``[0, mass)``."""
    hi, e = _two_sum(hi, -start)
    lo = lo + e
    r = hi + lo
    under, over = r < 0, r >= mass
    hi = jnp.where(under, 0.0, jnp.where(over, _below(mass), hi))
    lo = jnp.where(under | over, 0.0, lo)
    return hi, lo


def _choose_rows(rows: jax.Array, hi: jax.Array, lo: jax.Array):
    """Per row of ``rows`` ``[B, f]``: the first child with positive mass whose inclusive prefix exceeds
    the residual point ``hi + lo`` (with exact arithmetic, the child whose interval contains it); if
    round-off leaves the point at or past the row's end, the last positive child (child 0 if none is
    positive). A zero-mass child is never chosen, even where round-off makes the prefix non-monotone.

    One variadic reduction over the row: column ``t`` gets a distinct key (``t`` if it qualifies,
    ``2f - t`` if it is only positive, ``3f + t`` otherwise) and the reduction keeps the triple
    ``(key, mass, prefix)`` with the smallest key, so the choice and the values at it come out of one
    kernel, which XLA does not fuse into (and recompute in) its consumers. (Measured on XLA:CPU: such a
    reduction is cheap for rows of <= 8 and three operands; it is ~10x slower per element for rows of
    ~100, and carrying two more operands through it made each level ~8x slower.)

    Returns ``(child [B], new hi, new lo, mass of the child [B])``, the residual now relative to the
    child's start.
    """
    f = rows.shape[-1]
    c = _prefix(rows)
    t = jnp.arange(f, dtype=jnp.int32)
    positive = rows > 0
    key = jnp.where(positive & (c > (hi + lo)[:, None]), t, jnp.where(positive, 2 * f - t, 3 * f + t))

    def keep_smaller(a, b):
        first = a[0] < b[0]
        return tuple(jnp.where(first, x, y) for x, y in zip(a, b))

    k, mass, end = jax.lax.reduce((key, rows, c), (jnp.int32(4 * f), jnp.float32(0), jnp.float32(0)),
                                  keep_smaller, (1,))
    child = jnp.where(k < f, k, jnp.where(k <= 2 * f, 2 * f - k, 0))
    mass = jnp.where(k < 3 * f, mass, 0.0)
    hi, lo = _residual(hi, lo, end - mass, mass)
    return child, hi, lo, mass


def materialize(*xs: jax.Array):
    """Force ``xs`` (1-D) into buffers: each becomes the result of an exact 2-way max with ``-inf``
    (int min), a reduction, which XLA:CPU does not fuse into its consumers. Without it XLA fuses
    cheap producers (the unrolled hash, the residual arithmetic) into every consumer and recomputes
    them per element of the ``[B, f]`` rows (measured: ~70 µs of a ~130 µs step at N=1k);
    ``optimization_barrier`` does not prevent that on CPU (it is removed before fusion)."""
    out = []
    for x in xs:
        low = jnp.full_like(x, -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min)
        out.append(jnp.max(jnp.stack([x, low], axis=1), axis=1))
    return tuple(out)


TOP_ROW_MAX = 2 ** TOP_BITS   # wider tops (only when a mesh of more shards asks for one) go through
                              # `_choose_top`, a count against the shared prefix


def _choose_top(top_sums: jax.Array, hi: jax.Array, lo: jax.Array):
    """The top level (``n`` nodes shared by all draws): ``s`` = how many inclusive prefixes are
    ``<= point`` (one compare-and-count kernel over ``[B, n]``; for a monotone prefix that is the first
    child whose prefix exceeds the point), moved to the nearest positive node at or after it (else the
    last positive one), so a zero-mass node is never chosen."""
    n = top_sums.shape[0]
    c = _prefix(top_sums[None, :])[0]
    t = jnp.arange(n, dtype=jnp.int32)
    positive = top_sums > 0
    # nearest positive node at or after each slot ([n, n] masked min), else the last positive node
    nxt = jnp.min(jnp.where(positive[None, :] & (t[None, :] >= t[:, None]), t[None, :], n), axis=1)
    last_positive = jnp.max(jnp.where(positive, t, 0))
    nxt = jnp.where(nxt < n, nxt, last_positive)
    s = jnp.sum((c[None, :] <= (hi + lo)[:, None]).astype(jnp.int32), axis=1)
    node = nxt[jnp.minimum(s, n - 1)]
    mass = top_sums[node]
    hi, lo = _residual(hi, lo, c[node] - mass, mass)
    return node, hi, lo, mass


def stratified_descent(top_sums: jax.Array, rows_of: Callable[[int, jax.Array], jax.Array],
                       depth: int, key: jax.Array,
                       batch_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draw ``batch_size`` stratified leaves.

    ``top_sums`` ``[n_top]``; ``rows_of(l, nodes)`` the ``[B, fanout_l]`` child sums of the level-``l+1``
    ``nodes`` (``l = depth-1 .. 0``; ``l = 0`` are leaves). Returns ``(leaf indices [B] int32, T, leaf
    values [B])``; ``T`` is the total the probabilities refer to (the leaf values are read from the rows
    already gathered, so they cost no second random access). When ``T == 0`` the indices are meaningless.
    """
    total = row_sum(top_sums)
    j = jnp.arange(batch_size + 1, dtype=jnp.float32)
    bounds = (j * (total / batch_size)).at[-1].set(total)
    hi = bounds[:-1]
    lo = rng.uniform(key, batch_size) * (bounds[1:] - bounds[:-1])          # == jax.random.uniform
    # to buffers, so XLA does not fuse the unrolled hash into (and recompute it in) the row comparisons
    hi, lo = materialize(hi, lo)
    # the top row per draw, through a gather with a data-dependent zero index: XLA splits a broadcast
    # row into one scalar kernel per column, while a gather fuses into the first level's kernel
    if top_sums.shape[0] <= TOP_ROW_MAX:
        zero = (hi < 0).astype(jnp.int32)                                       # hi >= 0: always 0
        node, hi, lo, mass = _choose_rows(top_sums[None, :][zero], hi, lo)
    else:
        node, hi, lo, mass = _choose_top(top_sums, hi, lo)
    for l in range(depth - 1, -1, -1):
        rows = rows_of(l, node)
        child, hi, lo, mass = _choose_rows(rows, hi, lo)
        node = node * rows.shape[-1] + child
    # to buffers: otherwise XLA fuses the whole descent into every consumer of the indices (the
    # priority update's scatters and tree refresh) and recomputes it per element there
    node, mass = materialize(node, mass)
    return node, total, mass
