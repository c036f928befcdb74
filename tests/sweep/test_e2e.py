"""Sweeps end to end on stories260K (a toy sweep: 2 variants x 1 seed x 4 steps, a checkpoint every 2), every way a
sweep is run giving one results table:

- the ``--slurm`` array script's tasks, run here with ``SLURM_ARRAY_TASK_ID`` set for each index (an index out of
  range is refused; once every run is done there is nothing to submit, and ``--results-only`` reads the table);
- a ``--jobs 2`` local sweep started together with a second, sequential sweep of the same file and folder: between
  them every run runs exactly once and both end with the whole table (its numbers equal to float rounding:
  a run pinned to one core sums in another order than one on two);
- a sweep SIGKILLed (its whole process group, the running run included) after its second run checkpointed, then
  rerun: the finished run is skipped, the killed one resumes from its checkpoint.
"""

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
from tests.faults.conftest import REPO, TINY, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def _sweep_file(tmp: Path, stories_model: Path, data: Path) -> Path:
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"path": str(stories_model)}, "data": {"path": str(data)}}))
    tiny = [o for o in TINY if not o.startswith(("trainer.total_steps", "trainer.eval_prompts", "trainer.save_every"))]
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump({
        "name": "toy", "base": str(base), "seeds": [0], "overrides": [*tiny, "trainer.save_every=2"],
        "variants": {"a06": ["replay.alpha=0.6"], "a10": ["replay.alpha=1.0"]}, "baseline": "a06",
        # batch 16: evaluations at steps 0, 2 and 4 (0, 32 and 64 samples), 4 prompts x 2 samples
        "eval": {"every_samples": 32, "samples_per_prompt": 2, "prompts": 4}, "budget": {"samples": 64}},
        sort_keys=False))
    return f


def _cmd(f: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "jaxppo.sweep", "--config", str(f), "--output-dir", str(out), *args]


def _sweep(f: Path, out: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(f, out, *args), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _start(f: Path, out: Path, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(_cmd(f, out, *args), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its own process group, as a shell job would be


def _table(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in read_csv(out / "results.csv")]


def _without(row: dict, *keys: str) -> dict:
    return {k: v for k, v in row.items() if k not in keys}


def _slurm_tasks(f: Path, cluster: Path, tmp: Path, env: dict) -> None:
    script = tmp / "toy.sbatch"
    res = _sweep(f, cluster, env, "--slurm", str(script), "--slurm-time", "00:30:00", "--slurm-cpus", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    text = script.read_text()
    assert "#SBATCH --array=0-1\n" in text and "#SBATCH --time=00:30:00\n" in text
    assert "#SBATCH --cpus-per-task=2\n" in text
    bad = subprocess.run(["bash", str(script)], cwd=tmp, env=dict(env, SLURM_ARRAY_TASK_ID="2"),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "SLURM_ARRAY_TASK_ID must be 0..1" in bad.stderr
    for i in range(2):     # as SLURM runs each task: from any directory, with its index in the environment
        task = subprocess.run(["bash", str(script)], cwd=tmp, env=dict(env, SLURM_ARRAY_TASK_ID=str(i)),
                              capture_output=True, text=True, timeout=600)
        assert task.returncode == 0, task.stderr[-3000:]
    assert sorted(p.parent.parent.name + "/" + p.parent.name for p in cluster.rglob("summary.json")) == \
        ["a06/seed0", "a10/seed0"]
    # nothing is pending any more: the script would be empty, and --results-only reads the runs as they are
    again = _sweep(f, cluster, env, "--slurm", str(tmp / "none.sbatch"))
    assert again.returncode == 2 and "nothing to submit" in again.stderr
    assert _sweep(f, cluster, env, "--results-only").returncode == 0


def _kill_after_the_second_checkpoint(victim: subprocess.Popen, out: Path) -> None:
    second = out / "runs" / "a10" / "seed0"
    deadline = time.time() + 600
    while not (second / "checkpoints" / "2").is_dir() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert victim.poll() is None, "the sweep ended before its second run checkpointed:\n" + victim.communicate()[0]
    os.killpg(victim.pid, signal.SIGKILL)  # the sweep and its running run
    victim.wait()
    assert (out / "runs" / "a06" / "seed0" / "summary.json").is_file()
    assert not (second / "summary.json").exists() and not (out / "results.csv").exists()


def test_slurm_tasks_parallel_sweeps_and_a_killed_rerun_write_one_table(tmp_path, stories_model, scored_data,
                                                                        subprocess_compile_cache):
    f = _sweep_file(tmp_path, stories_model, scored_data)
    env = cli_env(subprocess_compile_cache)
    cluster, local, victim_out = tmp_path / "cluster", tmp_path / "local", tmp_path / "victim"
    _slurm_tasks(f, cluster, tmp_path, env)

    # two sweeps of one file and folder at once (the second one sequential), beside a third sweep that is killed
    both = [_start(f, local, env, "--jobs", "2"), _start(f, local, env)]
    victim = _start(f, victim_out, env, "--jobs", "1")
    try:
        _kill_after_the_second_checkpoint(victim, victim_out)
        rerun = _sweep(f, victim_out, env, "--jobs", "1")
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
        outs = [p.communicate(timeout=600)[0] for p in both]
    finally:
        for p in [*both, victim]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, o in zip(both, outs):
        assert p.returncode == 0, o[-3000:]
    starts = {d.parent.name + "/" + d.name: (d / "sweep_stdout.log").read_text().count("=== sweep attempt")
              for d in (local / "runs").glob("*/seed*")}
    assert starts == {"a06/seed0": 1, "a10/seed0": 1}, starts
    ran = [line.split()[1] for o in outs for line in o.splitlines() if line.strip().startswith("start ")]
    assert sorted(ran) == ["a06/seed0", "a10/seed0"], outs

    # the rerun skipped the finished run and resumed the killed one from its checkpoint
    assert "2 runs, 1 done, 1 to run" in rerun.stdout, rerun.stdout
    assert "start a06/seed0" not in rerun.stdout and "start a10/seed0" in rerun.stdout
    assert json.loads((victim_out / "runs" / "a10" / "seed0" / "summary.json").read_text())["resumed_from"] >= 2

    ref = _table(cluster)
    assert [(r["variant"], r["seed"], r["step"]) for r in ref] == [
        (v, "0", st) for v in ("a06", "a10") for st in ("0", "2", "4")]
    assert all(r["status"] == "ok" for r in ref)
    assert _table(victim_out) == ref   # sequential, like the slurm tasks: the same numbers to the last digit
    # --jobs 2 pins each run to one core; XLA:CPU then sums some products in another order (last digits differ)
    local_rows = _table(local)
    assert [_without(r, "reward", "kl") for r in local_rows] == [_without(r, "reward", "kl") for r in ref]
    for r, q in zip(local_rows, ref):
        assert float(r["reward"]) == pytest.approx(float(q["reward"]), rel=1e-5, abs=1e-7), (r, q)
        assert float(r["kl"]) == pytest.approx(float(q["kl"]), rel=1e-4, abs=1e-7), (r, q)
    assert (victim_out / "summary.csv").read_text() == (cluster / "summary.csv").read_text()
    for png in ("reward_vs_samples.png", "reward_vs_kl.png"):
        assert (victim_out / "plots" / png).stat().st_size > 1000
