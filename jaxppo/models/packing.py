"""Padding-free packed batches: a host-side (numpy) planner and the gathers back to the padded layout.

Padded layout (the repo's): ``prompt_ids``/``prompt_mask`` [B, P] left padded, ``response_ids``/``response_mask``
[B, R] right padded; the model row is ``concat(prompt, response)`` [B, P+R] and response token ``t`` is predicted by
slot ``P+t-1``. Sequence ``b``'s real tokens are the ``p_b`` real prompt tokens followed by the ``r_b`` real response
tokens (``n_b = p_b + r_b``; contiguous in the padded row because of the padding sides).

Packed layout: ``N`` rows of ``L`` slots (``L >= max n_b``, default ``P+R``). Sequence ``b`` occupies slots
``start_b .. start_b+n_b-1`` of row ``row_b``, rows being filled first-fit-decreasing (longest first, each into the
first row with room). Per slot:

- ``segment_ids``: ``1 + (rank of b within its row)`` on its tokens, 0 on padding;
- ``positions``: ``0 .. n_b-1`` on its tokens (``layers.positions_from_mask`` of the padded row at those tokens),
  0 on padding;
- attention (``Transformer.packed``): query ``i`` sees key ``j`` iff ``seg_i = seg_j > 0`` and ``j <= i`` (and
  ``i - j < w`` with a sliding window ``w``), which, the tokens of a sequence being contiguous in both layouts,
  is the padded row's mask restricted to real tokens, so every real token's hidden state is the padded one.

Index arrays (flat indices into ``N·L``, gathered by :func:`gather`, whose ``valid`` mask zeroes the rest):

- ``response_index`` [B, R]: the slot whose output predicts response token ``t``, i.e. the sequence's token
  ``p_b + t - 1`` (valid where ``response_mask``);
- ``token_index`` [B, P+R]: the slot of each padded-row slot's token (valid where ``concat(masks)``);
- ``last_index`` [B]: the slot of the sequence's last real token (``heads.last_token_index``);
- ``head_index`` [H] and ``head_target`` [H]: the real response tokens only, in order (sequence, then token):
  ``head_index`` the slot that predicts the token (as ``response_index``), ``head_target`` its flat index
  ``b·R + t`` into ``[B, R]``; entries past the real count are padding (``head_index`` 0, ``head_target`` ``B·R``,
  out of range). The LM head runs on these ``H`` slots (:func:`head_gather`, :func:`head_scatter`), not on the
  ``B·R`` response slots of which the padding is most on real data.

Groups of continuations of one prompt (a DPO pair's chosen and rejected answers) pack the prompt once:
:func:`pack_shared`, whose rows also carry ``branch_ids`` for attention's branch rule.

``N`` is the number of rows needed, rounded up to a budget (:func:`row_budgets`): the ``buckets`` values
``ceil(k·B/buckets)`` (k = 1..buckets), each rounded up to ``multiple_of`` (the data-parallel size). Every sequence
fits in one row, so ``N <= B``. ``H`` is the number of real response tokens rounded up the same way to a budget of
``row_budgets(B·R, buckets, multiple_of)``. A jitted consumer compiles one program per ``(N, H)`` seen, at most
``buckets²`` per (B, P, R) and in practice a few (both follow the batch's real token count).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger("jaxppo.packing")


class Packed(NamedTuple):
    """A packed batch (module docstring); numpy arrays on the host, any array type under jit (a pytree)."""

    ids: np.ndarray             # [N, L] int32
    segment_ids: np.ndarray     # [N, L] int32, 0 = padding
    positions: np.ndarray       # [N, L] int32
    response_index: np.ndarray  # [B, R] int32, flat into N·L
    token_index: np.ndarray     # [B, P+R] int32, flat into N·L
    last_index: np.ndarray      # [B] int32, flat into N·L
    head_index: np.ndarray      # [H] int32, flat into N·L (the real response tokens' predicting slots)
    head_target: np.ndarray     # [H] int32, flat into B·R (B·R on padding entries)
    branch_ids: np.ndarray | None = None  # [N, L] int32 (pack_shared: 0 = prompt, c + 1 = continuation c); None:
                                          # every sequence is one branch


def row_budgets(batch: int, buckets: int = 8, multiple_of: int = 1) -> list[int]:
    """The allowed packed row counts for ``batch`` sequences: ``ceil(ceil(k·batch/buckets) / m)·m`` for
    ``k = 1..buckets`` (``m = multiple_of``), deduplicated and sorted; the largest is ``>= batch``."""
    if batch < 1 or buckets < 1 or multiple_of < 1:
        raise ValueError(f"row_budgets: batch {batch}, buckets {buckets}, multiple_of {multiple_of} must be >= 1")
    def up(a: int, m: int) -> int:
        return (a + m - 1) // m * m

    return sorted({up(up(k * batch, buckets) // buckets, multiple_of) for k in range(1, buckets + 1)})


def _real_lengths(mask: np.ndarray, side: str, name: str) -> np.ndarray:
    """Row lengths of a 0/1 ``mask`` [B, T] whose real tokens are contiguous at the ``side`` end (else ValueError)."""
    m = np.asarray(mask).astype(bool)
    n = m.sum(axis=1)
    t = m.shape[1]
    slots = np.arange(t)[None, :]
    want = slots >= (t - n)[:, None] if side == "left" else slots < n[:, None]
    if not np.array_equal(m, want):
        raise ValueError(f"pack: {name} is not {side} padded (its real tokens must be contiguous at the "
                         f"{'right' if side == 'left' else 'left'} end)")
    return n.astype(np.int64)


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, start)`` [B] of each item of ``lengths`` placed first-fit-decreasing into rows of ``capacity``
    (items in order of decreasing length, ties by index; each goes to the lowest row with room, after that row's
    earlier items). Raises ValueError if an item is longer than ``capacity``."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > capacity:
        raise ValueError(f"first_fit_decreasing: an item of {lengths.max()} tokens exceeds the row of {capacity}")
    b = lengths.shape[0]
    free = np.full(max(b, 1), capacity, np.int64)   # B rows always suffice
    row = np.zeros(b, np.int64)
    start = np.zeros(b, np.int64)
    for i in np.argsort(-lengths, kind="stable"):
        r = int(np.argmax(free >= lengths[i]))
        row[i], start[i] = r, capacity - free[r]
        free[r] -= lengths[i]
    return row, start


def pack(prompt_ids, prompt_mask, response_ids, response_mask, *, row_length: int | None = None,
         buckets: int = 8, multiple_of: int = 1) -> Packed:
    """The packed layout (module docstring) of a padded batch. ``row_length`` ``L`` defaults to ``P+R``.

    Every sequence needs at least one prompt token (its first response token is predicted by the prompt's last).
    The one-continuation case of :func:`pack_shared` (``branch_ids`` None: every sequence is one branch).
    """
    response_ids, response_mask = np.asarray(response_ids), np.asarray(response_mask)
    plan = pack_shared(prompt_ids, prompt_mask, response_ids[:, None], response_mask[:, None],
                       row_length=row_length, buckets=buckets, multiple_of=multiple_of)
    return plan._replace(branch_ids=None)


def pack_shared(prompt_ids, prompt_mask, response_ids, response_mask, *, row_length: int | None = None,
                buckets: int = 8, multiple_of: int = 1) -> Packed:
    """The packed layout of ``n`` continuations per prompt with each prompt packed once.

    ``prompt_ids``/``prompt_mask`` [B, P] (left padded), ``response_ids``/``response_mask`` [B, n, R] (right
    padded). Group ``b`` is one item of ``p_b + sum_c r_bc`` tokens: its real prompt tokens, then continuation 0's
    real tokens, then continuation 1's, ... (rows filled first-fit-decreasing as :func:`pack`; ``L`` defaults to
    ``P + n·R``, which every group fits). Per slot, ``segment_ids`` is the group's rank in its row,
    ``branch_ids`` 0 on the prompt and ``c + 1`` on continuation ``c``, ``positions`` ``0 .. p_b-1`` on the prompt
    and ``p_b .. p_b+r_bc-1`` on continuation ``c`` (its positions in the row ``concat(prompt_b, response_bc)``).
    Attention (``models.attention.SegmentMask``) adds to the segment rule: query ``i`` sees key ``j`` only if
    ``branch_j = 0`` or ``branch_j = branch_i``, so each continuation sees its prompt and its own earlier tokens,
    exactly its padded row's context.

    The sequence-indexed arrays describe the ``[n·B]`` stack, continuation-major (row ``c·B + b`` is
    ``concat(prompt_b, response_bc)``, e.g. a DPO batch's chosen rows then its rejected rows): ``response_index``
    [n·B, R] (token 0 of every continuation is predicted by the prompt's last slot), ``token_index`` [n·B, P+R],
    ``last_index`` [n·B], ``head_index``/``head_target`` over the stack's ``[n·B, R]`` real response tokens.
    """
    prompt_ids, response_ids = np.asarray(prompt_ids), np.asarray(response_ids)
    b, p = prompt_ids.shape
    n, r = response_ids.shape[1:]
    lp = _real_lengths(prompt_mask, "left", "prompt_mask")
    lr = _real_lengths(np.asarray(response_mask).reshape(b * n, r), "right", "response_mask").reshape(b, n)
    if b and lp.min() < 1:
        raise ValueError("pack: a sequence has no prompt token")
    n_tok = lp + lr.sum(axis=1)
    width = p + n * r if row_length is None else int(row_length)
    row, start = first_fit_decreasing(n_tok, width)
    used = int(row.max()) + 1 if b else 0
    n_rows = next(k for k in row_budgets(max(b, 1), buckets, multiple_of) if k >= used)

    ids = np.zeros((n_rows, width), np.int32)
    seg = np.zeros((n_rows, width), np.int32)
    pos = np.zeros((n_rows, width), np.int32)
    branch = np.zeros((n_rows, width), np.int32)
    rank = np.zeros(b, np.int64)        # 1 + order of the group within its row (by start slot)
    order = np.lexsort((start, row))
    rank[order] = np.arange(b) - np.searchsorted(row[order], row[order]) + 1
    base = row * width + start          # flat slot of each group's first token
    # flat slot of continuation c's first token: after the prompt and the continuations before it
    cont = base[:, None] + lp[:, None] + np.concatenate([np.zeros((b, 1), np.int64), np.cumsum(lr, 1)[:, :-1]], 1)
    flat_ids, flat_seg, flat_pos, flat_branch = ids.reshape(-1), seg.reshape(-1), pos.reshape(-1), branch.reshape(-1)
    for i in range(b):
        sl = slice(base[i], base[i] + n_tok[i])
        flat_ids[sl] = np.concatenate([prompt_ids[i, p - lp[i]:]] + [response_ids[i, c, :lr[i, c]] for c in range(n)])
        flat_seg[sl] = rank[i]
        flat_pos[sl] = np.concatenate([np.arange(lp[i])] + [lp[i] + np.arange(lr[i, c]) for c in range(n)])
        flat_branch[sl] = np.concatenate([np.zeros(lp[i], np.int64)] + [np.full(lr[i, c], c + 1) for c in range(n)])

    # the [n·B] stack, continuation-major: stack row c·B + b
    lp_s, lr_s = np.tile(lp, n), lr.T.reshape(-1)
    base_s, cont_s = np.tile(base, n), cont.T.reshape(-1)
    t = np.arange(r)[None, :]
    response_index = np.where(t == 0, base_s[:, None] + lp_s[:, None] - 1, cont_s[:, None] + t - 1)
    response_index = np.where(t < lr_s[:, None], response_index, 0)
    s = np.arange(p + r)[None, :]
    in_prompt = s < p
    k = s - (p - lp_s[:, None])                                         # the slot's prompt token index
    slot = np.where(in_prompt, base_s[:, None] + k, cont_s[:, None] + s - p)
    real = np.where(in_prompt, k >= 0, s - p < lr_s[:, None])
    token_index = np.where(real, slot, 0)
    last_index = np.where(lr_s > 0, cont_s + lr_s - 1, base_s + lp_s - 1)
    real_response = t < lr_s[:, None]                                   # [n·B, R], row-major = (sequence, token)
    n_head = int(real_response.sum())
    h = next(k for k in row_budgets(max(n * b * r, 1), buckets, multiple_of) if k >= n_head)
    head_index = np.zeros(h, np.int32)
    head_target = np.full(h, n * b * r, np.int32)
    head_index[:n_head] = response_index[real_response]
    head_target[:n_head] = np.flatnonzero(real_response)
    return Packed(ids, seg, pos, response_index.astype(np.int32), token_index.astype(np.int32),
                  last_index.astype(np.int32), head_index, head_target, branch)


def pack_batch(batch, **kw) -> Packed:
    """:func:`pack` of anything with the token fields ``prompt_ids``, ``prompt_mask``, ``response_ids``,
    ``response_mask`` (attributes or mapping keys)."""
    get = (lambda k: batch[k]) if isinstance(batch, dict) else (lambda k: getattr(batch, k))  # noqa: E731
    return pack(*(np.asarray(get(k)) for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")), **kw)


def gather(x: jax.Array, index: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """``x`` [N, L, ...] read at the flat slot indices ``index`` [...] (into ``N·L``): ``out[i] = x.flat[index[i]]``,
    times ``valid`` (0 where it is 0) when given. Returns ``index.shape + x.shape[2:]``."""
    flat = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
    out = jnp.take(flat, index, axis=0)
    if valid is not None:
        v = valid.astype(out.dtype).reshape(valid.shape + (1,) * (out.ndim - valid.ndim))
        out = out * v
    return out


def head_gather(x: jax.Array, packed: Packed) -> jax.Array:
    """``x`` [N, L, ...] at the real response tokens' predicting slots: ``[H, ...]`` (``packed.head_index``)."""
    return gather(x, packed.head_index)


def head_scatter(values: jax.Array, packed: Packed, shape: tuple[int, int]) -> jax.Array:
    """``[H]`` per-real-response-token values back to ``shape = (B, R)``, 0 elsewhere (padding entries of
    ``head_target`` are out of range and dropped)."""
    b, r = shape
    out = jnp.zeros((b * r,), values.dtype).at[packed.head_target].set(values, mode="drop")
    return out.reshape(b, r)


def head_targets(response_ids: jax.Array, packed: Packed) -> jax.Array:
    """The response token ids ``[H]`` of ``packed.head_index``'s slots (padding entries read the last token)."""
    flat = response_ids.reshape(-1)
    return jnp.take(flat, jnp.minimum(packed.head_target, flat.shape[0] - 1), axis=0)


def fill(packed: Packed) -> float:
    """Fraction of the packed slots that hold a real token."""
    seg = np.asarray(packed.segment_ids)
    return float((seg > 0).mean()) if seg.size else 0.0


def program_shape(packed: Packed) -> tuple[int, int, int]:
    """``(N, L, H)``: what a jitted consumer of ``packed`` compiles one program for (with the batch's B, P, R)."""
    return (*np.shape(packed.ids), int(np.shape(packed.head_index)[0]))


class ProgramLog:
    """Counts the distinct packed shapes (one compiled program each per jitted consumer) and the real-token fill;
    ``log(name)`` writes one line: programs, their shapes, the packed and padded slot counts."""

    def __init__(self):
        self.shapes: set[tuple[int, ...]] = set()
        self.real = 0
        self.packed_slots = 0
        self.padded_slots = 0

    def add(self, packed: Packed) -> None:
        self.shapes.add(program_shape(packed))
        self.real += int((np.asarray(packed.segment_ids) > 0).sum())
        self.packed_slots += int(np.size(packed.ids))
        self.padded_slots += int(np.size(packed.token_index))

    def log(self, name: str) -> None:
        logger.info("%s: packed into %d program shape(s) %s; %d real tokens in %d packed slots (%.0f%%) vs %d padded",
                    name, len(self.shapes), sorted(self.shapes), self.real, self.packed_slots,
                    100.0 * self.real / max(self.packed_slots, 1), self.padded_slots)

