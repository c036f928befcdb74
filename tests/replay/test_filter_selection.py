"""The binned R² filter-selection tool on constructed data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo import replay
from jaxppo.replay import filter_selection


def numpy_binned_r2(rewards, actual, weights, num_bins):
    """Reference: equal-width bins over [min, max] (top edge inclusive), weighted bin means, then the
    R² of the bin-weight-weighted least-squares line (np.polyfit with w = sqrt(W))."""
    r, a, w = (np.asarray(x, np.float64) for x in (rewards, actual, weights))
    edges = np.linspace(r.min(), r.max(), num_bins + 1)
    b = np.clip(np.searchsorted(edges, r, side="right") - 1, 0, num_bins - 1)
    W = np.bincount(b, w, num_bins)
    keep = W > 0
    x = np.bincount(b, w * r, num_bins)[keep] / W[keep]
    y = np.bincount(b, w * a, num_bins)[keep] / W[keep]
    W = W[keep]
    c1, c0 = np.polyfit(x, y, 1, w=np.sqrt(W))
    resid = np.sum(W * (y - (c0 + c1 * x)) ** 2)
    ybar = np.sum(W * y) / W.sum()
    return 1.0 - resid / np.sum(W * (y - ybar) ** 2)


def constructed(n_groups=200, n=4, seed=0):
    """Rewards are faithful where high (actual = reward) and pure noise where low (reward < 0.5)."""
    rng = np.random.default_rng(seed)
    rewards = rng.uniform(0, 1, size=n_groups * n)
    actual = np.where(rewards >= 0.5, rewards, rng.uniform(0, 1, size=rewards.shape))
    groups = np.repeat(np.arange(n_groups), n)
    return rewards.astype(np.float32), actual.astype(np.float32), groups.astype(np.int32)


def test_hand_cases():
    r = jnp.array([0.0, 1.0, 2.0, 3.0])
    edges = filter_selection.bin_edges(r, 2)
    np.testing.assert_allclose(edges, [0.0, 1.5, 3.0])
    # bins {0, 1} and {2, 3}: x = (0.5, 2.5), y = (1, 2) -> two points on a line: R² = 1
    assert float(filter_selection.binned_r2(r, jnp.array([0.0, 2.0, 1.0, 3.0]), jnp.ones(4), edges)) == \
        pytest.approx(1.0)
    # undefined cases are NaN: constant actual, or a single non-empty bin
    assert np.isnan(filter_selection.binned_r2(r, jnp.ones(4), jnp.ones(4), edges))
    assert np.isnan(filter_selection.binned_r2(r, r, jnp.array([1.0, 1.0, 0.0, 0.0]), edges))


@pytest.mark.parametrize("name", ["none", "best_of_n", "best_worst", "pow"])
def test_matches_numpy_reference(name):
    rewards, actual, groups = constructed(seed=1)
    w = replay.filter_weights(name, jnp.asarray(rewards), jnp.asarray(groups), 200, weight_pow=2.0)
    edges = filter_selection.bin_edges(rewards, 10)
    got = float(filter_selection.binned_r2(rewards, actual, w, edges))
    np.testing.assert_allclose(got, numpy_binned_r2(rewards, actual, np.asarray(w), 10), rtol=1e-4)


def test_filter_r2_ranks_filters_on_constructed_data():
    rewards, actual, groups = constructed()
    out = replay.filter_r2(rewards, actual, groups, 200, key=jax.random.key(0), num_bins=10,
                           weight_pow=4.0)
    assert set(out) == set(replay.PF_FILTERS.names())
    assert all(0.0 <= v <= 1.0 for v in out.values())
    # best-of-N keeps mostly high-reward (faithful) responses: its R² beats no filtering and best-worst
    assert out["best_of_n"] > out["none"] + 0.05
    assert out["best_of_n"] > out["best_worst"]
    # a perfectly faithful reward gives R² = 1 for every filter
    exact = replay.filter_r2(rewards, 3 * rewards + 1, groups, 200, key=jax.random.key(0))
    assert all(v == pytest.approx(1.0, abs=1e-4) for v in exact.values()), exact


def test_bad_input():
    r, a, g = constructed(n_groups=3)
    with pytest.raises(ValueError, match="1-D of the same length"):
        replay.filter_r2(r, a[:-1], g, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="num_bins must be an int >= 2"):
        replay.filter_r2(r, a, g, 3, key=jax.random.key(0), num_bins=1)
    with pytest.raises(ValueError, match="actual scores contain NaN"):
        replay.filter_r2(r, np.full_like(a, np.nan), g, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="unknown pf_ppo filter .best.; known: best_of_n"):
        replay.filter_r2(r, a, g, 3, key=jax.random.key(0), filters=("best",))
