"""End to end on stories260K: a tiny sweep (2 variants x 2 seeds, 4 steps) SIGKILLed during a run (the whole
process group, runs included) and rerun writes the same results.csv (minus wall time) as an uninterrupted
sweep (run side by side with it); the killed run resumes from its checkpoint and the finished one is skipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from jaxppo.sweeps.results import read_csv

from .conftest import TINY

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _sweep_file(tmp: Path, stories_model: Path, scored_data: Path) -> Path:
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"path": str(stories_model)}, "data": {"path": str(scored_data)}}))
    tiny = [o for o in TINY if not o.startswith(("trainer.total_steps", "trainer.eval_prompts", "trainer.save_every"))]
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump({
        "name": "tiny", "base": str(base), "seeds": [0, 1], "overrides": [*tiny, "trainer.save_every=2"],
        "variants": {"per_a06": ["replay.alpha=0.6"], "per_a10": ["replay.alpha=1.0"]}, "baseline": "per_a06",
        # batch 16: evaluations at steps 2 and 4 (32 and 64 samples), 4 prompts x 2 samples
        "eval": {"every_samples": 32, "samples_per_prompt": 2, "prompts": 4}, "budget": {"samples": 64}},
        sort_keys=False))
    return f


def _sweep(f: Path, out: Path, cache: Path) -> subprocess.Popen:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    return subprocess.Popen([sys.executable, "-m", "jaxppo.sweep", "--config", str(f), "--output-dir", str(out),
                             "--jobs", "1"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group, as a shell job would be


def _table(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in read_csv(out / "results.csv")]


def test_killed_sweep_rerun_finishes_the_same_table(tmp_path, stories_model, scored_data, sweep_cache):
    f = _sweep_file(tmp_path, stories_model, scored_data)
    full = _sweep(f, tmp_path / "full", sweep_cache)   # uninterrupted, side by side with the victim and its rerun
    victim_out = tmp_path / "victim"
    second = victim_out / "runs" / "per_a06" / "seed1"
    try:
        victim = _sweep(f, victim_out, sweep_cache)
        deadline = time.time() + 300
        while not (second / "checkpoints" / "2").is_dir() and victim.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert victim.poll() is None, "the sweep ended before its second run checkpointed:\n" + victim.communicate()[0]
        os.killpg(victim.pid, signal.SIGKILL)  # the sweep and its running run
        victim.wait()
        assert (victim_out / "runs" / "per_a06" / "seed0" / "summary.json").is_file()
        assert not (second / "summary.json").exists()
        assert not (victim_out / "results.csv").exists()

        rerun = _sweep(f, victim_out, sweep_cache)
        out_rerun = rerun.communicate(timeout=600)[0]
        assert rerun.returncode == 0, out_rerun[-3000:]
        out_full = full.communicate(timeout=600)[0]
        assert full.returncode == 0, out_full[-3000:]
    finally:
        if full.poll() is None:
            os.killpg(full.pid, signal.SIGKILL)
            full.wait()
    # seed-major order: per_a06/seed0 and per_a10/seed0 finished before per_a06/seed1 started
    assert "4 runs, 2 done, 2 to run" in out_rerun
    assert "start per_a06/seed0" not in out_rerun and "start per_a10/seed0" not in out_rerun  # skipped
    assert json.loads((second / "summary.json").read_text())["resumed_from"] >= 2  # resumed from its checkpoint

    a, b = _table(tmp_path / "full"), _table(victim_out)
    assert [(r["variant"], r["seed"], r["step"]) for r in a] == [
        (v, s, st) for v in ("per_a06", "per_a10") for s in ("0", "1") for st in ("0", "2", "4")]
    assert all(r["status"] == "ok" for r in a)
    assert a == b
    assert (tmp_path / "full" / "summary.csv").read_text() == (victim_out / "summary.csv").read_text()
    for png in ("reward_vs_samples.png", "reward_vs_kl.png"):
        assert (victim_out / "plots" / png).stat().st_size > 1000
