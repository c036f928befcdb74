"""Replay priorities: TD error (as the PPO step writes it), |A|, group variance."""

from __future__ import annotations

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo import ops
from jaxppo.trainer.ppo.steps import _td_priority
from tests.ops import reference as ref
from tests.ops._data import random_inputs


class PrioritiesTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # rows: [-1, 3, pad] -> mean 2, max 3 ; empty row -> 0 ; [0.5, -0.5, 2] -> mean 1, max 2
        x = np.array([[-1, 3, 9], [5, 5, 5], [0.5, -0.5, 2]], np.float32)
        m = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
        for fn in (ops.priority_td_error, ops.priority_abs_advantage):
            np.testing.assert_allclose(self.variant(fn)(x, m), [2, 0, 1], rtol=1e-6)
            np.testing.assert_allclose(self.variant(functools.partial(fn, agg="max"))(x, m), [3, 0, 2], rtol=1e-6)
        # groups 8: scores (1, 3) -> var 2 ; group -1: (0, 0, 0) -> 0 ; group 4 alone -> 0
        s = np.array([1, 0, 3, 0, 7, 0], np.float32)
        ids = np.array([8, -1, 8, -1, 4, -1])
        np.testing.assert_allclose(self.variant(ops.priority_group_variance)(s, ids), [2, 0, 2, 0, 0, 0], atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_and_trainer(self):
        _, m, x = random_inputs(seed=3, b=6, t=7)
        d = x()
        for agg in ("mean", "max"):
            got = self.variant(functools.partial(ops.priority_td_error, agg=agg))(d, m)
            np.testing.assert_allclose(got, ref.priority_agg_abs(d, m, agg), rtol=1e-6)
            np.testing.assert_allclose(got, _td_priority(d, np.asarray(m, np.float32), agg), rtol=1e-6)
            got = self.variant(functools.partial(ops.priority_abs_advantage, agg=agg))(d, m)
            np.testing.assert_allclose(got, ref.priority_agg_abs(d, m, agg), rtol=1e-6)
        assert set(ops.PRIORITIES) == {"td_error", "abs_advantage", "group_variance"}


@given(s=hnp.arrays(np.float32, (6,), elements=st.floats(-5, 5, width=32)),
       ids=hnp.arrays(np.int32, (6,), elements=st.sampled_from([-3, 0, 11, 500])))
def test_group_variance_properties(s, ids):
    got = np.asarray(jax.jit(ops.priority_group_variance)(s, ids))
    np.testing.assert_allclose(got, ref.group_variance(s, ids), rtol=1e-4, atol=1e-5)
    assert np.all(got >= 0)
    equal = np.full_like(s, 1.5)
    np.testing.assert_array_equal(ops.priority_group_variance(equal, ids), 0)   # no signal -> 0


def test_bad_input():
    with pytest.raises(ValueError, match="agg='sum'"):
        ops.priority_abs_advantage(np.zeros((2, 3), np.float32), np.ones((2, 3)), agg="sum")
    with pytest.raises(ValueError, match="scores must be 1-D"):
        ops.priority_group_variance(np.zeros((2, 3), np.float32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="group_ids must have shape"):
        ops.priority_group_variance(np.zeros(3, np.float32), np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="integer"):
        ops.priority_group_variance(np.zeros(3, np.float32), np.zeros(3, np.float32))
