"""Input checks shared by the ops.

Every check raises a ``ValueError`` (or ``TypeError``) whose message names the argument and says
what is allowed. Checks on array *values* only run when the value is concrete (outside ``jit``);
shape, dtype and option checks always run, because they are static under tracing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
    """True when ``x`` is a Python number or a concrete (non-traced) array."""
    return not isinstance(x, jax.core.Tracer)


def check_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Raise if ``value`` is not one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed: {', '.join(repr(a) for a in allowed)}")


def check_same_shape(**arrays: Any) -> tuple[int, ...]:
    """Raise unless all arrays have the same shape; return that shape."""
    shapes = {k: tuple(jnp.shape(v)) for k, v in arrays.items()}
    first = next(iter(shapes.values()))
    if any(s != first for s in shapes.values()):
        detail = ", ".join(f"{k}{list(s)}" for k, s in shapes.items())
        raise ValueError(f"shape mismatch: {detail} must all have the same shape")
    return first


def check_ndim(name: str, x: Any, ndim: int, layout: str = "[B, T]") -> None:
    """Raise unless ``x`` has ``ndim`` dimensions."""
    if jnp.ndim(x) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {list(jnp.shape(x))}")


def check_floating(name: str, x: Any) -> None:
    """Raise unless ``x`` has a floating dtype."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")


def check_scalar_range(name: str, value: Any, *, gt: float | None = None, ge: float | None = None,
                       lt: float | None = None, le: float | None = None) -> None:
    """Raise if a concrete scalar lies outside the stated bounds (traced scalars are not checked)."""
    if not is_concrete(value):
        return
    arr = np.asarray(value)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got shape {list(arr.shape)}")
    v = float(arr)
    bounds = []
    ok = not np.isnan(v)
    if gt is not None:
        ok &= v > gt
        bounds.append(f"> {gt}")
    if ge is not None:
        ok &= v >= ge
        bounds.append(f">= {ge}")
    if lt is not None:
        ok &= v < lt
        bounds.append(f"< {lt}")
    if le is not None:
        ok &= v <= le
        bounds.append(f"<= {le}")
    if not ok:
        raise ValueError(f"{name} must be {' and '.join(bounds)}, got {v}")


def as_mask(mask: Any, dtype: Any) -> jax.Array:
    """The mask as an array of ``dtype`` (bool, int or float masks are accepted)."""
    return jnp.asarray(mask).astype(dtype)


def compute_dtype(*xs: Any) -> Any:
    """Floating dtype used for the arithmetic: the inputs' promoted float type, at least float32."""
    return jnp.promote_types(jnp.result_type(*xs), jnp.float32)
