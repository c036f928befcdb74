"""Generalized advantage estimation with verl's padding semantics.

For each row, walking backwards over the response (``t = T-1 .. 0``) with ``nv = lg = 0`` at ``t = T``::

    delta_t  = r_t + gamma * nv - v_t
    if mask_t:  lg = delta_t + gamma * lam * lg ;  nv = v_t
    else:       lg, nv unchanged            ("padding carries the next value through")
    adv_t = lg ;  ret_t = adv_t + v_t

so a masked position holds the advantage of the next valid position after it (0 if none), never decays the
running sums, and never contributes its own reward or value. This is verl's
``compute_gae_advantage_return`` before whitening. ``mask`` is read as a boolean (non-zero = valid).

:func:`gae` checks (on device) whether the mask is a *prefix* mask (each row 1...1 0...0: right padding, the
layout of our responses) and then takes the loop-free path: with the constant coefficient ``c = gamma*lam``,
``adv_t = sum_{s>=t} c^(s-t) x_s`` with ``x_s = m_s (r_s + gamma m_{s+1} v_{s+1} - v_s)``, computed as a
block-Toeplitz matmul inside chunks of ``C = BLOCK`` steps (``x_chunk @ M``, ``M[s,t] = c^(s-t) [s>=t]``), a
second small matmul for the chunk carries (``A_i = sum_{j>=i} c^(C(j-i)) L_j0``) and an elementwise fix-up
``adv = L + c^(C-t) A_{i+1}`` (``Precision.HIGHEST``: exact f32 on TPU/GPU too); any other mask takes a reverse
``lax.scan`` over time (``lax.cond``). These were the fastest of the formulations measured on CPU; the others
(associative scan, two-level chunked scan) and the stand-alone scan/blocked entry points live in
``benchmarks/gae_variants.py`` (``benchmarks/ops.py`` times them).

The state ``s_t = (lg_t, y_t)`` (``y_t`` = value of the first valid position at or after ``t``) evolves
affinely: on a valid step ``s_t = [[gamma*lam, gamma], [0, 0]] s_{t+1} + (r_t - v_t, v_t)``, on a masked
step ``s_t = s_{t+1}``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_floating, check_ndim, check_same_shape, check_scalar_range, compute_dtype

#: chunk length of the matmul (prefix-mask) path of :func:`gae`
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
