"""The DPO trainer end to end on ~64 real HH-RLHF pairs and stories260K: TRL metric names, learning, the cached
reference log-probs, SIGKILL + resume equals an uninterrupted run, hf/ export, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.resume_helpers import deterministic_rows, kill_at_checkpoint_then_resume
from tests.resume_helpers import rows as _rows
from tests.trainer.dpo.conftest import REPO, dpo_overrides
from tests.xla_flags import cli_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRL_KEYS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected", "grad_norm", "learning_rate")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, stories_model, hh_pairs):
    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, fit_dpo

    out = tmp_path_factory.mktemp("dpo_run")
    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, out, out / "cache", "trainer.save_hf=true"))
    run = build_dpo_run(cfg, devices=jax.devices()[:1])
    initial = run.state
    summary, state = fit_dpo(cfg, run=run)
    assert run.state is initial   # the loop threads the state; the run is only read
    return out, run, summary, state


def test_trl_metric_names_learning_and_heldout_accuracy(trained):
    out, run, summary, _ = trained
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(0, 13))
    # step 0: the reference's own held-out metrics. Every implicit reward is 0 up to float noise (the cached
    # reference log-probs were computed in other batches), so the margins are ~0 and the accuracy is noise
    assert abs(rows[0]["eval/rewards/margins"]) < 1e-4, rows[0]
    assert abs(rows[0]["eval/rewards/chosen"]) < 1e-4 and abs(rows[0]["eval/rewards/rejected"]) < 1e-4
    rows = rows[1:]
    for r in rows:
        assert set(TRL_KEYS) <= set(r), sorted(r)
    assert "eval/rewards/accuracies" in rows[5] and "eval/rewards/margins" in rows[5]
    # the loss starts at log 2 (policy = reference) and decreases
    assert abs(rows[0]["loss"] - np.log(2)) < 1e-3
    assert np.mean([r["loss"] for r in rows[-3:]]) < rows[0]["loss"] - 0.05
    # learnable: implicit-reward accuracy on the SAME (training) pairs is clearly above chance
    assert summary["train/rewards/accuracies"] >= 0.75, summary["train/rewards/accuracies"]
    assert summary["n_train_pairs"] + summary["n_heldout_pairs"] <= 64
    lo, hi = summary["eval/rewards/accuracies_ci95"]
    assert 0.0 <= lo <= summary["eval/rewards/accuracies"] <= hi <= 1.0
    assert "eval/reward_skipped" in summary and "eval/reward_after" not in summary  # no reward model given


def test_samples_tokens_and_train_time_are_cumulative(trained):
    """``train/samples_consumed`` = step x dpo.batch_size, ``train/tokens_consumed`` = the chosen + rejected answer
    tokens of the pairs drawn so far (recounted from ``batch_indices``), ``perf/train_time_s`` = the running sum of
    ``perf/step_time_s``."""
    from jaxppo.trainer.dpo.steps import batch_indices

    out, run, summary, _ = trained
    rows = [r for r in _rows(out / "metrics.jsonl") if r["step"] > 0]
    b, n = run.cfg.dpo.batch_size, run.train["prompt_ids"].shape[0]
    tokens, clock = 0.0, 0.0
    for r in rows:
        idx = batch_indices(run.cfg.data.seed, (r["step"] - 1) * b, b, n)
        tokens += float(run.train["chosen_mask"][idx].sum() + run.train["rejected_mask"][idx].sum())
        clock += r["perf/step_time_s"]
        assert r["train/samples_consumed"] == r["step"] * b
        assert r["train/tokens_consumed"] == pytest.approx(tokens)
        assert r["perf/train_time_s"] == pytest.approx(clock)
    assert summary["train/samples_consumed"] == 12 * b
    assert summary["train/tokens_consumed"] == pytest.approx(tokens)


def test_heldout_accuracy_matches_numpy_recount(trained):
    """eval/rewards/accuracies = share of held-out pairs with beta(pi_c - ref_c) > beta(pi_r - ref_r), recounted
    from per-pair log-probs of the trained policy (numpy)."""
    from jaxppo.data.behaviour import compute_behaviour_logprobs

    _, run, summary, state = trained
    h = run.heldout
    pol = run.policy(state.actor)

    def seq(ids, mask):
        arr = {"prompt_ids": h["prompt_ids"], "prompt_mask": h["prompt_mask"], "response_ids": ids,
               "response_mask": mask}
        return (compute_behaviour_logprobs(pol, arr, batch_size=8).astype(np.float64) * mask).sum(1)

    pc, pr = seq(h["chosen_ids"], h["chosen_mask"]), seq(h["rejected_ids"], h["rejected_mask"])
    acc = np.mean((pc - h["ref_chosen"]) > (pr - h["ref_rejected"]))
    assert abs(summary["eval/rewards/accuracies"] - acc) < 1e-9 + 1.0 / len(pc) * 0.5


def test_hf_export_loads_in_transformers_with_same_logits(trained):
    import torch
    import transformers

    out, run, _, state = trained
    hf = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", torch_dtype=torch.float32).eval()
    ids = np.concatenate([run.train["prompt_ids"][:2], run.train["chosen_ids"][:2]], 1)
    mask = np.ones_like(ids)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    got = np.asarray(run.policy(state.actor)(ids, mask))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ref = np.asarray(run.reference()(ids, mask))
    assert np.abs(got - ref).max() > 1e-3  # the export is the trained policy, not the reference


def test_reference_logps_are_cached(tmp_path, stories_model, hh_pairs, monkeypatch):
    import jaxppo.data.behaviour as behaviour
    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run

    calls = []
    real = behaviour.compute_behaviour_logprobs

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(behaviour, "compute_behaviour_logprobs", counting)
    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, tmp_path / "r", tmp_path / "cache",
                                          "data.max_rows=24"))
    a = build_dpo_run(cfg, devices=jax.devices()[:1])
    assert len(calls) == 1 and a.report.notes["behaviour_logprobs_cache"].startswith("written")
    b = build_dpo_run(cfg, devices=jax.devices()[:1])
    assert len(calls) == 1, "the second run recomputed the reference log-probs instead of reading the cache"
    assert b.report.notes["behaviour_logprobs_cache"].startswith("hit")
    for k in ("ref_chosen", "ref_rejected"):
        np.testing.assert_array_equal(a.train[k], b.train[k])
    # the cached sums are the reference's: recompute one pair's chosen sum directly
    arr = {"prompt_ids": a.train["prompt_ids"][:1], "prompt_mask": a.train["prompt_mask"][:1],
           "response_ids": a.train["chosen_ids"][:1], "response_mask": a.train["chosen_mask"][:1]}
    direct = (real(a.reference(), arr) * arr["response_mask"]).sum()
    np.testing.assert_allclose(a.train["ref_chosen"][0], direct, rtol=1e-5, atol=1e-4)


def _cli(out: Path, stories_model, hh_pairs, cache: Path, xla_cache: Path, *extra: str) -> subprocess.Popen:
    env = cli_env(xla_cache)
    cmd = [sys.executable, "-m", "jaxppo.dpo", *dpo_overrides(stories_model, hh_pairs, out, cache, *extra)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_resume_from_the_step0_checkpoint(tmp_path, stories_model, hh_pairs):
    """A DPO run killed after its step-0 checkpoint and before its first step resumes from it (it used to fail with
    StepAlreadyExistsError: the loop saved step 0 again) and then logs what the uninterrupted run logged."""
    import shutil

    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, train_dpo

    out = tmp_path / "run"
    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, out, tmp_path / "cache", "trainer.total_steps=2",
                                          "trainer.eval_every=null"))
    run = build_dpo_run(cfg, devices=jax.devices()[:1])
    train_dpo(cfg, run=run)
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["0", "2"]
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("perf/")}  # noqa: E731
    first = [strip(r) for r in _rows(out / "metrics.jsonl")]
    assert [r["step"] for r in first] == [1, 2]
    shutil.rmtree(ckpts / "2")            # as if killed before step 1: only checkpoint 0 was written
    summary = train_dpo(cfg, run=run)     # the same run: the loop only reads it
    assert summary["resumed_from"] == 0
    assert [strip(r) for r in _rows(out / "metrics.jsonl")] == first
    assert (ckpts / "2").is_dir()


@pytest.mark.slow
def test_sigkill_resume_matches_uninterrupted(tmp_path, stories_model, hh_pairs, dpo_compile_cache):
    extra = ("trainer.eval_every=4",)
    cache = tmp_path / "cache"
    res = kill_at_checkpoint_then_resume(
        lambda out: _cli(out, stories_model, hh_pairs, cache, dpo_compile_cache, *extra), tmp_path, 4)
    assert len(res.rows_at_kill) < 12
    a, b = deterministic_rows(res.full), deterministic_rows(res.victim)
    assert [r["step"] for r in b] == list(range(0, 13))
    assert a == b
    sb = json.loads((res.victim / "summary.json").read_text())
    assert sb["resumed_from"] >= 4
    # the update-step clock continues from the checkpoint's value: it never restarts at 0 and never decreases
    clock = [r["perf/train_time_s"] for r in _rows(res.victim / "metrics.jsonl") if r["step"] > 0]
    assert all(x < y for x, y in zip(clock, clock[1:])), clock


@pytest.mark.parametrize("override, needle", [
    ("dpo.loss_type=hinge dpo.label_smoothing=0.1", "dpo.label_smoothing"),
    ("dpo.beta=0", "dpo.beta"),
    ("dpo.loss_type=nope", "dpo.loss_type"),
    ("data.schema=scored", "data.schema"),
])
def test_bad_config_is_one_line_error(tmp_path, stories_model, hh_pairs, override, needle):
    env = cli_env()
    cmd = [sys.executable, "-m", "jaxppo.dpo", *dpo_overrides(stories_model, hh_pairs, tmp_path / "o",
                                                              tmp_path / "c"), *override.split()]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("python -m jaxppo.dpo"), p.stderr[-2000:]


def test_log_every_sets_the_metrics_cadence(tmp_path, stories_model, hh_pairs):
    """``trainer.log_every`` is the harness's cadence for every trainer: a DPO row every 5 steps, plus the steps
    with an evaluation (6, 12) and the last step (DPO used to log every step whatever the setting)."""
    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, train_dpo

    out = tmp_path / "run"
    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, out, tmp_path / "cache", "trainer.log_every=5"))
    train_dpo(cfg, run=build_dpo_run(cfg, devices=jax.devices()[:1]))
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 5, 6, 10, 12]   # 0: the reference's held-out metrics
    assert "eval/rewards/accuracies" in rows[2] and "eval/rewards/accuracies" not in rows[1]


def _wait_for_checkpoint(step_dir: Path, timeout: float = 60.0) -> list[Path]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = [p for p in (step_dir / "state" / "d").glob("*") if p.is_file()] if step_dir.is_dir() else []
        if files:
            return files
        time.sleep(0.05)
    raise AssertionError(f"checkpoint {step_dir} was not written")


def test_rollback_over_a_damaged_checkpoint_moves_it_aside_and_logs_it(tmp_path, stories_model, hh_pairs,
                                                                       monkeypatch):
    """The perplexity guard rolls back at step 8 to the newest verified checkpoint (step 4), which is damaged: it is
    moved aside with a ``checkpoint_damaged`` event and the run falls back to the verified step 0 (the rollback of
    every trainer is the harness's; DPO's used to skip damaged checkpoints silently)."""
    from jaxppo.config import load_config
    from jaxppo.trainer import harness
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, fit_dpo

    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, out, tmp_path / "cache", "trainer.total_steps=8",
                                          "guards.ppl_every=4", "trainer.save_every=100", "trainer.eval_every=null"))
    calls = iter(range(100))

    def fake_ppl(algo, params):   # baseline, step 4 passes, step 8 fails after checkpoint 4 was damaged
        i = next(calls)
        if i < 2:
            return 10.0
        for p in _wait_for_checkpoint(ckpts / "4"):
            with open(p, "r+b") as fh:
                fh.truncate(p.stat().st_size // 2)
        return 1000.0

    monkeypatch.setattr(harness, "heldout_ppl", fake_ppl)
    run = build_dpo_run(cfg, devices=jax.devices()[:1])
    _, final = fit_dpo(cfg, run=run)
    events = [(e["step"], e["kind"], e.get("checkpoint_step")) for e in _rows(out / "events.jsonl")]
    assert events == [(8, "rollback", None), (8, "checkpoint_damaged", 4), (8, "rollback_restored", 0)]
    assert [p.name for p in ckpts.iterdir() if p.name.startswith("4.damaged-")]
    assert int(final.data_cursor) == 0 and int(final.step) == 8   # step 0's data cursor, the step counter kept
