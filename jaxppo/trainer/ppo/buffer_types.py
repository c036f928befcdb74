"""Typed pytrees of the trainer's data: the buffer row :class:`BufferItem` = (:class:`Trajectories`, :class:`Prepared`).

The replay buffer (``jaxppo.replay``, which stores any pytree) holds one ``BufferItem`` per slot; a sampled
minibatch is a ``BufferItem`` of ``[B, ...]`` leaves, and every jitted function (prepare, the train step, the
loss terms) reads its fields by name. Shapes below are per batch of ``N`` rows (``N`` = buffer slots or
minibatch rows), ``P`` = prompt length (left-padded), ``R`` = response length (right-padded):

* :class:`Trajectories` — the data rows (from the data layer's numpy dict, cast to :data:`TRAJECTORY_DTYPES`);
  fixed for the life of a buffer window.
* :class:`Prepared` — what the prepare pass recomputes for every slot from the current policy/critic
  (``jaxppo.trainer.ppo.prepare``); ``values`` is ``None`` without a critic (critic-free advantage estimators), so
  nothing is stored, sharded or checkpointed for it.

The PF-PPO resample counts of a minibatch (``pf_ppo.reweight_method``) are not part of a row: the train step
passes them to the loss terms as an explicit ``counts`` argument (``jaxppo.trainer.ppo.steps``).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import jax
import numpy as np
from flax import struct


@struct.dataclass
class Trajectories:
    """The data fields of ``N`` rows.

    ``prompt_ids``         int32 ``[N, P]`` prompt tokens (left-padded);
    ``prompt_mask``        int32 ``[N, P]`` 1 on real prompt tokens;
    ``response_ids``       int32 ``[N, R]`` response tokens (right-padded);
    ``response_mask``      int32 ``[N, R]`` 1 on real response tokens (``m``);
    ``behaviour_logprobs`` float32 ``[N, R]`` log-probs of the behaviour policy μ that wrote the responses;
    ``score``              float32 ``[N]`` the sequence reward ``s``;
    ``group_id``           int32 ``[N]`` prompt group (padding slots get negative ids of their own);
    ``row``                int32 ``[N]`` dataset row (after the group ordering of ``windows.group_order``);
    ``ref_logp``           float32 ``[N, R]`` log-probs of the frozen reference (initial) policy;
    ``filter_w``           float32 ``[N]`` PF-PPO filter weight ``f`` (1 without a filter; 0: never sampled).
    """

    prompt_ids: jax.Array
    prompt_mask: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array
    behaviour_logprobs: jax.Array
    score: jax.Array
    group_id: jax.Array
    row: jax.Array
    ref_logp: jax.Array
    filter_w: jax.Array


@struct.dataclass
class Prepared:
    """The per-slot arrays of the prepare pass, each float32 ``[N, R]`` and 0 outside the response mask.

    ``prox_logp`` log-probs of the proximal ("old") policy snapshot; ``token_rewards`` ``r_t``; ``advantages``
    ``A_t``; ``returns`` ``G_t``; ``values`` ``V_t`` of the critic at the refresh (``None`` without a critic).
    """

    prox_logp: jax.Array
    token_rewards: jax.Array
    advantages: jax.Array
    returns: jax.Array
    values: jax.Array | None = None


@struct.dataclass
class BufferItem:
    """One replay row (or a batch of rows): its data and its prepared arrays. ``packed``: the packed layout of a
    drawn minibatch's micro-batches (``jaxppo.trainer.ppo.update_packing``), set by the update step with
    ``data.packing``; None in the buffer."""

    data: Trajectories
    prepared: Prepared
    packed: Any = None


class TokenFields(Protocol):
    """Anything with the four token fields the forward pass reads (a :class:`Trajectories`, :class:`Tokens`)."""

    prompt_ids: jax.Array
    prompt_mask: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array


@struct.dataclass
class Tokens:
    """Only the model inputs of ``N`` rows (shapes/dtypes as in :class:`Trajectories`); what prepare maps over."""

    prompt_ids: jax.Array
    prompt_mask: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array

    @classmethod
    def of(cls, t: TokenFields) -> "Tokens":
        return cls(prompt_ids=t.prompt_ids, prompt_mask=t.prompt_mask, response_ids=t.response_ids,
                   response_mask=t.response_mask)


#: dtype of every :class:`Trajectories` field (the data rows are cast to these, so an abstract plan and a real
#: run agree); every :class:`Prepared` field is float32.
TRAJECTORY_DTYPES: dict[str, type] = {
    "prompt_ids": np.int32, "prompt_mask": np.int32, "response_ids": np.int32, "response_mask": np.int32,
    "behaviour_logprobs": np.float32, "score": np.float32, "group_id": np.int32, "row": np.int32,
    "ref_logp": np.float32, "filter_w": np.float32}
PREPARED_DTYPE = np.float32
TRAJECTORY_FIELDS = tuple(TRAJECTORY_DTYPES)
_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
_SCALAR_FIELDS = ("score", "group_id", "row", "filter_w")


def field_shape(name: str, prompt_len: int, response_len: int) -> tuple[int, ...]:
    """Per-row shape of a :class:`Trajectories` field: ``()`` scalars, ``(P,)`` prompt fields, else ``(R,)``."""
    if name in _SCALAR_FIELDS:
        return ()
    return (prompt_len,) if name in _PROMPT_FIELDS else (response_len,)


def trajectories_from_arrays(arrays: Mapping[str, np.ndarray], rows: np.ndarray | None = None) -> Trajectories:
    """A numpy :class:`Trajectories` from the data layer's dict (``Run.train``: the data fields plus ``ref_logp``
    and ``filter_w``), taking ``rows`` (all rows by default) and casting to :data:`TRAJECTORY_DTYPES`.
    ``KeyError`` naming the missing fields."""
    missing = [k for k in TRAJECTORY_FIELDS if k not in arrays]
    if missing:
        raise KeyError(f"trajectory arrays lack the fields {missing} (have {sorted(arrays)})")

    def take(k):
        x = np.asarray(arrays[k])
        return (x if rows is None else x[rows]).astype(TRAJECTORY_DTYPES[k])
    return Trajectories(**{k: take(k) for k in TRAJECTORY_FIELDS})


def zero_prepared(n: int, response_len: int, *, critic: bool) -> Prepared:
    """Float32 zeros ``[n, R]`` for every :class:`Prepared` field (``values`` only with a critic)."""
    def z():
        return np.zeros((n, response_len), PREPARED_DTYPE)
    return Prepared(prox_logp=z(), token_rewards=z(), advantages=z(), returns=z(), values=z() if critic else None)


def example_item(prompt_len: int, response_len: int, *, critic: bool = True) -> BufferItem:
    """One buffer item (no batch axis) as ``ShapeDtypeStruct`` leaves, for ``jaxppo.replay.init``: the data fields
    (shapes of :func:`field_shape`, :data:`TRAJECTORY_DTYPES`) and the prepared ``[R]`` float32 arrays (no
    ``values`` without a critic)."""
    data = Trajectories(**{k: jax.ShapeDtypeStruct(field_shape(k, prompt_len, response_len), TRAJECTORY_DTYPES[k])
                           for k in TRAJECTORY_FIELDS})
    row = jax.ShapeDtypeStruct((response_len,), PREPARED_DTYPE)
    return BufferItem(data=data, prepared=Prepared(prox_logp=row, token_rewards=row, advantages=row, returns=row,
                                                   values=row if critic else None))
