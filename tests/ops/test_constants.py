"""``LOG_RATIO_CLAMP`` is defined once (``jaxppo.ops.constants``) and is the clamp every log-ratio op applies."""

from __future__ import annotations

import inspect
import re

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from jaxppo.ops import constants, importance, kl, losses, rollout_correction
from jaxppo.ops.importance import importance_weights
from jaxppo.ops.kl import kl_penalty
from jaxppo.ops.losses import policy_loss

C = constants.LOG_RATIO_CLAMP


def test_defined_once_and_imported():
    assert C == 20.0
    for mod in (kl, losses, importance):
        assert mod.LOG_RATIO_CLAMP is constants.LOG_RATIO_CLAMP, mod.__name__
        assert not re.search(r"^LOG_RATIO_CLAMP\s*=", inspect.getsource(mod), re.M), \
            f"{mod.__name__} defines its own LOG_RATIO_CLAMP"
    # verl's name for the same bound in the rollout-correction ops is an alias, not a fourth definition
    assert rollout_correction.SAFETY_BOUND is constants.LOG_RATIO_CLAMP
    assert not re.search(r"^SAFETY_BOUND\s*=\s*[0-9]", inspect.getsource(rollout_correction), re.M)


class ClampTest(parameterized.TestCase):
    """Hand cases at a log-ratio of ±40 (far past the clamp): every op sees ±C."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_ppo_ratio_clamped(self):
        # r = exp(min(40, C)); A = 1: loss = max(-r, -clip(r, 0.8, 1.2)) = -1.2 (clipped branch); ppo_kl = -C
        fn = self.variant(lambda lp: policy_loss(lp, jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1))))
        loss, m = fn(jnp.full((1, 1), 40.0))
        np.testing.assert_allclose(loss, -1.2, rtol=1e-6)
        np.testing.assert_allclose(m["ppo_kl"], -C, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_k3_log_ratio_clamped(self):
        # k3 = clip(exp(x) - x - 1, -10, 10) with x = clip(ref - logp, -C, C): at logp = -inf, x = +C and the value
        # is the finite clamp 10 (unclamped x = inf would give exp(inf) - inf = NaN)
        fn = self.variant(lambda lp, rp: kl_penalty(lp, rp, "k3"))
        np.testing.assert_array_equal(fn(jnp.full((1, 2), -jnp.inf), jnp.zeros((1, 2))), np.full((1, 2), 10.0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_importance_weight_clamped(self):
        # sequence level, truncate at a huge threshold: w = exp(clip(sum log-ratio, -C, C)) = exp(C)
        fn = self.variant(lambda t: importance_weights(t, jnp.zeros((1, 2)), jnp.ones((1, 2)), level="sequence",
                                                       mode="truncate", threshold=1e12))
        w, _ = fn(jnp.array([[30.0, 10.0]]))
        np.testing.assert_allclose(w, np.full((1, 2), np.exp(np.float32(C))), rtol=1e-5)
