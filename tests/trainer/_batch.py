"""Test helper: a ``BufferItem`` minibatch from a flat dict of the fields a test sets (the rest zeros)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxppo.trainer.ppo.buffer_types import (
    TRAJECTORY_DTYPES,
    BufferItem,
    Prepared,
    Trajectories,
    field_shape,
)

_PREPARED = tuple(f.name for f in dataclasses.fields(Prepared))


def as_batch(fields: dict) -> BufferItem:
    """``BufferItem`` of ``B`` rows (``B, R`` from ``response_mask``): the given fields, zeros for the other data and
    prepared fields (prompts of length 1), ``values`` None unless given. Unknown names are an error."""
    unknown = set(fields) - set(TRAJECTORY_DTYPES) - set(_PREPARED)
    if unknown:
        raise KeyError(f"not BufferItem fields: {sorted(unknown)}")
    b, r = fields["response_mask"].shape

    def get(k, dtype, shape):
        return jnp.asarray(fields[k]) if k in fields else jnp.zeros((b, *shape), dtype)
    data = Trajectories(**{k: get(k, TRAJECTORY_DTYPES[k], field_shape(k, 1, r)) for k in TRAJECTORY_DTYPES})
    prepared = Prepared(**{k: get(k, jnp.float32, (r,)) for k in _PREPARED if k != "values"},
                        values=jnp.asarray(fields["values"]) if "values" in fields else None)
    return BufferItem(data=data, prepared=prepared)
