"""aggregate / policy_loss / value_loss: hand cases, reference, gradients, properties, errors."""

from __future__ import annotations

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.ops import aggregate, policy_loss, value_loss
from jaxppo.ops.losses import AGG_MODES
from tests.ops import reference as ref
from tests.ops._data import random_inputs


class AggregateTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # loss = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], mask = [[1, 1, 0], [1, 0, 0], [0, 0, 0]] (row 2 fully masked)
        # token-mean = (1+2+4)/3 = 7/3 ; row sums [3, 4], row means [1.5, 4] over the 2 non-empty rows:
        # seq-mean-token-sum = 3.5 ; seq-mean-token-mean = 2.75 ; seq-mean-token-sum-norm = 3.5 / T(3) = 1.16667
        loss = jnp.arange(1.0, 10.0).reshape(3, 3)
        mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
        want = {"token-mean": 7 / 3, "seq-mean-token-sum": 3.5, "seq-mean-token-mean": 2.75,
                "seq-mean-token-sum-norm": 3.5 / 3}
        for mode, value in want.items():
            got = self.variant(functools.partial(aggregate, mode=mode))(loss, mask)
            np.testing.assert_allclose(got, value, rtol=1e-6, err_msg=mode)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_and_ignores_nan_padding(self):
        _, m, x = random_inputs(seed=9)
        loss = x()
        loss_nan = np.where(m > 0, loss, np.nan)
        for mode in AGG_MODES:
            got = self.variant(functools.partial(aggregate, mode=mode))(loss_nan, m)
            np.testing.assert_allclose(got, ref.aggregate(loss, m, mode), rtol=1e-5, err_msg=mode)

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_empty_mask_gives_zero(self):
        for mode in AGG_MODES:
            got = self.variant(functools.partial(aggregate, mode=mode))(jnp.ones((2, 3)), jnp.zeros((2, 3)))
            np.testing.assert_allclose(got, 0.0, err_msg=mode)


class PolicyLossTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # clip 0.2/0.2, c = 3; four tokens with ratio r = exp(logp - old) and advantage A:
        # t0: r = 1.1 (inside), A = 1   -> -1.1                                     (no clip)
        # t1: r = 1.5, A = 2            -> max(-3, -2*1.2 = -2.4) = -2.4            (clipped, upper)
        # t2: r = 0.5, A = -1           -> max(0.5, 0.8) = 0.8 ; min(0.8, 3) = 0.8  (clipped, lower side)
        # t3: r = 5,   A = -1           -> max(5, 1.2) = 5 ; dual clip min(5, 3) = 3 (pg_clipfrac_lower)
        # token-mean = (-1.1 - 2.4 + 0.8 + 3) / 4 = 0.075 ; pg_clipfrac = 2/4 (l2 > l1 at t1, t2)
        # pg_clipfrac_lower = 1/4 ; ppo_kl = -mean(log r) = -(ln 1.1 + ln 1.5 + ln 0.5 + ln 5)/4
        ratios = np.array([[1.1, 1.5, 0.5, 5.0]])
        logp = jnp.asarray(np.log(ratios), jnp.float32)
        old = jnp.zeros((1, 4))
        adv = jnp.array([[1.0, 2.0, -1.0, -1.0]])
        loss, metrics = self.variant(policy_loss)(logp, old, adv, jnp.ones((1, 4)))
        np.testing.assert_allclose(loss, 0.075, rtol=1e-5)
        np.testing.assert_allclose(metrics["pg_clipfrac"], 0.5, rtol=1e-6)
        np.testing.assert_allclose(metrics["pg_clipfrac_lower"], 0.25, rtol=1e-6)
        np.testing.assert_allclose(metrics["ppo_kl"], -np.log(ratios).mean(), rtol=1e-5)
        # no gradient at t1, t2 (clipped branch) and t3 (dual clip): 3/4; a zero weight at t0 or A = 0 there: 4/4
        np.testing.assert_allclose(metrics["pg_zero_grad_frac"], 0.75, rtol=1e-6)
        w0 = jnp.array([[0.0, 1.0, 1.0, 1.0]])
        _, mw = self.variant(policy_loss)(logp, old, adv, jnp.ones((1, 4)), weights=w0)
        np.testing.assert_allclose(mw["pg_zero_grad_frac"], 1.0, rtol=1e-6)
        _, ma = self.variant(policy_loss)(logp, old, adv.at[0, 0].set(0.0), jnp.ones((1, 4)))
        np.testing.assert_allclose(ma["pg_zero_grad_frac"], 1.0, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_grad_tokens_are_exactly_those_without_gradient(self):
        """``pg_zero_grad_frac`` counts a token exactly when d loss / d logp_t = 0 (random ratios, advantages with
        zeros, weights with zeros)."""
        rng = np.random.default_rng(4)
        logp = jnp.asarray(rng.normal(0, 0.6, (6, 9)), jnp.float32)
        adv = rng.normal(0, 1, (6, 9)) * (rng.random((6, 9)) > 0.15)
        w = jnp.asarray(rng.random((6, 9)) * (rng.random((6, 9)) > 0.15), jnp.float32)
        mask = jnp.ones((6, 9))
        old = jnp.zeros((6, 9))
        grad = jax.grad(lambda lp: policy_loss(lp, old, jnp.asarray(adv, jnp.float32), mask, weights=w)[0])(logp)
        _, met = self.variant(policy_loss)(logp, old, jnp.asarray(adv, jnp.float32), mask, weights=w)
        np.testing.assert_allclose(met["pg_zero_grad_frac"], float(np.mean(np.asarray(grad) == 0)), rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference(self):
        _, m, x = random_inputs(seed=10)
        logp, old, adv = x() * 0.5, x() * 0.5, x()
        logp[1, 0] = 30.0  # log-ratio clamp at +20
        w_tok = np.abs(x())
        w_seq = np.abs(x())[:, :1]
        cases = [(agg, None) for agg in AGG_MODES] + [("token-mean", w_tok), ("seq-mean-token-mean", w_seq)]
        for agg, weights in cases:
            fn = self.variant(functools.partial(policy_loss, clip_low=0.2, clip_high=0.28, clip_c=3.0, agg=agg))
            loss, metrics = fn(logp, old, adv, m, weights=weights)
            want, want_m = ref.policy_loss(logp, old, adv, m, 0.2, 0.28, 3.0, agg, weights)
            np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-5, err_msg=agg)
            for k, v in want_m.items():
                np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient(self):
        # d loss / d logp per valid token: unclipped branch -> -A r / N ; clipped branches -> 0.
        _, m, x = random_inputs(seed=11, b=4, t=5)
        logp, old, adv = x() * 0.3, x() * 0.3, x()
        w = np.abs(x())
        grad_fn = self.variant(jax.grad(lambda a, ww: policy_loss(a, old, adv, m, weights=ww)[0], argnums=(0, 1)))
        g, g_w = grad_fn(jnp.asarray(logp), jnp.asarray(w))
        r = np.exp(logp.astype(np.float64) - old)
        l1, l2 = -adv * r, -adv * np.clip(r, 0.8, 1.2)
        active = (l1 >= l2) & ~((adv < 0) & (np.maximum(l1, l2) > -adv * 3.0))
        want = np.where(active & (m > 0), -adv * r * w, 0.0) / m.sum()
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(g_w, 0.0)  # weights are detached


_x = hnp.arrays(np.float32, (3, 6), elements=st.floats(-3, 3, width=32))


@functools.lru_cache(maxsize=None)
def _loss_fn(agg):
    return jax.jit(functools.partial(policy_loss, clip_low=0.2, clip_high=0.3, agg=agg))


@given(adv=_x, m=hnp.arrays(np.bool_, (3, 6)),
       u=hnp.arrays(np.float32, (3, 6), elements=st.floats(-0.9375, 0.9375, width=32)),
       agg=st.sampled_from(AGG_MODES))
def test_property_equals_unclipped_surrogate_inside_clip_range(adv, m, u, agg):
    # ratio strictly inside [0.8, 1.3]: neither the clip nor the dual clip (c = 3) is active
    ratio = np.where(u < 0, 1 + 0.2 * u, 1 + 0.3 * u).astype(np.float32)
    logp = np.log(ratio).astype(np.float32)
    loss, metrics = _loss_fn(agg)(logp, np.zeros_like(logp), adv, m)
    surrogate = ref.aggregate(-adv * np.exp(logp.astype(np.float64)), m, agg)
    np.testing.assert_allclose(loss, surrogate, rtol=1e-4, atol=1e-5)
    assert float(metrics["pg_clipfrac_lower"]) == 0.0


class ValueLossTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # clip 0.5: v=[2, 0.2], v_old=[1, 0], R=[1.2, 1]
        # t0: v_c = 1.5, (2-1.2)^2 = 0.64 vs (1.5-1.2)^2 = 0.09 -> 0.64 (unclipped wins)
        # t1: v_c = 0.2, both 0.64 -> 0.64 ; loss = 0.5 * mean(0.64, 0.64) = 0.32 ; vf_clipfrac = 0
        # with R=[2.5, 1]: t0 (2-2.5)^2 = 0.25 vs (1.5-2.5)^2 = 1 -> 1 (clipped); loss = 0.5*(1+0.64)/2 = 0.41
        v, vo, m = jnp.array([[2.0, 0.2]]), jnp.array([[1.0, 0.0]]), jnp.ones((1, 2))
        fn = self.variant(value_loss)
        loss, met = fn(v, vo, jnp.array([[1.2, 1.0]]), m)
        np.testing.assert_allclose(loss, 0.32, rtol=1e-5)
        np.testing.assert_allclose(met["vf_clipfrac"], 0.0)
        loss, met = fn(v, vo, jnp.array([[2.5, 1.0]]), m)
        np.testing.assert_allclose(loss, 0.41, rtol=1e-5)
        np.testing.assert_allclose(met["vf_clipfrac"], 0.5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_and_gradient(self):
        _, m, x = random_inputs(seed=12)
        v, vo, ret = x(), x(), x()
        for agg in AGG_MODES:
            loss, met = self.variant(functools.partial(value_loss, clip=0.3, agg=agg))(v, vo, ret, m)
            want, want_m = ref.value_loss(v, vo, ret, m, 0.3, agg)
            np.testing.assert_allclose(loss, want, rtol=1e-5, err_msg=agg)
            np.testing.assert_allclose(met["vf_clipfrac"], want_m["vf_clipfrac"], rtol=1e-6)
        # token-mean gradient: (v - R) / N where the unclipped loss is the max, (v_c - R) * [v inside clip] / N else
        g = self.variant(jax.grad(lambda a: value_loss(a, vo, ret, m, clip=0.3)[0]))(jnp.asarray(v))
        v64 = v.astype(np.float64)
        vc = np.clip(v64, vo - 0.3, vo + 0.3)
        l1, l2 = (v64 - ret) ** 2, (vc - ret) ** 2
        inside = (v64 > vo - 0.3) & (v64 < vo + 0.3)
        want = np.where(l1 >= l2, v64 - ret, (vc - ret) * inside) * (m > 0) / m.sum()
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: aggregate(jnp.ones((2, 3)), jnp.ones((2, 3)), "seq-sum"), ValueError, "mode='seq-sum'"),
    (lambda: aggregate(jnp.ones(3), jnp.ones(3), "token-mean"), ValueError, "loss must be 2-D"),
    (lambda: policy_loss(jnp.ones((2, 3)), jnp.ones((2, 2)), jnp.ones((2, 3)), jnp.ones((2, 3))), ValueError,
     "old_logp"),
    (lambda: policy_loss(*[jnp.ones((2, 3))] * 4, clip_c=1.0), ValueError, "clip_c must be > 1"),
    (lambda: policy_loss(*[jnp.ones((2, 3))] * 4, agg="mean"), ValueError, "agg='mean'"),
    (lambda: policy_loss(*[jnp.ones((2, 3))] * 4, weights=jnp.ones((3,))), ValueError, "weights must have shape"),
    (lambda: value_loss(*[jnp.ones((2, 3))] * 4, clip=-1.0), ValueError, "clip must be >= 0"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
