"""Policy log-probs, entropies and values of response tokens, from parameters (functional models).

Layout (docs/interfaces): ``ids = concat(prompt_ids [B,P], response_ids [B,R])``; response token ``t``
is predicted by position ``P+t-1``, so logits and values are read at ``[:, P-1 : P+R-1]``.
With ``share_trunk`` the value head reads the actor's hidden states at those positions.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo import ops


def _ids_mask(items: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array, int, int]:
    p = items["prompt_ids"].shape[1]
    r = items["response_ids"].shape[1]
    ids = jnp.concatenate([items["prompt_ids"], items["response_ids"]], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([items["prompt_mask"], items["response_mask"]], axis=1).astype(jnp.int32)
    return ids, mask, p, r


def response_positions(x: jax.Array, prompt_len: int, response_len: int) -> jax.Array:
    """``x[:, P-1 : P+R-1]``: the positions whose outputs predict the response tokens (``[B, P+R, ...]`` in)."""
    return x[:, prompt_len - 1:prompt_len + response_len - 1]


def response_logits(actor_gd, actor_params, items: Mapping[str, jax.Array]) -> jax.Array:
    """``logits [B,R,V] f32`` of the response tokens under the policy ``actor_params``."""
    actor = nnx.merge(actor_gd, actor_params)
    ids, mask, p, r = _ids_mask(items)
    return actor.logits_from_hidden(response_positions(actor.hidden_states(ids, mask), p, r)).astype(jnp.float32)


def response_values(critic_gd, critic_params, items: Mapping[str, jax.Array]) -> jax.Array:
    """``values [B,R] f32`` of a separate critic (``ValueModel``) at the response positions."""
    ids, mask, p, r = _ids_mask(items)
    return response_positions(nnx.merge(critic_gd, critic_params)(ids, mask), p, r).astype(jnp.float32)


def response_logits_values(actor_gd, actor_params, critic_gd, critic_params, items: Mapping[str, jax.Array], *,
                           share_trunk: bool) -> tuple[jax.Array, jax.Array]:
    """``(logits [B,R,V] f32, values [B,R] f32)`` of the response tokens of ``items``."""
    if not share_trunk:
        return (response_logits(actor_gd, actor_params, items),
                response_values(critic_gd, critic_params, items))
    actor = nnx.merge(actor_gd, actor_params)
    ids, mask, p, r = _ids_mask(items)
    h_r = response_positions(actor.hidden_states(ids, mask), p, r)
    logits = actor.logits_from_hidden(h_r).astype(jnp.float32)
    values = nnx.merge(critic_gd, critic_params)(h_r)
    return logits, values.astype(jnp.float32)


def logp_entropy(logits: jax.Array, response_ids: jax.Array, response_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log π(y_t), H_t)`` [B,R], both 0 outside ``response_mask``."""
    m = response_mask.astype(jnp.float32)
    logp = ops.logprobs_from_logits(logits, response_ids.astype(jnp.int32)) * m
    ent = ops.entropy_from_logits(logits) * m
    return logp, ent
