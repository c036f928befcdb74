"""The replay buffer's windows over the training rows: prompt groups made contiguous, cut into windows of whole
groups, and each window written into the buffer's slots.

A dataset larger than ``replay.capacity`` is cut into consecutive windows of whole prompt groups
(:func:`group_windows`); the buffer holds one window at a time (``capacity`` slots, :func:`buffer_layout`) and
:func:`load_window` writes the next one at each refresh. Slots past a window's rows repeat its last row and are
invalid (filter weight 0, a group id of their own).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo import replay as replay_lib
from jaxppo.config import ConfigError
from jaxppo.trainer.ppo.buffer_types import TRAJECTORY_DTYPES, BufferItem, Trajectories, trajectories_from_arrays
from jaxppo.trainer.ppo.state import TrainState


def whole_groups_problem(train: dict[str, np.ndarray], group_size: int) -> str | None:
    """Why the (group-ordered) training rows are not whole prompt groups of ``group_size`` rows with one prompt each
    (the same ``prompt_ids`` and ``prompt_mask`` in each row), naming the first group that is not; None when
    they are."""
    gid = np.asarray(train["group_id"])
    starts, sizes = group_runs(gid)
    bad = np.flatnonzero(sizes != group_size)
    if bad.size:
        g = int(gid[starts[bad[0]]])
        return (f"{bad.size} of {len(starts)} prompt groups do not have {group_size} training rows (group_id {g} has "
                f"{int(sizes[bad[0]])})")
    for key in ("prompt_ids", "prompt_mask"):
        x = np.asarray(train[key]).reshape(len(starts), group_size, -1)
        differs = np.flatnonzero((x != x[:, :1]).any(axis=(1, 2)))
        if differs.size:
            g = int(gid[starts[differs[0]]])
            return (f"the rows of {differs.size} prompt groups do not share one prompt ({key} differs within "
                    f"group_id {g})")
    return None


def check_whole_groups(train: dict[str, np.ndarray], group_size: int) -> None:
    """``replay.group_size = n > 1``: every prompt group of the (group-ordered) training rows has exactly ``n`` rows
    and one prompt; ``ValueError`` naming the first group that does not, and how many do not."""
    problem = whole_groups_problem(train, group_size)
    if problem is not None:
        raise ValueError(f"replay.group_size={group_size}: {problem}; every group needs exactly replay.group_size "
                         "responses to the same prompt (or set replay.group_size=1)")


def prompt_group_size(train: dict[str, np.ndarray], group_size: int, chunk: int, shards: int) -> int:
    """Rows per prompt in the buffer's layout, which the prepare pass runs each prompt once for
    (``make_prepare_fn(..., group_size)``): ``replay.group_size`` when it is above 1; otherwise ``n`` when every prompt
    group of the (group-ordered) training rows has the same ``n > 1`` rows with one prompt (``rollout.n`` answers of
    each prompt) and each batch shard's part of a prepare chunk (``chunk / shards`` rows) holds whole groups; else 1.
    Buffer windows are whole groups and the buffer's slots a multiple of ``chunk``, so every block of ``n`` slots
    is then one group (slots past a window repeat its last row)."""
    if group_size > 1:
        return group_size
    _, sizes = group_runs(train["group_id"])
    n = int(sizes[0]) if len(sizes) else 1
    if n < 2 or chunk % shards or (chunk // shards) % n or whole_groups_problem(train, n) is not None:
        return 1
    return n
def _round_up(x: int, m: int) -> int:
    return int(math.ceil(x / m) * m)


def group_order(group_id: np.ndarray) -> np.ndarray:
    """Row order that makes every prompt group contiguous: groups in order of first appearance, rows within a
    group in their original order (the identity when the groups are already contiguous)."""
    gid = np.asarray(group_id)
    _, first, inv = np.unique(gid, return_index=True, return_inverse=True)
    return np.lexsort((np.arange(len(gid)), first[inv.reshape(-1)])).astype(np.int64)


def group_runs(group_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, sizes)`` of the runs of equal consecutive ``group_id`` values (one run per group when the groups are
    contiguous, :func:`group_order`)."""
    gid = np.asarray(group_id)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    return starts, np.diff(np.r_[starts, len(gid)])


def group_windows(group_id: np.ndarray, n_use: int) -> list[np.ndarray]:
    """Consecutive buffer windows of WHOLE prompt groups, each of at most ``n_use`` rows (greedy packing).

    ``group_id`` must have contiguous groups (:func:`group_order`). A dataset of ``<= n_use`` rows is one
    window. A group larger than ``n_use`` is a ``ConfigError`` (``replay.capacity`` must hold a whole group)."""
    gid = np.asarray(group_id)
    n = len(gid)
    if n <= n_use:
        return [np.arange(n, dtype=np.int64)]
    starts, sizes = group_runs(gid)
    if len(np.unique(gid)) != len(starts):
        raise ValueError("group_windows: prompt groups are not contiguous (order the rows with group_order)")
    if sizes.max() > n_use:
        raise ConfigError(f"replay.capacity: a prompt group has {int(sizes.max())} rows but a buffer window holds "
                          f"{n_use}; raise replay.capacity so whole groups fit")
    windows, begin, rows = [], 0, 0
    for st, sz in zip(starts, sizes):
        if rows + sz > n_use:
            windows.append(np.arange(begin, st, dtype=np.int64))
            begin, rows = st, 0
        rows += sz
    windows.append(np.arange(begin, n, dtype=np.int64))
    return windows


def window_slots(rows: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Dataset rows of the ``capacity`` buffer slots for a window and the slot-valid mask (slots past the window
    repeat its last row and are invalid: filter weight 0, never sampled)."""
    j = np.arange(capacity)
    n = len(rows)
    return np.asarray(rows)[np.minimum(j, n - 1)].astype(np.int64), j < n


def window_items(train: dict[str, np.ndarray], rows: np.ndarray, valid: np.ndarray) -> Trajectories:
    """The buffer's data fields (numpy ``Trajectories``) for slots ``rows`` of the data layer's dict ``train``;
    invalid slots get filter weight 0 and a group id of their own (below every real one), so no group estimator
    counts them in a real group."""
    data = trajectories_from_arrays(train, rows)
    low = min(int(np.min(train["group_id"], initial=0)), 0)
    pad_gid = low - 1 - np.arange(len(rows))
    return data.replace(filter_w=np.where(valid, data.filter_w, 0.0).astype(TRAJECTORY_DTYPES["filter_w"]),
                        group_id=np.where(valid, data.group_id, pad_gid).astype(TRAJECTORY_DTYPES["group_id"]))


def buffer_layout(cfg: Any, n_rows: int, mesh) -> tuple[int, int, int]:
    """``(n_use, capacity, chunk)``: dataset rows in the buffer window (``min(n_rows, replay.capacity)``), the
    buffer slots (``n_use`` rounded up to a multiple of ``lcm(chunk, batch shards)``) and the micro-batch /
    prepare chunk size (``actor.ppo_micro_batch_size`` or ``ppo_mini_batch_size``)."""
    from jaxppo.parallel import batch_divisor

    a = cfg.actor
    chunk = a.ppo_micro_batch_size or a.ppo_mini_batch_size
    n_use = min(n_rows, cfg.replay.capacity)
    return n_use, _round_up(n_use, math.lcm(chunk, batch_divisor(mesh))), chunk


def make_replay(cfg: Any, capacity: int, example: Any, mesh):
    """``replay_lib.init`` with the config's sampling and staleness-decay settings."""
    return replay_lib.init(capacity, example, alpha=cfg.replay.alpha, eps=cfg.replay.eps,
                           prioritization=cfg.replay.prioritization, mesh=mesh, decay=cfg.replay.decay.kind,
                           decay_rate=cfg.replay.decay.rate, weight_floor=cfg.replay.weight_floor)


def load_window(run: Any, state: TrainState, refresh_index: int) -> TrainState:
    """For datasets larger than the buffer: the rows of window ``refresh_index mod len(run.windows)`` (whole prompt
    groups, :func:`group_windows`) written into the buffer's ``BufferItem.data`` (no-op with a single window)."""
    if len(run.windows) <= 1:
        return state
    window = run.windows[refresh_index % len(run.windows)]
    rows, valid = window_slots(window, run.capacity)
    old: BufferItem = state.replay.storage
    data = jax.tree.map(lambda v, o: jax.device_put(v.astype(o.dtype), o.sharding),
                        window_items(run.train, rows, valid), old.data)
    return state.replace(replay=state.replay.replace(storage=old.replace(data=data)),
                         data_cursor=jax.device_put(jnp.int32(window[0]), state.data_cursor.sharding))


__all__ = ["buffer_layout", "check_whole_groups", "group_order", "group_runs", "group_windows", "load_window",
           "make_replay", "prompt_group_size", "whole_groups_problem", "window_items", "window_slots"]
