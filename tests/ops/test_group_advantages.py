"""Critic-free estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++, REINFORCE++-baseline) and their registry."""

from __future__ import annotations

import functools

import chex
import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jaxppo import ops
from tests.ops import reference as ref

# Two groups with non-contiguous, unsorted ids plus a group of one. T = 3, each score on the last valid token.
#   row: 0    1    2    3    4    5
#   id : 7    3    7    3    3    11
#   s  : 1    0    3    2    4    5
# GRPO  g7: mean 2, unbiased std sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt 2 -> -1/sqrt2, +1/sqrt2
#       g3: mean 2, std sqrt((4 + 0 + 4) / 2) = 2 -> -1, 0, +1 ;  g11 (one): mean 0, std 1 -> 5 / (1 + 1e-6)
# Dr.GRPO: -1, -2, 1, 0, 2, 5
# RLOO  g7: 1 - 3 = -2, 3 - 1 = 2 ; g3: 0 - (2+4)/2 = -3, 2 - (0+4)/2 = 0, 4 - (0+2)/2 = 3 ; g11: 5
IDS = np.array([7, 3, 7, 3, 3, 11])
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], np.float32)
REWARDS = np.zeros((6, 3), np.float32)
for row, (last, score) in enumerate(zip([1, 2, 0, 2, 2, 2], [1, 0, 3, 2, 4, 5])):
    REWARDS[row, last] = score
REWARDS[0, 2] = 100.0  # a reward on padding is ignored


def _rows(adv):
    return np.asarray(adv)[:, 0]


class HandTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_and_dr_grpo(self):
        f = self.variant(functools.partial(ops.grpo_advantages))
        adv, ret = f(REWARDS, MASK, IDS)
        want = [-1 / np.sqrt(2), -1, 1 / np.sqrt(2), 0, 1, 5 / (1 + 1e-6)]
        np.testing.assert_allclose(_rows(adv), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(adv, ret)
        np.testing.assert_array_equal(np.asarray(adv)[MASK == 0], 0)
        g = self.variant(functools.partial(ops.grpo_advantages, norm_by_std=False))
        np.testing.assert_allclose(_rows(g(REWARDS, MASK, IDS)[0]), [-1, -2, 1, 0, 2, 5], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rloo(self):
        adv, ret = self.variant(ops.rloo_advantages)(REWARDS, MASK, IDS)
        np.testing.assert_allclose(_rows(adv), [-2, -3, 2, 0, 3, 5], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(adv, ret)

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce_pp_hand(self):
        # one row [r] = [1, 0, 2 | pad], gamma 0.5: G = [1 + 0.5*(0 + 0.5*2), 0 + 0.5*2, 2, pad] = [1.5, 1, 2, 0]
        # a second row with an interior hole [3, (hole), 4]: G_2 = 4, G_1 = 0 + 0.5*4 = 2 (reset after), G_0 = 3
        r = np.array([[1, 0, 2, 0], [3, 9, 4, 0]], np.float32)
        m = np.array([[1, 1, 1, 0], [1, 0, 1, 0]], np.float32)
        adv, ret = self.variant(ops.reinforce_pp_advantages)(r, m, 0.5)
        np.testing.assert_allclose(ret, [[1.5, 1, 2, 0], [3, 2, 4, 0]], rtol=1e-6)
        vals = np.array([1.5, 1, 2, 3, 4])
        want = (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
        np.testing.assert_allclose(np.asarray(adv)[m == 1], want, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(adv)[m == 0], 0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce_pp_baseline_hand(self):
        # centred scores: g7 -> -1, +1 ; g3 -> -2, 0, +2 ; g11 (one) -> 5 ; whitened over the 15 valid tokens
        adv, _ = self.variant(ops.reinforce_pp_baseline_advantages)(REWARDS, MASK, IDS)
        x = np.repeat([-1.0, -2, 1, 0, 2, 5], MASK.sum(1).astype(int))
        want = (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)
        np.testing.assert_allclose(np.asarray(adv)[MASK == 1], want, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_variance_group_and_fully_masked_row(self):
        # group 5 all equal -> GRPO/RLOO 0; row 3 fully masked: score 0, still a member of group 9 (verl)
        r = np.array([[2, 0], [2, 0], [0, 1], [0, 0]], np.float32)
        m = np.array([[1, 1], [1, 1], [1, 1], [0, 0]], np.float32)
        ids = np.array([5, 5, 9, 9])
        adv, _ = self.variant(ops.grpo_advantages)(r, m, ids)
        # g9: scores (1, 0): mean 0.5, std sqrt(0.5) -> row 2: 0.5 / sqrt(0.5)
        np.testing.assert_allclose(adv, [[0, 0], [0, 0], [np.sqrt(0.5)] * 2, [0, 0]], rtol=1e-5, atol=1e-6)
        adv, _ = self.variant(ops.rloo_advantages)(r, m, ids)
        np.testing.assert_allclose(adv, [[0, 0], [0, 0], [1, 1], [0, 0]], atol=1e-6)


def _case(draw_ids, rewards, mask):
    return np.asarray(rewards, np.float32), np.asarray(mask, np.float32), np.asarray(draw_ids, np.int32)


@st.composite
def batches(draw, min_valid=0):
    b = draw(st.integers(2, 7))
    t = draw(st.integers(1, 4))
    ids = draw(st.lists(st.sampled_from([-4, 0, 3, 42, 1000]), min_size=b, max_size=b))
    rewards = draw(st.lists(st.floats(-3, 3, width=32), min_size=b * t, max_size=b * t))
    mask = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b * t, max_size=b * t))
    m = np.array(mask, np.float32).reshape(b, t)
    assume(m.sum() >= min_valid)
    return _case(ids, np.array(rewards).reshape(b, t), m)


JIT = {"jit": jax.jit, "eager": lambda f, **kw: f}


@pytest.mark.parametrize("mode", ["jit", "eager"])
@settings(max_examples=15)
@given(case=batches(), norm=st.booleans())
def test_grpo_rloo_match_reference(mode, case, norm):
    r, m, ids = case
    grpo = JIT[mode](functools.partial(ops.grpo_advantages, norm_by_std=norm))
    np.testing.assert_allclose(grpo(r, m, ids)[0], ref.grpo_advantages(r, m, ids, norm), rtol=1e-4, atol=1e-4)
    rloo = JIT[mode](ops.rloo_advantages)
    np.testing.assert_allclose(rloo(r, m, ids)[0], ref.rloo_advantages(r, m, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["jit", "eager"])
@settings(max_examples=15)
@given(case=batches(min_valid=2), gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]))
def test_reinforce_pp_match_reference(mode, case, gamma):
    r, m, ids = case
    adv, ret = JIT[mode](ops.reinforce_pp_advantages)(r, m, gamma)
    want_adv, want_ret = ref.reinforce_pp(r, m, gamma)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-3, atol=1e-3)
    base = JIT[mode](ops.reinforce_pp_baseline_advantages)(r, m, ids)[0]
    np.testing.assert_allclose(base, ref.reinforce_pp_baseline(r, m, ids), rtol=1e-3, atol=1e-3)


@given(case=batches())
def test_group_properties(case):
    r, _, ids = case
    m = np.ones_like(r)  # every row valid: the per-row advantage is A[:, 0]
    s = r.sum(1)
    grpo = np.asarray(ops.grpo_advantages(r, m, ids)[0])[:, 0]
    drg = np.asarray(ops.grpo_advantages(r, m, ids, norm_by_std=False)[0])[:, 0]
    rloo = np.asarray(ops.rloo_advantages(r, m, ids)[0])[:, 0]
    for g in np.unique(ids):
        sel = ids == g
        if sel.sum() > 1:
            np.testing.assert_allclose(grpo[sel].mean(), 0, atol=1e-4)   # group mean 0
            np.testing.assert_allclose(drg[sel].sum(), 0, atol=1e-4)
            np.testing.assert_allclose(rloo[sel].sum(), 0, atol=1e-4)    # RLOO sums to 0 within a group
            if np.ptp(s[sel]) > 1e-3:                                   # unit sample std
                np.testing.assert_allclose(np.std(grpo[sel], ddof=1), 1, rtol=1e-3)
        else:
            # group of one: score unchanged (up to XLA:CPU flushing a subnormal float32 to 0)
            np.testing.assert_allclose(rloo[sel], s[sel], rtol=1e-6, atol=float(np.finfo(np.float32).tiny))
    # relabelling the groups (a permutation of ids) changes nothing
    perm = {g: 10 * k + 1 for k, g in enumerate(np.unique(ids)[::-1])}
    ids2 = np.array([perm[g] for g in ids], np.int32)
    np.testing.assert_allclose(ops.grpo_advantages(r, m, ids2)[0], ops.grpo_advantages(r, m, ids)[0], atol=1e-6)


def test_registry():
    hp = ops.AdvantageHParams(gamma=0.9, lam=0.8, norm_by_std=False)
    r, m = REWARDS, MASK
    v = np.linspace(-1, 1, r.size, dtype=np.float32).reshape(r.shape)
    assert set(ops.ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "rloo", "reinforce_plus_plus",
                                             "reinforce_plus_plus_baseline"}
    assert [n for n in ops.ADVANTAGE_ESTIMATORS if ops.ADVANTAGE_ESTIMATORS.get(n).needs_critic] == ["gae"]
    est = ops.ADVANTAGE_ESTIMATORS.get
    np.testing.assert_array_equal(est("gae")(r, v, m, None, hp)[0], ops.gae(r, v, m, 0.9, 0.8)[0])
    np.testing.assert_array_equal(est("grpo")(r, None, m, IDS, hp)[0],
                                  ops.grpo_advantages(r, m, IDS, norm_by_std=False)[0])
    np.testing.assert_array_equal(est("rloo")(r, None, m, IDS, hp)[0], ops.rloo_advantages(r, m, IDS)[0])
    np.testing.assert_array_equal(est("reinforce_plus_plus")(r, None, m, None, hp)[1],
                                  ops.reinforce_pp_advantages(r, m, 0.9)[1])
    np.testing.assert_array_equal(est("reinforce_plus_plus_baseline")(r, None, m, IDS, hp)[0],
                                  ops.reinforce_pp_baseline_advantages(r, m, IDS)[0])
    jitted = jax.jit(est("grpo"), static_argnums=4)
    np.testing.assert_allclose(jitted(r, None, m, IDS, hp)[0], est("grpo")(r, None, m, IDS, hp)[0], atol=1e-6)
    with pytest.raises(ValueError, match="needs critic values"):
        est("gae")(r, None, m, None, hp)
    with pytest.raises(ValueError, match="needs group_ids"):
        est("rloo")(r, None, m, None, hp)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        est("ppo")


def test_register_new_estimator():
    name = "test_only_negated_scores"

    @ops.ADVANTAGE_ESTIMATORS.register(name)
    def _neg(token_rewards, values, mask, group_ids, hp):
        return -token_rewards * mask, -token_rewards * mask

    try:
        out = ops.ADVANTAGE_ESTIMATORS.get(name)(REWARDS, None, MASK, None, ops.AdvantageHParams())
        np.testing.assert_array_equal(out[0], -REWARDS * MASK)
        with pytest.raises(ValueError, match="already registered"):
            ops.ADVANTAGE_ESTIMATORS.register(name)(_neg)
    finally:
        ops.ADVANTAGE_ESTIMATORS.unregister(name)


def test_bad_input():
    with pytest.raises(ValueError, match="group_ids must have shape"):
        ops.grpo_advantages(REWARDS, MASK, IDS[:3])
    with pytest.raises(TypeError, match="group_ids must be an integer array"):
        ops.rloo_advantages(REWARDS, MASK, IDS.astype(np.float32))
    with pytest.raises(ValueError, match="group_ids is required"):
        ops.grpo_advantages(REWARDS, MASK, None)
    with pytest.raises(ValueError, match="shape mismatch"):
        ops.grpo_advantages(REWARDS, MASK[:, :2], IDS)
    with pytest.raises(ValueError, match="gamma must be"):
        ops.reinforce_pp_advantages(REWARDS, MASK, 1.5)
    with pytest.raises(TypeError, match="norm_by_std must be a bool"):
        ops.grpo_advantages(REWARDS, MASK, IDS, norm_by_std=1)
    with pytest.raises(ValueError, match="single 1"):
        ops.reinforce_pp_advantages(REWARDS[:1], np.array([[1, 0, 0]]), 1.0)
