"""Storage formats for a frozen base (QLoRA): int8 per output channel and NF4 in blocks of 64.

Pure array functions (jittable); a format stores ``w`` as integer codes plus float32 scales and gives it back
with ``dequantize_*``. Bounds on the error, checked by the tests:

- ``int8``: per output channel ``c`` (every axis but the ``n_in`` leading input axes), ``s_c = max|w[.., c]| / 127``,
  ``q = round(w / s_c)`` in [-127, 127], ``ŵ = q · s_c``; ``|w − ŵ| ≤ s_c / 2``.
- ``nf4`` (Dettmers et al. 2023, "QLoRA"): ``w`` flattened into blocks of :data:`NF4_BLOCK` values,
  ``m_b = max|w|`` of the block, each value becomes the index of the nearest of the 16 NormalFloat levels
  :data:`NF4_CODE` to ``w / m_b`` (two 4-bit indices packed per byte), ``ŵ = NF4_CODE[i] · m_b``;
  ``|w − ŵ| ≤ m_b · g / 2`` with ``g`` the widest gap between neighbouring levels of that value's interval
  (at most ``(1 − 0.6961928) / 2 · m_b`` anywhere: the gap between the levels −1 and −0.696).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# the 16 NF4 levels of the QLoRA paper / bitsandbytes (quantiles of N(0, 1) normalised to [-1, 1], exact 0)
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], np.float32)
NF4_BLOCK = 64
FORMATS = ("int8", "nf4")


class Int8Weight(NamedTuple):
    q: jax.Array       # int8, w's shape
    scale: jax.Array   # float32, 1 on the input axes (broadcasts against q)


class NF4Weight(NamedTuple):
    packed: jax.Array  # uint8 [ceil(n / 2)]: index 2j in the low nibble, 2j+1 in the high one
    absmax: jax.Array  # float32 [n_blocks]
    shape: tuple       # w's shape (static)


def quantize_int8(w: jax.Array, n_in: int = 1, lead: int = 0) -> Int8Weight:
    """Symmetric int8 with one absmax scale per output channel: the max over the ``n_in`` input axes that follow
    ``lead`` leading (batch, e.g. stacked-layer) axes."""
    if not 1 <= n_in <= w.ndim - lead or lead < 0:
        raise ValueError(f"quantize_int8: n_in={n_in}, lead={lead} do not fit a weight of shape {w.shape}")
    w32 = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w32), axis=tuple(range(lead, lead + n_in)), keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
    return Int8Weight(q, scale)


def dequantize_int8(x: Int8Weight, dtype=jnp.float32) -> jax.Array:
    return (x.q.astype(jnp.float32) * x.scale).astype(dtype)


def quantize_nf4(w: jax.Array, block: int = NF4_BLOCK) -> NF4Weight:
    """NF4 codes of ``w`` (flattened, zero-padded to whole blocks of ``block``), nearest level per value."""
    if block < 2 or block % 2:
        raise ValueError(f"quantize_nf4: block must be an even number >= 2, got {block}")
    n = math.prod(w.shape)
    flat = w.astype(jnp.float32).reshape(-1)
    n_blocks = -(-n // block)
    flat = jnp.pad(flat, (0, n_blocks * block - n)).reshape(n_blocks, block)
    absmax = jnp.max(jnp.abs(flat), axis=1)
    safe = jnp.where(absmax > 0, absmax, 1.0)
    code = jnp.asarray(NF4_CODE)
    idx = jnp.argmin(jnp.abs((flat / safe[:, None])[..., None] - code), axis=-1).astype(jnp.uint8).reshape(-1)
    packed = idx[0::2] | (idx[1::2] << 4)
    return NF4Weight(packed.astype(jnp.uint8), absmax, tuple(w.shape))


def dequantize_nf4(x: NF4Weight, dtype=jnp.float32) -> jax.Array:
    n = math.prod(x.shape)
    idx = jnp.stack([x.packed & 0xF, x.packed >> 4], axis=-1).reshape(-1)
    vals = jnp.asarray(NF4_CODE)[idx.astype(jnp.int32)].reshape(x.absmax.shape[0], -1) * x.absmax[:, None]
    return vals.reshape(-1)[:n].reshape(x.shape).astype(dtype)


def quantize_nf4_last(w: jax.Array, block: int = NF4_BLOCK) -> tuple[jax.Array, jax.Array]:
    """:func:`quantize_nf4` laid out along the last axis (which ``block`` must divide): ``(packed [..., n/2] uint8,
    absmax [..., n/block] float32)``, the same codes as the flattened form (blocks never cross a row), so a stacked
    ``[L, ...]`` weight can be sliced per layer."""
    last = w.shape[-1]
    if last % block:
        raise ValueError(f"nf4: the last dimension {last} of a weight of shape {w.shape} is not a multiple of the "
                         f"block size {block}")
    x = quantize_nf4(w, block)
    return x.packed.reshape(*w.shape[:-1], last // 2), x.absmax.reshape(*w.shape[:-1], last // block)


def dequantize_nf4_last(packed: jax.Array, absmax: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Inverse of :func:`quantize_nf4_last` (any leading dims; jittable, shapes from the arrays)."""
    p = packed.astype(jnp.int32)
    idx = jnp.stack([p & 0xF, p >> 4], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
    vals = jnp.asarray(NF4_CODE)[idx].reshape(*absmax.shape, -1) * absmax.astype(jnp.float32)[..., None]
    return vals.reshape(idx.shape).astype(dtype)


def nf4_error_bound(w: jax.Array, block: int = NF4_BLOCK) -> jax.Array:
    """Per-value bound on ``|w − dequantize_nf4(quantize_nf4(w))|``: half the gap between the two levels around
    ``w / m_b`` (times ``m_b``), plus float32 rounding slack."""
    n = math.prod(w.shape)
    flat = w.astype(jnp.float32).reshape(-1)
    n_blocks = -(-n // block)
    blocks = jnp.pad(flat, (0, n_blocks * block - n)).reshape(n_blocks, block)
    absmax = jnp.max(jnp.abs(blocks), axis=1, keepdims=True)
    r = blocks / jnp.where(absmax > 0, absmax, 1.0)
    code = jnp.asarray(NF4_CODE)
    hi = jnp.clip(jnp.searchsorted(code, r), 1, len(NF4_CODE) - 1)
    gap = code[hi] - code[hi - 1]
    bound = gap / 2 * absmax + 1e-6 * absmax
    return bound.reshape(-1)[:n].reshape(w.shape)


def bytes_per_value(fmt: str | None, param_dtype_bytes: int) -> float:
    """Stored bytes per weight value: ``None`` = the parameter dtype; int8 = 1 (+ its channel scales, not
    counted here); nf4 = 0.5 + 4 / NF4_BLOCK (a float32 absmax per block)."""
    if fmt is None:
        return float(param_dtype_bytes)
    if fmt == "int8":
        return 1.0
    if fmt == "nf4":
        return 0.5 + 4.0 / NF4_BLOCK
    raise ValueError(f"unknown quantization format {fmt!r}; expected one of {FORMATS} or None")


__all__ = ["FORMATS", "NF4_BLOCK", "NF4_CODE", "Int8Weight", "NF4Weight", "bytes_per_value", "dequantize_int8",
           "dequantize_nf4", "dequantize_nf4_last", "nf4_error_bound", "quantize_int8", "quantize_nf4",
           "quantize_nf4_last"]
