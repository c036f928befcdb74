"""Dtype names of the config (``model.param_dtype`` / ``model.compute_dtype``) -> JAX dtypes, in one place."""

from __future__ import annotations

import jax.numpy as jnp

from jaxppo.models.config import DTYPES

_BY_NAME = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
assert set(_BY_NAME) == set(DTYPES), "jaxppo.models.dtypes and LMConfig DTYPES disagree"


def dtype_of(name: str) -> jnp.dtype:
    """``jnp.dtype`` of a config dtype name (``"float32"``, ``"bfloat16"`` or ``"float16"``); ValueError otherwise."""
    if not isinstance(name, str) or name not in _BY_NAME:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return jnp.dtype(_BY_NAME[name])


__all__ = ["dtype_of"]
