"""The runner with stand-in runs (a tiny Python script per run, no JAX): done runs are skipped, a failing
run is recorded and does not stop the sweep, and is retried (and cleared) on the next invocation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jaxppo.sweeps.results import read_csv, write_results
from jaxppo.sweeps.runner import FAILURES_FILE, read_failures, run_sweep
from jaxppo.sweeps.spec import SweepError, parse_sweep, plan_runs

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:sweep fake")

# writes what a finished jaxppo.train run writes that the sweep reads; fails when <fail_dir>/<variant>_<seed> exists
FAKE = r"""
import json, sys, pathlib
out, variant, seed, steps, every, fail = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), pathlib.Path(sys.argv[6])
if (fail / f"{variant}_{seed}").exists():
    print("Traceback ...\nRuntimeError: planned failure", file=sys.stderr)
    sys.exit(3)
o = pathlib.Path(out)
o.mkdir(parents=True, exist_ok=True)
gain = 0.02 if variant == "per" else 0.01
with open(o / "metrics.jsonl", "w") as fh:
    for s in range(1, steps + 1):
        row = {"step": s, "perf/step_time_s": 0.1}
        if s % every == 0:
            row["eval/reward_mean"], row["eval/kl"] = 0.1 * seed + gain * s, 0.001 * s
        fh.write(json.dumps(row) + "\n")
(o / "summary.json").write_text(json.dumps({"eval/reward_before": 0.1 * seed}))
"""


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fail").mkdir()
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    spec = parse_sweep({"base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0, 1, 2],
                        "variants": {"uniform": ["replay.sampling=uniform"], "per": []}, "baseline": "uniform",
                        "eval": {"every_samples": 64}, "budget": {"samples": 128}, "output_dir": "out"},
                       name="fake")
    runs = plan_runs(spec)
    calls: list[str] = []

    def argv_for(r):
        calls.append(r.key)
        return [sys.executable, str(script), str(r.out_dir), r.variant, str(r.seed), str(r.total_steps),
                str(r.eval_every), str(tmp_path / "fail")]
    return spec, runs, argv_for, calls, tmp_path


def test_failure_is_recorded_does_not_stop_the_sweep_and_is_retried(sweep):
    spec, runs, argv_for, calls, tmp = sweep
    (tmp / "fail" / "per_1").touch()
    failed = run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert list(failed) == ["per/seed1"]
    assert len(calls) == 6  # the runs after the failure still ran
    rec = read_failures("out")["per/seed1"]
    assert rec["returncode"] == 3 and "RuntimeError: planned failure" in rec["stderr_tail"]
    assert "fake.py" in rec["command"]
    curves, _ = write_results(spec, runs, read_failures("out"))
    rows = read_csv(Path("out/results.csv"))
    bad = [r for r in rows if r["status"] != "ok"]
    assert bad == [{"variant": "per", "seed": "1", "step": "", "samples": "", "tokens": "", "reward": "", "kl": "",
                    "wall_time_s": "", "estimated": "", "status": "failed",
                    "error": "exit status 3: RuntimeError: planned failure"}]
    summary = {r["variant"]: r for r in read_csv(Path("out/summary.csv"))}
    assert (summary["per"]["n_seeds"], summary["per"]["n_failed"]) == ("2", "1")

    # the next invocation runs only the failed run, which now succeeds, and clears its record
    (tmp / "fail" / "per_1").unlink()
    calls.clear()
    assert run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None) == {}
    assert calls == ["per/seed1"]
    assert read_failures("out") == {}
    curves, summary = write_results(spec, runs, read_failures("out"))
    assert all(c.status == "ok" for c in curves)
    # samples axis shared: batch 32, eval every 2 steps -> 0, 64, 128
    assert {tuple(c.samples) for c in curves} == {(0, 64, 128)}
    assert json.loads((tmp / "out" / FAILURES_FILE).read_text()) == {}


def test_parallel_jobs_give_the_same_table(sweep):
    spec, runs, argv_for, calls, tmp = sweep
    run_sweep(spec, runs, jobs=3, argv_for=argv_for, log=lambda s: None)
    assert sorted(calls) == sorted(r.key for r in runs)
    write_results(spec, runs, {})
    par = Path("out/results.csv").read_text()
    for r in runs:
        (r.out_dir / "summary.json").unlink()
    run_sweep(spec, runs, jobs=1, argv_for=argv_for, log=lambda s: None)
    write_results(spec, runs, {})
    assert Path("out/results.csv").read_text() == par


def test_a_run_folder_from_a_different_config_stops_the_sweep(sweep):
    spec, runs, argv_for, calls, tmp = sweep
    d = runs[0].out_dir
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**runs[0].config, "replay": {**runs[0].config["replay"],
                                                                            "alpha": 0.9}}))
    with pytest.raises(SweepError, match=r"run uniform/seed0: .* different config \(replay\.alpha: 0\.9 -> 0\.6\)"):
        run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert calls == []
    (d / "config.json").write_text(json.dumps(runs[0].config))  # the same config: fine
    run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert len(calls) == 6


def test_finished_runs_of_another_config_block_new_runs_but_not_the_tables(sweep):
    spec, runs, argv_for, calls, tmp = sweep
    run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    calls.clear()
    # as if the schema grew (keys the runs' code lacked) and a default changed since the runs were made; a key
    # absent before and at its schema default today (replay.alpha = 0.6) is no change, one set otherwise is
    for r in runs:
        old = json.loads(json.dumps(r.config))
        del old["replay"]["alpha"], old["replay"]["capacity"]
        old["trainer"]["seed"] = "old"
        (r.out_dir / "config.json").write_text(json.dumps(old))
    logged: list[str] = []
    assert run_sweep(spec, runs, argv_for=argv_for, log=logged.append) == {}   # all finished: nothing runs
    assert calls == []
    note = next(s for s in logged if s.startswith("note:"))
    assert "6 finished runs were made with another config" in note and "nothing to run" in note
    assert "keys replay.capacity, trainer.seed" in note and 'uniform/seed0: replay.capacity: (absent) -> 1024' in note
    assert "replay.alpha" not in note
    # one run still to run: it would join a table of runs made with another config
    (runs[-1].out_dir / "summary.json").unlink()
    (runs[-1].out_dir / "config.json").unlink()
    with pytest.raises(SweepError, match=r"5 finished runs .* would mix configs in one table; use --output-dir"):
        run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert calls == []


def test_print_commands(tmp_path, capsys, monkeypatch):
    import yaml

    from jaxppo.cli.sweep import main

    monkeypatch.chdir(tmp_path)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0, 1, 2, 3, 4],
                                 "variants": {"a": [], "b": ["replay.alpha=1.0"]}, "baseline": "a",
                                 "eval": {"every_samples": 32}, "budget": {"samples": 64}, "output_dir": "o"}))
    assert main(["--config", str(f), "--print-commands"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 10 and not (tmp_path / "o").exists()
    assert lines[5].startswith("JAX_COMPILATION_CACHE_DIR=") and " python -m jaxppo.train --config " in lines[5]
    assert lines[5].endswith("replay.alpha=1.0 trainer.seed=0 trainer.total_steps=2 trainer.eval_every=1 "
                             "trainer.eval_samples=1 trainer.output_dir=o/runs/b/seed0 trainer.resume=auto")
    d = tmp_path / "o" / "runs" / "a" / "seed0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    assert main([str(f), "--print-commands", "--pending"]) == 0   # the deprecated positional form still works
    assert len(capsys.readouterr().out.strip().splitlines()) == 9


def test_a_committed_run_without_checkpoints_is_finished(sweep):
    """A run folder holding only the committed small outputs (metrics.jsonl, summary.json, config.json; no
    checkpoints), e.g. from another machine, is not run again and its curve is read."""
    import shutil

    spec, runs, argv_for, calls, tmp = sweep
    run_sweep(spec, runs[:1], argv_for=argv_for, log=lambda s: None)
    d = runs[0].out_dir
    (d / "config.json").write_text(json.dumps(runs[0].config))
    for p in d.iterdir():
        if p.name not in ("metrics.jsonl", "summary.json", "config.json"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    calls.clear()
    logs = []
    run_sweep(spec, runs, argv_for=argv_for, log=logs.append)
    assert runs[0].key not in calls and len(calls) == 5
    assert "6 runs, 1 done, 5 to run" in logs[0]
    curves, _ = write_results(spec, runs, {})
    assert curves[0].status == "ok" and curves[0].samples == [0, 64, 128]


def test_the_positional_form_warns_and_conflicts_are_errors(tmp_path, capsys):
    from jaxppo.cli.sweep import main

    with pytest.raises(SystemExit):
        main([])
    assert "required: --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["a.yaml", "--config", "b.yaml"])
    assert "give the sweep file once" in capsys.readouterr().err
    assert main([str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert "positional sweep file is deprecated; use --config" in err and "none.yaml not found" in err


def test_runs_execute_seed_by_seed(sweep):
    """Every variant of seed 0 runs before any of seed 1: a sweep stopped part-way leaves complete pairs."""
    spec, runs, argv_for, calls, tmp = sweep
    run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert calls == ["uniform/seed0", "per/seed0", "uniform/seed1", "per/seed1", "uniform/seed2", "per/seed2"]
    # resumed with uniform/seed0 done: the other half of seed 0 still comes first
    for r in runs[1:]:
        (r.out_dir / "summary.json").unlink()
    calls.clear()
    run_sweep(spec, runs, argv_for=argv_for, log=lambda s: None)
    assert calls == ["per/seed0", "uniform/seed1", "per/seed1", "uniform/seed2", "per/seed2"]
