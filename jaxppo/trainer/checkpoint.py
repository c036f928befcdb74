"""Orbax checkpoints of the whole train state plus a JSON side-car (guards, counters, config).

Layout: ``<dir>/<step>/state`` (the ``TrainState`` pytree: params, optimizer states, replay storage and
priorities, RNG key, KL coefficient, LR scale, counters, data cursor) and ``<dir>/<step>/meta`` (JSON:
step, guard state, config, data fingerprint). Orbax writes each step into a temporary directory and
renames it when the write is complete, so ``latest_step()`` only ever sees complete checkpoints; a
process killed mid-write leaves a temporary directory that is ignored (and cleaned up on the next
start). Saves are asynchronous: ``save`` copies the state (the train step donates its buffers) and
the files are written in the background. A state with any non-finite parameter is never written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxppo.trainer.state import TrainState, param_finite

logger = logging.getLogger("jaxppo.trainer")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (does not match this run's state or is unreadable)."""


class Checkpointer:
    """Save/restore ``TrainState`` + JSON metadata under ``directory`` (keeps the newest ``keep_last``)."""

    def __init__(self, directory: str | Path, *, keep_last: int, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep_last, enable_async_checkpointing=async_save,
                                            cleanup_tmp_directories=True, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=opts)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> bool:
        """Write ``state`` at ``step``; returns False (nothing written) when a parameter is non-finite."""
        if not param_finite(state):
            logger.warning("step %d: not saving a checkpoint, the parameters contain NaN/inf", step)
            return False
        # the next update step donates (reuses) the state's buffers while the write runs in the
        # background, so the asynchronous save gets its own copy
        snapshot = jax.tree.map(lambda x: x.copy(), state)
        self.manager.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(snapshot),
                                                             meta=ocp.args.JsonSave(dict(meta, step=int(step)))),
                          force=True)
        return True

    def restore(self, step: int, like: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """The state saved at ``step``, with the structure, dtypes and shardings of ``like``."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        try:
            out = self.manager.restore(int(step), args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # noqa: BLE001 - re-raised with the directory and a hint
            raise CheckpointError(
                f"cannot restore checkpoint step {step} from {self.directory}: {type(e).__name__}: {e}. "
                "It was probably written by a run with another model/data/config; use another "
                "trainer.output_dir or trainer.resume=never") from e
        # re-materialise as jit outputs: arrays assembled by the restore are not reliably donatable
        shardings = jax.tree.map(lambda x: x.sharding, like)
        state = jax.jit(lambda t: jax.tree.map(lambda x: x.copy(), t), out_shardings=shardings)(out.state)
        return state, dict(out.meta)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
