"""A command's output folder: created and checked before anything is written into it.

:func:`prepare_output_dir` creates the folder and proves it writable, or raises :class:`OutputDirError` (a
``ValueError``: the command-line entry points print it as one line and exit with status 2).
"""

from __future__ import annotations

import os
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


__all__ = ["OutputDirError", "prepare_output_dir"]
