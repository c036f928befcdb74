"""Packed layouts for the jitted passes over device-held rows (the PPO/GRPO update and the prepare pass): their rows'
token fields come to the host, the host plans one packed layout per piece (``jaxppo.models.packing.pack``; whole
prompt groups: ``pack_shared``, each prompt once), and the
jitted pass runs on ``(state, plan)`` (:class:`HostPlanned`).

Both passes split their ``B`` rows into ``n`` strided pieces (``jaxppo.trainer.micro``: the update's micro-batches,
the prepare pass's chunks); the layout of the pieces' plan is ``jaxppo.trainer.packed.plan_pieces`` (shared with the
DPO step).
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.models.packing import Packed, fill, program_shape, row_budgets
from jaxppo.trainer.packed import TOKEN_FIELDS, packed_shardings, plan_pieces

logger = logging.getLogger("jaxppo.trainer")


class HostPlanned:
    """``self(state) = jitted(state, plan)``: ``tokens(state)`` (jitted, replicated) gives the token fields of the rows
    the pass reads from ``state`` (``rows`` of them; default: the buffer's slots), the host plans their packed
    layout for strided pieces of ``piece_rows`` rows (:func:`plan_pieces`, one of at most ``buckets`` row
    budgets), places it with ``shardings`` and calls the jitted pass. ``cache_key(state)`` (optional): the plan
    is reused while the key is unchanged (the prepare pass: the buffer's tokens change only when a window is
    loaded). ``programs`` holds the plan shapes seen (one compiled program each, logged when new).
    ``lower(state)`` lowers the pass with the largest plan (the memory plan's). ``group_size = n > 1``: the rows
    come in whole groups of ``n`` (group order) and each group is packed with its prompt once
    (``plan_pieces(..., group_size=n)``)."""

    def __init__(self, jitted, tokens, piece_rows: int, *, name: str, rows: int | None = None, multiple_of: int = 1,
                 shardings=None, buckets: int = 8, cache_key=None, group_size: int = 1):
        self.jitted, self.tokens, self.piece_rows, self.rows, self.name = jitted, tokens, piece_rows, rows, name
        self.multiple_of, self.shardings, self.buckets, self.cache_key = multiple_of, shardings, buckets, cache_key
        self.group_size = int(group_size)
        self.programs: set[tuple[int, ...]] = set()
        self._cached: tuple[Any, Any] | None = None

    def plan(self, state) -> Packed:
        fields = {k: np.asarray(v.addressable_data(0)) for k, v in self.tokens(state).items()}
        n_pieces = fields["prompt_ids"].shape[0] // self.piece_rows
        return plan_pieces(fields, n_pieces, multiple_of=self.multiple_of, buckets=self.buckets,
                           group_size=self.group_size)

    def _place(self, plan: Packed):
        if self.shardings is None:
            return plan
        return Packed(*(None if a is None else jax.make_array_from_callback(a.shape, s, lambda i, a=a: a[i])
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
        n = self.group_size
        width = p + n * r                               # a group: its prompt once, then its n continuations
        n_rows = row_budgets(self.piece_rows // n, self.buckets, self.multiple_of)[-1] * (b // self.piece_rows)
        n_head = row_budgets(self.piece_rows * r, self.buckets, self.multiple_of)[-1] * (b // self.piece_rows)
        shapes = Packed(ids=(n_rows, width), segment_ids=(n_rows, width), positions=(n_rows, width),
                        response_index=(b, r), token_index=(b, p + r), last_index=(b,), head_index=(n_head,),
                        head_target=(n_head,), branch_ids=(n_rows, width) if n > 1 else None)
        sh = self.shardings or Packed(*([None] * len(Packed._fields)))
        plan = Packed(*(None if s is None else jax.ShapeDtypeStruct(s, jnp.int32, sharding=x)
                        for s, x in zip(shapes, sh)))
        return self.jitted.lower(state, plan)


__all__ = ["TOKEN_FIELDS", "HostPlanned", "packed_shardings", "plan_pieces"]
