"""GAE: hand-computed case, reference on random (holed and prefix) masks, gradients, properties. The benchmark-only
formulations are tested in tests/benchmarks/test_gae_variants.py."""

from __future__ import annotations

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.ops import gae
from jaxppo.ops.advantages import is_prefix_mask
from tests.ops import reference as ref
from tests.ops._data import random_inputs



class GaeTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # gamma = 0.5, lam = 0.5 (gamma*lam = 0.25), one row, mask [1, 0, 1, 0]:
        # t=3 masked: adv=0, nv=0.            t=2 valid: delta = 1 + 0.5*0 - 2 = -1, adv = -1, nv = 2.
        # t=1 masked: adv carries -1.         t=0 valid: delta = 4 + 0.5*2 - 1 = 4, adv = 4 + 0.25*(-1) = 3.75.
        # returns = adv + values = [4.75, 9, 1, 10].
        r = jnp.array([[4.0, 100.0, 1.0, 100.0]])
        v = jnp.array([[1.0, 10.0, 2.0, 10.0]])
        m = jnp.array([[1, 0, 1, 0]])
        fn = self.variant(gae)
        adv, ret = fn(r, v, m, 0.5, 0.5)
        np.testing.assert_allclose(adv, [[3.75, -1.0, -1.0, 0.0]], atol=1e-6)
        np.testing.assert_allclose(ret, [[4.75, 9.0, 1.0, 10.0]], atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_on_holed_and_prefix_masks(self):
        _, m, x = random_inputs(seed=1, b=6, t=11)
        r, v = x(), x()
        prefix = (np.arange(11)[None, :] < np.array([0, 11, 1, 4, 9, 5])[:, None]).astype(np.float32)
        fn = self.variant(gae)
        for mask in (m, prefix):  # lax.scan path and matmul path
            for gamma, lam in ((0.97, 0.9), (0.0, 0.7)):
                want_adv, want_ret = ref.gae(r, v, mask, gamma, lam)
                adv, ret = fn(jnp.asarray(r), jnp.asarray(v), jnp.asarray(mask), gamma, lam)
                np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ref.gae(r, v, m, 0.9, 0.9)[0][0], 0.0)  # a fully masked row: adv 0

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient_matches_finite_differences(self):
        _, holes, x = random_inputs(seed=2, b=4, t=5)
        r, v, c = x(), x(), x()
        prefix = (np.arange(5)[None, :] < np.array([0, 5, 2, 4])[:, None]).astype(np.float32)
        for m in (holes, prefix):  # scan path and matmul path

            def objective(r_, v_, m=m):
                adv, ret = gae(r_, v_, m, 0.9, 0.8)
                return jnp.sum(c * adv) + 0.5 * jnp.sum(c * ret)

            g_r, g_v = self.variant(jax.grad(objective, argnums=(0, 1)))(jnp.asarray(r), jnp.asarray(v))

            def ref_objective(r_, v_, m=m):
                adv, ret = ref.gae(r_, v_, m, 0.9, 0.8)
                return float(np.sum(c * adv) + 0.5 * np.sum(c * ret))

            fd_r = ref.finite_difference_grad(lambda r_: ref_objective(r_, v.astype(np.float64)), r, eps=1e-3)
            fd_v = ref.finite_difference_grad(lambda v_: ref_objective(r.astype(np.float64), v_), v, eps=1e-3)
            for grad, fd in ((g_r, fd_r), (g_v, fd_v)):
                np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-4)


_T = 8
_B = 4
_floats = hnp.arrays(np.float32, (_B, _T), elements=st.floats(-5, 5, width=32))
_masks = hnp.arrays(np.bool_, (_B, _T))


_gae_jit = jax.jit(gae)


@given(r=_floats, v=_floats, m=_masks, gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_property_equals_naive_reverse_recursion(r, v, m, gamma, lam):
    adv, ret = _gae_jit(r, v, m, gamma, lam)
    want_adv, want_ret = ref.gae(r, v, m, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


@given(r=_floats, v=_floats, lengths=hnp.arrays(np.int64, (_B,), elements=st.integers(0, _T)),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_property_prefix_masks_equal_naive_reverse_recursion(r, v, lengths, gamma, lam):
    m = np.arange(_T)[None, :] < lengths[:, None]
    adv, ret = _gae_jit(r, v, m, gamma, lam)
    want_adv, want_ret = ref.gae(r, v, m, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


def test_is_prefix_mask():
    assert bool(is_prefix_mask(np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]])))
    assert not bool(is_prefix_mask(np.array([[1, 0, 1], [1, 1, 1]])))
    assert not bool(is_prefix_mask(np.array([[0, 1, 1]])))  # left padding is not a prefix mask


def test_full_mask_gamma_lam_one_is_reward_to_go_minus_value():
    # gamma = lam = 1, no padding: adv_t = sum_{s>=t} r_s - v_t (telescoping), by hand for r=[1,2,3], v=[0.5,0,1]:
    # adv = [6-0.5, 5-0, 3-1] = [5.5, 5, 2].
    adv, _ = gae(jnp.array([[1.0, 2.0, 3.0]]), jnp.array([[0.5, 0.0, 1.0]]), jnp.ones((1, 3)), 1.0, 1.0)
    np.testing.assert_allclose(adv, [[5.5, 5.0, 2.0]], atol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (dict(values=np.zeros((2, 4), np.float32)), "shape mismatch"),
    (dict(mask=np.ones((2, 3, 1))), "mask must be 2-D"),
    (dict(gamma=1.5), "gamma"),
    (dict(lam=-0.1), "lam"),
])
def test_bad_input(bad, match):
    args = dict(rewards=np.zeros((2, 3), np.float32), values=np.zeros((2, 3), np.float32),
                mask=np.ones((2, 3)), gamma=0.9, lam=0.9)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        gae(**args)


def test_integer_rewards_rejected():
    with pytest.raises(TypeError, match="rewards"):
        gae(np.zeros((2, 3), np.int32), np.zeros((2, 3), np.float32), np.ones((2, 3)), 0.9, 0.9)


def test_batch_sharded_over_eight_devices_matches_single_device():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 (simulated) devices; tests/conftest.py sets XLA_FLAGS for that")
    mesh = jax.sharding.Mesh(np.array(devices[:8]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
    rng = np.random.default_rng(5)
    r, v = (rng.normal(size=(8, 12)).astype(np.float32) for _ in range(2))
    prefix = (np.arange(12)[None, :] < rng.integers(0, 13, size=8)[:, None]).astype(np.float32)
    holes = prefix * (rng.random((8, 12)) > 0.3)
    for m in (prefix, holes):
        args = [jax.device_put(a, sharding) for a in (r, v, m)]
        adv, ret = jax.jit(gae)(*args, 0.99, 0.95)
        want_adv, want_ret = ref.gae(r, v, m, 0.99, 0.95)
        np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
        assert adv.sharding.is_equivalent_to(sharding, 2)
