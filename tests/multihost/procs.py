"""Launch N real Python processes joined by ``jax.distributed`` on CPU (127.0.0.1), collect their results.

Each process gets ``JAXPPO_COORDINATOR`` / ``JAXPPO_NUM_PROCESSES`` / ``JAXPPO_PROCESS_ID`` (what
``launch/multihost.py`` reads), ``XLA_FLAGS`` for D simulated devices (``tests/xla_flags.py``) and
``JAX_PLATFORMS=cpu``; CPU collectives run over gloo. No mocks: these are separate OS processes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ProcResult:
    index: int
    returncode: int | None  # None: still running when the timeout hit (then killed)
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (f"--- process {self.index}: exit {self.returncode} after {self.seconds:.1f}s\n"
                f"stdout (tail):\n{self.stdout[-3000:]}\nstderr (tail):\n{self.stderr[-6000:]}")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(index: int, n: int, port: int, devices: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "JAXPPO_COORDINATOR": f"127.0.0.1:{port}", "JAXPPO_NUM_PROCESSES": str(n), "JAXPPO_PROCESS_ID": str(index),
        "XLA_FLAGS": xla_flags(devices), "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def start(cmd: list[str], n: int = 2, devices: int = 4, cwd: Path | str = REPO, env: dict | None = None,
          logdir: Path | None = None) -> list[tuple[subprocess.Popen, Path, Path]]:
    """Start ``cmd`` in ``n`` processes (stdout/stderr to files under ``logdir``); returns (popen, out, err)."""
    port = free_port()
    logdir = Path(logdir or cwd)
    logdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        out, err = logdir / f"proc{i}.out", logdir / f"proc{i}.err"
        p = subprocess.Popen(cmd, cwd=cwd, env=process_env(i, n, port, devices, env),
                             stdout=out.open("w"), stderr=err.open("w"))
        procs.append((p, out, err))
    return procs


def wait(procs, timeout: float) -> list[ProcResult]:
    """Wait for every process up to ``timeout`` seconds in all; kill (and report as None) the late ones."""
    t0 = time.monotonic()
    results = []
    for i, (p, out, err) in enumerate(procs):
        left = max(0.1, timeout - (time.monotonic() - t0))
        try:
            rc = p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        results.append(ProcResult(i, rc, out.read_text(), err.read_text(), time.monotonic() - t0))
    return results


def run(cmd: list[str], n: int = 2, devices: int = 4, timeout: float = 300, **kw) -> list[ProcResult]:
    """Start ``cmd`` in ``n`` joined processes and wait for all of them (see :func:`start`, :func:`wait`)."""
    return wait(start(cmd, n=n, devices=devices, **kw), timeout)


MESH = ("mesh.data=2", "mesh.fsdp=2")   # the mesh both sides of a 1-vs-2-process comparison train on
DEVICES = 2                              # devices per process of the 2-process side; the 1-process side has twice


def one_and_two(base: Path, module: str, command: list[str], overrides: Callable[[Path], list[str]],
                env: dict | None = None, timeout_two: float = 1500, timeout_one: float = 600):
    """``(base/"one", base/"two", results of the 2 processes)``: ``python -m <module> <overrides(one)>`` in 1 process
    x ``2·DEVICES`` devices (``JAXPPO_DISTRIBUTED=0``, the baseline) and ``launch/multihost.py <command>
    <overrides(two)>`` in 2 processes x :data:`DEVICES` devices, side by side, both with :data:`MESH` (logs under
    ``base/logs1``, ``base/logs2``). Fails naming every process's output unless all exit 0.
    ``JAXPPO_MULTIHOST_TIMEOUT`` overrides ``timeout_two``."""
    one, two = base / "one", base / "two"
    env = env or {}
    p1 = start([sys.executable, "-m", module, *overrides(one), *MESH], n=1, devices=2 * DEVICES, logdir=base / "logs1",
               env=dict(env, JAXPPO_DISTRIBUTED="0"))
    p2 = start(python(str(REPO / "launch/multihost.py"), *command, *overrides(two), *MESH), n=2, devices=DEVICES,
               logdir=base / "logs2", env=env)
    r2 = wait(p2, timeout=float(os.environ.get("JAXPPO_MULTIHOST_TIMEOUT", timeout_two)))
    r1 = wait(p1, timeout=timeout_one)
    assert all(r.returncode == 0 for r in r1 + r2), "\n".join(x.describe() for x in r1 + r2)
    return one, two, r2


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def metrics_by_step(out: Path) -> dict[int, dict]:
    """A run folder's ``metrics.jsonl`` rows by step."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "step" in r}


def rel_diff(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)`` (1e-12 floor)."""
    return abs(a - b) / max(abs(a), abs(b), 1e-12)
