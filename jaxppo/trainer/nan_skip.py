"""Skipping a non-finite update in-graph, as every trainer's step does.

A step whose loss or gradients are not all finite keeps the fields it would have changed (parameters, optimizer
states, ...: :func:`keep_if_finite`) and is counted (:func:`skip_counts`)::

    nan_total'  = nan_total + [not finite]
    nan_streak' = 0 if finite else nan_streak + 1

The harness reads the two counters (``guards.max_nan_steps`` skipped steps in a row roll back); the step logs
``train/nan_skipped`` (:func:`skipped_metric`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def keep_if_finite(finite: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``finite``, else ``old`` (leaf by leaf; the two trees have one structure)."""
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def skip_counts(state: Any, finite: jax.Array) -> dict[str, jax.Array]:
    """``{"nan_total", "nan_streak"}`` of ``state`` after a step that was applied (``finite``) or skipped (int32)."""
    return {"nan_total": state.nan_total + (~finite).astype(jnp.int32),
            "nan_streak": jnp.where(finite, 0, state.nan_streak + 1).astype(jnp.int32)}


def skipped_metric(finite: jax.Array) -> jax.Array:
    """``train/nan_skipped``: 1.0 for a skipped step, else 0.0 (float32)."""
    return (~finite).astype(jnp.float32)


__all__ = ["keep_if_finite", "skip_counts", "skipped_metric"]
