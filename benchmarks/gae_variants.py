"""GAE formulations kept for benchmarking (``benchmarks/ops.py``); the library uses only ``jaxppo.ops.gae``.

All compute the recursion of :mod:`jaxppo.ops.advantages` (verl's padding semantics) and are tested equal to a
per-timestep reference in ``tests/benchmarks/test_gae_variants.py``:

* :func:`gae_scan` — ``lax.scan`` over time (time-major), one ``[B]`` vector step per token. Any mask.
* :func:`gae_associative` — the recursion as two first-order affine scans
  ``y_t = a_t y_{t+1} + b_t`` solved with ``lax.associative_scan`` (log-depth). Any mask.
* :func:`gae_chunked` — two-level blocked scan: the time axis is cut into ``nC`` chunks of length ``C``;
  each chunk is summarised by the affine map from its right boundary state to its left one (a ``C``-step
  scan over all chunks at once), the boundary states are propagated across chunks (``nC`` steps), then
  each chunk is re-run from its true boundary (``C`` steps). ``2C + nC`` sequential steps instead of ``T``.
  Any mask.
* :func:`gae_blocked` — the matmul path of ``jaxppo.ops.gae`` on its own, for *prefix* masks only, with a
  chosen block size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.ops.advantages import BLOCK, _blocked, _prepare, _step, is_prefix_mask

#: chunk length of :func:`gae_chunked`
DEFAULT_CHUNK = 64


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


__all__ = ["DEFAULT_CHUNK", "gae_associative", "gae_blocked", "gae_chunked", "gae_scan"]
