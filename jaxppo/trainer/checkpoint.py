"""Orbax checkpoints of the whole train state plus a JSON side-car (guards, counters, config).

Layout: ``<dir>/<step>/state`` (the ``TrainState`` pytree: params, optimizer states, replay storage and
priorities, RNG key, KL coefficient, LR scale, counters, data cursor) and ``<dir>/<step>/meta`` (JSON:
step, ``verified``, guard state, config, data fingerprint). Orbax writes each step into a temporary
directory and renames it when the write is complete, so ``latest_step()`` only ever sees complete
checkpoints; a process killed mid-write leaves a temporary directory that is ignored (and cleaned up on
the next start). Saves are asynchronous: ``save`` copies the state (the train step donates its buffers)
and the files are written in the background. A state with any non-finite parameter is never written.

Verified checkpoints and rotation: ``save(..., verified=True)`` marks a checkpoint whose policy passed
the held-out perplexity guard at that step (the trainer also marks the step-0 checkpoint, whose
perplexity is the baseline). Rotation keeps the newest ``keep_last`` checkpoints **and** the newest
verified one (``newest_verified()``, the target of a rollback), so a rollback target is never deleted
while newer unverified checkpoints accumulate. Deletion is done here, not by Orbax's ``max_to_keep``.

Errors: a checkpoint whose stored tree (paths, shapes, dtypes) differs from this run's state is a
``CheckpointMismatchError`` (written by a run with another model/data/config); one whose files cannot
be read (truncated/corrupted data, manifest or metadata) is a ``CheckpointDamagedError``.
``restore_newest`` skips damaged checkpoints: each is moved aside to ``<step>.damaged-<UTC time>``
(outside Orbax's view, never deleted) and the next older one is tried.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from jaxppo.optim import param_finite
from jaxppo.parallel.host import all_processes, is_main_process, steps_from_main

logger = logging.getLogger("jaxppo.trainer")

META_FILE = ("meta", "metadata")  # where Orbax's JsonSave puts the side-car inside <step>/


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (does not match this run's state or is unreadable)."""


class CheckpointMismatchError(CheckpointError):
    """The stored tree differs from this run's state: another model/data/config wrote it."""


class CheckpointDamagedError(CheckpointError):
    """The checkpoint's files cannot be read (truncated or corrupted)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a file size limit, a folder that is not writable); its
    partial files have been removed."""


@dataclass
class Restored:
    """Result of :meth:`Checkpointer.restore_newest`: the restored step (None: nothing restorable) and the
    damaged checkpoints moved aside on the way, as ``(step, new_path, reason)``."""

    step: int | None
    state: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    damaged: list[tuple[int, Path, str]] = field(default_factory=list)


def _path_key(k: Any) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def tree_signature(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{"a/b/c": (shape, dtype)}`` of every array leaf (attribute, dict and sequence keys alike)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(_path_key(k) for k in path): (tuple(int(d) for d in leaf.shape), str(leaf.dtype))
            for path, leaf in leaves if hasattr(leaf, "shape") and hasattr(leaf, "dtype")}


def signature_diff(stored: dict[str, tuple], expected: dict[str, tuple], limit: int = 3) -> str:
    """A short description of how two :func:`tree_signature` results differ ("" when they are equal)."""
    parts = []
    missing = sorted(set(expected) - set(stored))
    extra = sorted(set(stored) - set(expected))
    if missing:
        parts.append(f"missing {missing[:limit]}{' ...' if len(missing) > limit else ''}")
    if extra:
        parts.append(f"unexpected {extra[:limit]}{' ...' if len(extra) > limit else ''}")
    differ = [k for k in sorted(set(stored) & set(expected)) if stored[k] != expected[k]]
    parts += [f"{k}: stored {stored[k][0]} {stored[k][1]}, expected {expected[k][0]} {expected[k][1]}"
              for k in differ[:limit]]
    if len(differ) > limit:
        parts.append(f"... {len(differ) - limit} more")
    return "; ".join(parts)


# loggers that report a failed restore again, with tracebacks: Orbax's (absl) warnings about unreadable files, and
# the "Event loop is closed" errors of its cancelled async reads (concurrent.futures callbacks, asyncio)
_ORBAX_LOGGERS = ("absl", "concurrent.futures", "asyncio")


#: step directories whose restore this process has reported as failed (``CheckpointDamagedError`` or
#: ``CheckpointMismatchError``); Orbax's abandoned reads of their files keep failing after the restore raised, and
#: those late errors name the files
_REPORTED_DAMAGED: set[str] = set()


#: checkpoint directories of this process's ``Checkpointer`` objects (absolute, ending in a separator): an error that
#: names one of their temporary step folders is a failed write, which :meth:`Checkpointer.save` / ``wait`` raise once
#: as a ``CheckpointWriteError``; Orbax's background threads and asyncio report the same error many times first
_WRITE_DIRS: set[str] = set()


def _names_a_failed_write(text: str) -> bool:
    return any(f"{d}" in text and ".orbax-checkpoint-tmp" in text for d in _WRITE_DIRS)


def _closed_loop_error(err: BaseException | None) -> bool:
    """An error to drop after a failed restore or write: a ``RuntimeError('Event loop is closed')`` of a cancelled
    read, a read error naming a file of a checkpoint already reported as damaged (asyncio logs each abandoned read
    task's error as "Task exception was never retrieved" when the task is collected, after the restore has raised),
    or a write error naming a temporary step folder of a checkpoint directory of this process (raised once by the
    ``Checkpointer`` as a ``CheckpointWriteError``)."""
    if err is None:
        return False
    if isinstance(err, RuntimeError) and "Event loop is closed" in str(err):
        return True
    text = str(err)
    return any(d in text for d in _REPORTED_DAMAGED) or _names_a_failed_write(text)


class _FailedWriteFilter(logging.Filter):
    """Drops Orbax's (absl) log records about a failed write into a temporary step folder of this process's
    checkpoint directories (the ``Checkpointer`` raises the failure once, as a ``CheckpointWriteError``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _closed_loop_error(record.exc_info[1]):
            return False
        try:
            return not _names_a_failed_write(record.getMessage())
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is passed on as it is
            return True


def _short_os_error(err: BaseException) -> str:
    """The operating-system reason of a failed write (``No space left on device (errno 28)``), else the error's
    first 200 characters on one line."""
    import re

    text = str(err)
    m = re.search(r"os_error_code=\\?'?(\d+)", text) or re.search(r"\[Errno (\d+)\]", text)
    if isinstance(err, OSError) and err.errno:
        return f"{os.strerror(err.errno)} (errno {err.errno})"
    if m:
        return f"{os.strerror(int(m[1]))} (errno {m[1]})"
    return f"{type(err).__name__}: {' '.join(text.split())[:200]}"


class _ClosedLoopFilter(logging.Filter):
    """Drops log records that carry an error :func:`_closed_loop_error` holds back."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _closed_loop_error(record.exc_info[1]))


def _wrap_hook(owner: Any, name: str, error_of: Callable[..., BaseException | None]) -> None:
    """Replace ``owner.<name>`` (a hook) once by one that drops closed-loop errors (``error_of(*args)`` picks the
    exception out of the hook's arguments) and passes everything else to the previous hook."""
    previous = getattr(owner, name)
    if getattr(previous, "_jaxppo_closed_loop", False):
        return

    def hook(*args):
        if not _closed_loop_error(error_of(*args)):
            previous(*args)

    hook._jaxppo_closed_loop = True  # type: ignore[attr-defined]
    setattr(owner, name, hook)


def _hold_back_closed_loop_errors() -> None:
    """After a failed restore, Orbax's cancelled reads complete on a closed event loop and each
    ``RuntimeError('Event loop is closed')`` surfaces as a bare traceback on stderr, later than the restore call:
    through ``sys.unraisablehook`` ("Exception ignored in ..."), ``sys.excepthook`` / ``threading.excepthook`` (a
    native callback thread printing it) or the ``concurrent.futures`` / ``asyncio`` loggers ("exception calling
    callback ..."); the reads that failed on the damaged files report their own errors the same ways when asyncio
    collects their tasks ("Task exception was never retrieved"). Drop exactly those errors
    (:func:`_closed_loop_error`); everything else reaches the previous hook or handler."""
    import sys
    import threading

    _wrap_hook(sys, "unraisablehook", lambda u: u.exc_value)
    _wrap_hook(sys, "excepthook", lambda _t, exc, _tb: exc)
    _wrap_hook(threading, "excepthook", lambda args: args.exc_value)
    for name in ("concurrent.futures", "asyncio"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _ClosedLoopFilter) for f in log.filters):
            log.addFilter(_ClosedLoopFilter())
    absl_log = logging.getLogger("absl")
    if not any(isinstance(f, _FailedWriteFilter) for f in absl_log.filters):
        absl_log.addFilter(_FailedWriteFilter())


@contextlib.contextmanager
def _quiet_orbax():
    """Hold back the records of :data:`_ORBAX_LOGGERS` below CRITICAL while a restore runs."""
    logs = [logging.getLogger(name) for name in _ORBAX_LOGGERS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _join_restore_barrier() -> None:
    """After a failed read under several processes: wait at the barrier that ends Orbax's restore
    (``Checkpointer:restore``, orbax-checkpoint 0.12), where the processes that read their shards wait, so that all
    of them can then agree on the outcome (``Checkpointer.restore_newest``) instead of waiting there forever."""
    if jax.process_count() > 1:
        ocp.multihost.sync_global_processes(ocp.multihost.unique_barrier_key("Checkpointer:restore"))


class Checkpointer:
    """Save/restore ``TrainState`` + JSON metadata under ``directory`` (keeps the newest ``keep_last`` and the
    newest verified checkpoint)."""

    def __init__(self, directory: str | Path, *, keep_last: int, async_save: bool = True):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_last = int(keep_last)
        opts = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=async_save,
                                            cleanup_tmp_directories=True, create=True)
        _WRITE_DIRS.add(str(self.directory) + os.sep)
        _hold_back_closed_loop_errors()   # before any save: a failed write is reported by save/wait, once
        self._write_failed = False
        self._on_close: list[Callable[[], None]] = []
        self._pending: int | None = None   # the step of the newest save not yet known to be complete
        self.manager = ocp.CheckpointManager(self.directory, options=opts)
        self._verified = {s for s in self.all_steps() if self._read_meta_file(s).get("verified") is True}

    def temporary_folders(self) -> list[Path]:
        """Leftover ``*.orbax-checkpoint-tmp`` folders of interrupted writes in the directory."""
        return sorted(p for p in self.directory.glob("*.orbax-checkpoint-tmp"))

    def _write_error(self, step: int | None, err: BaseException) -> CheckpointWriteError:
        """Remove the partial step folders and describe the failed write of ``step`` in one line."""
        import shutil

        self._write_failed = True
        for tmp in self.temporary_folders():
            shutil.rmtree(tmp, ignore_errors=True)
        where = self.directory / (str(step) if step is not None else "")
        return CheckpointWriteError(f"checkpoint {where} could not be written: {_short_os_error(err)}; its partial "
                                    "files were removed (free disk space or set trainer.output_dir to another disk, "
                                    "then resume with trainer.resume=auto)")

    # ------------------------------------------------------------------ listing
    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(int(s) for s in self.manager.all_steps())

    def verified_steps(self) -> list[int]:
        present = set(self.all_steps())
        return sorted(s for s in self._verified if s in present)

    def newest_verified(self) -> int | None:
        """The newest checkpoint saved with ``verified=True`` (the rollback target), or None."""
        v = self.verified_steps()
        return v[-1] if v else None

    def _read_meta_file(self, step: int) -> dict[str, Any]:
        try:
            return dict(json.loads(self.directory.joinpath(str(step), *META_FILE).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return {}

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: Any, meta: dict[str, Any], *, verified: bool = False) -> bool:
        """Write ``state`` at ``step``; returns False (nothing written) when a parameter is non-finite."""
        if not param_finite(state):
            logger.warning("step %d: not saving a checkpoint, the parameters contain NaN/inf", step)
            return False
        step = int(step)
        # the next update step donates (reuses) the state's buffers while the write runs in the
        # background, so the asynchronous save gets its own copy
        snapshot = jax.tree.map(lambda x: x.copy(), state)
        try:   # an earlier asynchronous save that failed raises here
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(snapshot),
                meta=ocp.args.JsonSave(dict(meta, step=step, verified=bool(verified)))), force=True)
        except Exception as e:  # noqa: BLE001 - a failed write is re-raised as one line
            failed = self._pending if self._pending is not None and _names_a_failed_write(str(e)) else step
            raise self._write_error(failed, e) from None
        self._pending = step
        if verified:
            self._verified.add(step)
        else:
            self._verified.discard(step)
        self._rotate()
        return True

    def _rotate(self) -> None:
        """Delete all but the newest ``keep_last`` checkpoints and the newest verified one."""
        steps = self.all_steps()
        keep = set(steps[-self.keep_last:])
        nv = self.newest_verified()
        if nv is not None:
            keep.add(nv)
        for s in steps:
            if s not in keep:
                self.manager.delete(s)
                self._verified.discard(s)

    # ------------------------------------------------------------------ restore
    def _mismatch(self, step: int, like: Any, *, dtypes: bool = True) -> CheckpointError | None:
        """A ``CheckpointMismatchError`` when the stored tree's paths (``state/_METADATA``, plain JSON) or the shapes
        (and, with ``dtypes``, the dtypes) of its readable array headers differ from ``like``; a
        ``CheckpointDamagedError`` when the tree metadata cannot be read; else ``None``. Reads metadata only."""
        where = f"checkpoint step {step} in {self.directory}"
        expected = tree_signature(like)
        try:
            tree_md = json.loads((self.directory / str(step) / "state" / "_METADATA").read_text())["tree_metadata"]
            # array leaves only: empty containers and None nodes are recorded with skip_deserialize
            paths = {"/".join(str(k["key"]) for k in entry["key_metadata"]) for entry in tree_md.values()
                     if entry.get("value_metadata", {}).get("value_type") not in (None, "None")
                     and not entry.get("value_metadata", {}).get("skip_deserialize", False)}
        except Exception as e:  # noqa: BLE001 - unreadable tree metadata: the checkpoint is damaged
            return CheckpointDamagedError(f"{where} is damaged (its tree metadata cannot be read: "
                                          f"{type(e).__name__}: {str(e)[:300]})")
        stored = {k: ("?", "?") for k in paths}
        try:   # shapes/dtypes of the arrays whose headers are readable (unreadable ones are left out)
            with ocp.StandardCheckpointer() as c:
                md = c.metadata(self.directory / str(step) / "state").item_metadata
            stored.update({k: v for k, v in tree_signature(getattr(md, "tree", md)).items() if k in stored})
        except Exception:  # noqa: BLE001,S110 - array headers unreadable: compare paths only
            pass
        # an unreadable array header is not evidence of a mismatch: compare it as if it matched
        merged = {k: expected[k] if v == ("?", "?") and k in expected else v for k, v in stored.items()}
        diff = signature_diff(merged, expected)
        if not dtypes and not signature_diff({k: (v[0], "") for k, v in merged.items()},
                                             {k: (v[0], "") for k, v in expected.items()}):
            diff = ""   # the paths and shapes agree; a dtype differing alone is cast by the restore
        if diff:
            return CheckpointMismatchError(
                f"{where} does not match this run's state ({diff}). It was probably written by a run with another "
                "model/data/config; use another trainer.output_dir or trainer.resume=never")
        return None

    def _classify(self, step: int, like: Any, err: BaseException) -> CheckpointError:
        """Why ``step`` did not restore (``err``): a mismatch or unreadable metadata as :meth:`_mismatch` finds
        them; otherwise the files are damaged."""
        found = self._mismatch(step, like)
        if found is not None:
            return found
        return CheckpointDamagedError(f"checkpoint step {step} in {self.directory} is damaged (its files cannot be "
                                      f"read: {type(err).__name__}: {str(err)[:300]})")

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """The state saved at ``step``, with the structure, dtypes and shardings of ``like``.

        Raises ``CheckpointMismatchError`` (stored paths/shapes/dtypes differ from ``like``) or
        ``CheckpointDamagedError`` (the files cannot be read). Orbax's own log records (warnings and tracebacks
        about the files it cannot read) are held back: the raised error says what happened, once."""
        raw, meta = self.read(step, like)
        return self.materialise(raw, like), meta

    def read(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """The files of ``step`` as Orbax assembles them (this process reads its own devices' shards; no program
        runs) and the metadata; errors as :meth:`restore`."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
        # installed before the read: a cancelled read may report its closed-loop error before the except below runs
        _hold_back_closed_loop_errors()
        # a checkpoint of another shape is found from its metadata before any read starts: Orbax's reads of it
        # would fail later, on its own threads, with errors that name no file
        with _quiet_orbax():
            found = self._mismatch(int(step), like, dtypes=False)
            if isinstance(found, CheckpointMismatchError):
                raise found
            try:
                out = self.manager.restore(int(step), args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
                return out.state, dict(out.meta)
            except Exception as e:  # noqa: BLE001 - re-raised as a mismatch or damage with the directory
                _join_restore_barrier()
                err = self._classify(int(step), like, e)
                # damaged or of another shape: Orbax's abandoned reads of its files report late errors that name
                # them (as the late errors spell it: absolute, maybe resolved)
                d = Path(self.directory) / str(step)
                _REPORTED_DAMAGED.update({os.path.abspath(d) + os.sep, str(d.resolve()) + os.sep})
                raise err from e

    @staticmethod
    def materialise(raw: Any, like: Any) -> Any:
        """``raw`` (from :meth:`read`) re-made as jit outputs with ``like``'s shardings: arrays assembled by the
        restore are not reliably donatable. A program: under several processes every process must run it."""
        shardings = jax.tree.map(lambda x: x.sharding, like)
        return jax.jit(lambda t: jax.tree.map(lambda x: x.copy(), t), out_shardings=shardings)(raw)

    def move_aside(self, step: int) -> Path:
        """Rename ``<dir>/<step>`` to ``<dir>/<step>.damaged-<UTC time>`` (Orbax no longer lists it)."""
        self.manager.wait_until_finished()
        src = self.directory / str(int(step))
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dst = self.directory / f"{int(step)}.damaged-{stamp}"
        n = 1
        while dst.exists():
            dst = self.directory / f"{int(step)}.damaged-{stamp}-{n}"
            n += 1
        src.rename(dst)
        self.manager.reload()
        self._verified.discard(int(step))
        return dst

    def restore_newest(self, like: Any, *, verified_only: bool = False,
                       on_damaged: Callable[[int, Path, str], None] | None = None) -> Restored:
        """Restore the newest (``verified_only``: newest verified) checkpoint that can be read.

        Damaged checkpoints met on the way are moved aside (:meth:`move_aside`) and reported through
        ``on_damaged(step, new_path, reason)``; a ``CheckpointMismatchError`` is raised as is.

        Several processes decide once, together (no process may restore another step than the others): the
        candidates are process 0's list (:func:`jaxppo.parallel.steps_from_main`), a checkpoint counts as
        readable only when every process read it (:func:`jaxppo.parallel.all_processes`), and only process 0
        moves a damaged one aside (the others report the path it was at).
        """
        self.manager.wait_until_finished()
        result = Restored(step=None)
        while True:
            candidates = steps_from_main(self.verified_steps() if verified_only else self.all_steps())
            if result.damaged and not is_main_process():
                self.manager.reload()   # process 0 has moved the damaged one aside (before the broadcast above)
            if not candidates:
                return result
            step = candidates[-1]
            err: CheckpointError | None = None
            try:   # each process reads its own shards; the program that re-makes the state runs once all could
                raw, meta = self.read(step, like)
            except CheckpointError as e:
                err = e
            if not all_processes(err is None):
                if isinstance(err, CheckpointMismatchError):
                    raise err
                why = str(err) if err is not None else (f"checkpoint step {step} in {self.directory} is damaged "
                                                        "(another process could not read it)")
                moved = self.move_aside(step) if is_main_process() else self._forget(step)
                # the caller reports it (``on_damaged`` / ``Restored.damaged``: the trainers log one warning event)
                logger.info("%s; moved it to %s and trying an older checkpoint", why, moved)
                result.damaged.append((step, moved, why))
                if on_damaged is not None:
                    on_damaged(step, moved, why)
                continue
            result.step, result.state, result.meta = step, self.materialise(raw, like), meta
            return result

    def _forget(self, step: int) -> Path:
        """What a process other than 0 does for a damaged checkpoint that process 0 moves aside: drop it from the
        verified set; returns the path it was at."""
        self._verified.discard(int(step))
        return self.directory / str(int(step))

    # ------------------------------------------------------------------ lifecycle
    def wait(self) -> None:
        """Wait for the background write; a failed one is a ``CheckpointWriteError`` (partial files removed)."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - a failed write is re-raised as one line
            raise self._write_error(self._pending, e) from None
        self._pending = None
        self._rotate()

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when :meth:`close` ends, however it ends (e.g. release the run folder's lock)."""
        self._on_close.append(fn)

    def close(self) -> None:
        """Wait for the background write and close; after a ``CheckpointWriteError`` has been raised, closing raises
        nothing more (the failure was reported once). The :meth:`on_close` callbacks run last."""
        try:
            if self._write_failed:
                with contextlib.suppress(Exception):
                    self.manager.close()
                return
            try:
                self.wait()
            except CheckpointWriteError:
                with contextlib.suppress(Exception):
                    self.manager.close()
                raise
            self.manager.close()
        finally:
            callbacks, self._on_close = self._on_close, []
            for fn in callbacks:
                fn()
