"""entropy_from_logits / logprobs_from_logits: hand cases, reference, gradients, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.ops import entropy_from_logits, logprobs_from_logits
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
