"""The in-graph skip of a non-finite update (``trainer.nan_skip``) and its counters."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxppo.trainer.nan_skip import keep_if_finite, skip_counts, skipped_metric


@struct.dataclass
class _S:
    nan_total: jnp.ndarray
    nan_streak: jnp.ndarray


def test_keep_if_finite_picks_the_tree():
    new, old = {"a": jnp.ones(3), "b": jnp.float32(2)}, {"a": jnp.zeros(3), "b": jnp.float32(5)}
    assert float(keep_if_finite(jnp.bool_(True), new, old)["b"]) == 2.0
    kept = keep_if_finite(jnp.bool_(False), new, old)
    np.testing.assert_array_equal(kept["a"], np.zeros(3))
    assert float(kept["b"]) == 5.0


def test_counters_and_metric():
    s = _S(nan_total=jnp.int32(4), nan_streak=jnp.int32(2))
    skipped = skip_counts(s, jnp.bool_(False))
    assert (int(skipped["nan_total"]), int(skipped["nan_streak"])) == (5, 3)
    applied = skip_counts(s, jnp.bool_(True))
    assert (int(applied["nan_total"]), int(applied["nan_streak"])) == (4, 0)
    assert all(v.dtype == jnp.int32 for v in (*skipped.values(), *applied.values()))
    assert float(skipped_metric(jnp.bool_(False))) == 1.0 and float(skipped_metric(jnp.bool_(True))) == 0.0
