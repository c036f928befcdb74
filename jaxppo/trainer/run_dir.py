"""The start of a trainer run (the run folder), used by the run harness (``jaxppo.trainer.harness.fit``).

:func:`start_run`: create ``trainer.output_dir``, take its lock (one writer per folder: a second trainer or sweep
run on the same folder gets ``RunFolderBusy`` naming the holder; a stale lock is taken over) and remove the temporary
checkpoint folders of interrupted writes (both reported), and write its ``config.json``; build the run (unless one is given)
and time it (``t_setup``); open the ``Checkpointer`` of ``<output_dir>/checkpoints`` (every ``trainer.save_every``
steps, keeping ``trainer.keep_last``); then, by ``trainer.resume``:

- ``never``: a folder that already holds checkpoints is a ``ConfigError`` (nothing is overwritten);
- ``auto``: the newest readable checkpoint is restored (damaged ones are moved aside and listed in ``damaged``);
  the loop starts at its step with its guard state;
- otherwise (or with nothing to restore): from step 0 with the run's initial state and fresh guards.

The checkpointer is closed (and the lock released) before any error leaves :func:`start_run`; afterwards the caller
owns the checkpointer, and closing it releases the lock.
:func:`metrics_logger` opens the run's ``MetricsLogger`` the same way for both loops.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax

from jaxppo.config import ConfigError, to_dict
from jaxppo.console import warn
from jaxppo.parallel.host import is_main_process
from jaxppo.trainer.run_folder import RunLock
from jaxppo.trainer.checkpoint import Checkpointer

logger = logging.getLogger("jaxppo.trainer")


@dataclasses.dataclass
class RunStart:
    """What a loop starts from (see the module doc)."""

    out: Path                           # trainer.output_dir (created)
    run: Any                            # the built (or given) run; its ``state`` is the initial state
    state: Any                          # the state the loop starts from: the run's initial one or the resumed one
    ckpt: Checkpointer                  # open; the caller closes it
    guards: Any                         # jaxppo.trainer.guards.Guards, restored on resume
    start: int                          # the step the loop starts after (0: from scratch)
    meta: dict[str, Any]                # the resumed checkpoint's metadata ({} from scratch)
    damaged: list[tuple[int, Path, str]]  # damaged checkpoints moved aside on resume: (step, new path, reason)
    t_start: float                      # time.perf_counter() at the start
    t_setup: float                      # seconds spent building the run


def start_run(cfg: Any, build: Callable[[Any], Any], run: Any = None) -> RunStart:
    """Output folder, ``config.json``, ``run = build(cfg)`` (unless ``run`` is given), checkpointer and resume."""
    from jaxppo.trainer.guards import Guards

    t_start = time.perf_counter()
    tc = cfg.trainer
    out = Path(tc.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_run_folder(out)
    try:
        if is_main_process():
            (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2), encoding="utf-8")
        run = build(cfg) if run is None else run
        t_setup = time.perf_counter() - t_start
        state = run.state
        # several processes: synchronous saves (Orbax's background commit interleaved with the training programs
        # differently on each process and deadlocked 2 CPU processes)
        ckpt = Checkpointer(out / "checkpoints", keep_last=tc.keep_last, async_save=jax.process_count() == 1)
    except BaseException:
        lock.release()
        raise
    ckpt.on_close(lock.release)
    guards = Guards(cfg.guards)
    start, meta = 0, {}
    if tc.resume == "never" and ckpt.all_steps():
        ckpt.close()
        raise ConfigError(f"trainer.resume=never but {ckpt.directory} already holds checkpoints {ckpt.all_steps()}; "
                          "use another trainer.output_dir, delete them, or resume with trainer.resume=auto")
    damaged: list[tuple[int, Path, str]] = []
    if tc.resume == "auto":
        try:
            resumed = ckpt.restore_newest(state)   # damaged checkpoints are moved aside, older ones tried
        except BaseException:
            ckpt.close()
            raise
        damaged = resumed.damaged
        if resumed.step is not None:
            state, meta = resumed.state, resumed.meta
            guards = Guards.from_state_dict(cfg.guards, meta["guards"])
            start = int(meta["step"])
            logger.info("resumed from %s step %d", ckpt.directory, start)
    return RunStart(out=out, run=run, state=state, ckpt=ckpt, guards=guards, start=start, meta=meta,
                    damaged=damaged, t_start=t_start, t_setup=t_setup)


def lock_run_folder(out: Path) -> RunLock:
    """Take the run folder's lock (:class:`jaxppo.trainer.run_folder.RunLock`; process 0 holds it for all processes, and
    all of them raise ``RunFolderBusy`` when it cannot), then remove the temporary checkpoint folders an interrupted
    write left (only the lock holder may). A stale lock taken over and the folders removed are logged and printed."""
    from jaxppo.trainer.run_folder import RunFolderBusy, remove_temporary_checkpoints

    lock, busy = RunLock(out), None
    if is_main_process():
        try:
            note = lock.acquire()
        except RunFolderBusy as e:
            busy = e
        else:
            removed = remove_temporary_checkpoints(out / "checkpoints")
            if removed:
                note = (f"{note}; " if note else "") + (f"removed {len(removed)} unfinished checkpoint folder(s) of an "
                                                        f"interrupted write: {', '.join(p.name for p in removed)}")
            if note:
                warn(logger, note, label="note")
    if jax.process_count() > 1:
        import numpy as np

        from jaxppo.parallel.host import broadcast_from_main

        if not bool(broadcast_from_main(np.int32(busy is None))):
            raise busy or RunFolderBusy(f"trainer.output_dir={out} is in use (process 0 could not take its lock)")
    elif busy is not None:
        raise busy
    return lock


def metrics_logger(cfg: Any, out: Path, start: int, ckpt: Checkpointer | None = None):
    """The run's ``MetricsLogger`` (``trainer.logger`` / ``tensorboard`` / ``progress`` / ``run_name`` / ``group``),
    counting from step ``start``; when it cannot be opened, ``ckpt`` (if given) is closed before the error
    propagates."""
    from jaxppo.trainer.metrics_log import MetricsLogger
    from jaxppo.trainer.trackers import resolve_logger

    tc = cfg.trainer
    try:
        tb_on, trackers = resolve_logger(tc.logger, tc.tensorboard)
        return MetricsLogger(out, total_steps=tc.total_steps, start_step=start, tensorboard=tb_on,
                             progress=tc.progress, trackers=trackers, run_name=tc.run_name, group=tc.group,
                             run_config=to_dict(cfg))
    except BaseException:
        if ckpt is not None:
            ckpt.close()
        raise


__all__ = ["RunStart", "lock_run_folder", "metrics_logger", "start_run"]
