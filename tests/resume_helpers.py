"""The SIGKILL-then-resume pattern of the trainer tests, in one place.

Two runs of the same command start side by side: ``full`` runs to the end uninterrupted; ``victim`` is SIGKILLed as
soon as its checkpoint ``checkpoints/<step>`` exists, then started again in the same folder (``resume=auto``) and run
to the end. The caller compares the two folders' ``metrics.jsonl`` (:func:`deterministic_rows`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def rows(path: Path) -> list[dict]:
    """The JSON lines of ``path`` (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def deterministic(row: dict) -> dict:
    """A metrics row without its timing keys (``perf/...``), which differ between any two runs."""
    return {k: v for k, v in row.items() if not k.startswith("perf/")}


def deterministic_rows(run_dir: Path) -> list[dict]:
    """``run_dir/metrics.jsonl`` rows without their timing keys."""
    return [deterministic(r) for r in rows(run_dir / "metrics.jsonl")]


@dataclass(frozen=True)
class KilledAndFull:
    """The folders of both runs and the metrics rows the victim had written when it was killed."""

    full: Path
    victim: Path
    rows_at_kill: list[dict]


def kill_at_checkpoint_then_resume(start: Callable[[Path], subprocess.Popen], tmp: Path, step: int, *,
                                   wait_s: float = 300, finish_s: float = 400) -> KilledAndFull:
    """Run ``start(tmp/"full")`` and ``start(tmp/"victim")`` side by side; SIGKILL the victim once
    ``victim/checkpoints/<step>`` exists (within ``wait_s``), start it again in the same folder and wait (``finish_s``)
    for both to exit 0. ``start(out)`` returns a Popen whose stdout (stderr merged) is a text pipe."""
    full_dir, victim_dir = tmp / "full", tmp / "victim"
    full, victim = start(full_dir), start(victim_dir)
    ckpt = victim_dir / "checkpoints" / str(step)
    deadline = time.time() + wait_s
    while not ckpt.is_dir() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if victim.poll() is not None or not ckpt.is_dir():
        victim.kill()
        full.kill()
        raise AssertionError(f"the victim run did not reach checkpoint {step} (exit {victim.returncode}):\n"
                             + victim.communicate()[0][-3000:])
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    metrics = victim_dir / "metrics.jsonl"
    at_kill = rows(metrics) if metrics.is_file() else []
    resumed = start(victim_dir)
    out_r, out_f = resumed.communicate(timeout=finish_s)[0], full.communicate(timeout=finish_s)[0]
    assert resumed.returncode == 0, "the resumed run failed:\n" + out_r[-3000:]
    assert full.returncode == 0, "the uninterrupted run failed:\n" + out_f[-3000:]
    return KilledAndFull(full_dir, victim_dir, at_kill)
