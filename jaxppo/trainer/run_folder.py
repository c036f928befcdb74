"""A command's output folder: created and checked before anything is written into it.

:func:`prepare_output_dir` creates the folder and proves it writable, or raises :class:`OutputDirError` (a
``ValueError``: the command-line entry points print it as one line and exit with status 2).

One writer per folder: :class:`RunLock` is an exclusive lock held by the process that writes a run folder (the
trainers, through :func:`jaxppo.trainer.run_dir.start_run`) or claims a sweep's run (:mod:`jaxppo.sweeps.runner`); a
second writer gets :class:`RunFolderBusy` (also a ``ValueError``) naming the holder.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path


class OutputDirError(ValueError):
    """The output folder cannot be used (an existing file, or a folder that cannot be created or written)."""


def prepare_output_dir(out_dir: str | Path, key: str = "trainer.output_dir") -> Path:
    """Create ``out_dir`` (and its parents) and check that this process can write into it; returns it.

    Raises :class:`OutputDirError` (one line naming ``key`` and the path) when it is an existing file, lies under a
    file, cannot be created or is not writable.
    """
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise OutputDirError(f"{key}={p} is an existing file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputDirError(f"{key}={p}: the folder cannot be created ({e.strerror or type(e).__name__}"
                             f"{': ' + e.filename if e.filename and str(e.filename) != str(p) else ''})") from None
    probe = p / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputDirError(f"{key}={p}: the folder is not writable ({e.strerror or type(e).__name__})") from None
    return p


#: the lock file of a run folder (JSON: the holder's pid, host, start time and command)
LOCK_FILE = ".jaxppo.lock"


class RunFolderBusy(ValueError):
    """Another live process holds the folder's lock (one writer per output folder)."""


def _read_holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 65536, 0)
        return dict(json.loads(raw.decode("utf-8"))) if raw.strip() else {}
    except (OSError, ValueError, TypeError):
        return {}


def describe_holder(h: dict) -> str:
    """``pid 123 on host h (started 2025-01-01T00:00:00Z: python -m jaxppo.train ...)``."""
    if not h:
        return "an unknown process"
    cmd = f": {h['command'][:120]}" if h.get("command") else ""
    return f"pid {h.get('pid', '?')} on {h.get('host', '?')} (started {h.get('started', '?')}{cmd})"


class RunLock:
    """An exclusive lock on a folder: ``<folder>/.jaxppo.lock`` (or ``<folder>/<name>``), held with ``flock`` by one open file for as long as
    the holder keeps it (the kernel drops it when the holder's process ends, however it ends) and holding the
    holder's pid, host, start time and command as JSON.

    :meth:`acquire` either takes the lock or raises :class:`RunFolderBusy` naming the live holder. A lock file
    whose recorded holder no longer holds the lock (a process that died without releasing it) is taken over; the
    takeover message names the previous holder. :meth:`release` empties the file and drops the lock (the file
    stays, so a waiting process never locks a file that has been replaced)."""

    def __init__(self, folder: str | Path, key: str = "trainer.output_dir", name: str = LOCK_FILE):
        self.folder = Path(folder)
        self.path = self.folder / name
        self.key = key
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, wait: bool = False) -> str | None:
        """Take the lock (``wait``: block until the holder releases it). Returns a message when a stale lock of a
        dead holder was taken over, else None; raises :class:`RunFolderBusy` when a live process holds it."""
        import fcntl

        if self._fd is not None:
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunFolderBusy(f"{self.key}={self.folder} is in use by {describe_holder(holder)}; one writer per "
                                f"folder (lock {self.path}): wait for it to end, or use another folder") from None
        except BaseException:
            os.close(fd)
            raise
        previous = _read_holder(fd)
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": shlex.join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode("utf-8"), 0)
        self._fd = fd
        if previous:
            gone = "which has ended" if previous.get("host") == me["host"] else "which no longer holds it"
            return f"took over the lock {self.path} of {describe_holder(previous)}, {gone}"
        return None

    def release(self) -> None:
        """Empty the lock file and drop the lock (no-op when not held)."""
        import fcntl

        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def remove_temporary_checkpoints(checkpoints: str | Path) -> list[Path]:
    """Delete the ``*.orbax-checkpoint-tmp`` folders (writes that were interrupted) under ``checkpoints``; returns
    what was removed. Only the holder of the run folder's lock may call it (no other writer is running)."""
    import shutil

    found = sorted(Path(checkpoints).glob("*.orbax-checkpoint-tmp")) if Path(checkpoints).is_dir() else []
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return found


__all__ = ["LOCK_FILE", "OutputDirError", "RunFolderBusy", "RunLock", "describe_holder", "prepare_output_dir",
           "remove_temporary_checkpoints"]
