"""Two processes (``launch/multihost.py``, jax.distributed on 127.0.0.1).

1. SIGTERM to one process at a random step: the flag is agreed at the step boundary, so both processes stop after
   the same step, write that checkpoint together and exit 75 with the same line; the run resumed from it (both
   processes, ``trainer.resume=auto``) ends bit-identical to an uninterrupted 2-process run.
2. Process 1 SIGKILLed: process 0 stops with one line naming process 1 and the last complete checkpoint, and exit
   status 76, instead of the runtime's native abort (kept in ``crash-process0.log``).
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.faults.conftest import TINY
from tests.multihost import procs
from tests.resume_helpers import deterministic_rows, rows

REPO = procs.REPO
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _start(stories_model, data, out, logdir, *extra: str):
    return procs.start(procs.python(str(REPO / "launch/multihost.py"), "train", f"model.path={stories_model}",
                                    f"data.path={data}", f"trainer.output_dir={out}", *TINY, "data.eval_fraction=0",
                                    "trainer.save_every=2", "trainer.log_every=1", "trainer.total_steps=400",
                                    *procs.MESH, *extra),
                       n=2, devices=4, logdir=logdir, env={"JAXPPO_HEARTBEAT_TIMEOUT_S": "8"})


def _wait_for(path, ps, limit: float = 600) -> None:
    t0 = time.monotonic()
    while not path.is_dir():
        assert time.monotonic() - t0 < limit and all(p.poll() is None for p, _, _ in ps), \
            "\n".join(r.describe() for r in procs.wait(ps, 1))
        time.sleep(0.2)


def _final(out) -> dict:
    """A run's final metrics: the numbers of its ``summary.json`` but its timings and its resume point (the other
    entries say where the run found its caches)."""
    import json

    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items()
            if isinstance(v, (int, float)) and not k.startswith(("time/", "perf/")) and k != "resumed_from"}


@pytest.mark.slow
def test_sigterm_at_a_random_step_then_resume_equals_the_uninterrupted_two_process_run(tmp_path, stories_model,
                                                                                       scored_data):
    import random

    steps = 5
    k = random.SystemRandom().randint(1, steps - 2)      # the last logged step before the signal
    # packed minibatches (data.packing): every process plans the same layout from the replicated draw
    short = ("trainer.total_steps=5", "trainer.save_every=3", "data.packing=true")
    full = _start(stories_model, scored_data, tmp_path / "full", tmp_path / "logs_full", *short)
    out = tmp_path / "victim"
    ps = _start(stories_model, scored_data, out, tmp_path / "logs1", *short)
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < k:
        assert time.monotonic() - t0 < 600 and all(p.poll() is None for p, _, _ in ps), \
            "\n".join(r.describe() for r in procs.wait(ps, 1))
        time.sleep(0.02)
    ps[random.SystemRandom().randrange(2)][0].send_signal(signal.SIGTERM)   # one process: both stop
    res = procs.wait(ps, timeout=300)
    assert [r.returncode for r in res] == [75, 75], "\n".join(r.describe() for r in res)
    n = [r["step"] for r in rows(out / "metrics.jsonl")][-1]
    assert n >= k and (out / "checkpoints" / str(n)).is_dir() and not list(out.rglob("*.orbax-checkpoint-tmp"))
    assert [r.stderr.strip().splitlines()[-1] for r in res] == 2 * [
        f"python -m jaxppo.train: preempted at step {n}; saved checkpoint {n}; resume with trainer.resume=auto"]
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == list(range(1, n + 1))

    resumed = procs.wait(_start(stories_model, scored_data, out, tmp_path / "logs2", *short, "trainer.resume=auto"),
                         timeout=600)
    done = procs.wait(full, timeout=600)
    assert all(r.returncode == 0 for r in resumed + done), "\n".join(r.describe() for r in resumed + done)
    a, b = deterministic_rows(tmp_path / "full"), deterministic_rows(out)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after the resume from {n} (SIGTERM after step {k})"
    final = _final(tmp_path / "full")
    assert len(final) > 5 and _final(out) == final, sorted(final)


@pytest.mark.slow
def test_a_dead_peer_is_one_line_naming_it_and_the_last_checkpoint(tmp_path, stories_model, scored_data):
    out = tmp_path / "run"
    ps = _start(stories_model, scored_data, out, tmp_path / "logs")
    _wait_for(out / "checkpoints" / "2", ps)
    ps[1][0].send_signal(signal.SIGKILL)        # its supervisor: the training child dies with it
    res = procs.wait(ps, timeout=180)
    survivor = res[0]
    assert survivor.returncode == 76, survivor.describe()
    last = survivor.stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"launch/multihost\.py: process 0: (process 1 of 2 died \(it stopped sending heartbeats\)|a peer "
                     r"process of 2 died \(its connection to process 0 was lost\)); the run stopped; last complete "
                     r"checkpoint: step (\d+) in (\S+); restart every process with trainer\.resume=auto "
                     r"\(runtime report in (\S+)\)", last)
    assert m, survivor.stderr[-3000:]
    assert int(m[2]) >= 2 and (out / "checkpoints" / m[2]).is_dir() and m[3] == str(out / "checkpoints")
    assert m[4] == str(out / "crash-process0.log") and (out / "crash-process0.log").read_text().strip()
    assert "Traceback" not in survivor.stderr and "Fatal Python error" not in survivor.stderr
    logged = [r["step"] for r in rows(out / "metrics.jsonl")]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= int(m[2])
