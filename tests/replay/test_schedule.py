"""β schedule: linear from β0 to 1 over ``total_steps``, then 1."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxppo import replay


class LinearBetaTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_values(self):
        f = self.variant(lambda step: replay.linear_beta(step, 0.4, 1000))
        steps = [0, 1, 250, 500, 999, 1000, 1001, 10 ** 6]
        expected = [0.4, 0.4006, 0.55, 0.7, 0.9994, 1.0, 1.0, 1.0]
        np.testing.assert_allclose([float(f(jnp.int32(s))) for s in steps], expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_schedule_closure_and_bounds(self):
        sched = replay.beta_schedule(0.0, 3)
        f = self.variant(sched)
        np.testing.assert_allclose([float(f(s)) for s in range(5)], [0, 1 / 3, 2 / 3, 1, 1], rtol=1e-6)
        assert float(replay.linear_beta(-5, 0.4, 10)) == pytest.approx(0.4)   # clipped below
        assert float(replay.linear_beta(7, 1.0, 10)) == 1.0


@pytest.mark.parametrize("beta0, steps, match", [(-0.1, 10, "beta0"), (1.5, 10, "beta0"),
                                                 (0.4, 0, "beta_steps"), (0.4, float("inf"), "beta_steps")])
def test_bad_arguments(beta0, steps, match):
    with pytest.raises(ValueError, match=match):
        replay.linear_beta(0, beta0, steps)
    with pytest.raises(ValueError, match=match):
        replay.beta_schedule(beta0, steps)
