"""Generalized advantage estimation with verl's padding semantics.

For each row, walking backwards over the response (``t = T-1 .. 0``) with ``nv = lg = 0`` at ``t = T``::

    delta_t  = r_t + gamma * nv - v_t
    if mask_t:  lg = delta_t + gamma * lam * lg ;  nv = v_t
    else:       lg, nv unchanged            ("padding carries the next value through")
    adv_t = lg ;  ret_t = adv_t + v_t

so a masked position holds the advantage of the next valid position after it (0 if none), never decays the
running sums, and never contributes its own reward or value. This is verl's
``compute_gae_advantage_return`` before whitening. ``mask`` is read as a boolean (non-zero = valid).

Three formulations of the same recursion live here; :func:`gae` uses the fastest one on CPU
(see ``benchmarks/ops.py`` and ``benchmarks/README.md``), the others are kept and tested equal:

* :func:`gae_scan` — ``lax.scan`` over time (time-major), one ``[B]`` vector step per token.
* :func:`gae_associative` — the recursion as two first-order affine scans
  ``y_t = a_t y_{t+1} + b_t`` solved with ``lax.associative_scan`` (log-depth).
* :func:`gae_chunked` — two-level blocked scan: the time axis is cut into ``nC`` chunks of length ``C``;
  each chunk is summarised by the affine map from its right boundary state to its left one (a ``C``-step
  scan over all chunks at once), the boundary states are propagated across chunks (``nC`` steps), then
  each chunk is re-run from its true boundary (``C`` steps). ``2C + nC`` sequential steps instead of ``T``.

The state ``s_t = (lg_t, y_t)`` (``y_t`` = value of the first valid position at or after ``t``) evolves
affinely: on a valid step ``s_t = [[gamma*lam, gamma], [0, 0]] s_{t+1} + (r_t - v_t, v_t)``, on a masked
step ``s_t = s_{t+1}``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_floating, check_ndim, check_same_shape, check_scalar_range, compute_dtype

#: chunk length used by :func:`gae` (measured fastest at T=1024..4096 on the 2-core dev CPU).
DEFAULT_CHUNK = 64


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
             lam: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """GAE as a reverse ``lax.scan`` over time (see the module docstring for the recursion)."""
    r, v, m, g, gl = _prepare(rewards, values, mask, gamma, lam)
    zeros = jnp.zeros(r.shape[:1], r.dtype)
    _, adv = jax.lax.scan(_step(g, gl), (zeros, zeros), (r.T, v.T, m.T), reverse=True)
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


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
        lam: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw (not whitened) GAE advantages and returns ``[B, T]`` with verl's padding semantics.

    ``delta_t = r_t + gamma * nv - v_t``; on valid ``t``: ``adv_t = delta_t + gamma*lam*adv_next`` and
    ``nv = v_t``; on masked ``t`` both carry unchanged (``adv_t`` = the next valid advantage).
    ``returns = advantages + values``. Differentiable (linear in ``rewards`` and ``values``).
    """
    return gae_scan(rewards, values, mask, gamma, lam)
