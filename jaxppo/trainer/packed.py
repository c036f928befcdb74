"""Packed layouts of strided pieces, shared by the trainers whose passes split their rows into micro-batches or
chunks (the PPO/GRPO update and prepare pass: ``jaxppo.trainer.ppo.packed``; the DPO step:
``jaxppo.trainer.dpo.steps.plan_pairs``).

The token fields are one sequence per row (``response_ids`` [B, R]: ``jaxppo.models.packing.pack``), or ``n``
continuations of each row's prompt (``response_ids`` [B, n, R]: ``packing.pack_shared``, the prompt packed once;
its sequence-indexed arrays describe the ``[n·B]`` stack, continuation-major, whose strided split hands piece ``j``
its groups' continuations in the same order, since ``B`` is a multiple of ``n``).

A pass splits its ``B`` rows into ``n`` strided pieces (``jaxppo.trainer.micro``: piece ``j`` = rows ``j, j+n, j+2n,
...``). :func:`plan_pieces` packs each piece's ``m = B/n`` sequences into ``N`` rows of ``L`` slots, ``N`` the same for
every piece (the largest piece's budget; the others get rows of padding), and lays the arrays out so that the strided
split hands piece ``j`` its own plan:

- row-indexed arrays (``ids``, ``segment_ids``, ``positions`` [n·N, L]): packed row ``k`` of piece ``j`` at
  row ``k·n + j``;
- sequence-indexed arrays (``response_index`` [B, R], ``token_index`` [B, P+R], ``last_index`` [B]): row
  ``k·n + j`` holds piece ``j``'s entry for its local row ``k``, a flat index into that piece's ``N·L`` slots;
- the real-response-token arrays (``head_index``, ``head_target`` [n·H]): entry ``k·n + j`` is piece ``j``'s
  entry ``k`` (``head_target`` flat into that piece's ``m·R``, ``m·n_c·R`` with ``n_c`` continuations), ``H``
  the same for every piece (the largest piece's budget; the others get padding entries).

``N`` is a multiple of ``multiple_of`` (the data-parallel size: each piece's rows are split over the batch axes)
and one of at most ``buckets`` values for a given ``m``; so is ``H`` (of ``m·R``). A pass compiles one program per
``(N, H)`` seen.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxppo.models.packing import Packed, pack, pack_shared

TOKEN_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


ONE_DIM = ("last_index", "head_index", "head_target")   # the plan's one-dimensional arrays


def _pad_piece(p: Packed, n_rows: int, n_head: int, n_slots: int) -> Packed:
    """``p`` with padding rows (segment 0) appended up to ``n_rows`` and padding head entries (slot 0, target
    ``n_slots`` = the piece's ``m·R``, out of range) up to ``n_head``; its flat indices stay valid."""
    extra, more = n_rows - p.ids.shape[0], n_head - p.head_index.shape[0]
    pad = lambda a: None if a is None else np.concatenate([a, np.zeros((extra, a.shape[1]), a.dtype)])  # noqa: E731
    if extra:
        p = p._replace(ids=pad(p.ids), segment_ids=pad(p.segment_ids), positions=pad(p.positions),
                       branch_ids=pad(p.branch_ids))
    if more:
        p = p._replace(head_index=np.concatenate([p.head_index, np.zeros(more, np.int32)]),
                       head_target=np.concatenate([p.head_target, np.full(more, n_slots, np.int32)]))
    return p


def _interleave_rows(parts: list[np.ndarray]) -> np.ndarray:
    """``[n] x [N, ...] -> [N·n, ...]`` with part ``j``'s row ``k`` at ``k·n + j`` (inverse of the strided split)."""
    return np.stack(parts, axis=1).reshape(-1, *parts[0].shape[1:])


def group_fields(fields: dict[str, Any], group_size: int) -> dict[str, np.ndarray]:
    """Rows in whole groups of ``n = group_size`` consecutive rows sharing a prompt (``[G·n, ...]``) as the token
    fields of ``G`` prompts with ``n`` continuations each: ``prompt_*`` [G, P] (each group's first row),
    ``response_*`` [G, n, R]."""
    arrays = {k: np.asarray(fields[k]) for k in TOKEN_FIELDS}
    b = arrays["prompt_ids"].shape[0]
    if group_size < 1 or b % group_size:
        raise ValueError(f"group_fields: {b} rows are not whole groups of {group_size}")
    g = b // group_size
    out = {k: arrays[k][::group_size] for k in ("prompt_ids", "prompt_mask")}
    out.update({k: arrays[k].reshape(g, group_size, -1) for k in ("response_ids", "response_mask")})
    return out


def plan_pieces(fields: dict[str, Any], n_micro: int, *, multiple_of: int = 1, buckets: int = 8,
                group_size: int = 1) -> Packed:
    """The packed layout (module docstring) of ``B`` rows given as their token fields (:data:`TOKEN_FIELDS`, numpy
    ``[B, ...]``; ``response_ids``/``response_mask`` [B, n, R] for ``n`` continuations of each prompt) for
    ``n_micro`` strided pieces.

    ``group_size = n > 1``: the ``B`` rows are whole groups of ``n`` consecutive rows sharing a prompt, in group
    order, and piece ``j`` gets groups ``j, j+n_micro, ...`` (``jaxppo.trainer.micro.group_micro_order``); each
    group is packed with its prompt once (:func:`group_fields`), and each piece's sequence-indexed arrays describe
    its ``[n·G_j]`` continuation-major stack."""
    if group_size > 1:
        fields = group_fields(fields, group_size)
    arrays = [np.asarray(fields[k]) for k in TOKEN_FIELDS]
    b = arrays[0].shape[0]
    if n_micro < 1 or b % n_micro:
        raise ValueError(f"plan_pieces: {b} rows do not split into {n_micro} equal pieces")
    packer = pack_shared if arrays[2].ndim == 3 else pack
    parts = [packer(*(a[j::n_micro] for a in arrays), buckets=buckets, multiple_of=multiple_of)
             for j in range(n_micro)]
    n_rows = max(p.ids.shape[0] for p in parts)     # each is a budget of row_budgets(m, ...), so is the largest
    n_head = max(p.head_index.shape[0] for p in parts)
    slots = (b // n_micro) * int(np.prod(arrays[2].shape[1:]))
    parts = [_pad_piece(p, n_rows, n_head, slots) for p in parts]
    return Packed(*(None if getattr(parts[0], f) is None else _interleave_rows([getattr(p, f) for p in parts])
                    for f in Packed._fields))


def packed_shardings(mesh, *, branches: bool = False) -> Packed | None:
    """The shardings of a plan on ``mesh``: every array's leading axis over the batch axes (None without a mesh);
    ``branches``: the plan has ``branch_ids`` (:func:`plan_pieces` of continuations)."""
    if mesh is None:
        return None
    from jaxppo.parallel import batch_sharding

    return Packed(*(None if f == "branch_ids" and not branches else batch_sharding(mesh, 1 if f in ONE_DIM else 2)
                    for f in Packed._fields))


__all__ = ["TOKEN_FIELDS", "group_fields", "packed_shardings", "plan_pieces"]
