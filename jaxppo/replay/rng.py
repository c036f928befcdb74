"""Uniform draws for the strata, bit-identical to ``jax.random.uniform`` but fused on CPU.

On CPU, JAX lowers the Threefry-2x32 hash behind ``jax.random`` to a rolled 5-iteration ``while``
loop (to save compile time); for a few hundred numbers that loop costs ~20-30 µs per call, more
than the rest of a replay sample. :func:`uniform` computes the same bits with the rounds written
out (Threefry-2x32, 20 rounds, key injection every 4 rounds; Salmon et al. 2011), which XLA fuses
into a single elementwise kernel. For the default ``threefry2x32`` keys with
``jax_threefry_partitionable`` (JAX's default) the result equals ``jax.random.uniform(key, (n,))``
bit for bit (tested); any other key implementation or setting falls back to ``jax.random.uniform``.

Bits of element ``i``: ``(y0 ^ y1)`` where ``(y0, y1) = threefry2x32(key, (0, i))``; a float in
``[0, 1)`` from the top 23 bits as the mantissa of a number in ``[1, 2)`` minus 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 block function (20 rounds) on uint32 words, unrolled."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for g in range(5):
        for r in _ROT[g % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(g + 1) % 3]
        x1 = x1 + ks[(g + 2) % 3] + np.uint32(g + 1)
    return x0, x1


def _fusable(key: jax.Array) -> bool:
    if not jax.config.jax_threefry_partitionable:
        return False
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key)) == "threefry2x32" and key.shape == ()
    return key.dtype == jnp.uint32 and key.shape == (2,)          # legacy raw PRNGKey (threefry)


def uniform(key: jax.Array, n: int) -> jax.Array:
    """``n`` float32 draws in ``[0, 1)``, equal to ``jax.random.uniform(key, (n,))``."""
    if not _fusable(key):
        return jax.random.uniform(key, (n,), jnp.float32)
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    y0, y1 = threefry2x32(data[0], data[1], jnp.zeros((n,), jnp.uint32), jnp.arange(n, dtype=jnp.uint32))
    bits = y0 ^ y1
    one = np.array(1.0, np.float32).view(np.uint32)
    return jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | one, jnp.float32) - jnp.float32(1.0)
