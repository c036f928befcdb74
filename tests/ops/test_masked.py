"""masked_mean / masked_whiten: hand cases, reference, NaN outside the mask, gradients, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp

from jaxppo.ops import masked_mean, masked_whiten
from tests.ops import reference as ref
from tests.ops._data import random_inputs


class MaskedTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # x = [[1, 2, 100], [3, nan, 5]], mask = [[1, 1, 0], [1, 0, 1]]
        # mean over the 4 valid entries = (1+2+3+5)/4 = 2.75 ; row means = [1.5, 4] ; column means = [2, 2, 5].
        x = jnp.array([[1.0, 2.0, 100.0], [3.0, jnp.nan, 5.0]])
        m = jnp.array([[1, 1, 0], [1, 0, 1]])
        mean = self.variant(masked_mean, static_argnames="axis")
        np.testing.assert_allclose(mean(x, m), 2.75, rtol=1e-6)
        np.testing.assert_allclose(mean(x, m, axis=1), [1.5, 4.0], rtol=1e-6)
        np.testing.assert_allclose(mean(x, m, axis=0), [2.0, 2.0, 5.0], rtol=1e-6)
        # unbiased variance: squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75, / (4 - 1) = 2.91667;
        # whitened valid entries = (x - 2.75) / sqrt(2.91667 + 1e-8): (1 - 2.75)/1.70783 = -1.02469.
        w = self.variant(masked_whiten, static_argnames="shift_mean")(jnp.where(m, x, 0.0), m)
        np.testing.assert_allclose(w[0, 0], -1.75 / np.sqrt(8.75 / 3), rtol=1e-5)
        np.testing.assert_allclose(w[1, 2], 2.25 / np.sqrt(8.75 / 3), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference(self):
        _, m, x = random_inputs(seed=4)
        a = x()
        np.testing.assert_allclose(self.variant(masked_mean)(a, m), ref.masked_mean(a, m), rtol=1e-5)
        for axis in (0, 1):
            got = self.variant(masked_mean, static_argnames="axis")(a, m, axis=axis)
            np.testing.assert_allclose(got, ref.masked_mean_axis(a, m, axis), rtol=1e-5, atol=1e-6)
        for shift in (True, False):
            got = self.variant(masked_whiten, static_argnames="shift_mean")(a, m, shift_mean=shift)
            np.testing.assert_allclose(got, ref.masked_whiten(a, m, shift), rtol=1e-4, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient_of_whiten_matches_finite_differences(self):
        _, m, x = random_inputs(seed=5, b=4, t=4)
        a, c = x(), x()
        grad = self.variant(jax.grad(lambda z: jnp.sum(c * m * masked_whiten(z, m))))(jnp.asarray(a))
        fd = ref.finite_difference_grad(lambda z: np.sum(c * m * ref.masked_whiten(z, m)), a)
        np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(np.asarray(grad)[m == 0], 0.0)  # masked entries do not move the statistics

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_mask_mean_is_zero(self):
        np.testing.assert_allclose(self.variant(masked_mean)(jnp.ones((2, 3)), jnp.zeros((2, 3))), 0.0)


@given(x=hnp.arrays(np.float32, (3, 5), elements=st.floats(-10, 10, width=32)),
       m=hnp.arrays(np.bool_, (3, 5)))
def test_property_whitened_valid_entries_have_zero_mean_unit_variance(x, m):
    if m.sum() < 2 or np.var(x[m]) < 1e-3:
        return
    w = np.asarray(jax.jit(masked_whiten)(x, m))
    assert abs(w[m].mean()) < 1e-4
    np.testing.assert_allclose(w[m].var(ddof=1), 1.0, rtol=1e-3)


def test_unbiased_variance_needs_two_entries():
    with pytest.raises(ValueError, match="at least two"):
        masked_whiten(jnp.ones((1, 3)), jnp.array([[0, 1, 0]]))
    with pytest.raises(ValueError, match="empty"):
        masked_whiten(jnp.ones((1, 3)), jnp.zeros((1, 3)))


def test_shape_mismatch_names_arguments():
    with pytest.raises(ValueError, match=r"x\[2, 3\].*mask\[3, 2\]"):
        masked_mean(jnp.ones((2, 3)), jnp.ones((3, 2)))
