"""PF-PPO filter weights under prioritized replay: the buffer samples with ``P(i) ∝ f_i·q_i`` and the step's
weights correct only the priority part, so the expected gradient share stays ``∝ f_i·q_i^(1−β)`` (proportional and
rank prioritization, 0/1 filters, uniform sampling). Exact and cheap: replay-level checks of what prepare stores."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo import replay as replay_lib
from jaxppo.replay.filtered import filtered_stored_priority, filtered_weights

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALPHA, EPS = 0.6, 1e-6
# jitted: draws of more items than the buffer holds (with replacement) are only refused eagerly
_sample_jit = jax.jit(replay_lib.sample, static_argnames="batch_size")


# ------------------------------------------------------------------------------------ 1. PF-PPO under PER
def _buffer(td_abs, f, prioritization="proportional", weight_floor=0.0):
    """A 4..n-item buffer holding the stored values prepare writes (``filtered_stored_priority``). ``weight_floor``
    0 (the classic PER weights, whose exact shares these tests check) unless given."""
    n = len(f)
    rs = replay_lib.init(n, {"filter_w": jnp.zeros((), jnp.float32)}, alpha=ALPHA, eps=EPS,
                         prioritization=prioritization, weight_floor=weight_floor)
    rs = replay_lib.add(rs, {"filter_w": jnp.asarray(f, jnp.float32)})
    stored = filtered_stored_priority(rs, jnp.asarray(td_abs, jnp.float32), jnp.asarray(f, jnp.float32))
    return replay_lib.set_priorities(rs, jnp.arange(n), stored)


def _exact_shares(rs, f, beta, *, jit):
    """``P(i)·w_i`` normalised, from the exact ``probs`` the sampler returns and the step's loss weights
    (``filtered_weights``), collected over draws until every sampleable slot was seen."""
    n = len(f)
    weights_fn = filtered_weights
    sample_fn = functools.partial(replay_lib.sample, batch_size=n)
    if jit:
        weights_fn, sample_fn = jax.jit(filtered_weights), jax.jit(sample_fn)
    prob, wt = {}, {}
    for k in range(200):
        smp = sample_fn(rs, jax.random.PRNGKey(k), beta=jnp.float32(beta))
        w = weights_fn(rs, smp, jnp.asarray(f, jnp.float32), jnp.float32(beta))
        for i, p, x in zip(np.asarray(smp.indices), np.asarray(smp.probs), np.asarray(w)):
            assert prob.setdefault(int(i), float(p)) == pytest.approx(float(p), rel=1e-6)
            assert wt.setdefault(int(i), float(x)) == pytest.approx(float(x), rel=1e-6)
        if len(prob) == int(np.sum(np.asarray(f) > 0)):
            break
    share = np.zeros(n)
    for i in prob:
        share[i] = prob[i] * wt[i]
    assert all(0.0 < wt[i] <= 1.0 + 1e-6 for i in wt)
    return share / share.sum(), prob, wt


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_pow_filter_survives_per_correction_equal_priorities(beta, jit):
    """Equal |δ|, f = [1, 2, 4, 8]: the intended share is f/Σf = [.067 .133 .267 .533] at EVERY β
    (before the fix: [.25 .25 .25 .25] at β = 1)."""
    f = [1.0, 2.0, 4.0, 8.0]
    share, prob, _ = _exact_shares(_buffer([0.5] * 4, f), f, beta, jit=jit)
    np.testing.assert_allclose(share, [1 / 15, 2 / 15, 4 / 15, 8 / 15], rtol=1e-5)
    np.testing.assert_allclose([prob[i] for i in range(4)], np.array(f) / 15, rtol=1e-5)   # P(i) ∝ f_i q_i


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_pow_filter_shares_with_unequal_priorities(beta):
    """share_i ∝ f_i·q_i^(1−β), q_i = (|δ_i| + ε)^α (independent numpy formula)."""
    td, f = np.array([0.1, 2.0, 0.7, 0.3]), np.array([3.0, 0.5, 1.0, 2.0])
    share, _, _ = _exact_shares(_buffer(td, f), f, beta, jit=True)
    want = f * ((td + EPS) ** ALPHA) ** (1 - beta)
    np.testing.assert_allclose(share, want / want.sum(), rtol=1e-5)


def test_the_old_scheme_loses_the_filter_at_beta_one():
    """Contrast (the bug): storing (|δ|·f + ε)^α and correcting the whole sampling distribution with the
    sampler's own PER weights gives uniform shares at β = 1."""
    f = np.array([1.0, 2.0, 4.0, 8.0])
    rs = replay_lib.init(4, {"x": jnp.zeros(())}, alpha=ALPHA, eps=EPS)
    rs = replay_lib.add(rs, {"x": jnp.zeros(4)}, priorities=jnp.asarray(0.5 * f, jnp.float32))
    smp = _sample_jit(rs, jax.random.PRNGKey(0), 64, beta=1.0)
    share = {int(i): float(p * w) for i, p, w in zip(smp.indices, smp.probs, smp.weights)}
    assert len(share) == 4 and np.allclose(list(share.values()), list(share.values())[0], rtol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_rank_prioritization_keeps_the_filter(beta):
    """Rank: sampled by rank of |δ|+ε (f only switches items off), loss weight = rank PER weight · f/max f:
    share_i ∝ f_i · P_rank(i)^(1−β) with P_rank(i) ∝ rank(i)^(−α) (numpy)."""
    td, f = np.array([0.1, 2.0, 0.7, 0.3]), np.array([3.0, 0.5, 1.0, 2.0])
    share, _, _ = _exact_shares(_buffer(td, f, "rank"), f, beta, jit=False)
    rank = np.empty(4)
    rank[np.argsort(-td)] = np.arange(1, 5)
    p_rank = rank ** -ALPHA / np.sum(rank ** -ALPHA)
    want = f * p_rank ** (1 - beta)
    np.testing.assert_allclose(share, want / want.sum(), rtol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_zero_one_filters_are_plain_per_over_the_kept_items(beta):
    """best_of_n & co (0/1 weights): a filtered-out item is never drawn and the loss weights equal the
    sampler's own PER weights over the kept items."""
    td, f = np.array([0.1, 2.0, 0.7, 0.3]), np.array([1.0, 0.0, 1.0, 1.0])
    rs = _buffer(td, f)
    share, prob, wt = _exact_shares(rs, f, beta, jit=True)
    assert 1 not in prob and share[1] == 0.0
    want = f * ((td + EPS) ** ALPHA) ** (1 - beta)
    np.testing.assert_allclose(share, want / want.sum(), rtol=1e-5)
    smp = replay_lib.sample(rs, jax.random.PRNGKey(3), 4, beta=beta)
    np.testing.assert_allclose(filtered_weights(rs, smp, jnp.asarray(f, jnp.float32), beta), smp.weights, rtol=1e-6)


def test_uniform_sampling_stores_the_filter_weights():
    """Uniform path (prepare stores f_i itself, weights 1): P(i) ∝ f_i, so share ∝ f_i."""
    f = np.array([1.0, 2.0, 4.0, 8.0])
    rs = replay_lib.init(4, {"x": jnp.zeros(())}, alpha=ALPHA, eps=EPS)
    rs = replay_lib.add(rs, {"x": jnp.zeros(4)})
    rs = replay_lib.set_priorities(rs, jnp.arange(4), jnp.asarray(f, jnp.float32))
    smp = _sample_jit(rs, jax.random.PRNGKey(0), 64, beta=0.0)
    assert set(np.asarray(smp.indices).tolist()) == {0, 1, 2, 3}
    for i, p in zip(np.asarray(smp.indices), np.asarray(smp.probs)):
        assert p == pytest.approx(f[i] / f.sum(), rel=1e-6)


@settings(max_examples=15, deadline=None)
@given(td=st.lists(st.floats(0.0, 5.0), min_size=4, max_size=4),
       f=st.lists(st.floats(0.05, 10.0), min_size=4, max_size=4), beta=st.floats(0.0, 1.0))
@pytest.mark.parametrize("kappa", [0.0, 0.1])
def test_property_share_is_filter_times_priority_power(td, f, beta, kappa):
    """``P(i)·w_i ∝ f_i q_i^(1−β)`` among the items whose priority mass is at least ``κ·max`` (all of them at κ = 0;
    below it the weight floor truncates the weight to 1, ``jaxppo.replay.weights``)."""
    td, f = np.array(td), np.array(f)
    rs = _buffer(td, f, weight_floor=kappa)
    smp = _sample_all(rs)
    w = np.asarray(_weights(rs, smp, jnp.asarray(f, jnp.float32), jnp.float32(beta)))
    idx, probs = np.asarray(smp.indices), np.asarray(smp.probs)
    share = np.zeros(4)
    share[idx] = probs * w
    q = (td.astype(np.float32) + np.float32(EPS)) ** ALPHA
    # a slot of tiny mass may be missed: compare ratios among the seen ones above the floor
    seen = np.isin(np.arange(4), idx) & (q >= kappa * q.max() * (1 + 1e-6))
    np.testing.assert_allclose(probs, (f * q)[idx] / np.sum(f * q), rtol=2e-4)     # P(i) ∝ f_i q_i
    want = f * q ** (1 - beta)
    np.testing.assert_allclose(share[seen] / share[seen].sum(), want[seen] / want[seen].sum(), rtol=2e-4)
    assert np.all(w > 0) and np.all(w <= 1 + 1e-6)


_weights = jax.jit(filtered_weights)


def _sample_all(rs):
    """A draw that contains every slot: stratified over 4096 draws (each slot has mass >= ~1e-3 here)."""
    return _sample_jit(rs, jax.random.PRNGKey(0), 4096, beta=0.0)
