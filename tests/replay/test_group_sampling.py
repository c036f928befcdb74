"""Whole-group sampling (``replay.sample(group_size=n)``): group frequencies (chi-square), exact ``P(g)``, the
in-group shares ``s_i = n·m_i/m_g`` (hand-computed and as a property), the unbiasedness identity, bad input."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st_

from jaxppo import replay
from tests.replay import _ref
from tests.replay.test_sampling import TD, filled


def _group_probs(P, n):
    """Row probabilities -> group probabilities (groups of n consecutive slots)."""
    return P.reshape(-1, n).sum(-1)


@pytest.mark.parametrize("prioritization, n, batch_size", [("proportional", 2, 8), ("proportional", 4, 8),
                                                           ("rank", 4, 16)])
def test_group_frequencies_match_summed_row_probabilities(prioritization, n, batch_size):
    """Drawn groups (each as n consecutive rows, in order) occur with P(g) = Σ_{i∈g} P(i) (chi-square, and the
    statistic rejects the uniform hypothesis, so it has power)."""
    alpha, eps = 0.7, 1e-3
    st = filled(32, TD, alpha=alpha, eps=eps, prioritization=prioritization)
    keys = jax.random.split(jax.random.key(n), 40_000 // batch_size)
    idx = np.asarray(jax.jit(jax.vmap(lambda k: replay.sample(st, k, batch_size, beta=1.0,
                                                              group_size=n).indices))(keys))
    rows = idx.reshape(len(keys), batch_size // n, n)
    assert (rows == rows[..., :1] + np.arange(n)).all() and (rows[..., 0] % n == 0).all()
    counts = np.bincount(rows[..., 0].ravel() // n, minlength=32 // n)
    expected = _group_probs(_ref.probs(_ref.stored(TD, alpha, eps, prioritization), alpha, prioritization), n)
    assert counts[len(TD) // n:].sum() == 0, "empty groups were drawn"
    stat, df = _ref.chi_square(counts[:len(TD) // n], expected)
    assert stat < _ref.chi_square_critical(df), (stat, df, counts, expected)
    wrong, _ = _ref.chi_square(counts[:len(TD) // n], np.full(len(TD) // n, n / len(TD)))
    assert wrong > _ref.chi_square_critical(df)


class GroupExactTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_groups_of_two(self):
        # stored p = [1, 3, 2, 2, 0, 4] (α = 1, ε = 0), groups {0,1} {2,3} {4,5}: m_g = 4, 4, 4, T = 12.
        # P(g) = 1/3 each; shares s = 2·m_i/m_g = [0.5, 1.5, 1, 1, 0, 2]; slot 4 (mass 0) gets share 0 and
        # weight 0. Row PER weights (κ = 0, β = 1): w_i = m_min / m_i = [1, 1/3, 1/2, 1/2, 0, 1/4].
        st = filled(8, [1.0, 3.0, 2.0, 2.0, 0.0, 4.0], alpha=1.0, eps=0.0, weight_floor=0.0)
        st = replay.set_priorities(st, jnp.array([4]), jnp.array([0.0]))
        s = self.variant(replay.sample, static_argnames=("batch_size", "group_size"))(
            st, jax.random.key(0), batch_size=6, beta=1.0, group_size=2)
        idx = np.asarray(s.indices)
        # 3 strata of mass 4 over the group masses [0,4) [4,8) [8,12): one draw in each group, groups in order
        np.testing.assert_array_equal(idx, np.arange(6))
        np.testing.assert_allclose(s.probs, np.full(6, 1 / 3), rtol=1e-6)
        np.testing.assert_allclose(s.group_share, [0.5, 1.5, 1.0, 1.0, 0.0, 2.0], rtol=1e-6)
        np.testing.assert_allclose(s.weights, [1.0, 1 / 3, 0.5, 0.5, 0.0, 0.25], rtol=1e-6)
        np.testing.assert_array_equal(s.items["x"], idx.astype(np.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_group_size_one_is_item_sampling(self):
        st = filled(16, TD)
        sample = self.variant(replay.sample, static_argnames=("batch_size", "group_size"))
        a = sample(st, jax.random.key(5), batch_size=8, beta=0.4)
        b = sample(st, jax.random.key(5), batch_size=8, beta=0.4, group_size=1)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.group_share, np.ones(8, np.float32))


@settings(max_examples=25, deadline=None)
@given(td=st_.lists(st_.one_of(st_.just(0.0), st_.floats(1e-3, 50.0)), min_size=8, max_size=8),
       n=st_.sampled_from([2, 4]), rank=st_.booleans(), seed=st_.integers(0, 2 ** 16))
def test_unbiased_identity_and_share_bounds(td, n, rank, seed):
    """For every drawn row: (B/n)·P(g)·s_i = B·P(i) (so a row's expected loss weight is that of B item draws),
    with P(i) the item-sampling probability computed independently; shares sum to n over each group; a row of mass
    0 has share 0; rows of a group of equal masses have share 1."""
    prioritization = "rank" if rank else "proportional"
    td = np.asarray(td, np.float64)
    if not (td > 0).any():
        td[0] = 1.0
    st = filled(8, td, alpha=1.0, eps=0.0, prioritization=prioritization)
    zero = np.flatnonzero(td == 0)
    if zero.size:
        st = replay.set_priorities(st, jnp.asarray(zero), jnp.zeros(zero.size))
    stored = _ref.stored(td, 1.0, 0.0, prioritization)
    stored[zero] = 0.0
    P = _ref.probs(stored, 1.0, prioritization)
    s = replay.sample(st, jax.random.key(seed), 8, beta=0.5, group_size=n)
    idx = np.asarray(s.indices)
    share, pg = np.asarray(s.group_share, np.float64), np.asarray(s.probs, np.float64)
    np.testing.assert_allclose(pg * share / n, P[idx], rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(share.reshape(-1, n).sum(-1), n, rtol=2e-5)
    assert (share[P[idx] == 0] == 0).all() and (np.asarray(s.weights)[P[idx] == 0] == 0).all()
    np.testing.assert_allclose(pg, _group_probs(P, n)[idx // n], rtol=2e-5)


def test_bad_group_size():
    st = filled(16, TD)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="group_size must be a positive integer"):
            replay.sample(st, jax.random.key(0), 8, beta=0.5, group_size=bad)
    with pytest.raises(ValueError, match="multiples of group_size=3"):
        replay.sample(st, jax.random.key(0), 8, beta=0.5, group_size=3)
