"""Packed layouts of strided pieces, shared by the trainers whose passes split their rows into micro-batches or
chunks (the PPO/GRPO update and prepare pass: ``jaxppo.trainer.ppo.packed``; the DPO step:
``jaxppo.trainer.dpo.steps.plan_pairs``).

A pass splits its ``B`` rows into ``n`` strided pieces (``jaxppo.trainer.micro``: piece ``j`` = rows ``j, j+n, j+2n,
...``). :func:`plan_pieces` packs each piece's ``m = B/n`` sequences into ``N`` rows of ``L`` slots, ``N`` the same for
every piece (the largest piece's budget; the others get rows of padding), and lays the arrays out so that the strided
split hands piece ``j`` its own plan:

- row-indexed arrays (``ids``, ``segment_ids``, ``positions`` [n·N, L]): packed row ``k`` of piece ``j`` at
  row ``k·n + j``;
- sequence-indexed arrays (``response_index`` [B, R], ``token_index`` [B, P+R], ``last_index`` [B]): row
  ``k·n + j`` holds piece ``j``'s entry for its local row ``k``, a flat index into that piece's ``N·L`` slots.

``N`` is a multiple of ``multiple_of`` (the data-parallel size: each piece's rows are split over the batch axes)
and one of at most ``buckets`` values for a given ``m``, so a pass compiles at most ``buckets`` programs.
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
    parts = [_pad_rows(p, n_rows) for p in parts]
    return Packed(*(_interleave_rows([getattr(p, f) for p in parts]) for f in Packed._fields))


def packed_shardings(mesh) -> Packed | None:
    """The shardings of a plan on ``mesh``: every array's leading axis over the batch axes (None without a mesh)."""
    if mesh is None:
        return None
    from jaxppo.parallel import batch_sharding

    return Packed(*(batch_sharding(mesh, 1 if f == "last_index" else 2) for f in Packed._fields))


__all__ = ["TOKEN_FIELDS", "packed_shardings", "plan_pieces"]
