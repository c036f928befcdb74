"""Sampling: frequencies match P(i) (chi-square), exact probs, PER weights, stratification, zero priority."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxppo import replay
from tests.replay import _ref

EXAMPLE = {"x": jnp.zeros((), jnp.float32)}


def filled(capacity, td, *, alpha=0.6, eps=1e-6, prioritization="proportional", n=None, weight_floor=0.1):
    """A buffer holding ``n`` (default ``len(td)``) items ``x = slot`` with priorities from ``td``."""
    n = len(td) if n is None else n
    st = replay.init(capacity, EXAMPLE, alpha=alpha, eps=eps, prioritization=prioritization,
                     weight_floor=weight_floor)
    return replay.add(st, {"x": jnp.arange(n, dtype=jnp.float32)}, priorities=jnp.asarray(td, jnp.float32))


def draw_counts(st, n_batches, batch_size, seed=0):
    keys = jax.random.split(jax.random.key(seed), n_batches)
    idx = jax.jit(jax.vmap(lambda k: replay.sample(st, k, batch_size, beta=1.0).indices))(keys)
    return np.bincount(np.asarray(idx).ravel(), minlength=st.capacity)


TD = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 0.3, 0.3, 8.0, 0.05, 1.5, 3.0, 0.7, 0.2, 5.0, 0.01], np.float64)


@pytest.mark.parametrize("prioritization, batch_size", [("proportional", 7), ("rank", 16)])
def test_chi_square_frequencies(prioritization, batch_size):
    alpha, eps = 0.7, 1e-3
    st = filled(32, TD, alpha=alpha, eps=eps, prioritization=prioritization)
    counts = draw_counts(st, 40_000 // batch_size, batch_size, seed=batch_size)
    expected = _ref.probs(_ref.stored(TD, alpha, eps, prioritization), alpha, prioritization)
    assert counts[len(TD):].sum() == 0, "empty slots were drawn"
    stat, df = _ref.chi_square(counts[:len(TD)], expected)
    assert stat < _ref.chi_square_critical(df), (stat, df, counts, expected)
    # the same statistic rejects a wrong hypothesis (here: uniform), so the check has power
    wrong, _ = _ref.chi_square(counts[:len(TD)], np.full(len(TD), 1 / len(TD)))
    assert wrong > _ref.chi_square_critical(df)


def test_rank_frequencies_ignore_magnitudes():
    """Rank-based P depends on the order only: scaling a top priority 1000x changes nothing."""
    a = filled(32, TD, prioritization="rank")
    td2 = TD.copy()
    td2[8] *= 1000.0
    b = filled(32, td2, prioritization="rank")
    key = jax.random.key(3)
    sa, sb = replay.sample(a, key, 16, beta=0.5), replay.sample(b, key, 16, beta=0.5)
    np.testing.assert_array_equal(sa.indices, sb.indices)
    np.testing.assert_array_equal(sa.probs, sb.probs)


class ExactValuesTest(parameterized.TestCase):
    """probs, weights and indices, jitted and not."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(prioritization=("proportional", "rank"), weight_floor=(0.0, 0.1, 0.5))
    def test_probs_and_weights_exact(self, prioritization, weight_floor):
        alpha, eps, beta = 0.6, 1e-6, 0.4
        st = filled(16, TD, alpha=alpha, eps=eps, prioritization=prioritization, weight_floor=weight_floor)
        st = replay.set_priorities(st, jnp.array([9]), jnp.array([0.0]))        # slot 9 switched off
        p_store = _ref.stored(TD, alpha, eps, prioritization)
        p_store[9] = 0.0
        P = _ref.probs(p_store, alpha, prioritization)
        sample = self.variant(replay.sample, static_argnames="batch_size")
        s = sample(st, jax.random.key(1), batch_size=16, beta=beta)
        idx = np.asarray(s.indices)
        assert 9 not in idx
        np.testing.assert_allclose(s.probs, P[idx], rtol=2e-5)
        np.testing.assert_allclose(s.weights, _ref.weights(P, idx, beta, weight_floor), rtol=2e-5)
        np.testing.assert_array_equal(s.items["x"], idx.astype(np.float32))
        assert np.all(np.asarray(s.weights) <= 1.0) and np.all(np.asarray(s.weights) > 0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_weights_hand_computed(self):
        # stored p = (td + 0)^1 = [1, 2, 4, 1]; P = [1, 2, 4, 1] / 8; least likely P_min = 1/8.
        # w_i = (N P_i)^-β / (N P_min)^-β = (P_min / P_i)^β: β = 0.5 -> item 2 (P = 1/2): (1/4)^0.5 = 0.5
        st = filled(8, [1.0, 2.0, 4.0, 1.0], alpha=1.0, eps=0.0, weight_floor=0.0)
        sample = self.variant(replay.sample, static_argnames="batch_size")
        s = sample(st, jax.random.key(0), batch_size=4, beta=0.5)
        # strata of mass 2 each over the cumulative masses [0,1) [1,3) [3,7) [7,8):
        # [0,2) -> 0 or 1, [2,4) -> 1 or 2, [4,6) -> 2, [6,8) -> 2 or 3
        idx = np.asarray(s.indices)
        assert idx[0] in (0, 1) and idx[1] in (1, 2) and idx[2] == 2 and idx[3] in (2, 3)
        P = np.array([1, 2, 4, 1]) / 8
        w = {0: 1.0, 1: np.sqrt(0.5), 2: 0.5, 3: 1.0}
        np.testing.assert_allclose(s.probs, P[idx], rtol=1e-6)
        np.testing.assert_allclose(s.weights, [w[i] for i in idx], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_weights_hand_computed_with_floor(self):
        # the same buffer with κ = 0.5: m_max = 4, m_ref = max(m_min = 1, 0.5·4) = 2; w = min(1, (2 / m_i)^0.5):
        # items 0 and 3 (m = 1) -> 1, item 1 (m = 2) -> 1, item 2 (m = 4) -> sqrt(1/2)
        st = filled(8, [1.0, 2.0, 4.0, 1.0], alpha=1.0, eps=0.0, weight_floor=0.5)
        s = self.variant(replay.sample, static_argnames="batch_size")(st, jax.random.key(0), batch_size=4, beta=0.5)
        w = {0: 1.0, 1: 1.0, 2: np.sqrt(0.5), 3: 1.0}
        np.testing.assert_allclose(s.weights, [w[i] for i in np.asarray(s.indices)], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_beta_zero_gives_unit_weights(self):
        st = filled(16, TD)
        s = self.variant(replay.sample, static_argnames="batch_size")(st, jax.random.key(2), batch_size=8,
                                                                      beta=0.0)
        np.testing.assert_array_equal(s.weights, np.ones(8, np.float32))


def test_stratified_one_draw_per_stratum():
    """Equal masses and B = N: every item exactly once, in order. Masses [3, 1, 0, 0], B = 4: [0, 0, 0, 1]."""
    st = filled(8, np.ones(8), alpha=1.0, eps=0.0)
    for seed in range(5):
        np.testing.assert_array_equal(replay.sample(st, jax.random.key(seed), 8, beta=1.0).indices,
                                      np.arange(8))
    st = filled(4, [3.0, 1.0, 0.0, 0.0], alpha=1.0, eps=0.0)
    for seed in range(5):
        np.testing.assert_array_equal(replay.sample(st, jax.random.key(seed), 4, beta=1.0).indices,
                                      [0, 0, 0, 1])


def test_stratified_draw_lies_in_its_stratum():
    """Draw j's cumulative-mass interval [c_{i-1}, c_i) meets stratum [jT/B, (j+1)T/B)."""
    rng = np.random.default_rng(0)
    td = rng.exponential(size=200)
    st = filled(256, td, alpha=0.6, eps=1e-6, n=200)
    p = _ref.stored(td, 0.6, 1e-6)
    c = np.concatenate([[0.0], np.cumsum(p)])
    total, b = c[-1], 50
    for seed in range(4):
        idx = np.asarray(replay.sample(st, jax.random.key(seed), b, beta=1.0).indices)
        lo, hi = np.arange(b) * total / b, np.arange(1, b + 1) * total / b
        tol = 1e-5 * total
        assert np.all(c[idx] < hi + tol) and np.all(c[idx + 1] > lo - tol), idx
        assert np.all(np.diff(idx) >= 0)


@pytest.mark.parametrize("prioritization", ["proportional", "rank"])
def test_zero_priority_never_drawn(prioritization):
    # eps = 0 and |δ| = 0 stores priority 0; set_priorities(…, 0) switches items off; empty slots are 0
    td = np.array([0.0, 1.0, 0.0, 2.0, 0.5, 0.0, 1e-3, 3.0])
    st = filled(16, td, alpha=0.6, eps=0.0, prioritization=prioritization)
    st = replay.set_priorities(st, jnp.array([3]), jnp.array([0.0]))
    counts = draw_counts(st, 500, 8, seed=7)
    never = [0, 2, 3, 5, *range(8, 16)]
    assert counts[never].sum() == 0, counts
    assert np.all(counts[[1, 4, 6, 7]] > 0)


def test_tiny_priority_next_to_huge_is_drawn_with_its_probability():
    """A 1e-6 share is neither lost nor inflated (the residual keeps per-level precision)."""
    td = np.array([1e6, 1.0, 1e6, 1e6])
    st = filled(4, td, alpha=1.0, eps=0.0)
    counts = draw_counts(st, 100_000, 4, seed=11)      # 400k draws: expected ~0.13 draws of item 1
    assert counts[1] <= 5
    st = filled(4, [1.0, 1.0, 1e-4, 1.0], alpha=1.0, eps=0.0)
    counts = draw_counts(st, 100_000, 4, seed=12)      # expected ~13 draws of item 2
    assert 2 <= counts[2] <= 35, counts


def test_sample_under_jit_on_empty_buffer_returns_zero_probs():
    st = replay.init(8, EXAMPLE)
    s = jax.jit(lambda s, k: replay.sample(s, k, 4, beta=1.0))(st, jax.random.key(0))
    np.testing.assert_array_equal(s.probs, np.zeros(4))
    np.testing.assert_array_equal(s.weights, np.zeros(4))


# ------------------------------------------------------------- the descent over a top row alone
# Tops of <= 8 nodes go through the per-row variadic reduction, wider ones (a mesh of many shards)
# through a count against the shared prefix: both are checked here on the same inputs.

def _draw_top(p, batch_size, n_keys, seed):
    from jaxppo.replay.sampling import stratified_descent
    keys = jax.random.split(jax.random.key(seed), n_keys)
    f = jax.jit(jax.vmap(lambda k: stratified_descent(jnp.asarray(p, jnp.float32), None, 0, k, batch_size)))
    return f(keys)


@pytest.mark.parametrize("n", [6, 8, 40, 128])
def test_top_row_frequencies_and_masses(n):
    rng = np.random.default_rng(n)
    p = rng.exponential(size=n).astype(np.float32)
    p[::5] = 0.0
    idx, total, mass = _draw_top(p, 16, 4000, seed=n)
    idx = np.asarray(idx).ravel()
    assert np.all(p[idx] > 0), "a zero-mass node was drawn"
    np.testing.assert_array_equal(np.asarray(mass).ravel(), p[idx])          # the mass read at the draw
    np.testing.assert_allclose(np.asarray(total)[0], p.astype(np.float64).sum(), rtol=1e-6)
    counts = np.bincount(idx, minlength=n)
    stat, df = _ref.chi_square(counts, p / p.astype(np.float64).sum())
    assert stat < _ref.chi_square_critical(df), (stat, df)


@pytest.mark.parametrize("pad", [0, 12])
def test_top_row_stratified_hand_case(pad):
    """Masses [3, 1, 0, 0] (+ ``pad`` zero nodes, which takes the wide path), B = 4: strata
    [0,1), [1,2), [2,3) lie in node 0 and [3,4) in node 1, whatever the key."""
    p = np.array([3.0, 1.0, 0.0, 0.0] + [0.0] * pad, np.float32)
    idx, _, _ = _draw_top(p, 4, 20, seed=pad)
    assert np.asarray(idx).tolist() == [[0, 0, 0, 1]] * 20


def test_top_row_point_past_the_end_takes_the_last_positive_node():
    """Trailing zero nodes are never drawn, even for the last stratum (whose point is closest to T)."""
    p = np.array([1.0, 2.0, 0.5] + [0.0] * 29, np.float32)
    idx, _, _ = _draw_top(p, 64, 200, seed=1)
    assert set(np.unique(np.asarray(idx)).tolist()) == {0, 1, 2}


@pytest.mark.parametrize("n", [6, 32])
def test_point_at_or_past_the_row_end_takes_the_last_positive_child(n):
    """Round-off can leave a residual at or past a row's prefix end; the choice is then the last
    positive child (never a trailing zero), for both the per-row and the shared-top paths."""
    from jaxppo.replay import sampling
    p = np.zeros(n, np.float32)
    p[[1, 3]] = [2.0, 1.0]
    hi = jnp.array([3.0, 3.5, 1e9, 0.0, 2.5], jnp.float32)     # total 3: three points at/past the end
    lo = jnp.zeros(5, jnp.float32)
    rows = jnp.broadcast_to(jnp.asarray(p), (5, n))
    child, _, _, mass = sampling._choose_rows(rows, hi, lo)
    np.testing.assert_array_equal(child, [3, 3, 3, 1, 3])
    np.testing.assert_array_equal(mass, [1.0, 1.0, 1.0, 2.0, 1.0])
    node, h2, l2, mass = sampling._choose_top(jnp.asarray(p), hi, lo)
    np.testing.assert_array_equal(node, [3, 3, 3, 1, 3])
    np.testing.assert_array_equal(mass, [1.0, 1.0, 1.0, 2.0, 1.0])
    r = np.asarray(h2) + np.asarray(l2)                         # residual clamped into [0, mass)
    assert np.all(r >= 0) and np.all(r < np.asarray(mass))


def test_all_zero_row_picks_child_zero_with_zero_mass():
    from jaxppo.replay import sampling
    child, _, _, mass = sampling._choose_rows(jnp.zeros((3, 8)), jnp.ones(3), jnp.zeros(3))
    np.testing.assert_array_equal(child, [0, 0, 0])
    np.testing.assert_array_equal(mass, [0.0, 0.0, 0.0])
