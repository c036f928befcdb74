"""A damaged newest checkpoint does not end the run: resume falls back to the newest one that restores (the
damaged one moved aside, an event logged). Bad input to ``python -m jaxppo.train`` is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from tests.trainer.conftest import REPO, overrides_for_cli
from tests.xla_flags import cli_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("perf/")}


@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint(make_cfg, tmp_path):
    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("data.eval_fraction=0", "trainer.total_steps=12", "trainer.save_every=4", "trainer.keep_last=3")
    train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["12", "4", "8"]
    first = [_deterministic(r) for r in _rows(out / "metrics.jsonl")]
    # damage the newest checkpoint: truncate its array data files
    data_files = [p for p in (ckpts / "12" / "state" / "d").iterdir() if p.is_file()]
    assert data_files
    for p in data_files:
        with open(p, "r+b") as fh:
            fh.truncate(p.stat().st_size // 2)
    run = build_run(cfg, devices=jax.devices()[:1])
    summary = train(cfg, run=run)
    assert summary["resumed_from"] == 8
    events = [e for e in _rows(out / "events.jsonl") if e["kind"] == "checkpoint_damaged"]
    assert len(events) == 1 and events[0]["checkpoint_step"] == 12 and events[0]["step"] == 8
    moved = Path(events[0]["moved_to"])
    assert moved.parent == ckpts and moved.name.startswith("12.damaged-") and (moved / "state").is_dir()
    assert all(p.stat().st_size > 0 for p in (moved / "state" / "d").iterdir())   # kept, not deleted
    # steps 9..12 were redone from checkpoint 8 exactly as the first run did them, and 12 was written again
    second = [_deterministic(r) for r in _rows(out / "metrics.jsonl")]
    assert [r["step"] for r in second] == list(range(1, 13))
    assert second == first
    assert (ckpts / "12").is_dir()
    # a real train state of another shape is a mismatch (the "another model/config" hint), not damage
    from jaxppo.trainer.checkpoint import Checkpointer, CheckpointMismatchError

    ck = Checkpointer(ckpts, keep_last=3, async_save=False)
    other = run.state.replace(kl_coef=jax.numpy.zeros((2,), jax.numpy.float32))
    with pytest.raises(CheckpointMismatchError, match=r"kl_coef: stored \(\) float32, expected \(2,\) float32"):
        ck.restore(8, other)
    ck.close()


def test_resume_from_the_step0_checkpoint(make_cfg, tmp_path):
    """A run killed after its step-0 checkpoint and before its first step resumes from it (it used to fail with
    StepAlreadyExistsError: the loop saved step 0 again) and then does exactly what an uninterrupted run does."""
    import shutil

    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("data.eval_fraction=0", "trainer.total_steps=4", "trainer.save_every=4", "trainer.keep_last=3")
    train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["0", "4"]
    first = [_deterministic(r) for r in _rows(out / "metrics.jsonl")]
    shutil.rmtree(ckpts / "4")            # as if killed before step 1: only checkpoint 0 was written
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    assert summary["resumed_from"] == 0
    assert [_deterministic(r) for r in _rows(out / "metrics.jsonl")] == first
    assert (ckpts / "4").is_dir()


def _train_cli(tmp_path: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxppo.train", *overrides], cwd=REPO, env=cli_env(cache),
                          capture_output=True, text=True, timeout=300)


def test_cli_missing_model_path_is_one_line(tmp_path, stories_model, scored_data, compile_cache):
    missing = tmp_path / "no-such-model"
    r = _train_cli(tmp_path, compile_cache, *overrides_for_cli(stories_model, scored_data, tmp_path / "out"),
                   f"model.path={missing}")
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("python -m jaxppo.train: error: FileNotFoundError") and str(missing) in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_resume_over_a_damaged_checkpoint_prints_one_warning_line(tmp_path, stories_model, scored_data,
                                                                      compile_cache):
    """The fallback handles a damaged newest checkpoint with ONE warning line on stderr (Orbax's own warnings and
    tracebacks about the unreadable files are held back)."""
    out = tmp_path / "out"
    args = (*overrides_for_cli(stories_model, scored_data, out), "data.eval_fraction=0", "trainer.total_steps=4",
            "trainer.save_every=2")
    first = _train_cli(tmp_path, compile_cache, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    for p in (out / "checkpoints" / "4" / "state" / "d").iterdir():
        if p.is_file():
            with open(p, "r+b") as fh:
                fh.truncate(p.stat().st_size // 2)
    again = _train_cli(tmp_path, compile_cache, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr, again.stderr[-3000:]
    damaged = [ln for ln in again.stderr.splitlines() if "damaged" in ln and not ln.startswith("INFO")]
    assert len(damaged) == 1 and "checkpoint step 4" in damaged[0], again.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == 2
