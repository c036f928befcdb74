"""Masked reductions and whitening (verl ``torch_functional`` numerics).

``mask`` is 1 on valid entries and 0 elsewhere (bool, int or float). Values outside the mask never
reach a result, even if they are NaN or inf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import as_mask, check_same_shape, compute_dtype, is_concrete

Axis = int | tuple[int, ...] | None

#: added to the count in ``masked_mean`` and to the variance in ``masked_whiten`` (as verl).
EPS = 1e-8


def masked_sum(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """``sum(x * mask)`` over ``axis``; entries outside the mask count as 0 (NaN-safe)."""
    check_same_shape(x=x, mask=mask)
    x = jnp.asarray(x)
    m = as_mask(mask, compute_dtype(x))
    return jnp.sum(jnp.where(m != 0, x, 0) * m, axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """Masked mean ``sum(x * mask) / (sum(mask) + 1e-8)`` over ``axis`` (all axes by default).

    An empty mask gives 0.
    """
    check_same_shape(x=x, mask=mask)
    m = as_mask(mask, compute_dtype(x))
    return masked_sum(x, mask, axis) / (jnp.sum(m, axis=axis) + EPS)


def masked_var(x: jax.Array, mask: jax.Array, unbiased: bool = True) -> jax.Array:
    """Masked variance over all entries: ``mean_m((x - mean_m(x))^2)``, times ``n / (n - 1)`` when unbiased.

    ``n = sum(mask)``. As in verl, an unbiased variance needs ``n >= 2``: with a concrete mask a smaller
    ``n`` raises ``ValueError``; under ``jit`` (mask traced) the Bessel factor is dropped for ``n < 2``
    and the (zero) biased variance is returned.
    """
    check_same_shape(x=x, mask=mask)
    mean = masked_mean(x, mask)
    var = masked_mean(jnp.square(x - mean), mask)
    if not unbiased:
        return var
    n = jnp.sum(as_mask(mask, var.dtype))
    if is_concrete(n):
        count = float(n)
        if count == 0:
            raise ValueError("masked_var: the mask is empty; at least two entries must be 1 for an unbiased variance")
        if count == 1:
            raise ValueError("masked_var: the mask has a single 1; an unbiased variance needs at least two entries")
    bessel = jnp.where(n > 1, n / jnp.where(n > 1, n - 1, 1), 1)
    return var * bessel


def masked_whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
    """Whiten with masked statistics: ``(x - mean) * rsqrt(var + 1e-8)`` (``var`` unbiased).

    With ``shift_mean=False`` the mean is added back: ``(x - mean) * rsqrt(var + 1e-8) + mean``.
    Every entry is transformed (also those outside the mask), as in verl.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    out = (x - mean) * jax.lax.rsqrt(var + EPS)
    if not shift_mean:
        out = out + mean
    return out
