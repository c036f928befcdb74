"""PF-PPO filters on hand-made groups, verl's batch-level reweighting, resampling."""

from __future__ import annotations

import chex
import hypothesis.extra.numpy as _hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st_

from jaxppo import replay
from jaxppo.replay import pf_ppo
from tests.replay import _ref

#            group 0      group 1     g2    group 3 (all equal)
SCORES = [1.0, 3.0, 2.0, 5.0, 5.0, 0.0, -1.0, 2.0, 2.0, 2.0]
GROUPS = [0, 0, 0, 1, 1, 1, 2, 3, 3, 3]


class GroupFiltersTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_best_of_n(self):
        f = self.variant(replay.best_of_n, static_argnames="num_groups")
        out = f(jnp.array(SCORES), jnp.array(GROUPS), num_groups=4)
        np.testing.assert_array_equal(out, [0, 1, 0, 1, 0, 0, 1, 1, 0, 0])   # ties: lowest index

    @chex.variants(with_jit=True, without_jit=True)
    def test_best_worst(self):
        f = self.variant(replay.best_worst, static_argnames="num_groups")
        out = f(jnp.array(SCORES), jnp.array(GROUPS), num_groups=4)
        np.testing.assert_array_equal(out, [1, 1, 0, 1, 0, 1, 1, 1, 1, 0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_mask_excludes_padding(self):
        f = self.variant(replay.best_worst, static_argnames="num_groups")
        mask = jnp.array([1, 0, 1, 1, 1, 1, 1, 1, 1, 1])                   # the best of group 0 is padding
        out = f(jnp.array(SCORES), jnp.array(GROUPS), num_groups=4, mask=mask)
        np.testing.assert_array_equal(out, [1, 0, 1, 1, 0, 1, 1, 1, 1, 0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_best_random(self):
        f = self.variant(replay.best_random, static_argnames="num_groups")
        scores, groups = jnp.array(SCORES), jnp.array(GROUPS)
        kept = np.stack([np.asarray(f(scores, groups, num_groups=4, key=jax.random.key(i)))
                         for i in range(200)])
        assert np.all(kept[:, [1, 3, 6, 7]] == 1)                            # the best always
        per_group = [kept[:, np.array(GROUPS) == g].sum(1) for g in range(4)]
        assert all(np.all(c == 2) for c in (per_group[0], per_group[1], per_group[3]))
        assert np.all(per_group[2] == 1)                                     # a group of one
        # the other kept response is uniform over the rest of its group: 200 draws, p = 1/2 each
        for j in (0, 2, 4, 5, 8, 9):
            assert 65 <= kept[:, j].sum() <= 135, (j, kept[:, j].sum())

    @chex.variants(with_jit=True, without_jit=True)
    def test_pow(self):
        f = self.variant(replay.pow_weights)
        np.testing.assert_allclose(f(jnp.array(SCORES), 2.0), np.abs(SCORES) ** 2, rtol=1e-6)
        np.testing.assert_allclose(f(jnp.array([-4.0, 0.25]), 0.5), [2.0, 0.5], rtol=1e-6)

    def test_filter_weights_dispatch(self):
        s, g = jnp.array(SCORES), jnp.array(GROUPS)
        np.testing.assert_array_equal(replay.filter_weights("best_of_n", s, g, 4), replay.best_of_n(s, g, 4))
        np.testing.assert_array_equal(replay.filter_weights("none", s), np.ones(10))
        np.testing.assert_allclose(replay.filter_weights("pow", s, weight_pow=3.0), np.abs(SCORES) ** 3)
        k = jax.random.key(5)
        np.testing.assert_array_equal(replay.filter_weights("best_random", s, g, 4, key=k),
                                      replay.best_random(s, g, 4, k))


def verl_reference(scores, method, k):
    """verl's ``compute_pf_ppo_reweight_data`` weights as documented: then ``clamp(w + 1e-8, min=1e-8)``."""
    s = np.asarray(scores, np.float32)
    if method == "pow":
        w = np.abs(s) ** np.float32(k)
    elif method == "max_min":
        w = ((s == s.max()) | (s == s.min())).astype(np.float32)
    else:
        w = np.where(s == s.max(), np.float32(0.4), np.float32(0.1))
    return np.maximum(w + np.float32(1e-8), np.float32(1e-8))


class BatchReweightTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        f = self.variant(replay.batch_reweight, static_argnames="method")
        s = jnp.array([3.0, 1.0, 2.0, 3.0, 0.0])
        np.testing.assert_allclose(f(s, method="max_min"), [1, 1e-8, 1e-8, 1, 1], rtol=1e-6)
        np.testing.assert_allclose(f(s, method="max_random"), [0.4, 0.1, 0.1, 0.4, 0.1], rtol=1e-6)
        np.testing.assert_allclose(f(jnp.array([0.0, -2.0, 0.5]), method="pow", weight_pow=2.0),
                                   [1e-8, 4.0, 0.25], rtol=1e-6)
        np.testing.assert_allclose(f(jnp.array([2.0, 2.0]), method="max_min"), [1.0, 1.0])   # max == min

    @given(scores=st_.lists(st_.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=12),
           method=st_.sampled_from(["pow", "max_min", "max_random"]), k=st_.sampled_from([1.0, 2.0, 0.5]))
    def test_matches_verl_semantics(self, scores, method, k):
        np.testing.assert_allclose(replay.batch_reweight(jnp.array(scores), method, k),
                                   verl_reference(scores, method, k), rtol=1e-6, atol=0)


def test_resample_indices_frequencies():
    w = replay.batch_reweight(jnp.array([3.0, 1.0, 2.0, 3.0, 0.0]), "max_random")
    idx = replay.resample_indices(jax.random.key(0), w, 5000)
    counts = np.bincount(np.asarray(idx), minlength=5)
    stat, df = _ref.chi_square(counts, np.asarray(w, np.float64) / float(np.sum(w)))
    assert stat < _ref.chi_square_critical(df)
    assert replay.resample_indices(jax.random.key(1), w).shape == (5,)


def test_bad_input():
    s, g = jnp.array(SCORES), jnp.array(GROUPS)
    with pytest.raises(ValueError, match="unknown pf_ppo filter 'best_of_2'; known: best_of_n, best_random"):
        replay.filter_weights("best_of_2", s, g, 4)
    with pytest.raises(ValueError, match="needs group_ids and num_groups"):
        replay.filter_weights("best_worst", s)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        replay.filter_weights("best_random", s, g, 4)
    with pytest.raises(ValueError, match="group_ids must lie in"):
        replay.best_of_n(s, g, 3)
    with pytest.raises(ValueError, match="scores contain NaN"):
        replay.best_of_n(s.at[0].set(jnp.nan), g, 4)
    with pytest.raises(ValueError, match="scores must be 1-D"):
        replay.best_of_n(s[None], g, 4)
    with pytest.raises(ValueError, match="group_ids shape"):
        replay.best_of_n(s, g[:5], 4)
    with pytest.raises(ValueError, match="unknown pf_ppo reweight method 'max'; known: max_min, max_random, pow"):
        replay.batch_reweight(s, "max")
    with pytest.raises(ValueError, match="resampling weights"):
        replay.resample_indices(jax.random.key(0), jnp.zeros(3))
    assert pf_ppo.PF_REWEIGHTS.names() == ("max_min", "max_random", "pow")


def dapo_reference(scores, groups, mask=None, atol=1e-6):
    """DAPO's keep rule per group of real responses: keep if max - min > atol or the group has one response."""
    keep = np.zeros(len(scores), np.float32)
    dropped = 0
    for g in sorted(set(groups)):
        rows = [i for i, gi in enumerate(groups) if gi == g and (mask is None or mask[i])]
        if not rows:
            continue
        vals = [scores[i] for i in rows]
        if len(rows) == 1 or max(vals) - min(vals) > atol:
            keep[rows] = 1
        else:
            dropped += 1
    return keep, dropped


class DynamicSamplingTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # group 3 (all 2.0) is dropped ; group 2 has one response: kept (verl: std > 0 or len == 1)
        f = self.variant(replay.pf_ppo.dynamic_sampling_weights, static_argnames="num_groups")
        w, n = f(jnp.array(SCORES), jnp.array(GROUPS), num_groups=4)
        np.testing.assert_array_equal(w, [1, 1, 1, 1, 1, 1, 1, 0, 0, 0])
        assert int(n) == 1
        # masking the 3.0 of group 0 leaves (1, 2): kept ; masking row 5 leaves group 1 as (5, 5): dropped
        mask = jnp.array([1, 0, 1, 1, 1, 0, 1, 1, 1, 1])
        w, n = f(jnp.array(SCORES), jnp.array(GROUPS), num_groups=4, mask=mask)
        np.testing.assert_array_equal(w, [1, 0, 1, 0, 0, 0, 1, 0, 0, 0])
        assert int(n) == 2

    @given(scores=st_.lists(st_.sampled_from([0.0, 1.0, 2.5]), min_size=8, max_size=8),
           groups=st_.lists(st_.integers(0, 3), min_size=8, max_size=8),
           mask=st_.lists(st_.booleans(), min_size=8, max_size=8))
    def test_matches_reference(self, scores, groups, mask):
        f = jax.jit(pf_ppo.dynamic_sampling_weights, static_argnames="num_groups")
        w, n = f(jnp.array(scores), jnp.array(groups), num_groups=4, mask=jnp.array(mask, jnp.float32))
        want, dropped = dapo_reference(scores, groups, mask)
        np.testing.assert_array_equal(w, want)
        assert int(n) == dropped

    def test_tolerance_and_errors(self):
        w, _ = pf_ppo.dynamic_sampling_weights(jnp.array([1.0, 1.0 + 1e-7, 2.0, 2.5]), jnp.array([0, 0, 1, 1]), 2)
        np.testing.assert_array_equal(w, [0, 0, 1, 1])
        with pytest.raises(ValueError, match="group_ids must lie in"):
            pf_ppo.dynamic_sampling_weights(jnp.array([1.0, 2.0]), jnp.array([0, 5]), 2)
        with pytest.raises(ValueError, match="atol must be >= 0"):
            pf_ppo.dynamic_sampling_weights(jnp.array([1.0, 2.0]), jnp.array([0, 1]), 2, atol=-1.0)


def test_dropped_groups_counts_groups_whose_every_row_has_weight_zero():
    # groups 0 (rows 0, 1: both 0) and 2 (row 3: 0) are dropped; group 1 keeps row 2; group 3 has no row
    assert int(pf_ppo.dropped_groups(jnp.array([0.0, 0.0, 0.5, 0.0]), jnp.array([0, 0, 1, 2]), 4)) == 2
    assert int(jax.jit(pf_ppo.dropped_groups, static_argnums=2)(jnp.ones(4), jnp.array([0, 0, 1, 2]), 4)) == 0


@given(scores=_hnp.arrays(np.float32, (12,), elements=st_.sampled_from([0.0, 1.0, 2.0])),
       groups=_hnp.arrays(np.int32, (12,), elements=st_.integers(0, 3)))
def test_dropped_groups_of_the_dynamic_sampling_filter_is_its_own_count(scores, groups):
    """The trainer's generic count (pf_ppo/dropped_groups of any filter) equals DAPO's n_dropped_groups."""
    w, n = pf_ppo.dynamic_sampling_weights(jnp.asarray(scores), jnp.asarray(groups), 4)
    assert int(pf_ppo.dropped_groups(w, groups, 4)) == int(n)
    np.testing.assert_array_equal(replay.filter_weights("dynamic_sampling", scores, groups, 4), w)
