"""jaxppo.sweeps.stats: hand-computed cases and hypothesis properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.sweeps import stats

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


def test_t_interval_hand_computed():
    # x = 1, 2, 3: mean 2, s = 1, t_{0.975,2} = 4.302652729..., half = 4.3027 / sqrt(3) = 2.484138
    m, lo, hi = stats.t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and lo == pytest.approx(2 - 2.4841377, abs=1e-6) and hi == pytest.approx(2 + 2.4841377, abs=1e-6)
    assert math.isnan(stats.t_interval([5.0])[1])


def test_sign_flip_hand_computed():
    # d = (1, 2, 3): sums over the 8 sign vectors: +-6 (2), +-4 (2), +-2 (2), +-0 (2); |S| >= 6: 2 of 8
    assert stats.sign_flip_pvalue([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # d = (1, -1): sums 0, 2, -2, 0; observed |0| -> every vector is as extreme
    assert stats.sign_flip_pvalue([1.0, -1.0]) == 1.0
    assert stats.sign_flip_pvalue([0.0, 0.0, 0.0]) == 1.0
    # five positive differences: the smallest p a 5-seed test can give, above 0.05
    assert stats.sign_flip_pvalue([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32) == stats.min_sign_flip_p(5)
    assert stats.min_sign_flip_p(10) == pytest.approx(2 / 1024)


def test_sign_flip_bad_input():
    with pytest.raises(ValueError, match="finite"):
        stats.sign_flip_pvalue([1.0, math.nan])
    with pytest.raises(ValueError, match="too large"):
        stats.sign_flip_pvalue(np.ones(stats.EXACT_MAX_N + 1))


def _brute_sign_flip(d) -> float:
    """Every one of the 2^n sign vectors, counted directly (the definition of the module docstring)."""
    import itertools

    x = np.asarray(d, np.float64)
    sums = np.abs(np.asarray(list(itertools.product((-1.0, 1.0), repeat=x.size))) @ x)
    tol = 1e-12 * max(1.0, float(np.abs(x).sum()))
    return float(np.count_nonzero(sums >= abs(float(x.sum())) - tol) / sums.size)


@given(st.lists(st.one_of(finite, st.integers(-3, 3).map(float)), min_size=1, max_size=12))
@settings(max_examples=80, deadline=None)
def test_sign_flip_meet_in_the_middle_equals_the_enumeration(d):
    assert stats.sign_flip_pvalue(d) == _brute_sign_flip(d)


def test_sign_flip_twenty_seeds_hand_computed():
    # 20 equal positive differences: only the all-plus and all-minus vectors reach |sum| = 20
    assert stats.sign_flip_pvalue(np.ones(20)) == 2 / 2 ** 20
    # 19 x (+1) and one -1: |sum| = 18 is reached by flipping nothing or only the -1 (and the mirror images): 4 vectors
    assert stats.sign_flip_pvalue([1.0] * 19 + [-1.0]) == pytest.approx((2 + 2 * 20) / 2 ** 20)


def test_paired_t_pvalue_hand_computed():
    # d = (1, 2, 3): mean 2, s = 1, t = 2 sqrt(3) = 3.4641, df 2: two-sided p = 0.074180 (t table)
    assert stats.paired_t_pvalue([1.0, 2.0, 3.0]) == pytest.approx(0.0741799, abs=1e-6)
    assert stats.paired_t_pvalue([0.0, 0.0]) == 1.0 and stats.paired_t_pvalue([0.5, 0.5]) == 0.0
    assert math.isnan(stats.paired_t_pvalue([1.0]))


@given(st.lists(finite, min_size=2, max_size=15))
@settings(max_examples=60, deadline=None)
def test_paired_t_pvalue_agrees_with_the_interval(d):
    """p < 0.05 exactly when the 95% t-interval excludes 0 (the same test), away from the boundary."""
    p = stats.paired_t_pvalue(d)
    m, lo, hi = stats.t_interval(d)
    assert 0.0 <= p <= 1.0
    if np.std(d) > 1e-9 and abs(p - 0.05) > 1e-9:
        assert (p < 0.05) == (lo > 0 or hi < 0)


def test_holm_hand_computed():
    # sorted 0.01, 0.03, 0.04 with m = 3: 3 x 0.01 = 0.03; max(0.03, 2 x 0.03) = 0.06; max(0.06, 1 x 0.04) = 0.06
    assert stats.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    # NaN is outside the family: m = 2
    out = stats.holm([0.02, math.nan, 0.5])
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.5)
    assert stats.holm([0.6, 0.7]) == [1.0, 1.0] and stats.holm([]) == []


@given(st.lists(st.floats(0, 1), min_size=1, max_size=10))
@settings(max_examples=60, deadline=None)
def test_holm_properties(p):
    a = stats.holm(p)
    m = len(p)
    for pi, ai in zip(p, a):
        assert pi - 1e-15 <= ai <= min(1.0, m * pi) + 1e-12          # between raw and Bonferroni
    order = np.argsort(p, kind="stable")
    assert all(a[order[i]] <= a[order[i + 1]] + 1e-15 for i in range(m - 1))   # monotone in the raw p


def test_clopper_pearson_hand_computed():
    # k = 0: [0, 1 - (a/2)^(1/n)]; n = 10, 95%: 1 - 0.025^0.1 = 0.30850
    lo, hi = stats.clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** 0.1, rel=1e-9)
    # k = n: [(a/2)^(1/n), 1]
    lo, hi = stats.clopper_pearson(10, 10)
    assert lo == pytest.approx(0.025 ** 0.1, rel=1e-9) and hi == 1.0
    # 5 of 100, 95%: the published exact interval [0.01643, 0.11284]
    lo, hi = stats.clopper_pearson(5, 100)
    assert lo == pytest.approx(0.01643, abs=1e-5) and hi == pytest.approx(0.11284, abs=1e-5)
    with pytest.raises(ValueError):
        stats.clopper_pearson(3, 2)


@given(st.lists(finite, min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_sign_flip_properties(d):
    p = stats.sign_flip_pvalue(d)
    assert stats.min_sign_flip_p(len(d)) - 1e-12 <= p <= 1.0
    assert stats.sign_flip_pvalue([-v for v in d]) == pytest.approx(p)       # symmetric in the sign of d
    assert stats.sign_flip_pvalue(list(reversed(d))) == pytest.approx(p)     # order of seeds is irrelevant
    assert stats.sign_flip_pvalue([3.0 * v for v in d]) == pytest.approx(p)  # scale-free


def test_paired_words():
    p = stats.paired([1.1, 1.2, 1.3, 1.4], [1.0, 1.0, 1.0, 1.0])
    assert p.mean == pytest.approx(0.25) and p.word == "higher" and p.n == 4
    assert stats.paired([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]).word == "no difference measured"
    assert stats.paired([0.0, 0.1, -0.2], [0.3, 0.4, 0.2]).word == "lower"
    assert stats.paired([1.0], [0.0]).word == "not measurable"
    with pytest.raises(ValueError, match="pair them by seed"):
        stats.paired([1.0, 2.0], [1.0])


def test_value_at_interpolates_inside_only():
    x, y = [0, 10, 20], [0.0, 1.0, 3.0]
    assert stats.value_at(x, y, 10) == 1.0 and stats.value_at(x, y, 15) == 2.0 and stats.value_at(x, y, 0) == 0.0
    with pytest.raises(ValueError, match="outside the evaluation grid"):
        stats.value_at(x, y, 25)


def test_auc_hand_computed():
    # (10 (0 + 1)/2 + 10 (1 + 3)/2) / 20 = (5 + 20) / 20
    assert stats.normalized_auc([0, 10, 20], [0.0, 1.0, 3.0]) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="strictly increasing"):
        stats.normalized_auc([0, 0, 1], [1, 2, 3])


def test_samples_to_target_censoring():
    x = [0, 10, 20, 30]
    assert stats.samples_to_target(x, [0.5, 0.1, 0.2, 0.3], 0.4) == stats.Passage(0, 0.0, stats.CENSOR_BELOW)
    assert stats.samples_to_target(x, [0.0, 0.5, 0.6, 0.7], 0.4).status == stats.CENSOR_BELOW
    # reached at the third grid point: the grid value, not an interpolated 15
    assert stats.samples_to_target(x, [0.0, 0.1, 0.5, 0.7], 0.4) == stats.Passage(2, 20.0, stats.REACHED)
    never = stats.samples_to_target(x, [0.0, 0.1, 0.2, 0.3], 0.4)
    assert (never.index, never.status) == (4, stats.CENSOR_BEYOND) and math.isnan(never.samples)
    # non-monotone: first passage counts even if the curve falls back
    assert stats.samples_to_target(x, [0.0, 0.1, 0.5, 0.2], 0.4).index == 2
    # a missing evaluation before the passage: not measured, never "not reached"
    assert stats.samples_to_target(x, [0.0, math.nan, 0.5, 0.6], 0.4).status == stats.NOT_MEASURED


@given(st.lists(finite, min_size=2, max_size=9), finite)
@settings(max_examples=80, deadline=None)
def test_samples_to_target_never_off_grid(y, target):
    x = np.arange(len(y), dtype=float) * 7.0
    p = stats.samples_to_target(x, y, target)
    if p.status == stats.CENSOR_BEYOND:
        assert max(y) < target and math.isnan(p.samples)
    else:
        assert p.samples in set(x.tolist()) and y[p.index] >= target and all(v < target for v in y[:p.index])


def test_first_passage_identical_arms_tie():
    x = np.asarray([0, 10, 20, 30.0])
    y = np.asarray([[0.0, 0.3, 0.2, 0.25], [0.0, 0.1, 0.4, 0.3], [0.1, 0.2, 0.3, 0.35]])
    fp = stats.paired_first_passage(x, y, y.copy())
    assert fp.ties == 3 and fp.earlier == fp.later == 0 and fp.p == 1.0 and fp.word == "no difference measured"


@given(st.integers(2, 6), st.integers(3, 8), st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_first_passage_symmetric_in_arms(n, m, seed):
    """Swapping the arms swaps earlier/later and keeps p: the target does not depend on which is the baseline."""
    rng = np.random.default_rng(seed)
    x = np.arange(m) * 10.0
    a, b = rng.normal(size=(n, m)).cumsum(1), rng.normal(size=(n, m)).cumsum(1)
    f, g = stats.paired_first_passage(x, a, b), stats.paired_first_passage(x, b, a)
    assert (f.earlier, f.later, f.ties) == (g.later, g.earlier, g.ties)
    assert f.target == pytest.approx(g.target) and f.p == pytest.approx(g.p)


def test_power_hand_checks():
    # n = 10, sd 1: the textbook paired-t sample size table gives 80% power near effect 0.99 (alpha 0.05)
    d = stats.min_detectable_effect(1.0, 10)
    assert 0.95 < d < 1.02 and stats.t_power(d, 1.0, 10) == pytest.approx(0.8, abs=1e-6)
    assert stats.t_power(0.0, 1.0, 10) == pytest.approx(0.05, abs=1e-9)      # the level at no effect
    assert stats.min_detectable_effect(2.0, 10) == pytest.approx(2 * d, rel=1e-6)   # scales with the noise
    assert stats.min_detectable_effect(1.0, 40) < d
