"""PER weights with a relative floor (jaxppo.replay.weights): bounded below whatever sits at the priority floor."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import strategies as st

from jaxppo import replay
from jaxppo.replay.filtered import filtered_stored_priority, filtered_weights
from jaxppo.replay.weights import check_weight_floor, per_weights, reference_mass

EXAMPLE = {"x": jnp.zeros((), jnp.float32)}


def buffer(td, *, weight_floor, prioritization="proportional", alpha=0.6, eps=1e-6, capacity=None):
    capacity = capacity or len(td)
    s = replay.init(capacity, EXAMPLE, alpha=alpha, eps=eps, prioritization=prioritization, weight_floor=weight_floor)
    return replay.add(s, {"x": jnp.arange(len(td), dtype=jnp.float32)}, priorities=jnp.asarray(td, jnp.float32))


class PerWeightsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # masses [0.001, 0.5, 1, 2, 4], κ = 0.2: κ·m_max = 0.8, the smallest mass >= 0.8 is m_ref = 1;
        # β = 1: w = min(1, 1/m) = [1, 1, 1, .5, .25]; β = 0.5: the square roots
        mass = jnp.array([0.001, 0.5, 1.0, 2.0, 4.0])
        f = self.variant(lambda m, b: per_weights(m, reference_mass(m, m > 0, 0.2), b))
        np.testing.assert_allclose(f(mass, 1.0), [1.0, 1.0, 1.0, 0.5, 0.25], rtol=1e-6)
        np.testing.assert_allclose(f(mass, 0.5), [1.0, 1.0, 1.0, np.sqrt(0.5), 0.5], rtol=1e-6)
        assert float(self.variant(reference_mass)(mass, mass > 0, 0.2)) == 1.0
        # mass 0 (switched off) and an empty buffer (m_ref = inf): weight 0
        assert float(per_weights(jnp.array([0.0]), 1.0, 1.0)[0]) == 0.0
        assert float(per_weights(jnp.array([1.0]), jnp.inf, 1.0)[0]) == 0.0
        assert float(reference_mass(mass, jnp.zeros(5, bool), 0.2)) == np.inf

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_floor_is_the_classic_weight(self):
        # κ = 0: m_ref = m_min = 1e-4; masses [1e-4, 0.5, 1], β = 1 -> [1, 2e-4, 1e-4] (the collapse the floor prevents)
        mass = jnp.array([1e-4, 0.5, 1.0])
        w = self.variant(lambda m: per_weights(m, reference_mass(m, m > 0, 0.0), 1.0))(mass)
        np.testing.assert_allclose(w, [1.0, 2e-4, 1e-4], rtol=1e-5)


def test_check_weight_floor():
    assert check_weight_floor(0) == 0.0 and check_weight_floor(1) == 1.0
    for bad in (-0.1, 1.5, "x", None):
        with pytest.raises(ValueError, match="weight_floor"):
            check_weight_floor(bad)
    with pytest.raises(ValueError, match="weight_floor"):
        replay.init(4, EXAMPLE, weight_floor=2.0)


@given(n_info=st.integers(1, 12), n_floor=st.integers(0, 116), beta=st.floats(0.0, 1.0),
       kappa=st.sampled_from([0.01, 0.1, 0.3, 1.0]), prioritization=st.sampled_from(["proportional", "rank"]),
       seed=st.integers(0, 2 ** 16), scale=st.floats(0.01, 10.0))
def test_bounded_below_with_any_fraction_at_the_floor(n_info, n_floor, beta, kappa, prioritization, seed, scale):
    """Every sampled weight is in [κ^β, 1] whatever fraction of the buffer has |δ| = 0 (0%..99%); among the items
    with mass >= m_ref the ratios are Schaul's (P(j) / P(i))^β."""
    rng = np.random.default_rng(seed)
    n_floor = max(n_floor, 16 - n_info)           # at least one batch of filled slots
    td = np.concatenate([rng.uniform(0.05, 1.0, n_info) * scale, np.zeros(n_floor)])
    rng.shuffle(td)
    s = buffer(td, weight_floor=kappa, prioritization=prioritization, capacity=128)
    smp = replay.sample(s, jax.random.key(seed), 16, beta=beta)
    w = np.asarray(smp.weights, np.float64)
    assert np.all(w <= 1.0 + 1e-6)
    assert np.all(w >= kappa ** beta * (1 - 1e-5)), (w.min(), kappa ** beta)
    p = np.asarray(smp.probs, np.float64)
    unclipped = w < 1.0 - 1e-6        # these have mass above m_ref: exact relative correction among them
    if unclipped.sum() >= 2:
        i, j = np.flatnonzero(unclipped)[:2]
        np.testing.assert_allclose(w[i] / w[j], (p[j] / p[i]) ** beta, rtol=1e-4)


@pytest.mark.parametrize("prioritization", ["proportional", "rank"])
def test_grpo_like_buffer_does_not_collapse(prioritization):
    """Half the groups have equal rewards (advantage 0, priority ε): with the default κ = 0.1 the informative items
    keep weights >= 0.1^β; the classic weights (κ = 0) sink to ~(ε^α / m)^β (proportional), the collapse that
    stopped GRPO + PER from learning."""
    rng = np.random.default_rng(0)
    td = np.where(np.arange(256) % 2 == 0, 0.0, rng.uniform(0.2, 1.5, 256))
    beta = 1.0
    default = buffer(td, weight_floor=replay.init(1, EXAMPLE).weight_floor, prioritization=prioritization)
    assert default.weight_floor == pytest.approx(0.1)
    w = np.asarray(replay.sample(default, jax.random.key(1), 64, beta=beta).weights)
    assert w.min() >= 0.1 ** beta - 1e-6 and w.mean() > 0.3, w
    if prioritization == "proportional":
        classic = buffer(td, weight_floor=0.0)
        wc = np.asarray(replay.sample(classic, jax.random.key(1), 64, beta=beta).weights)
        assert wc.max() < 1e-2, wc     # what the floor prevents


def test_filtered_weights_bounded_with_floor_items():
    """PF-PPO filter weights under PER: the same bound holds for the priority part."""
    rng = np.random.default_rng(3)
    n = 64
    td = np.where(np.arange(n) % 4 == 0, rng.uniform(0.1, 2.0, n), 0.0)
    f = np.where(np.arange(n) % 8 == 7, 0.0, 1.0).astype(np.float32)
    s = replay.init(n, EXAMPLE, weight_floor=0.1)
    s = replay.add(s, {"x": jnp.arange(n, dtype=jnp.float32)})
    s = replay.set_priorities(s, jnp.arange(n), filtered_stored_priority(s, jnp.asarray(td, jnp.float32),
                                                                         jnp.asarray(f)))
    smp = replay.sample(s, jax.random.key(0), 32, beta=1.0)
    w = np.asarray(filtered_weights(s, smp, jnp.asarray(f), 1.0))
    assert np.all(f[np.asarray(smp.indices)] > 0)
    assert w.min() >= 0.1 - 1e-6 and w.max() <= 1.0 + 1e-6, w


def test_floor_and_clipped_fractions_hand_computed():
    # 8 items, 3 with |δ| = 0 (floor), α = 1, ε = 1e-6: masses [ε, 1, ε, 2, 4, ε, 0.5, 8]; κ = 0.1 -> m_ref = 0.8:
    # clipped (mass < 0.8): the 3 floor items and the 0.5 one = 4 of 8
    td = np.array([0.0, 1.0, 0.0, 2.0, 4.0, 0.0, 0.5, 8.0])
    s = buffer(td, weight_floor=0.1, alpha=1.0)
    m = replay.metrics(s)
    assert float(m["floor_fraction"]) == pytest.approx(3 / 8)
    assert float(m["weight_clipped_fraction"]) == pytest.approx(4 / 8)
    # rank, α = 1: masses 1/r, κ = 0.1 -> clipped when 1/r < max(1/8, 0.1) = 0.125: none of ranks 1..8
    r = replay.metrics(buffer(td, weight_floor=0.1, alpha=1.0, prioritization="rank"))
    assert float(r["floor_fraction"]) == pytest.approx(3 / 8) and float(r["weight_clipped_fraction"]) == 0.0
