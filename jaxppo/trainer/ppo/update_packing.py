"""Packed layouts for the PPO/GRPO update: the minibatch is drawn on device, its token fields come to the host, and
the host plans one packed layout per micro-batch (``jaxppo.models.packing.pack``) for the jitted update.

The update splits its ``B``-row minibatch into ``n`` strided micro-batches (``jaxppo.trainer.micro``: micro-batch
``j`` = rows ``j, j+n, j+2n, ...``). :func:`plan_micro_batches` packs each micro-batch's ``m = B/n`` sequences into
``N`` rows of ``L`` slots, ``N`` the same for every micro-batch (the largest micro-batch's budget; the others get
rows of padding), and lays the arrays out so that the strided split hands micro-batch ``j`` its own plan:

- row-indexed arrays (``ids``, ``segment_ids``, ``positions`` [n·N, L]): packed row ``k`` of micro-batch ``j`` at
  row ``k·n + j``;
- sequence-indexed arrays (``response_index`` [B, R], ``token_index`` [B, P+R], ``last_index`` [B]): minibatch row
  ``k·n + j`` holds micro-batch ``j``'s entry for its local row ``k``, a flat index into that micro-batch's ``N·L``
  slots.

``N`` is a multiple of ``multiple_of`` (the data-parallel size: each micro-batch's rows are split over the batch
axes) and one of at most ``buckets`` values for a given ``m``, so the update compiles at most ``buckets`` programs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxppo.models.packing import Packed, pack

TOKEN_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def _pad_rows(p: Packed, n_rows: int) -> Packed:
    """``p`` with padding rows (segment 0) appended up to ``n_rows``; its flat indices stay valid."""
    extra = n_rows - p.ids.shape[0]
    if extra == 0:
        return p
    pad = lambda a: np.concatenate([a, np.zeros((extra, a.shape[1]), a.dtype)])  # noqa: E731
    return p._replace(ids=pad(p.ids), segment_ids=pad(p.segment_ids), positions=pad(p.positions))


def _interleave_rows(parts: list[np.ndarray]) -> np.ndarray:
    """``[n] x [N, ...] -> [N·n, ...]`` with part ``j``'s row ``k`` at ``k·n + j`` (inverse of the strided split)."""
    return np.stack(parts, axis=1).reshape(-1, *parts[0].shape[1:])


def plan_micro_batches(fields: dict[str, Any], n_micro: int, *, multiple_of: int = 1, buckets: int = 8) -> Packed:
    """The packed layout (module docstring) of a minibatch given as its token fields (:data:`TOKEN_FIELDS`, numpy
    ``[B, ...]``) for ``n_micro`` strided micro-batches."""
    arrays = [np.asarray(fields[k]) for k in TOKEN_FIELDS]
    b = arrays[0].shape[0]
    if n_micro < 1 or b % n_micro:
        raise ValueError(f"plan_micro_batches: {b} rows do not split into {n_micro} equal micro-batches")
    parts = [pack(*(a[j::n_micro] for a in arrays), buckets=buckets, multiple_of=multiple_of)
             for j in range(n_micro)]
    n_rows = max(p.ids.shape[0] for p in parts)     # each is a budget of row_budgets(m, ...): so is the largest
    parts = [_pad_rows(p, n_rows) for p in parts]
    return Packed(*(_interleave_rows([getattr(p, f) for p in parts]) for f in Packed._fields))


__all__ = ["TOKEN_FIELDS", "plan_micro_batches"]
