"""Policy log-probs, entropies and values of response tokens, from parameters (functional models).

Layout (docs/interfaces): ``ids = concat(prompt_ids [B,P], response_ids [B,R])``; response token ``t``
is predicted by position ``P+t-1``, so logits and values are read at ``[:, P-1 : P+R-1]``.
With ``share_trunk`` the value head reads the actor's hidden states at those positions. ``batch`` is anything with the
token fields ``prompt_ids``, ``prompt_mask``, ``response_ids``, ``response_mask`` (``batch.TokenFields``: a
``Trajectories`` or ``Tokens``). ``lora_key``: adapter dropout (``jaxppo.models.lora_dropout``), passed only by the
training update's loss (``steps.make_phases``); every other caller (prepare, evaluation) leaves it None.

``group_size = n > 1`` (the training update with ``replay.group_size = n``): the batch is made of whole prompt groups,
rows ``k·n .. k·n+n−1`` sharing one prompt (the same ``prompt_ids``/``prompt_mask``; the buffer checks it,
``windows.check_whole_groups``), and the trunk runs each group's prompt once (``Transformer.shared_prefix``) with every
response attending to it and rotated as in its own row: the same hidden states as the row layout, ``(P + n·R)/(n·(P+R))``
of the token positions. With a packed layout as well (``packed``, planned by ``trainer.packed.plan_pieces(...,
group_size=n)``), each group is one packed item, its prompt once (``packing.pack_shared``): the packed passes read
the batch as its continuation-major stack (:func:`stack_order`) and return the outputs in row order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo import ops
from jaxppo.models.adapters import merge_with_base, trunk_of
from jaxppo.models.packing import gather, head_gather, head_scatter, head_targets
from jaxppo.ops.logits import entropy_metric_from_logits
from jaxppo.trainer.ppo.buffer_types import TokenFields


def _ids_mask(batch: TokenFields) -> tuple[jax.Array, jax.Array, int, int]:
    p = batch.prompt_ids.shape[1]
    r = batch.response_ids.shape[1]
    ids = jnp.concatenate([batch.prompt_ids, batch.response_ids], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([batch.prompt_mask, batch.response_mask], axis=1).astype(jnp.int32)
    return ids, mask, p, r


class _Responses(NamedTuple):
    """The response fields of a batch, reordered (:func:`stack_order`)."""

    response_ids: jax.Array
    response_mask: jax.Array


def stack_order(x: jax.Array, group_size: int, inverse: bool = False) -> jax.Array:
    """Rows ``[G·n, ...]`` in whole groups of ``n`` (row ``g·n + c`` = continuation ``c`` of group ``g``) as the
    continuation-major stack ``[n·G, ...]`` (row ``c·G + g``) of ``packing.pack_shared``; ``inverse``: back."""
    n = int(group_size)
    g = x.shape[0] // n
    shape = (g, n) if not inverse else (n, g)
    return jnp.swapaxes(x.reshape(*shape, *x.shape[1:]), 0, 1).reshape(x.shape)


def _packed_view(batch: TokenFields, group_size: int):
    """``(batch as the packed plan's sequences, outputs [.., R] back to row order)``: the batch itself with
    ``group_size = 1``; its continuation-major stack with ``n > 1`` (module docstring)."""
    n = int(group_size)
    if n == 1:
        return batch, lambda y: y
    if batch.response_ids.shape[0] % n:
        raise ValueError(f"packed batch of {batch.response_ids.shape[0]} rows is not made of whole groups of {n}")
    view = _Responses(stack_order(batch.response_ids, n), stack_order(batch.response_mask, n))
    return view, lambda y: stack_order(y, n, inverse=True)


def response_positions(x: jax.Array, prompt_len: int, response_len: int) -> jax.Array:
    """``x[:, P-1 : P+R-1]``: the positions whose outputs predict the response tokens (``[B, P+R, ...]`` in)."""
    return x[:, prompt_len - 1:prompt_len + response_len - 1]


def response_hidden(trunk, batch: TokenFields, *, group_size: int = 1, lora_key=None, packed=None) -> jax.Array:
    """``h [B,R,D]``: the final-normed hidden states of the trunk (a ``Transformer``) at the positions that predict
    the response tokens. ``group_size = n > 1``: ``B = G·n`` rows, ``n`` consecutive rows per prompt, each prompt
    through the trunk once (module docstring); the result equals the row layout's.

    ``packed``: the batch's packed layout (``jaxppo.models.packing.pack_batch(batch)``): the trunk runs on the packed
    rows (``Transformer.packed``) and ``h`` is gathered at ``packed.response_index``; equal to the row layout's where
    ``response_mask`` is 1, and 0 elsewhere (the row layout has the hidden states of padding slots there)."""
    if packed is not None:
        view, back = _packed_view(batch, group_size)
        h = trunk.packed(packed.ids, packed.segment_ids, packed.positions, branch_ids=packed.branch_ids,
                         lora_key=lora_key)
        return back(gather(h, packed.response_index, view.response_mask))
    n = int(group_size)
    if n == 1:
        ids, mask, p, r = _ids_mask(batch)
        return response_positions(trunk(ids, mask, lora_key=lora_key), p, r)
    b, p = batch.prompt_ids.shape
    r = batch.response_ids.shape[1]
    if n < 1 or b % n:
        raise ValueError(f"response_hidden: a batch of {b} rows is not made of whole groups of {n}")
    first = lambda x: x.reshape(b // n, n, p)[:, 0]     # noqa: E731  (the group's prompt: its first row's)
    hp, hr = trunk.shared_prefix(first(batch.prompt_ids).astype(jnp.int32), first(batch.prompt_mask),
                                 batch.response_ids.reshape(b // n, n, r).astype(jnp.int32),
                                 batch.response_mask.reshape(b // n, n, r), lora_key=lora_key)
    d = hr.shape[-1]
    last = jnp.broadcast_to(hp[:, None, -1:], (b // n, n, 1, d))        # the prompt's last slot predicts y_0
    return jnp.concatenate([last, hr[:, :, :r - 1]], axis=2).reshape(b, r, d)


def response_logits(actor_gd, actor_params, batch: TokenFields, *, base=None, lora_key=None,
                    group_size: int = 1) -> jax.Array:
    """``logits [B,R,V] f32`` of the response tokens under the policy ``actor_params`` (with adapters: the
    trainable part, ``base`` the frozen one; ``jaxppo.models.adapters``). Row layout only: packed batches go through
    :func:`response_logp_entropy`, whose LM head runs on the real response tokens only."""
    actor = merge_with_base(actor_gd, actor_params, base)
    h = response_hidden(actor.model, batch, group_size=group_size, lora_key=lora_key)
    return actor.logits_from_hidden(h).astype(jnp.float32)


def response_values(critic_gd, critic_params, batch: TokenFields, *, base=None, lora_key=None,
                    group_size: int = 1, packed=None) -> jax.Array:
    """``values [B,R] f32`` of a separate critic (``ValueModel``) at the response positions; with adapters
    ``base`` is the actor's frozen base, whose trunk the critic shares (``adapters.trunk_of``). ``packed``:
    ``response_hidden`` (the values of padding slots are then the head's bias)."""
    critic = merge_with_base(critic_gd, critic_params, None if base is None else trunk_of(base))
    h = response_hidden(critic.model, batch, group_size=group_size, lora_key=lora_key, packed=packed)
    return critic.value_head(h).astype(jnp.float32)


def response_logits_values(actor_gd, actor_params, critic_gd, critic_params, batch: TokenFields, *,
                           share_trunk: bool, base=None, lora_key=None,
                           group_size: int = 1) -> tuple[jax.Array, jax.Array]:
    """``(logits [B,R,V] f32, values [B,R] f32)`` of the response tokens of ``batch`` (``lora_key`` only with
    ``share_trunk``: one trunk pass, whose adapter dropout the value head sees too). Row layout only, as
    :func:`response_logits`."""
    if not share_trunk:
        if lora_key is not None:
            raise ValueError("response_logits_values: lora_key with separate models; give each model its own key")
        return (response_logits(actor_gd, actor_params, batch, base=base, group_size=group_size),
                response_values(critic_gd, critic_params, batch, base=base, group_size=group_size))
    actor = merge_with_base(actor_gd, actor_params, base)
    h_r = response_hidden(actor.model, batch, group_size=group_size, lora_key=lora_key)
    logits = actor.logits_from_hidden(h_r).astype(jnp.float32)
    values = nnx.merge(critic_gd, critic_params)(h_r)
    return logits, values.astype(jnp.float32)


def _packed_logp_entropy(actor, h: jax.Array, batch: TokenFields, packed, entropy_grad: bool
                         ) -> tuple[jax.Array, jax.Array]:
    """:func:`logp_entropy` [B,R] from the packed rows' hidden states ``h`` [N,L,D]: the LM head runs on the ``H``
    real response tokens only (``packing.head_gather``), the results go back to ``[B,R]`` (0 elsewhere)."""
    z = actor.logits_from_hidden(head_gather(h, packed)).astype(jnp.float32)      # [H, V]
    ids = head_targets(batch.response_ids, packed)
    lp, ent = logp_entropy(z, ids, jnp.ones(ids.shape, jnp.float32), entropy_grad=entropy_grad)
    shape, m = batch.response_ids.shape, batch.response_mask.astype(jnp.float32)
    return head_scatter(lp, packed, shape) * m, head_scatter(ent, packed, shape) * m


def response_logp_entropy(actor_gd, actor_params, batch: TokenFields, *, base=None, lora_key=None,
                          group_size: int = 1, packed=None, entropy_grad: bool = True) -> tuple[jax.Array, jax.Array]:
    """:func:`logp_entropy` ``(log π(y_t), H_t)`` [B,R] of the response tokens under the policy ``actor_params``
    (arguments as :func:`response_logits`). ``packed``: the trunk runs on the packed rows and the LM head on the real
    response tokens only (not on the ``B·R`` response slots); equal to the row layout's up to float summation order."""
    if packed is None:
        logits = response_logits(actor_gd, actor_params, batch, base=base, lora_key=lora_key, group_size=group_size)
        return logp_entropy(logits, batch.response_ids, batch.response_mask, entropy_grad=entropy_grad)
    view, back = _packed_view(batch, group_size)
    actor = merge_with_base(actor_gd, actor_params, base)
    h = actor.model.packed(packed.ids, packed.segment_ids, packed.positions, branch_ids=packed.branch_ids,
                           lora_key=lora_key)
    return tuple(map(back, _packed_logp_entropy(actor, h, view, packed, entropy_grad)))


def response_logp_entropy_values(actor_gd, actor_params, critic_gd, critic_params, batch: TokenFields, *,
                                 share_trunk: bool, base=None, lora_key=None, group_size: int = 1, packed=None,
                                 entropy_grad: bool = True) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    """``((logp, entropy) [B,R], values [B,R])``: :func:`response_logp_entropy` and the critic's values
    (:func:`response_logits_values`'s arguments; with ``share_trunk`` one trunk pass feeds the LM head and the
    value head)."""
    kw = dict(base=base, group_size=group_size, packed=packed)
    if not share_trunk:
        if lora_key is not None:
            raise ValueError("response_logp_entropy_values: lora_key with separate models; give each model its own key")
        return (response_logp_entropy(actor_gd, actor_params, batch, entropy_grad=entropy_grad, **kw),
                response_values(critic_gd, critic_params, batch, **kw))
    if packed is None:
        logits, values = response_logits_values(actor_gd, actor_params, critic_gd, critic_params, batch,
                                                share_trunk=True, lora_key=lora_key, base=base,
                                                group_size=group_size)
        return logp_entropy(logits, batch.response_ids, batch.response_mask, entropy_grad=entropy_grad), values
    view, back = _packed_view(batch, group_size)
    actor = merge_with_base(actor_gd, actor_params, base)
    h = actor.model.packed(packed.ids, packed.segment_ids, packed.positions, branch_ids=packed.branch_ids,
                           lora_key=lora_key)
    values = nnx.merge(critic_gd, critic_params)(gather(h, packed.response_index, view.response_mask))
    logp, ent = _packed_logp_entropy(actor, h, view, packed, entropy_grad)
    return (back(logp), back(ent)), back(values.astype(jnp.float32))


def logp_entropy(logits: jax.Array, response_ids: jax.Array, response_mask: jax.Array, *,
                 entropy_grad: bool = True) -> tuple[jax.Array, jax.Array]:
    """``(log π(y_t), H_t)`` [B,R], both 0 outside ``response_mask``.

    ``entropy_grad=False`` (an entropy coefficient of 0: ``H`` is only logged): ``H`` is
    ``ops.logits.entropy_metric_from_logits`` (no gradient, one shared exponential pass over ``[B,R,V]``) instead of the
    differentiable ``ops.entropy_from_logits`` (a softmax pass and its backward).
    """
    m = response_mask.astype(jnp.float32)
    logp = ops.logprobs_from_logits(logits, response_ids.astype(jnp.int32)) * m
    ent_fn = ops.entropy_from_logits if entropy_grad else entropy_metric_from_logits
    ent = ent_fn(logits) * m
    return logp, ent
