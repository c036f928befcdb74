"""One writer per output folder: a run folder's lock names its holder to a second trainer (exit 2, one line), a
stale lock is taken over with a message, leftover temporary checkpoint folders are removed and reported, and two
sweeps of one file started together run every run exactly once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jaxppo.trainer.run_folder import LOCK_FILE, RunFolderBusy, RunLock
from tests.faults.conftest import REPO, one_line_error, overrides, run_module

HOLD = textwrap.dedent("""
    import sys, time, pathlib
    from jaxppo.trainer.run_folder import RunLock
    lock = RunLock(sys.argv[1])
    lock.acquire()
    pathlib.Path(sys.argv[2]).write_text("held")
    while not pathlib.Path(sys.argv[3]).exists():
        time.sleep(0.05)
    lock.release()
    """)


@pytest.fixture
def holder(tmp_path):
    """A live process holding the lock of ``tmp_path/run`` until the test ends: ``(folder, pid)``."""
    folder = tmp_path / "run"
    folder.mkdir()
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(ready), str(stop)], cwd=REPO)
    deadline = time.monotonic() + 60
    while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the lock holder did not start"
    yield folder, p.pid
    stop.touch()
    p.wait(timeout=30)


def test_lock_names_a_live_holder_and_frees_when_it_ends(holder, tmp_path):
    folder, pid = holder
    with pytest.raises(RunFolderBusy) as e:
        RunLock(folder).acquire()
    msg = str(e.value)
    assert f"trainer.output_dir={folder} is in use by pid {pid} on {socket.gethostname()}" in msg
    assert "\n" not in msg
    (tmp_path / "stop").touch()
    deadline = time.monotonic() + 30
    lock = RunLock(folder)
    while True:   # the holder exits and releases (its file is emptied): no takeover message
        try:
            note = lock.acquire()
            break
        except RunFolderBusy:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert note is None
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (folder / LOCK_FILE).read_text() == ""


def test_stale_lock_of_a_killed_holder_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(ready), str(tmp_path / "never")], cwd=REPO)
    while not ready.exists():
        assert p.poll() is None
        time.sleep(0.05)
    p.kill()          # dies holding the lock: its record stays in the file
    p.wait()
    lock = RunLock(folder)
    note = lock.acquire()
    assert note is not None and f"of pid {p.pid} on {socket.gethostname()}" in note and "which has ended" in note
    lock.release()


def test_second_trainer_on_a_held_folder_exits_2_naming_the_holder(holder, stories_model, scored_data,
                                                                   compile_cache):
    folder, pid = holder
    res = run_module("jaxppo.train", overrides(stories_model, scored_data, folder), compile_cache)
    one_line_error(res, "python -m jaxppo.train", "RunFolderBusy", f"trainer.output_dir={folder}", f"pid {pid}")
    assert not (folder / "checkpoints").exists() and not (folder / "config.json").exists()


def test_stale_lock_and_temporary_checkpoint_are_reported_on_start(finished_run):
    out, res, dead_pid = finished_run
    assert f"took over the lock {out / LOCK_FILE} of pid {dead_pid}" in res.stdout, res.stdout[-3000:]
    assert "removed 1 unfinished checkpoint folder(s) of an interrupted write: 2.orbax-checkpoint-tmp" in res.stdout
    assert list(out.rglob("*.orbax-checkpoint-tmp")) == []
    assert (out / LOCK_FILE).read_text() == ""       # released at the end


# a stand-in run (no JAX): records each start in <out>/starts, holds on for a moment, writes summary.json
FAKE = r"""
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
with open(out / "starts", "a") as fh:
    fh.write(f"{os.getpid()}\n")
time.sleep(0.3)
(out / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/reward_mean": 0.1, "eval/kl": 0.0}) + "\n")
(out / "summary.json").write_text("{}")
"""

SWEEP = r"""
import sys
from jaxppo.sweeps.runner import run_sweep
from jaxppo.sweeps.spec import parse_sweep, plan_runs
spec = parse_sweep({"base": sys.argv[1], "seeds": [0, 1, 2], "variants": {"a": [], "b": ["replay.alpha=0.5"]},
                    "baseline": "a", "eval": {"every_samples": 64}, "budget": {"samples": 128},
                    "output_dir": sys.argv[2]}, name="twice")
runs = plan_runs(spec)
failed = run_sweep(spec, runs, jobs=int(sys.argv[4]), argv_for=lambda r: [sys.executable, sys.argv[3], str(r.out_dir)])
missing = [r.key for r in runs if not (r.out_dir / "summary.json").is_file()]
print("FAILED", sorted(failed), "MISSING", missing)
sys.exit(1 if failed or missing else 0)
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_two_concurrent_sweeps_run_every_run_once(tmp_path, jobs):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-c", SWEEP, str(REPO / "configs" / "smoke.yaml"), str(out), str(fake), str(jobs)]
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    a = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    b = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_a, out_b = a.communicate(timeout=120)[0], b.communicate(timeout=120)[0]
    assert a.returncode == 0 and b.returncode == 0, out_a + "\n----\n" + out_b
    starts = {p.parent.relative_to(out / "runs").as_posix(): p.read_text().split() for p in out.rglob("starts")}
    assert sorted(starts) == sorted(f"{v}/seed{s}" for v in "ab" for s in range(3))
    assert all(len(v) == 1 for v in starts.values()), starts
    # both sweeps did part of the work or one waited for the other: either way, each ran what it claimed
    assert "Traceback" not in out_a + out_b
    assert not Path(out / "failures.json").exists() or json.loads((out / "failures.json").read_text()) == {}
