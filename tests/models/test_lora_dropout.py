"""Adapter dropout (jaxppo.models.lora_dropout): the mask by hand, the expectation over masks equals the
no-dropout adapter output (exactly by enumeration, and statistically with the real RNG), jit = no jit, the model
with and without a key, and no random operation without one."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.models.adapters import attach_lora
from jaxppo.models.layers import linear
from jaxppo.models.lora import TARGETS, LoraSpec, lora_delta
from jaxppo.models.lora_dropout import DROPOUT_TARGETS, Drop, adapter_dropout, layer_keys, target_input
from tests.models.tiny_lm import tiny_lm

IDS = np.array([[5, 9, 3, 17, 2, 40], [0, 0, 7, 8, 33, 1]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int32)


def test_dropout_targets_are_the_lora_targets():
    assert DROPOUT_TARGETS == TARGETS


def test_adapter_dropout_by_hand():
    x = jnp.arange(1.0, 2001.0).reshape(40, 50)
    y = np.asarray(adapter_dropout(x, jax.random.PRNGKey(3), 0.25))
    kept = y != 0
    # inverted scaling: kept entries times 1/(1-p) (rounded to x's dtype), exactly
    np.testing.assert_array_equal(y[kept], np.asarray(x)[kept] * np.float32(1 / 0.75))
    assert abs(kept.mean() - 0.75) < 4 * np.sqrt(0.75 * 0.25 / x.size)     # ~ Bernoulli(1-p): 4 sigma
    assert adapter_dropout(x, jax.random.PRNGKey(3), 0.0) is x              # p = 0: the input itself
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="dropout rate"):
            adapter_dropout(x, jax.random.PRNGKey(0), bad)
    np.testing.assert_array_equal(adapter_dropout(x, jax.random.PRNGKey(3), 0.25), y)   # same key, same mask
    assert not np.array_equal(np.asarray(adapter_dropout(x, jax.random.PRNGKey(4), 0.25)), y)


@given(st.floats(0.05, 0.9), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2 ** 16))
def test_expected_adapter_output_over_all_masks_is_the_no_dropout_output(p, d_in, r, d_out, seed):
    """E_ξ[s·((x⊙ξ/(1−p))·A)·B] summed over all 2^d masks with their probabilities (1−p)^k p^(d−k): exactly
    s·(x·A)·B, the expectation without sampling."""
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = np.asarray(jax.random.normal(k[0], (d_in,)), np.float64)
    a = np.asarray(jax.random.normal(k[1], (d_in, r)), np.float64)
    b = np.asarray(jax.random.normal(k[2], (r, d_out)), np.float64)
    expect = np.zeros(d_out)
    for xi in itertools.product((0, 1), repeat=d_in):
        xi = np.array(xi)
        prob = (1 - p) ** xi.sum() * p ** (d_in - xi.sum())
        expect += prob * (((x * xi / (1 - p)) @ a) @ b) * 1.5
    np.testing.assert_allclose(expect, ((x @ a) @ b) * 1.5, rtol=1e-9, atol=1e-9)


@given(st.floats(0.05, 0.6), st.integers(2, 6), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2 ** 16))
def test_mean_adapter_output_over_sampled_masks_tends_to_the_no_dropout_output(p, d_in, r, d_out, seed):
    """The real RNG: the mean of the adapter output over n = 4000 keys is within 5 standard errors of the
    no-dropout output (per output element), and the dropped output differs from it for most keys."""
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = jax.random.normal(k[0], (3, d_in))
    a, b = jax.random.normal(k[1], (d_in, r)), jax.random.normal(k[2], (r, d_out))
    keys = jax.random.split(k[3], 4000)
    ys = np.asarray(jax.vmap(lambda kk: lora_delta(adapter_dropout(x, kk, p), a, b, 2.0))(keys), np.float64)
    target = np.asarray(lora_delta(x, a, b, 2.0), np.float64)
    se = ys.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(ys.mean(0) - target) <= 5 * se + 1e-5), (ys.mean(0), target, se)
    assert np.mean(np.any(np.abs(ys - target) > 1e-6, axis=(1, 2))) > 0.5


def test_linear_with_dropout_jit_equals_no_jit_and_touches_only_the_adapter_branch():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(k[0], (2, 5, 8))
    p = {"q": jax.random.normal(k[1], (8, 6)), "q_lora_a": jax.random.normal(k[2], (8, 2)),
         "q_lora_b": jax.random.normal(k[3], (2, 6))}
    drop = Drop(jax.random.PRNGKey(7), 0.4)
    y = linear(x, p, "q", drop=drop)
    yj = jax.jit(lambda x_, p_, key: linear(x_, p_, "q", drop=Drop(key, 0.4)))(x, p, drop.key)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(yj))
    xd = target_input(x, drop, "q")     # the mask of target q: fold_in(key, 0)
    np.testing.assert_array_equal(np.asarray(xd), np.asarray(adapter_dropout(x, jax.random.fold_in(drop.key, 0), 0.4)))
    by_hand = x @ p["q"] + (xd @ p["q_lora_a"]) @ p["q_lora_b"]
    np.testing.assert_allclose(np.asarray(y), np.asarray(by_hand), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(y), np.asarray(linear(x, p, "q")))
    # without adapters in the dict the dropout has nothing to act on: x·W exactly
    w_only = {"q": p["q"]}
    np.testing.assert_array_equal(np.asarray(linear(x, w_only, "q", drop=drop)), np.asarray(linear(x, w_only, "q")))
    # q and k read independent masks of the same input
    assert not np.array_equal(np.asarray(target_input(x, drop, "q")), np.asarray(target_input(x, drop, "k")))


def _adapted(dropout: float, scan_layers=True):
    lm = attach_lora(tiny_lm(scan_layers=scan_layers), LoraSpec(rank=2, dropout=dropout))
    for t in TARGETS:     # B = 0 at initialisation would hide the adapter branch
        v = getattr(lm.model.layers, f"{t}_lora_b")
        v.set_value(0.3 * jax.random.normal(jax.random.PRNGKey(TARGETS.index(t)), v.shape))
    return lm


def _n_random_ops(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("random_") or eqn.primitive.name == "threefry2x32":
            n += 1
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    n += _n_random_ops(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    n += _n_random_ops(sub)
    return n


def count_random_ops(fn, *args) -> int:
    """Random primitives (key derivation and bits) in the jaxpr of ``fn(*args)``, sub-jaxprs included."""
    return _n_random_ops(jax.make_jaxpr(fn)(*args).jaxpr)


@nnx.jit
def _logits(m, key):
    return m(IDS, MASK, lora_key=key)


@nnx.jit
def _logprobs(m):
    return m.continuation_logprobs(IDS[:, :3], MASK[:, :3], IDS[:, 3:], MASK[:, 3:])


@pytest.mark.slow
def test_model_dropout_only_with_a_key_scan_equals_unrolled():
    key = jax.random.PRNGKey(0)
    outs = {}
    for scan in (True, False):
        lm0, lm = _adapted(0.0, scan), _adapted(0.3, scan)
        plain = np.asarray(_logits(lm0, None))
        # no key (every evaluation / log-prob pass): p > 0 gives exactly the p = 0 logits and log-probs
        np.testing.assert_array_equal(np.asarray(_logits(lm, None)), plain)
        np.testing.assert_array_equal(np.asarray(_logprobs(lm)), np.asarray(_logprobs(lm0)))
        # p = 0 with a key: the key is ignored, bit for bit
        np.testing.assert_array_equal(np.asarray(_logits(lm0, key)), plain)
        outs[scan] = np.asarray(_logits(lm, key))
        assert np.max(np.abs(outs[scan] - plain)) > 1e-3
        np.testing.assert_array_equal(np.asarray(_logits(lm, key)), outs[scan])   # deterministic
        assert not np.array_equal(np.asarray(_logits(lm, jax.random.PRNGKey(1))), outs[scan])
    # the same per-layer keys whether the layers are scanned or unrolled
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)


def test_no_random_operation_without_dropout_and_jit_equals_no_jit():
    lm0, lm = _adapted(0.0), _adapted(0.3)
    key = jax.random.PRNGKey(5)
    assert count_random_ops(lambda k: lm0(IDS, MASK, lora_key=k), key) == 0
    assert count_random_ops(lambda k: lm(IDS, MASK), key) == 0
    assert count_random_ops(lambda k: lm(IDS, MASK, lora_key=k), key) > 0
    np.testing.assert_allclose(np.asarray(_logits(lm, key)), np.asarray(lm(IDS, MASK, lora_key=key)), rtol=1e-5,
                               atol=1e-5)   # jit vs no jit
    assert layer_keys(key, None, 2) is None and layer_keys(None, lm.config.lora, 2) is None
    with pytest.raises(ValueError, match="cached decoding"):
        lm.model.layers(jnp.zeros((2, 6, 32)), None, None, None, cache=(None, None), lora_key=key)
