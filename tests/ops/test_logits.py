"""entropy_from_logits / entropy_metric_from_logits / logprobs_from_logits: hand cases, reference, gradients, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.ops import entropy_from_logits, logprobs_from_logits
from jaxppo.ops import logits as ops_logits
from tests.ops import reference as ref


class LogitsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # uniform over 4 tokens: H = log 4 = 1.386294, log p = -log 4.
        # logits [0, ln 3] -> p = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335; log p[1] = ln 0.75.
        z = jnp.array([[0.0, 0.0, 0.0, 0.0], [0.0, np.log(3.0), -jnp.inf, -jnp.inf]])
        h = self.variant(entropy_from_logits)(z)
        np.testing.assert_allclose(h, [np.log(4.0), 0.5623351], rtol=1e-5)
        lp = self.variant(logprobs_from_logits)(z, jnp.array([2, 1]))
        np.testing.assert_allclose(lp, [-np.log(4.0), np.log(0.75)], rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference(self):
        rng = np.random.default_rng(6)
        z = (3 * rng.normal(size=(2, 5, 7))).astype(np.float32)
        tok = rng.integers(0, 7, size=(2, 5))
        np.testing.assert_allclose(self.variant(entropy_from_logits)(z), ref.entropy(z), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(self.variant(logprobs_from_logits)(z, tok), ref.logprobs(z, tok), rtol=1e-5,
                                   atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradients(self):
        rng = np.random.default_rng(7)
        z = rng.normal(size=(3, 6)).astype(np.float32)
        tok = np.array([0, 5, 2])
        # d log p_k / d z = onehot(k) - softmax(z)
        g = self.variant(jax.grad(lambda a: jnp.sum(logprobs_from_logits(a, tok))))(jnp.asarray(z))
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(g, np.eye(6)[tok] - p, rtol=1e-5, atol=1e-6)
        # entropy gradient vs central finite differences of the reference
        g = self.variant(jax.grad(lambda a: jnp.sum(entropy_from_logits(a))))(jnp.asarray(z))
        fd = ref.finite_difference_grad(lambda zz: ref.entropy(zz).sum(), z)
        np.testing.assert_allclose(g, fd, rtol=1e-3, atol=1e-4)


def test_bad_tokens():
    z = jnp.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="tokens shape"):
        logprobs_from_logits(z, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(TypeError, match="tokens must be an integer"):
        logprobs_from_logits(z, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        logprobs_from_logits(z, jnp.full((2, 3), 4))


class EntropyMetricTest(chex.TestCase):
    """``entropy_metric_from_logits``: the entropy for logging (no gradient), one shared exponential pass."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # uniform over 4: H = log 4; p = [1/4, 3/4] (two banned -inf tokens): H = 0.5623351;
        # one-hot limit (logits [0, -inf, -inf]): H = 0.
        z = jnp.array([[0.0, 0.0, 0.0, 0.0], [0.0, np.log(3.0), -jnp.inf, -jnp.inf], [5.0, -jnp.inf, -jnp.inf,
                                                                                      -jnp.inf]])
        h = self.variant(ops_logits.entropy_metric_from_logits)(z)
        np.testing.assert_allclose(h, [np.log(4.0), 0.5623351, 0.0], rtol=1e-5, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_equals_the_differentiable_entropy_and_has_no_gradient(self):
        rng = np.random.default_rng(8)
        z = jnp.asarray((4 * rng.normal(size=(3, 5, 11)) + 30).astype(np.float32))   # large offset: shift-stable
        h = self.variant(ops_logits.entropy_metric_from_logits)(z)
        np.testing.assert_allclose(h, ref.entropy(np.asarray(z, np.float64) - 30), rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(h, entropy_from_logits(z), rtol=1e-5, atol=2e-5)
        g = self.variant(jax.grad(lambda a: jnp.sum(ops_logits.entropy_metric_from_logits(a))))(z)
        assert np.all(np.asarray(g) == 0.0)

    def test_bf16_in_float32_out(self):
        z = jnp.asarray([[0.0, 1.0, 2.0]], jnp.bfloat16)
        h = ops_logits.entropy_metric_from_logits(z)
        assert h.dtype == jnp.float32
        np.testing.assert_allclose(h, ref.entropy(np.asarray([[0.0, 1.0, 2.0]])), rtol=1e-5)

    def test_scalar_logits_raise(self):
        with pytest.raises(ValueError, match="vocabulary axis"):
            ops_logits.entropy_metric_from_logits(jnp.float32(1.0))


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 4), st.integers(2, 40), st.floats(0.1, 20.0), st.integers(0, 2**31 - 1))
def test_entropy_metric_properties(rows, vocab, scale, seed):
    """0 <= H <= log V, equal to the differentiable form and invariant to a shift of the logits."""
    z = (scale * np.random.default_rng(seed).normal(size=(rows, vocab))).astype(np.float32)
    h = np.asarray(ops_logits.entropy_metric_from_logits(z))
    assert np.all(h >= -1e-5) and np.all(h <= np.log(vocab) + 1e-5)
    np.testing.assert_allclose(h, entropy_from_logits(z), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ops_logits.entropy_metric_from_logits(z + 7.0), h, rtol=1e-4, atol=1e-5)
