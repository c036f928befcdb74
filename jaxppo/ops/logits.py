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


def entropy_metric_from_logits(logits: jax.Array) -> jax.Array:
    """The entropy of :func:`entropy_from_logits` for logging only (no gradient: ``stop_gradient`` on the logits).

    ``H = lse − Σ_v e_v·z_v / s`` with ``a = max_v z_v`` (0 if not finite), ``e = exp(z − a)``, ``s = Σ_v e_v``,
    ``lse = log s + a``: one exponential pass whose ``exp(z − a)`` is the one ``jax.nn.logsumexp`` computes for the
    log-probs of the same logits (XLA shares it), instead of the separate softmax pass of the differentiable form.
    Equal to :func:`entropy_from_logits` up to float rounding. ``logits [..., V] -> [...]``; ``-inf`` logits
    contribute 0.
    """
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits must have a vocabulary axis [..., V], got shape {list(jnp.shape(logits))}")
    z = jax.lax.stop_gradient(jnp.asarray(logits).astype(compute_dtype(logits)))
    a = jnp.max(z, axis=-1, keepdims=True)
    a = jnp.where(jnp.isfinite(a), a, 0.0)
    e = jnp.exp(z - a)
    s = jnp.sum(e, axis=-1, keepdims=True)
    ez = jnp.sum(jnp.where(e > 0, e * z, 0.0), axis=-1, keepdims=True)
    return (jnp.log(s) + a - ez / s)[..., 0]


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
