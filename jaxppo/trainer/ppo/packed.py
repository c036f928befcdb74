"""Packed layouts for the jitted passes over device-held rows (the PPO/GRPO update and the prepare pass): their rows'
token fields come to the host, the host plans one packed layout per piece (``jaxppo.models.packing.pack``), and the
jitted pass runs on ``(state, plan)`` (:class:`HostPlanned`).

Both passes split their ``B`` rows into ``n`` strided pieces (``jaxppo.trainer.micro``: piece ``j`` = rows
``j, j+n, j+2n, ...``; the update's micro-batches, the prepare pass's chunks). :func:`plan_pieces` packs each
piece's ``m = B/n`` sequences into ``N`` rows of ``L`` slots, ``N`` the same for every piece (the largest piece's
budget; the others get rows of padding), and lays the arrays out so that the strided split hands piece ``j`` its
own plan:

- row-indexed arrays (``ids``, ``segment_ids``, ``positions`` [n·N, L]): packed row ``k`` of piece ``j`` at
  row ``k·n + j``;
- sequence-indexed arrays (``response_index`` [B, R], ``token_index`` [B, P+R], ``last_index`` [B]): row
  ``k·n + j`` holds piece ``j``'s entry for its local row ``k``, a flat index into that piece's ``N·L`` slots;
- the real-response-token arrays (``head_index``, ``head_target`` [n·H]): entry ``k·n + j`` is piece ``j``'s
  entry ``k`` (``head_target`` flat into that piece's ``m·R``), ``H`` the same for every piece (the largest
  piece's budget; the others get padding entries).

``N`` is a multiple of ``multiple_of`` (the data-parallel size: each piece's rows are split over the batch axes)
and one of at most ``buckets`` values for a given ``m``; so is ``H`` (of ``m·R``). A pass compiles one program per
``(N, H)`` seen.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.models.packing import Packed, fill, pack, program_shape, row_budgets

logger = logging.getLogger("jaxppo.trainer")

TOKEN_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
ONE_DIM = ("last_index", "head_index", "head_target")   # the plan's one-dimensional arrays


def _pad_piece(p: Packed, n_rows: int, n_head: int, n_slots: int) -> Packed:
    """``p`` with padding rows (segment 0) appended up to ``n_rows`` and padding head entries (slot 0, target
    ``n_slots`` = the piece's ``m·R``, out of range) up to ``n_head``; its flat indices stay valid."""
    extra, more = n_rows - p.ids.shape[0], n_head - p.head_index.shape[0]
    pad = lambda a: np.concatenate([a, np.zeros((extra, a.shape[1]), a.dtype)])  # noqa: E731
    if extra:
        p = p._replace(ids=pad(p.ids), segment_ids=pad(p.segment_ids), positions=pad(p.positions))
    if more:
        p = p._replace(head_index=np.concatenate([p.head_index, np.zeros(more, np.int32)]),
                       head_target=np.concatenate([p.head_target, np.full(more, n_slots, np.int32)]))
    return p


def _interleave_rows(parts: list[np.ndarray]) -> np.ndarray:
    """``[n] x [N, ...] -> [N·n, ...]`` with part ``j``'s row ``k`` at ``k·n + j`` (inverse of the strided split)."""
    return np.stack(parts, axis=1).reshape(-1, *parts[0].shape[1:])


def plan_pieces(fields: dict[str, Any], n_micro: int, *, multiple_of: int = 1, buckets: int = 8) -> Packed:
    """The packed layout (module docstring) of ``B`` rows given as their token fields (:data:`TOKEN_FIELDS`, numpy
    ``[B, ...]``) for ``n_micro`` strided pieces."""
    arrays = [np.asarray(fields[k]) for k in TOKEN_FIELDS]
    b = arrays[0].shape[0]
    if n_micro < 1 or b % n_micro:
        raise ValueError(f"plan_pieces: {b} rows do not split into {n_micro} equal pieces")
    parts = [pack(*(a[j::n_micro] for a in arrays), buckets=buckets, multiple_of=multiple_of)
             for j in range(n_micro)]
    n_rows = max(p.ids.shape[0] for p in parts)     # each is a budget of row_budgets(m, ...), so is the largest
    n_head = max(p.head_index.shape[0] for p in parts)
    slots = (b // n_micro) * arrays[2].shape[1]
    parts = [_pad_piece(p, n_rows, n_head, slots) for p in parts]
    return Packed(*(_interleave_rows([getattr(p, f) for p in parts]) for f in Packed._fields))


def packed_shardings(mesh) -> Packed | None:
    """The shardings of a plan on ``mesh``: every array's leading axis over the batch axes (None without a mesh)."""
    if mesh is None:
        return None
    from jaxppo.parallel import batch_sharding

    return Packed(*(batch_sharding(mesh, 1 if f in ONE_DIM else 2) for f in Packed._fields))


class HostPlanned:
    """``self(state) = jitted(state, plan)``: ``tokens(state)`` (jitted, replicated) gives the token fields of the rows
    the pass reads from ``state`` (``rows`` of them; default: the buffer's slots), the host plans their packed
    layout for strided pieces of ``piece_rows`` rows (:func:`plan_pieces`, one of at most ``buckets`` row
    budgets), places it with ``shardings`` and calls the jitted pass. ``cache_key(state)`` (optional): the plan
    is reused while the key is unchanged (the prepare pass: the buffer's tokens change only when a window is
    loaded). ``programs`` holds the plan shapes seen (one compiled program each, logged when new).
    ``lower(state)`` lowers the pass with the largest plan (the memory plan's)."""

    def __init__(self, jitted, tokens, piece_rows: int, *, name: str, rows: int | None = None, multiple_of: int = 1,
                 shardings=None, buckets: int = 8, cache_key=None):
        self.jitted, self.tokens, self.piece_rows, self.rows, self.name = jitted, tokens, piece_rows, rows, name
        self.multiple_of, self.shardings, self.buckets, self.cache_key = multiple_of, shardings, buckets, cache_key
        self.programs: set[tuple[int, ...]] = set()
        self._cached: tuple[Any, Any] | None = None

    def plan(self, state) -> Packed:
        fields = {k: np.asarray(v.addressable_data(0)) for k, v in self.tokens(state).items()}
        n_pieces = fields["prompt_ids"].shape[0] // self.piece_rows
        return plan_pieces(fields, n_pieces, multiple_of=self.multiple_of, buckets=self.buckets)

    def _place(self, plan: Packed):
        if self.shardings is None:
            return plan
        return Packed(*(jax.make_array_from_callback(a.shape, s, lambda i, a=a: a[i])
                        for a, s in zip(plan, self.shardings)))

    def __call__(self, state):
        key = None if self.cache_key is None else self.cache_key(state)
        if key is not None and self._cached is not None and self._cached[0] == key:
            placed = self._cached[1]
        else:
            plan = self.plan(state)
            shape = program_shape(plan)
            if shape not in self.programs:
                self.programs.add(shape)
                logger.info("%s: program %d for packed rows %s and %d real response tokens (%.0f%% of the slots "
                            "hold tokens)", self.name, len(self.programs), shape[:2], shape[2], 100.0 * fill(plan))
            placed = self._place(plan)
            if key is not None:
                self._cached = (key, placed)
        return self.jitted(state, placed)

    def lower(self, state):
        data = state.replay.storage.data
        b = data.prompt_ids.shape[0] if self.rows is None else self.rows
        p, r = data.prompt_ids.shape[1], data.response_ids.shape[1]
        n_rows = row_budgets(self.piece_rows, self.buckets, self.multiple_of)[-1] * (b // self.piece_rows)
        n_head = row_budgets(self.piece_rows * r, self.buckets, self.multiple_of)[-1] * (b // self.piece_rows)
        shapes = Packed(ids=(n_rows, p + r), segment_ids=(n_rows, p + r), positions=(n_rows, p + r),
                        response_index=(b, r), token_index=(b, p + r), last_index=(b,), head_index=(n_head,),
                        head_target=(n_head,))
        sh = self.shardings or Packed(*([None] * len(Packed._fields)))
        plan = Packed(*(jax.ShapeDtypeStruct(s, jnp.int32, sharding=x) for s, x in zip(shapes, sh)))
        return self.jitted.lower(state, plan)


__all__ = ["TOKEN_FIELDS", "HostPlanned", "packed_shardings", "plan_pieces"]
