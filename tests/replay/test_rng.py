"""The fused uniform draws equal ``jax.random.uniform`` bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxppo.replay import rng


@pytest.mark.parametrize("n", [256])
def test_uniform_equals_jax_random(n):
    keys = [jax.random.key(0), jax.random.key(2 ** 31 - 1), jax.random.split(jax.random.key(5))[1],
            jax.random.PRNGKey(42)]
    f = jax.jit(rng.uniform, static_argnums=1)
    for key in keys:
        want = np.asarray(jax.random.uniform(key, (n,)))
        np.testing.assert_array_equal(rng.uniform(key, n), want)
        np.testing.assert_array_equal(f(key, n), want)
    batched = jax.vmap(lambda k: rng.uniform(k, n))(jax.random.split(jax.random.key(9), 3))
    np.testing.assert_array_equal(batched, jax.vmap(lambda k: jax.random.uniform(k, (n,)))(
        jax.random.split(jax.random.key(9), 3)))


def test_other_key_impls_fall_back():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(rng.uniform(key, 16), jax.random.uniform(key, (16,)))
