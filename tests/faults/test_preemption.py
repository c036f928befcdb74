"""Preemption: SIGTERM / SIGINT stop a run after the current step with that step's checkpoint written, one line on
stderr and exit status 75; the resumed run equals the uninterrupted one bit for bit; a second signal aborts."""

from __future__ import annotations

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


def _signal_after(proc: subprocess.Popen, metrics: Path, n_rows: int, sig: int, timeout: float = 300) -> None:
    """Send ``sig`` to ``proc`` once ``metrics`` holds ``n_rows`` rows (the run is inside step ``n_rows + 1``,
    its evaluation or its checkpoint write)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= n_rows:
            os.kill(proc.pid, sig)
            return
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"the run did not reach {n_rows} logged steps (exit {proc.returncode})")


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
