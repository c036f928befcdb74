"""A preempted run in a sweep (exit 75: stopped by a signal with its checkpoint saved) is recorded as preempted, not
failed (``failures.json``, ``results.csv`` and the printed summary), and the next invocation resumes it; a signal to
the sweep's process group stops the sweep after its running run saved (exit 75), and the rerun finishes the table.

The runs are stand-ins without JAX (``FAKE``: a "checkpoint" file, the exit status of a preempted run, a summary),
driven by the real ``python -m jaxppo.sweep`` entry point with ``RunSpec.argv`` pointed at them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from jaxppo.sweeps.results import read_csv
from tests.faults.conftest import REPO

# a stand-in run: argv[1] its folder. With a checkpoint file it resumes (notes it) and finishes. Without one it
# writes the checkpoint and then: exits 75 at once when its folder is listed in $FAKE_PREEMPT, or waits for SIGTERM
# when $FAKE_WAIT is set (then exits 75), or finishes.
FAKE = r"""
import json, os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
ckpt = out / "checkpoint"
resumed = ckpt.is_file()
with open(out / "starts", "a") as fh:
    fh.write("resumed\n" if resumed else "fresh\n")
def preempted(*_):
    print("python -m jaxppo.train: preempted at step 2; saved checkpoint 2; resume with trainer.resume=auto",
          file=sys.stderr)
    sys.exit(75)
if not resumed:
    ckpt.write_text("2")
    if str(out) in os.environ.get("FAKE_PREEMPT", "").split(os.pathsep):
        preempted()
    if os.environ.get("FAKE_WAIT"):
        signal.signal(signal.SIGTERM, preempted)
        signal.signal(signal.SIGINT, preempted)
        (out / "waiting").write_text("")
        time.sleep(120)
        sys.exit(3)
rows = [{"step": s, "train/samples": 16 * s, "eval/reward_mean": 0.1 * s, "eval/kl": 0.01 * s} for s in (2, 4)]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
(out / "summary.json").write_text(json.dumps({"eval/reward_before": 0.0}))
"""

DRIVER = r"""
import sys
from jaxppo.sweeps.spec import RunSpec
RunSpec.argv = lambda self, python="python": [sys.executable, sys.argv[1], str(self.out_dir)]
from jaxppo.cli.sweep import main
sys.exit(main(sys.argv[2:]))
"""


def _sweep_file(tmp: Path) -> Path:
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump({
        "name": "stop", "base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0],
        "variants": {"a": [], "b": ["replay.alpha=0.5"]}, "baseline": "a",
        "eval": {"every_samples": 64}, "budget": {"samples": 128}, "output_dir": str(tmp / "sweep")}))
    (tmp / "fake.py").write_text(FAKE)
    return f


def _cmd(tmp: Path) -> list[str]:
    return [sys.executable, "-c", DRIVER, str(tmp / "fake.py"), "--config", str(tmp / "sweep.yaml")]


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, JAX_PLATFORMS="cpu",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra)


def _statuses(out: Path) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for r in read_csv(out / "results.csv"):
        got.setdefault(f"{r['variant']}/seed{r['seed']}", set()).add(r["status"])
    return got


def _starts(out: Path) -> dict[str, list[str]]:
    return {p.parent.relative_to(out / "runs").as_posix(): p.read_text().split() for p in out.rglob("starts")}


def test_a_preempted_run_is_recorded_as_preempted_and_resumed_by_the_rerun(tmp_path):
    _sweep_file(tmp_path)
    out = tmp_path / "sweep"
    first = subprocess.run(_cmd(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env=_env(FAKE_PREEMPT=str(out / "runs" / "b" / "seed0")))
    assert first.returncode == 75, first.stdout[-2000:] + first.stderr[-3000:]
    rec = json.loads((out / "failures.json").read_text())
    assert list(rec) == ["b/seed0"]
    assert rec["b/seed0"]["status"] == "preempted" and rec["b/seed0"]["returncode"] == 75
    assert "preempted at step 2; saved checkpoint 2" in rec["b/seed0"]["stderr_tail"]
    assert _statuses(out) == {"a/seed0": {"ok"}, "b/seed0": {"preempted"}}
    assert "PREEMPTED b/seed0" in first.stdout and "FAILED" not in first.stdout
    assert "PREEMPTED: b/seed0: preempted (exit status 75)" in first.stderr
    assert "FAILED" not in first.stderr and "1 preempted with their checkpoint saved" in first.stderr
    with open(out / "summary.csv") as fh:
        summary = {r["variant"]: r for r in __import__("csv").DictReader(fh)}
    assert summary["b"]["n_failed"] == "0"

    again = subprocess.run(_cmd(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert _starts(out) == {"a/seed0": ["fresh"], "b/seed0": ["fresh", "resumed"]}
    assert json.loads((out / "failures.json").read_text()) == {}
    assert _statuses(out) == {"a/seed0": {"ok"}, "b/seed0": {"ok"}}


def test_sigterm_to_the_sweeps_process_group_stops_it_after_the_running_run_saved(tmp_path):
    _sweep_file(tmp_path)
    out = tmp_path / "sweep"
    p = subprocess.Popen(_cmd(tmp_path), cwd=tmp_path, env=_env(FAKE_WAIT="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    waiting = out / "runs" / "a" / "seed0" / "waiting"
    deadline = time.monotonic() + 120
    while not waiting.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGTERM)      # as SLURM and `kill -TERM -PGID` do: the sweep and its run
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 75, stdout[-2000:] + stderr[-3000:]
    assert ("python -m jaxppo.sweep: stopped by SIGTERM: 1 run(s) preempted with their checkpoint saved, 1 not "
            "started; rerun the same command to continue") in stderr
    assert "Traceback" not in stderr
    assert {k: v["status"] for k, v in json.loads((out / "failures.json").read_text()).items()} == \
        {"a/seed0": "preempted"}
    assert _statuses(out) == {"a/seed0": {"preempted"}, "b/seed0": {"missing"}}
    assert _starts(out) == {"a/seed0": ["fresh"]}     # b was not started after the signal

    again = subprocess.run(_cmd(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert _starts(out) == {"a/seed0": ["fresh", "resumed"], "b/seed0": ["fresh"]}
    assert _statuses(out) == {"a/seed0": {"ok"}, "b/seed0": {"ok"}}
