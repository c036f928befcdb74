"""Generalized advantage estimation with verl's padding semantics.

For each row, walking backwards over the response (``t = T-1 .. 0``) with ``nv = lg = 0`` at ``t = T``::

    delta_t  = r_t + gamma * nv - v_t
    if mask_t:  lg = delta_t + gamma * lam * lg ;  nv = v_t
    else:       lg, nv unchanged            ("padding carries the next value through")
    adv_t = lg ;  ret_t = adv_t + v_t

so a masked position holds the advantage of the next valid position after it (0 if none), never decays the
running sums, and never contributes its own reward or value. This is verl's
``compute_gae_advantage_return`` before whitening. ``mask`` is read as a boolean (non-zero = valid).

Four formulations of the same recursion live here, all tested equal to a per-timestep reference:

* :func:`gae_scan` — ``lax.scan`` over time (time-major), one ``[B]`` vector step per token. Any mask.
* :func:`gae_associative` — the recursion as two first-order affine scans
  ``y_t = a_t y_{t+1} + b_t`` solved with ``lax.associative_scan`` (log-depth). Any mask.
* :func:`gae_chunked` — two-level blocked scan: the time axis is cut into ``nC`` chunks of length ``C``;
  each chunk is summarised by the affine map from its right boundary state to its left one (a ``C``-step
  scan over all chunks at once), the boundary states are propagated across chunks (``nC`` steps), then
  each chunk is re-run from its true boundary (``C`` steps). ``2C + nC`` sequential steps instead of ``T``.
  Any mask.
* :func:`gae_blocked` — no loop at all, for *prefix* masks (each row is 1...1 0...0: right padding, the
  layout of our responses). Then the recursion has the constant coefficient ``c = gamma*lam``:
  ``adv_t = sum_{s>=t} c^(s-t) x_s`` with ``x_s = m_s (r_s + gamma m_{s+1} v_{s+1} - v_s)``, computed as a
  block-Toeplitz matmul inside chunks of ``C`` steps (``x_chunk @ M``, ``M[s,t] = c^(s-t) [s>=t]``), a
  second small matmul for the chunk carries (``A_i = sum_{j>=i} c^(C(j-i)) L_j0``) and an elementwise
  fix-up ``adv = L + c^(C-t) A_{i+1}``. Matmuls use ``Precision.HIGHEST`` (exact f32 on TPU/GPU too).

:func:`gae` checks (on device) whether the mask is a prefix mask and takes ``gae_blocked`` if so, else
``gae_scan`` (``lax.cond``), the fastest choices measured on CPU (``benchmarks/ops.py``).

The state ``s_t = (lg_t, y_t)`` (``y_t`` = value of the first valid position at or after ``t``) evolves
affinely: on a valid step ``s_t = [[gamma*lam, gamma], [0, 0]] s_{t+1} + (r_t - v_t, v_t)``, on a masked
step ``s_t = s_{t+1}``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_floating, check_ndim, check_same_shape, check_scalar_range, compute_dtype

#: chunk length of :func:`gae_chunked` (scan-based) and :func:`gae_blocked` (matmul-based).
DEFAULT_CHUNK = 64
BLOCK = 32


def _prepare(rewards: Any, values: Any, mask: Any, gamma: Any, lam: Any):
    check_ndim("rewards", rewards, 2)
    check_ndim("values", values, 2)
    check_ndim("mask", mask, 2)
    check_same_shape(rewards=rewards, values=values, mask=mask)
    check_floating("rewards", rewards)
    check_floating("values", values)
    check_scalar_range("gamma", gamma, ge=0.0, le=1.0)
    check_scalar_range("lam", lam, ge=0.0, le=1.0)
    dtype = compute_dtype(rewards, values)
    r = jnp.asarray(rewards, dtype)
    v = jnp.asarray(values, dtype)
    m = jnp.asarray(mask) != 0
    g = jnp.asarray(gamma, dtype)
    gl = g * jnp.asarray(lam, dtype)
    return r, v, m, g, gl


def _step(g: jax.Array, gl: jax.Array):
    """One backward step of the recursion on a slice of any shape; emits the new ``lg``."""

    def step(carry, x):
        lg, y = carry
        r, v, m = x
        lg = jnp.where(m, r - v + g * y + gl * lg, lg)
        y = jnp.where(m, v, y)
        return (lg, y), lg

    return step


def gae_scan(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
             lam: float | jax.Array, *, unroll: int = 1) -> tuple[jax.Array, jax.Array]:
    """GAE as a reverse ``lax.scan`` over time-major data (``unroll`` steps per loop iteration)."""
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    zeros = jnp.zeros(r.shape[:1], r.dtype)
    _, adv = jax.lax.scan(_step(g, gl), (zeros, zeros), (r.T, v.T, m.T), reverse=True, unroll=unroll)
    adv = adv.T
    return adv, adv + v


def _affine_combine(later, earlier):
    """Compose ``y -> a_e * (a_l * y + b_l) + b_e`` (``later`` is applied first)."""
    a_l, b_l = later
    a_e, b_e = earlier
    return a_e * a_l, a_e * b_l + b_e


def gae_associative(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
                    lam: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """GAE via two log-depth affine scans along time.

    ``y_t = (1 - m_t) y_{t+1} + m_t v_t`` gives the next valid value ``nv_t = y_{t+1}``; then
    ``adv_t = a_t adv_{t+1} + m_t (r_t + gamma nv_t - v_t)`` with ``a_t = gamma*lam`` if valid else 1.
    """
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    mf = m.astype(r.dtype)

    def combine(x, y):
        # associative_scan(reverse=True) calls fn(right_part, left_part) on the reversed view; the
        # composition "apply the element further right first" is what the reverse recursion needs.
        return _affine_combine(x, y)

    _, y = jax.lax.associative_scan(combine, (1 - mf, mf * v), reverse=True, axis=1)
    nv = jnp.concatenate([y[:, 1:], jnp.zeros_like(y[:, :1])], axis=1)
    delta = r + g * nv - v
    a = jnp.where(m, gl, jnp.ones_like(r))
    _, adv = jax.lax.associative_scan(combine, (a, mf * delta), reverse=True, axis=1)
    return adv, adv + v


def gae_chunked(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
                lam: float | jax.Array, *, chunk: int = DEFAULT_CHUNK) -> tuple[jax.Array, jax.Array]:
    """GAE as a two-level blocked scan (chunks of length ``chunk``; ``T`` is padded with masked steps)."""
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    b, t = r.shape
    c = min(chunk, t) if t > 0 else 1
    n = -(-t // c)
    pad = n * c - t
    if pad:  # masked padding on the right is exactly neutral (it carries zeros)
        r_, v_, m_ = (jnp.pad(x, ((0, 0), (0, pad))) for x in (r, v, m))
    else:
        r_, v_, m_ = r, v, m

    def chunk_major(x):  # [B, n*c] -> [c, B, n]: position inside the chunk leads
        return x.reshape(b, n, c).transpose(2, 0, 1)

    xs = (chunk_major(r_), chunk_major(v_), chunk_major(m_))

    # pass 1: each chunk's affine map s_start = s0 + P s_right (zero right boundary gives s0).
    def summary(carry, x):
        lg, y, p, q, pr, ps = carry
        rr, vv, mm = x
        zero = jnp.zeros_like(p)
        return (jnp.where(mm, rr - vv + g * y + gl * lg, lg), jnp.where(mm, vv, y),
                jnp.where(mm, gl * p + g * pr, p), jnp.where(mm, gl * q + g * ps, q),
                jnp.where(mm, zero, pr), jnp.where(mm, zero, ps)), None

    zeros = jnp.zeros((b, n), r.dtype)
    ones = jnp.ones((b, n), r.dtype)
    (lg0, y0, p, q, pr, ps), _ = jax.lax.scan(summary, (zeros, zeros, ones, zeros, zeros, ones), xs,
                                              reverse=True)

    # pass 2: true state at each chunk's right boundary, right to left over chunks.
    def across(carry, x):
        lg_r, y_r = carry
        lg0_, y0_, p_, q_, pr_, ps_ = x
        return (lg0_ + p_ * lg_r + q_ * y_r, y0_ + pr_ * lg_r + ps_ * y_r), carry

    zb = jnp.zeros((b,), r.dtype)
    _, (lg_b, y_b) = jax.lax.scan(across, (zb, zb), tuple(x.T for x in (lg0, y0, p, q, pr, ps)), reverse=True)

    # pass 3: re-run every chunk from its true right boundary, emitting advantages.
    _, adv = jax.lax.scan(_step(g, gl), (lg_b.T, y_b.T), xs, reverse=True)
    adv = adv.transpose(1, 2, 0).reshape(b, n * c)[:, :t]
    return adv, adv + v


def _toeplitz_powers(c: jax.Array, n: int, dtype: Any) -> jax.Array:
    """``M[s, t] = c^(s-t)`` for ``s >= t`` else 0 (``n x n``; ``0^0 = 1``)."""
    k = jnp.arange(n, dtype=dtype)
    d = k[:, None] - k[None, :]
    return jnp.where(d >= 0, jnp.power(c, jnp.maximum(d, 0)), 0).astype(dtype)


def _blocked(r: jax.Array, v: jax.Array, m: jax.Array, g: jax.Array, c: jax.Array, block: int) -> jax.Array:
    b, t = r.shape
    size = min(block, max(t, 1))
    n = -(-t // size)
    pad = n * size - t
    if pad:  # masked padding on the right keeps the mask a prefix mask and changes nothing
        r, v, m = (jnp.pad(x, ((0, 0), (0, pad))) for x in (r, v, m))
    vm = jnp.where(m, v, 0)
    next_v = jnp.concatenate([vm[:, 1:], jnp.zeros((b, 1), r.dtype)], axis=1)
    x = jnp.where(m, r + g * next_v - v, 0).reshape(b, n, size)
    hi = jax.lax.Precision.HIGHEST
    local = jnp.einsum("bns,st->bnt", x, _toeplitz_powers(c, size, r.dtype), precision=hi)
    cb = jnp.power(c, size)
    carry = jnp.matmul(local[:, :, 0], _toeplitz_powers(cb, n, r.dtype), precision=hi)  # adv at chunk starts
    after = jnp.concatenate([carry[:, 1:], jnp.zeros((b, 1), r.dtype)], axis=1)
    tail = jnp.power(c, size - jnp.arange(size, dtype=r.dtype))
    adv = (local + after[:, :, None] * tail).reshape(b, n * size)
    return adv[:, :t]


def is_prefix_mask(mask: jax.Array) -> jax.Array:
    """True (a jnp bool) when every row of ``mask`` is 1...1 0...0 (possibly all 0 or all 1)."""
    valid = jnp.asarray(mask) != 0
    return jnp.all(valid[:, 1:] <= valid[:, :-1])


def gae_blocked(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
                lam: float | jax.Array, *, block: int = BLOCK) -> tuple[jax.Array, jax.Array]:
    """GAE by block-Toeplitz matmuls; **only valid for prefix masks** (see :func:`is_prefix_mask`).

    A concrete mask that is not a prefix mask raises ``ValueError``; use :func:`gae` for any mask.
    """
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if not isinstance(m, jax.core.Tracer) and not bool(is_prefix_mask(m)):
        raise ValueError("gae_blocked needs a prefix mask (each row 1...1 0...0); use gae for masks with holes")
    adv = _blocked(r, v, m, g, gl, block)
    return adv, adv + v


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
        lam: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw (not whitened) GAE advantages and returns ``[B, T]`` with verl's padding semantics.

    ``delta_t = r_t + gamma * nv - v_t``; on valid ``t``: ``adv_t = delta_t + gamma*lam*adv_next`` and
    ``nv = v_t``; on masked ``t`` both carry unchanged (``adv_t`` = the next valid advantage).
    ``returns = advantages + values``. Differentiable (linear in ``rewards`` and ``values``).
    Prefix masks take the matmul path (:func:`gae_blocked`), other masks the ``lax.scan`` path.
    """
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    zeros = jnp.zeros(r.shape[:1], r.dtype)

    def by_scan(ops):
        r_, v_, m_, g_, gl_ = ops
        _, adv_tm = jax.lax.scan(_step(g_, gl_), (zeros, zeros), (r_.T, v_.T, m_.T), reverse=True)
        return adv_tm.T

    def by_matmul(ops):
        return _blocked(*ops, BLOCK)

    adv = jax.lax.cond(is_prefix_mask(m), by_matmul, by_scan, (r, v, m, g, gl))
    return adv, adv + v
