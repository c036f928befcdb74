"""KL estimators (values, clamps, straight-through gradients) and KL controllers."""

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

from jaxppo.ops import adaptive_kl_update, kl_penalty
from tests.ops import reference as ref

KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+")


class KLPenaltyTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # logp = [0, -1, 30], ref = [-1, 0, 0]: d = [1, -1, 30]
        # k1 = d = [1, -1, 30] ; abs = [1, 1, 30] ; k2 = d^2/2 = [0.5, 0.5, 450]
        # k3 with x = ref - logp = [-1, 1, -30 -> clamped -20]: e^x - x - 1 = [e^-1, e - 2, e^-20 + 19 -> 10]
        lp = jnp.array([0.0, -1.0, 30.0])
        rp = jnp.array([-1.0, 0.0, 0.0])
        want = {"k1": [1, -1, 30], "abs": [1, 1, 30], "k2": [0.5, 0.5, 450],
                "k3": [np.exp(-1.0), np.e - 2, 10.0]}
        for kind, value in want.items():
            fn = self.variant(functools.partial(kl_penalty, kind=kind))
            np.testing.assert_allclose(fn(lp, rp), value, rtol=1e-5, err_msg=kind)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_all_kinds(self):
        rng = np.random.default_rng(8)
        lp, rp = (rng.normal(size=(4, 6)).astype(np.float32) for _ in range(2))
        lp[0, 0], rp[0, 0] = -40.0, 0.0  # k3 value clamp (+10)
        for kind in KINDS:
            got = self.variant(functools.partial(kl_penalty, kind=kind))(lp, rp)
            np.testing.assert_allclose(got, ref.kl(lp, rp, kind), rtol=1e-5, atol=1e-6, err_msg=kind)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradients(self):
        # d/dlogp: k1 -> 1 ; abs -> sign(d) ; k2 -> d ; k3 -> 1 - exp(ref - logp) ; '+' kinds -> d (k2's gradient)
        lp = jnp.array([0.3, -0.2, 1.0])
        rp = jnp.array([0.0, 0.5, 0.2])
        d = np.asarray(lp - rp)
        want = {"k1": np.ones(3), "abs": np.sign(d), "k2": d, "k3": 1 - np.exp(-d), "k1+": d, "k3+": d}
        for kind, g in want.items():
            grad = self.variant(jax.grad(lambda a, k=kind: jnp.sum(kl_penalty(a, rp, k))))(lp)
            np.testing.assert_allclose(grad, g, rtol=1e-5, err_msg=kind)


_lp = hnp.arrays(np.float32, (2, 5), elements=st.floats(-8, 8, width=32))


@functools.lru_cache(maxsize=None)
def _value_and_grad(kind):
    return jax.jit(lambda a, b: (kl_penalty(a, b, kind), jax.grad(lambda x: jnp.sum(kl_penalty(x, b, kind)))(a)))


@given(lp=_lp, rp=_lp, base=st.sampled_from(["k1", "k3", "abs", "kl", "low_var_kl"]))
def test_property_straight_through_has_base_value_and_k2_gradient(lp, rp, base):
    v, g = _value_and_grad(base + "+")(lp, rp)
    base_value, _ = _value_and_grad(base)(lp, rp)
    _, k2_grad = _value_and_grad("k2")(lp, rp)
    np.testing.assert_allclose(v, base_value, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g, k2_grad, rtol=1e-6, atol=1e-6)


@given(lp=_lp, rp=_lp)
def test_property_k3_is_nonnegative_and_bounded(lp, rp):
    v, _ = _value_and_grad("k3")(lp, rp)
    assert np.all(np.asarray(v) >= -1e-6) and np.all(np.asarray(v) <= 10.0)


def test_unknown_kind():
    with pytest.raises(ValueError, match="kind='k4' is not supported"):
        kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_penalty(jnp.zeros(2), jnp.zeros(3), "k1")


class ControllerTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_adaptive_update_hand_computed(self):
        # coef 0.1, target 0.05, horizon 100, 10 steps:
        # kl = 0.055 -> err = 0.1 -> 0.1 * (1 + 0.1 * 10/100) = 0.101
        # kl = 1.0   -> err clipped to 0.2 -> 0.1 * 1.02 = 0.102 ; kl = 0 -> err = -0.2 -> 0.098
        fn = self.variant(functools.partial(adaptive_kl_update, target=0.05, horizon=100.0))
        for kl_value, want in ((0.055, 0.101), (1.0, 0.102), (0.0, 0.098)):
            np.testing.assert_allclose(fn(0.1, kl_value, 10), want, rtol=1e-5)
            np.testing.assert_allclose(want, ref.adaptive_kl(0.1, kl_value, 10, 0.05, 100.0), rtol=1e-6)


def test_adaptive_update_bad_input():
    with pytest.raises(ValueError, match="horizon must be > 0"):
        adaptive_kl_update(0.1, 0.1, 1, target=0.1, horizon=0)
    with pytest.raises(ValueError, match="target must be > 0"):
        adaptive_kl_update(0.1, 0.1, 1, target=0.0, horizon=10)
