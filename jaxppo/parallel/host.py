"""Host <-> global-array transfers that work in one process and in several (``jax.distributed``).

Under several processes a ``jax.Array`` may span devices this process cannot address; ``np.asarray`` on
it raises. Every host-side read of a global value goes through :func:`to_host`, every global array made
from host data that all processes hold goes through :func:`from_host`, and only :func:`is_main_process`
writes files. On one process all three reduce to ``np.asarray``, ``jax.device_put`` and ``True``.

SPMD rule: :func:`to_host` of an array that is sharded over several processes is a collective (an
all-gather); every process must call it, in the same order, on the same arrays.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def process_index() -> int:
    """This process's index in ``0 .. jax.process_count() - 1``."""
    return jax.process_index()


def is_main_process() -> bool:
    """True on process 0, the one process that writes files (metrics, plots, checkpoint metadata, ``hf/``)."""
    return jax.process_index() == 0


def _leaf_to_host(x: Any) -> Any:
    if not isinstance(x, jax.Array):
        return x if isinstance(x, (int, float, bool, str, type(None))) else np.asarray(x)
    if x.is_fully_addressable:
        return np.asarray(x)
    if x.is_fully_replicated:  # every process holds the whole value: read a local copy, no communication
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def to_host(tree: Any) -> Any:
    """``tree`` with every ``jax.Array`` leaf replaced by its whole value as a numpy array.

    Equals ``jax.tree.map(np.asarray, tree)`` on one process. Arrays sharded over several processes are
    all-gathered (a collective: call it on every process); replicated ones are read from a local copy.
    Python scalars pass through; other leaves (numpy, lists) become numpy arrays.
    """
    return jax.tree.map(_leaf_to_host, tree)


def host_scalar(x: Any) -> float:
    """``float`` of a scalar (0-d or size-1) value, global or local; ValueError for a larger array."""
    a = np.asarray(to_host(x))
    if a.size != 1:
        raise ValueError(f"host_scalar: expected a scalar, got an array of shape {a.shape}")
    return float(a.reshape(()))


def from_host(data: Any, sharding: Sharding) -> jax.Array:
    """A global array with ``sharding`` from ``data``, a host array that EVERY process holds in full.

    Each process fills only the shards its own devices hold (``jax.make_array_from_callback``), so the
    same call builds the same global array in one process (then it equals ``jax.device_put``) or in N.
    """
    if isinstance(data, jax.Array) and data.sharding == sharding:
        return data
    arr = np.asarray(to_host(data))
    return jax.make_array_from_callback(arr.shape, sharding, lambda index: arr[index])


def tree_from_host(tree: Any, shardings: Any) -> Any:
    """:func:`from_host` on every leaf; ``shardings`` is one sharding or a tree of them matching ``tree``."""
    if isinstance(shardings, Sharding):
        return jax.tree.map(lambda x: from_host(x, shardings), tree)
    return jax.tree.map(from_host, tree, shardings)


def all_processes(flag: bool) -> bool:
    """True when ``flag`` is True on every process (a collective: call it on all of them); ``flag`` on one.

    For decisions that change which collectives run next (e.g. "every process found the cache"): if any
    process disagrees, all take the same branch.
    """
    if jax.process_count() == 1:
        return bool(flag)
    flags = multihost_utils.process_allgather(np.asarray(bool(flag), np.int32))
    return bool(np.all(np.asarray(flags)))


def broadcast_from_main(tree: Any) -> Any:
    """Process 0's value of ``tree`` (numpy leaves) on every process; ``tree`` itself on one process.

    For decisions that process 0 makes (which checkpoint to restore, whether to roll back) and every other
    process must follow.
    """
    if jax.process_count() == 1:
        return tree
    return to_host(multihost_utils.broadcast_one_to_all(tree))


def steps_from_main(steps: Sequence[int]) -> list[int]:
    """Process 0's list of integers (e.g. the checkpoint steps it sees) on every process; ``steps`` on one.

    The lists may differ in length between processes (each lists its own filesystem): the length is
    broadcast first, then the values.
    """
    if jax.process_count() == 1:
        return [int(s) for s in steps]
    n = int(broadcast_from_main(np.asarray(len(steps), np.int32)))
    local = np.asarray(list(steps) if is_main_process() else [0] * n, np.int32).reshape(n)
    return [int(s) for s in np.asarray(broadcast_from_main(local)).reshape(n)]


def float_from_main(x: float) -> float:
    """Process 0's ``float`` on every process, bit for bit (sent as the two 32-bit halves of its float64); ``x`` on
    one process. For values a decision is taken on (the held-out perplexity of the rollback guard)."""
    if jax.process_count() == 1:
        return float(x)
    halves = np.asarray(broadcast_from_main(np.asarray([x], np.float64).view(np.int32)), np.int32)
    return float(halves.view(np.float64)[0])


def use_distributed_barriers() -> None:
    """Make Orbax wait at its barriers through the ``jax.distributed`` coordination service instead of an
    XLA all-reduce (its default when absl flags are not parsed).

    A collective barrier is a program like any other: run from Orbax's background commit thread it can
    interleave differently with the training programs on each process, and over CPU (gloo) collectives both
    processes then wait forever (seen here with 2 processes: one in the barrier, one in a reduction).
    """
    from absl import flags

    import orbax.checkpoint  # noqa: F401  (defines the flag)

    flags.FLAGS(["jaxppo", "--experimental_orbax_use_distributed_barrier=true"], known_only=True)
