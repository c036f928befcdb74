"""The benchmark-only GAE formulations (benchmarks/gae_variants.py) equal the per-timestep reference and
jaxppo.ops.gae, on holed and prefix masks (hypothesis), jitted and not."""

from __future__ import annotations

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.gae_variants import gae_associative, gae_blocked, gae_chunked, gae_scan
from jaxppo.ops import gae
from tests.ops import reference as ref
from tests.ops._data import random_inputs

VARIANTS = {"scan": gae_scan, "scan_unroll4": functools.partial(gae_scan, unroll=4), "associative": gae_associative,
            "chunked": gae_chunked, "chunked3": functools.partial(gae_chunked, chunk=3)}
#: formulations that are only valid for prefix (right-padded) masks
PREFIX_VARIANTS = {"blocked": gae_blocked, "blocked3": functools.partial(gae_blocked, block=3)}


class VariantsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # the case of tests/ops/test_advantages.py: gamma = lam = 0.5, mask [1, 0, 1, 0] -> adv [3.75, -1, -1, 0]
        r, v, m = np.array([[4.0, 100.0, 1.0, 100.0]]), np.array([[1.0, 10.0, 2.0, 10.0]]), np.array([[1, 0, 1, 0]])
        for name, fn in VARIANTS.items():
            adv, ret = self.variant(fn)(r.astype(np.float32), v.astype(np.float32), m, 0.5, 0.5)
            np.testing.assert_allclose(adv, [[3.75, -1.0, -1.0, 0.0]], atol=1e-6, err_msg=name)
            np.testing.assert_allclose(ret, [[4.75, 9.0, 1.0, 10.0]], atol=1e-6, err_msg=name)

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_formulations_match_reference_and_gae(self):
        _, m, x = random_inputs(seed=1, b=6, t=11)
        r, v = x(), x()
        prefix = (np.arange(11)[None, :] < np.array([0, 11, 1, 4, 9, 5])[:, None]).astype(np.float32)
        for mask, variants in ((m, VARIANTS), (prefix, {**VARIANTS, **PREFIX_VARIANTS})):
            want_adv, want_ret = ref.gae(r, v, mask, 0.97, 0.9)
            lib_adv, _ = gae(r, v, mask, 0.97, 0.9)
            for name, fn in variants.items():
                adv, ret = self.variant(fn)(r, v, mask, 0.97, 0.9)
                np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5, err_msg=name)
                np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5, err_msg=name)
                np.testing.assert_allclose(adv, lib_adv, rtol=1e-5, atol=1e-5, err_msg=name)


_T, _B = 8, 4
_floats = hnp.arrays(np.float32, (_B, _T), elements=st.floats(-5, 5, width=32))


@functools.lru_cache(maxsize=None)
def _jitted(name):
    return jax.jit({**VARIANTS, **PREFIX_VARIANTS}[name])


@settings(max_examples=30, deadline=None)
@given(r=_floats, v=_floats, m=hnp.arrays(np.bool_, (_B, _T)), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0),
       name=st.sampled_from(sorted(VARIANTS)))
def test_property_equals_naive_reverse_recursion(r, v, m, gamma, lam, name):
    adv, ret = _jitted(name)(r, v, m, gamma, lam)
    want_adv, want_ret = ref.gae(r, v, m, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(r=_floats, v=_floats, lengths=hnp.arrays(np.int64, (_B,), elements=st.integers(0, _T)),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0), name=st.sampled_from(sorted(PREFIX_VARIANTS)))
def test_property_prefix_masks_equal_naive_reverse_recursion(r, v, lengths, gamma, lam, name):
    m = np.arange(_T)[None, :] < lengths[:, None]
    adv, ret = _jitted(name)(r, v, m, gamma, lam)
    want_adv, want_ret = ref.gae(r, v, m, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


def test_chunked_handles_length_not_multiple_of_chunk():
    _, m, x = random_inputs(seed=3, b=5, t=13)
    r, v = x(), x()
    adv, _ = gae_chunked(r, v, m, 0.99, 0.95, chunk=4)
    np.testing.assert_allclose(adv, ref.gae(r, v, m, 0.99, 0.95)[0], rtol=1e-5, atol=1e-5)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="prefix mask"):
        gae_blocked(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), np.array([[1, 0, 1]]), 0.9, 0.9)
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        gae_chunked(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), np.ones((1, 3)), 0.9, 0.9, chunk=0)
    with pytest.raises(ValueError, match="block must be a positive int"):
        gae_blocked(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), np.ones((1, 3)), 0.9, 0.9, block=0)
