"""Per-token entropy and log-probabilities from logits (computed in at least float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import compute_dtype


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Categorical entropy over the last axis: ``H = logsumexp(z) - sum(softmax(z) * z)``.

    ``logits [..., V] -> [...]``. ``-inf`` logits (banned tokens) contribute 0.
    """
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits must have a vocabulary axis [..., V], got shape {list(jnp.shape(logits))}")
    z = jnp.asarray(logits).astype(compute_dtype(logits))
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jax.nn.softmax(z, axis=-1)
    pz = jnp.where(p > 0, p * jnp.where(jnp.isfinite(z), z, 0), 0)
    return lse - jnp.sum(pz, axis=-1)


def logprobs_from_logits(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """``log softmax(z)[..., token]``: ``z[token] - logsumexp(z)``; ``logits [..., V]``, ``tokens [...]`` int.

    Token ids outside ``[0, V)`` raise when ``tokens`` is concrete (under ``jit`` they are clamped).
    """
    logits = jnp.asarray(logits)
    tokens = jnp.asarray(tokens)
    if logits.ndim < 1 or tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"tokens shape {list(tokens.shape)} must equal logits shape without the vocabulary "
                         f"axis {list(logits.shape[:-1])}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"tokens must be an integer array, got dtype {tokens.dtype}")
    vocab = logits.shape[-1]
    if not isinstance(tokens, jax.core.Tracer) and tokens.size:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"tokens must lie in [0, {vocab}) (vocabulary size), got range [{lo}, {hi}]")
    z = logits.astype(compute_dtype(logits))
    picked = jnp.take_along_axis(z, jnp.clip(tokens, 0, vocab - 1)[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(z, axis=-1)
