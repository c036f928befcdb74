"""Real processes: ``launch/multihost.py dpo`` trains ~64 HH-RLHF pairs on stories260K under 2 processes x 2 devices
(``jax.distributed`` over 127.0.0.1, gloo CPU collectives) and its per-step losses equal those of 1 process x 4
devices on the same (data=2, fsdp=2) mesh, with packed batches (``data.packing``: every process plans the same
layout from the replicated batch; the padded layout runs in the SIGKILL test); only process 0 wrote files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.multihost import procs
from tests.trainer.dpo.conftest import TINY

pytestmark = [pytest.mark.slow, pytest.mark.processes]

REPO = procs.REPO
STEPS = 6
KEYS = ("loss", "rewards/margins", "logps/chosen", "grad_norm")
RTOL = 1e-4


def _overrides(stories_model: Path, hh_pairs: Path, out: Path) -> list[str]:
    return [f"model.path={stories_model}", f"data.path={hh_pairs}", f"data.cache_dir={out}.cache", f"trainer.output_dir={out}", *TINY,
            f"trainer.total_steps={STEPS}", "trainer.save_every=3", "trainer.eval_every=3", "trainer.save_hf=true"]


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory, stories_model, hh_pairs):
    """(one, two, results of the 2 processes): 1 process x 4 devices and 2 processes x 2 devices (run together)."""
    return procs.one_and_two(tmp_path_factory.mktemp("mh_dpo"), "jaxppo.dpo", ["dpo"],
                             lambda out: [*_overrides(stories_model, hh_pairs, out), "data.packing=true"],
                             timeout_two=1200)


def test_dpo_two_processes_match_one(dpo_runs):
    one, two, _ = dpo_runs
    m1, m2 = procs.metrics_by_step(one), procs.metrics_by_step(two)
    assert sorted(m1) == sorted(m2) == list(range(0, STEPS + 1))   # step 0: the reference's held-out metrics
    worst: dict[str, float] = {}
    for step in m1:
        for k in (KEYS if step else ()) + (("eval/loss", "eval/rewards/accuracies") if step % 3 == 0 else ()):
            a, b = m1[step][k], m2[step][k]
            assert np.isfinite(a) and np.isfinite(b), (step, k)
            worst[k] = max(worst.get(k, 0.0), procs.rel_diff(a, b))
    print(f"worst relative difference, steps 1-{STEPS}:", worst)
    assert all(v <= RTOL for v in worst.values()), worst
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s1["n_train_pairs"] == s2["n_train_pairs"] and s1["n_heldout_pairs"] == s2["n_heldout_pairs"]
    for k in ("eval/rewards/accuracies", "train/rewards/accuracies", "eval/loss"):
        assert procs.rel_diff(s1[k], s2[k]) <= RTOL, (k, s1[k], s2[k])


def test_dpo_only_process_zero_wrote(dpo_runs):
    one, two, res = dpo_runs
    for name in ("metrics.jsonl", "events.jsonl"):   # process 1 appending would double the lines
        if (one / name).exists():
            assert len((two / name).read_text().splitlines()) == len((one / name).read_text().splitlines()), name

    def names(d: Path) -> list[str]:
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if "checkpoints" not in p.parts)
    assert names(two) == names(one)
    assert {"summary.json", "config.json", "hf/config.json", "hf/model.safetensors"} <= set(names(two))
    assert sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit())[-1] == STEPS
    # the log file: process 0's lines only (each carries the process tag of launch/multihost.py)
    log = (two / "dpo.log").read_text()
    assert "[process 0/2]" in log and "[process 1/2]" not in log
    assert "process 1/2" in res[1].stderr


def test_dpo_one_process_killed_the_other_stops(tmp_path, stories_model, hh_pairs):
    """Process 1 of a 2-process DPO run is SIGKILLed once the first checkpoint exists: process 0 exits with status 76
    within 60 s with one line naming the failed process (the coordination service's heartbeat) and the last
    checkpoint."""
    import re
    import signal
    import time

    out = tmp_path / "killed"
    ps = procs.start(procs.python(str(REPO / "launch/multihost.py"), "dpo", *_overrides(stories_model, hh_pairs, out),
                                  *procs.MESH, "trainer.total_steps=200", "trainer.eval_every=null"),
                     n=2, devices=procs.DEVICES, logdir=tmp_path / "logs")
    t0 = time.monotonic()
    while not (out / "checkpoints" / "3").is_dir():
        assert time.monotonic() - t0 < 900 and all(p.poll() is None for p, _, _ in ps), \
            "\n".join(r.describe() for r in procs.wait(ps, 1))
        time.sleep(0.5)
    ps[1][0].send_signal(signal.SIGKILL)
    t_kill = time.time()
    res = procs.wait(ps, timeout=120)
    survivor = res[0]
    assert res[1].returncode == -9, res[1].describe()
    assert survivor.returncode not in (0, None), survivor.describe()
    waited = (tmp_path / "logs" / "proc0.err").stat().st_mtime - t_kill
    assert waited < 60, f"process 0 needed {waited:.0f} s to stop\n{survivor.describe()}"
    # JAX names the dead task in one of two words, depending on whether process 0 was waiting in a barrier
    # ("Task 1 heartbeat timeout") or not ("The following tasks are unhealthy (stopped sending heartbeats):\n1").
    # When the kill lands inside one of the step's gloo collectives, gloo aborts process 0 first, at once, with its
    # own error on the pair to the dead peer ("Received data size doesn't match expected size"; more likely the
    # shorter the steps): it does not name the process, but it stops the run the same way, which is what this test
    # is about
    # launch/multihost.py turns either report into one line (the runtime's report goes to crash-process0.log)
    assert survivor.returncode == 76, survivor.describe()
    last = survivor.stderr.strip().splitlines()[-1]
    assert re.match(r"launch/multihost\.py: process 0: (process 1 of 2 died \(it stopped sending heartbeats\)|a peer "
                    r"process of 2 died \(its connection to process 0 was lost\)); the run stopped; last complete "
                    r"checkpoint: step \d+ in ", last), survivor.stderr[-3000:]
    heartbeat = r"task 1 heartbeat timeout|tasks are unhealthy \(stopped sending heartbeats\):\s*1\b"
    gloo_pair = r"gloo/transport/tcp/pair\.cc.*Received data size doesn't match expected size"
    report = (out / "crash-process0.log").read_text()
    assert re.search(heartbeat, report, re.IGNORECASE) or re.search(gloo_pair, report), report[-3000:]
    assert not (out / "summary.json").exists()
