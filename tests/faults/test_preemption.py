"""Preemption: SIGTERM / SIGINT stop a run after the current step with that step's checkpoint written, one line on
stderr and exit status 75; the resumed run equals the uninterrupted one bit for bit; a second signal aborts."""

from __future__ import annotations

import pytest

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


from jaxppo.trainer.preemption import PREEMPTED_EXIT, PreemptionWatch
from tests.faults.conftest import REPO, cli_env, overrides
from tests.trainer.dpo.conftest import dpo_overrides
from tests.resume_helpers import deterministic_rows, rows

STEPS = 6


def test_first_signal_sets_the_flag_second_goes_to_the_previous_handler():
    seen: list[int] = []

    def previous(signum, frame):
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, previous)
    try:
        with PreemptionWatch() as watch:
            assert not watch.requested()
            os.kill(os.getpid(), signal.SIGTERM)
            assert watch.requested() and watch.signame == "SIGTERM" and seen == []
            os.kill(os.getpid(), signal.SIGTERM)     # the second: the previous handler, at once
            assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous and seen == [signal.SIGTERM]
        with PreemptionWatch() as watch:     # a fresh watch, left without a signal: the handler comes back too
            assert signal.getsignal(signal.SIGTERM) is not previous
        assert signal.getsignal(signal.SIGTERM) is previous and not watch.requested()
    finally:
        signal.signal(signal.SIGTERM, before)


def _start(module: str, args: list[str], cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _last_step(metrics: Path) -> int:
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    try:
        return json.loads(lines[-1])["step"] if lines else -1
    except json.JSONDecodeError:        # a line being written
        return -1


def _signal_after(proc: subprocess.Popen, metrics: Path, step: int, sig: int, timeout: float = 300) -> None:
    """Send ``sig`` to ``proc`` once ``metrics`` has logged step ``step`` (every step logged: the run is inside
    step ``step + 1``, its evaluation or its checkpoint write)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if _last_step(metrics) >= step:
            os.kill(proc.pid, sig)
            return
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"the run did not log step {step} (exit {proc.returncode})")


@pytest.mark.slow
def test_signal_at_a_random_step_saves_and_resumes_bit_for_bit(tmp_path, stories_model, scored_data, compile_cache):
    rng = random.SystemRandom()
    k = rng.randint(1, STEPS - 2)                         # logged steps before the signal
    sig = rng.choice([signal.SIGTERM, signal.SIGINT])
    extra = (f"trainer.total_steps={STEPS}", "trainer.save_every=3", "trainer.log_every=1")
    full = _start("jaxppo.train", overrides(stories_model, scored_data, tmp_path / "full", *extra), compile_cache)
    victim_dir = tmp_path / "victim"
    victim = _start("jaxppo.train", overrides(stories_model, scored_data, victim_dir, *extra), compile_cache)
    _signal_after(victim, victim_dir / "metrics.jsonl", k, sig)
    out, err = victim.communicate(timeout=300)
    assert victim.returncode == PREEMPTED_EXIT, f"{sig!r} after {k} rows: exit {victim.returncode}\n{err[-3000:]}"
    last = err.strip().splitlines()[-1]
    logged = [r["step"] for r in rows(victim_dir / "metrics.jsonl")]
    n = logged[-1]
    assert n >= k and logged == list(range(1, n + 1)), (k, logged)
    assert last == (f"python -m jaxppo.train: preempted at step {n}; saved checkpoint {n}; resume with "
                    "trainer.resume=auto"), err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    ckpts = victim_dir / "checkpoints"
    assert (ckpts / str(n)).is_dir() and not list(ckpts.glob("*.orbax-checkpoint-tmp"))
    meta = json.loads((ckpts / str(n) / "meta" / "metadata").read_text())
    assert meta["step"] == n
    events = [e for e in rows(victim_dir / "events.jsonl") if e["kind"] == "preempted"]
    assert [e["step"] for e in events] == [n]

    resumed = _start("jaxppo.train", overrides(stories_model, scored_data, victim_dir, *extra, "trainer.resume=auto"),
                     compile_cache)
    r_out, r_err = resumed.communicate(timeout=300)
    f_out, f_err = full.communicate(timeout=300)
    assert resumed.returncode == 0, r_err[-3000:]
    assert full.returncode == 0, f_err[-3000:]
    a, b = deterministic_rows(tmp_path / "full"), deterministic_rows(victim_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after the resume from {n} ({sig!r} after {k} rows)"
    assert json.loads((victim_dir / "summary.json").read_text())["resumed_from"] == n


def _final(summary: Path) -> dict:
    """A run's final metrics: the numbers of its ``summary.json`` but its timings and its resume point (the other
    entries say where the run found its caches)."""
    return {k: v for k, v in json.loads(summary.read_text()).items()
            if isinstance(v, (int, float)) and not k.startswith(("time/", "perf/")) and k != "resumed_from"}


@pytest.mark.slow
def test_dpo_sigterm_saves_and_the_resumed_run_ends_as_the_uninterrupted_one(tmp_path, stories_model, hh_pairs,
                                                                             compile_cache):
    steps = 4
    k = random.SystemRandom().randint(1, steps - 2)       # the last logged step before the signal
    extra = (f"trainer.total_steps={steps}", "trainer.save_every=3", "trainer.eval_every=2", "trainer.log_every=1",
             "data.max_rows=48")

    def args(out: Path, *more: str) -> list[str]:
        return dpo_overrides(stories_model, hh_pairs, out, tmp_path / f"{out.name}.cache", *extra, *more)

    full = _start("jaxppo.dpo", args(tmp_path / "full"), compile_cache)
    victim_dir = tmp_path / "victim"
    victim = _start("jaxppo.dpo", args(victim_dir), compile_cache)
    _signal_after(victim, victim_dir / "metrics.jsonl", k, signal.SIGTERM)
    _, err = victim.communicate(timeout=300)
    assert victim.returncode == PREEMPTED_EXIT, f"SIGTERM after step {k}: exit {victim.returncode}\n{err[-3000:]}"
    logged = [r["step"] for r in rows(victim_dir / "metrics.jsonl")]
    n = logged[-1]
    assert n >= k and logged == list(range(0, n + 1)), (k, logged)      # step 0: the reference's held-out metrics
    assert err.strip().splitlines()[-1] == (f"python -m jaxppo.dpo: preempted at step {n}; saved checkpoint {n}; "
                                            "resume with trainer.resume=auto"), err[-3000:]
    ckpts = victim_dir / "checkpoints"
    assert (ckpts / str(n)).is_dir() and not list(ckpts.glob("*.orbax-checkpoint-tmp"))
    assert json.loads((ckpts / str(n) / "meta" / "metadata").read_text())["step"] == n
    assert not (victim_dir / "summary.json").exists()

    resumed = _start("jaxppo.dpo", args(victim_dir, "trainer.resume=auto"), compile_cache)
    _, r_err = resumed.communicate(timeout=300)
    _, f_err = full.communicate(timeout=300)
    assert resumed.returncode == 0, r_err[-3000:]
    assert full.returncode == 0, f_err[-3000:]
    a, b = deterministic_rows(tmp_path / "full"), deterministic_rows(victim_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(0, steps + 1))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after the resume from {n} (SIGTERM after step {k})"
    assert json.loads((victim_dir / "summary.json").read_text())["resumed_from"] == n
    final = _final(tmp_path / "full" / "summary.json")
    assert "eval/rewards/accuracies" in final and "train/rewards/accuracies" in final, sorted(final)
    assert _final(victim_dir / "summary.json") == final
