"""Quantized-base formats (jaxppo.models.quant): hand-computed int8 / NF4 cases and the error bounds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models.quant import (
    NF4_CODE,
    NF4Weight,
    bytes_per_value,
    dequantize_int8,
    dequantize_nf4,
    nf4_error_bound,
    quantize_int8,
    quantize_nf4,
)


def test_int8_by_hand():
    # two output channels (columns): absmax 2.54 -> s = 0.02, absmax 1.27 -> s = 0.01
    w = jnp.array([[2.54, -1.27], [0.011, 0.5], [-1.0, 0.004]], jnp.float32)
    x = quantize_int8(w)
    np.testing.assert_allclose(np.asarray(x.scale).ravel(), [0.02, 0.01], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x.q), [[127, -127], [1, 50], [-50, 0]])
    np.testing.assert_allclose(np.asarray(dequantize_int8(x)), [[2.54, -1.27], [0.02, 0.5], [-1.0, 0.0]], atol=1e-6)
    assert x.q.dtype == jnp.int8
    zero = quantize_int8(jnp.zeros((3, 2)))         # an all-zero channel: scale 1, codes 0, no NaN
    np.testing.assert_array_equal(np.asarray(dequantize_int8(zero)), np.zeros((3, 2)))


def test_nf4_by_hand():
    # one block of 4 values, absmax 2: w/2 = [1, -0.5, 0.1, 0] -> nearest levels 1, -0.5250730, 0.0795803, 0
    w = jnp.array([2.0, -1.0, 0.2, 0.0], jnp.float32)
    x = quantize_nf4(w, block=4)
    np.testing.assert_allclose(np.asarray(x.absmax), [2.0])
    idx = [15, 2, 8, 7]
    np.testing.assert_array_equal(np.asarray(x.packed), [idx[0] | idx[1] << 4, idx[2] | idx[3] << 4])
    np.testing.assert_allclose(np.asarray(dequantize_nf4(x)), 2.0 * NF4_CODE[idx], rtol=1e-6)
    assert x.packed.dtype == jnp.uint8 and x.packed.size == 2      # two 4-bit codes per byte


@settings(max_examples=20)   # few shapes (each new shape compiles): sizes are drawn from a short list
@given(st.sampled_from([1, 7, 64, 130]), st.floats(1e-3, 1e3), st.integers(0, 2 ** 16), st.sampled_from([1, 2]))
def test_int8_error_within_half_a_step(n_out, std, seed, n_in):
    shape = (3, 4, n_out) if n_in == 2 else (5, n_out)
    w = std * jax.random.normal(jax.random.PRNGKey(seed), shape)
    x = quantize_int8(w, n_in=n_in)
    err = np.abs(np.asarray(dequantize_int8(x)) - np.asarray(w))
    assert np.all(err <= np.asarray(x.scale) / 2 * (1 + 1e-5) + 1e-12)


@settings(max_examples=20)
@given(st.sampled_from([1, 18, 64, 65, 300]), st.floats(1e-3, 1e3), st.integers(0, 2 ** 16))
def test_nf4_error_within_half_the_level_gap(n, std, seed):
    w = std * jax.random.normal(jax.random.PRNGKey(seed), (n,))
    got = dequantize_nf4(quantize_nf4(w))
    assert got.shape == w.shape
    err = np.abs(np.asarray(got) - np.asarray(w))
    assert np.all(err <= np.asarray(nf4_error_bound(w)))
    # the coarsest case anywhere: half the widest level gap, (1 - 0.6961928) / 2, of the block absmax
    assert np.max(err) <= 0.1520 * float(jnp.max(jnp.abs(w)))


def test_jit_and_shapes():
    w = jax.random.normal(jax.random.PRNGKey(0), (2, 64, 3))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: dequantize_int8(quantize_int8(a)))(w)),
                                  np.asarray(dequantize_int8(quantize_int8(w))))
    x = quantize_nf4(w)
    jitted = jax.jit(lambda a: tuple(quantize_nf4(a)[:2]))(w)      # the shape stays static (not traced)
    np.testing.assert_array_equal(np.asarray(jitted[0]), np.asarray(x.packed))
    deq = jax.jit(lambda p, m: dequantize_nf4(NF4Weight(p, m, w.shape)))(*jitted)
    np.testing.assert_array_equal(np.asarray(deq), np.asarray(dequantize_nf4(x)))
    assert x.absmax.shape == (6,) and x.packed.shape == (192,)
    assert bytes_per_value("nf4", 2) == 0.5625 and bytes_per_value("int8", 4) == 1.0 and bytes_per_value(None, 2) == 2
    with pytest.raises(ValueError, match="format"):
        bytes_per_value("fp8", 2)
    with pytest.raises(ValueError, match="n_in"):
        quantize_int8(w, n_in=4)
