"""jaxppo.optim: the float32 master copy of 16-bit parameters (with_master_weights / make_optimizer)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.config.schema import OptimConfig
from jaxppo.optim import MasterState, has_low_precision, make_optimizer, set_learning_rate, with_master_weights

BF16 = jnp.bfloat16


def _params(dtype, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w": (0.02 * jax.random.normal(k1, (8, 4))).astype(dtype), "b": jax.random.normal(k2, (4,)).astype(dtype)}


def test_make_optimizer_wraps_only_16_bit_parameters():
    cfg = OptimConfig(lr=1e-3)
    assert has_low_precision(_params(BF16)) and not has_low_precision(_params(jnp.float32))
    assert has_low_precision({"a": jnp.zeros(2, jnp.float16), "i": jnp.zeros(2, jnp.int8)})
    assert not has_low_precision({"i": jnp.zeros(2, jnp.int8)})
    assert isinstance(make_optimizer(cfg, 10, _params(BF16)).init(_params(BF16)), MasterState)
    assert not isinstance(make_optimizer(cfg, 10, _params(jnp.float32)).init(_params(jnp.float32)), MasterState)
    assert not isinstance(make_optimizer(cfg, 10).init(_params(BF16)), MasterState)   # no params given: as before
    # the master copy is exact and the wrapped AdamW's moments are float32
    state = make_optimizer(cfg, 10, _params(BF16)).init(_params(BF16))
    chex.assert_trees_all_equal(state.master, jax.tree.map(lambda x: x.astype(jnp.float32), _params(BF16)))
    assert {x.dtype for x in jax.tree.leaves(state.inner) if x.ndim} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("jit", [False, True])
def test_small_updates_accumulate_in_the_master_and_params_are_its_rounding(jit):
    """An SGD step of 1e-5 on weights of 1.0 (bf16 ulp 2^-7 = 0.0078) is lost without a master copy; with it the
    master moves by exactly 1e-5 per step (float32) and the stored weight is always round_bf16(master): after 1000
    steps 0.99 (1 - 1000e-5), which bf16 represents as 0.98828125 (hand value: nearest bf16 to 0.99)."""
    p = {"w": jnp.ones((3,), BF16)}
    g = {"w": jnp.ones((3,), BF16)}
    tx = with_master_weights(optax.sgd(1e-5))
    plain = optax.sgd(1e-5)

    def step(tx):
        def f(p, s):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s
        return jax.jit(f) if jit else f

    s, p2, s2 = tx.init(p), p, plain.init(p)
    f, f2 = step(tx), step(plain)
    for _ in range(1000):
        p, s = f(p, s)
        p2, s2 = f2(p2, s2)
        assert p["w"].dtype == BF16
    np.testing.assert_array_equal(np.asarray(p2["w"], np.float32), 1.0)            # lost without the master
    want = np.float32(1.0)
    for _ in range(1000):
        want = np.float32(want - np.float32(1e-5))
    np.testing.assert_array_equal(np.asarray(s.master["w"]), want)                  # float32 arithmetic, exactly
    np.testing.assert_array_equal(np.asarray(p["w"], np.float32), 0.98828125)
    chex.assert_trees_all_equal(p, jax.tree.map(lambda m: m.astype(BF16), s.master))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), lr=st.sampled_from([1e-6, 1e-4, 1e-2, 1.0]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_stored_params_equal_the_rounded_master_and_match_a_float32_run(seed, lr, scale):
    """For any gradients: after each update the bf16 parameters are exactly round_bf16(master), and the master
    follows the same AdamW trajectory as a float32 run fed the same float32 gradients (bit for bit: the master's
    chain sees the same numbers)."""
    cfg = OptimConfig(lr=lr, grad_clip=1.0)
    p32 = jax.tree.map(lambda x: x * scale, _params(jnp.float32, seed))
    p16 = jax.tree.map(lambda x: x.astype(BF16), p32)
    tx16, tx32 = make_optimizer(cfg, 10, p16), make_optimizer(cfg, 10, p32)
    s16, s32 = tx16.init(p16), tx32.init(jax.tree.map(lambda x: x.astype(jnp.float32), p16))
    m32 = s16.master
    for i in range(3):
        g = jax.tree.map(lambda x, i=i: jax.random.normal(jax.random.PRNGKey(seed + i), x.shape) * scale, p32)
        s16, s32 = set_learning_rate(s16, lr), set_learning_rate(s32, lr)
        u16, s16 = tx16.update(jax.tree.map(lambda x: x.astype(BF16), g), s16, p16)
        p16 = optax.apply_updates(p16, u16)
        u32, s32 = tx32.update(jax.tree.map(lambda x: x.astype(BF16).astype(jnp.float32), g), s32, m32)
        m32 = optax.apply_updates(m32, u32)
        chex.assert_trees_all_equal(s16.master, m32)
        chex.assert_trees_all_equal(p16, jax.tree.map(lambda m: m.astype(BF16), s16.master))


def test_update_without_params_is_an_error():
    tx = with_master_weights(optax.sgd(0.1))
    with pytest.raises(ValueError, match="needs the current params"):
        tx.update(_params(BF16), tx.init(_params(BF16)))


def test_float32_leaves_get_no_copy_and_the_inner_update_unchanged():
    """A tree mixing bf16 and float32 leaves (a bf16 value head beside float32 adapters): only the bf16 leaf has a
    master copy; the float32 leaf's update is bit-identical to the unwrapped optimizer's (the global-norm clip sees the
    same gradients: the bf16 one cast to float32 exactly)."""
    cfg = OptimConfig(lr=1e-2, grad_clip=0.5)
    params = {"head": jnp.full((3,), 0.5, BF16), "lora": jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)}
    grads = {"head": jnp.array([1.0, -2.0, 3.0], BF16), "lora": jnp.arange(5, dtype=jnp.float32)}
    tx = make_optimizer(cfg, 10, params)
    s = tx.init(params)
    assert s.master["head"].dtype == jnp.float32 and s.master["lora"].shape == (0,)
    u, s = tx.update(grads, s, params)
    plain = make_optimizer(cfg, 10)
    g32 = {"head": grads["head"].astype(jnp.float32), "lora": grads["lora"]}
    p32 = {"head": params["head"].astype(jnp.float32), "lora": params["lora"]}
    u_ref, _ = plain.update(g32, plain.init(p32), p32)
    np.testing.assert_array_equal(np.asarray(u["lora"]), np.asarray(u_ref["lora"]))
    np.testing.assert_array_equal(np.asarray(s.master["head"]), np.asarray(p32["head"] + u_ref["head"]))
    new = optax.apply_updates(params, u)
    assert new["head"].dtype == BF16
    np.testing.assert_array_equal(np.asarray(new["head"]), np.asarray(s.master["head"].astype(BF16)))
