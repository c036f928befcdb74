"""Sweeps beyond one sequential runner, end to end on stories260K (a 2-run toy sweep): the ``--slurm`` array
script's tasks, run here with ``SLURM_ARRAY_TASK_ID`` set for each index, produce the same results table as a
``--jobs 2`` local sweep (runs side by side on split cores) started together with a second sweep of the same file
and folder: between them every run runs exactly once and both end with the whole table; a task index out of range
is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxppo.sweeps.results import read_csv
from tests.faults.conftest import REPO, TINY, cli_env

pytestmark = pytest.mark.slow


def _sweep_file(tmp: Path, stories_model: Path, data: Path) -> Path:
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"path": str(stories_model)}, "data": {"path": str(data)}}))
    tiny = [o for o in TINY if not o.startswith(("trainer.total_steps", "trainer.eval_prompts", "trainer.save_every"))]
    f = tmp / "sweep.yaml"
    f.write_text(yaml.safe_dump({
        "name": "toy", "base": str(base), "seeds": [0], "overrides": [*tiny, "trainer.save_every=2"],
        "variants": {"a06": ["replay.alpha=0.6"], "a10": ["replay.alpha=1.0"]}, "baseline": "a06",
        "eval": {"every_samples": 32, "samples_per_prompt": 1, "prompts": 4}, "budget": {"samples": 32}},
        sort_keys=False))
    return f


def _sweep(f: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxppo.sweep", "--config", str(f), *args], cwd=REPO,
                          env=cli_env(cache), capture_output=True, text=True, timeout=600)


def _table(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in read_csv(out / "results.csv")]


def test_slurm_array_tasks_equal_a_two_job_local_sweep(tmp_path, stories_model, scored_data, compile_cache):
    f = _sweep_file(tmp_path, stories_model, scored_data)
    cluster, local = tmp_path / "cluster", tmp_path / "local"
    script = tmp_path / "toy.sbatch"
    res = _sweep(f, compile_cache, "--output-dir", str(cluster), "--slurm", str(script), "--slurm-time", "00:30:00",
                 "--slurm-cpus", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    text = script.read_text()
    assert "#SBATCH --array=0-1\n" in text and "#SBATCH --time=00:30:00\n" in text
    assert "#SBATCH --cpus-per-task=2\n" in text

    env = cli_env(compile_cache)
    bad = subprocess.run(["bash", str(script)], cwd=tmp_path, env=dict(env, SLURM_ARRAY_TASK_ID="2"),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "SLURM_ARRAY_TASK_ID must be 0..1" in bad.stderr
    for i in range(2):     # as SLURM runs each task: from any directory, with its index in the environment
        task = subprocess.run(["bash", str(script)], cwd=tmp_path, env=dict(env, SLURM_ARRAY_TASK_ID=str(i)),
                              capture_output=True, text=True, timeout=600)
        assert task.returncode == 0, task.stderr[-3000:]
    assert sorted(p.parent.name + "/" + p.parent.parent.name for p in cluster.rglob("summary.json")) == \
        ["seed0/a06", "seed0/a10"]
    # nothing is pending any more: the script would be empty, and --results-only reads the runs as they are
    again = _sweep(f, compile_cache, "--output-dir", str(cluster), "--slurm", str(tmp_path / "none.sbatch"))
    assert again.returncode == 2 and "nothing to submit" in again.stderr
    assert _sweep(f, compile_cache, "--output-dir", str(cluster), "--results-only").returncode == 0

    # two sweeps of one file and folder at once (the second one sequential): each run runs once, in one of them
    cmd = [sys.executable, "-m", "jaxppo.sweep", "--config", str(f), "--output-dir", str(local)]
    both = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in ([*cmd, "--jobs", "2"], cmd)]
    outs = [p.communicate(timeout=600) for p in both]
    for p, (o, e) in zip(both, outs):
        assert p.returncode == 0, o[-2000:] + e[-3000:]
    starts = {d.parent.name + "/" + d.name: (d / "sweep_stdout.log").read_text().count("=== sweep attempt")
              for d in (local / "runs").glob("*/seed*")}
    assert starts == {"a06/seed0": 1, "a10/seed0": 1}, starts
    ran = [line.split()[1] for o, _ in outs for line in o.splitlines() if line.strip().startswith("start ")]
    assert sorted(ran) == ["a06/seed0", "a10/seed0"], [o for o, _ in outs]
    a, b = _table(cluster), _table(local)
    assert len(a) == len(b) > 2 and all(r["status"] == "ok" for r in a)
    assert a == b
