"""The offline loop end to end: SIGKILL + resume equals an uninterrupted run, NaN rollback, reward gain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.resume_helpers import deterministic_rows, kill_at_checkpoint_then_resume
from tests.resume_helpers import rows as _rows
from tests.trainer.conftest import REPO, overrides_for_cli
from tests.xla_flags import cli_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _cli(out: Path, stories_model, scored_data, cache: Path, *extra: str) -> subprocess.Popen:
    env = cli_env(cache)
    cmd = [sys.executable, "-m", "jaxppo.train", *overrides_for_cli(stories_model, scored_data, out, *extra)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigkill_resume_matches_uninterrupted(tmp_path, stories_model, scored_data, compile_cache):
    extra = ("data.eval_fraction=0",)  # no held-out evaluation: only the training steps matter here
    res = kill_at_checkpoint_then_resume(lambda out: _cli(out, stories_model, scored_data, compile_cache, *extra),
                                         tmp_path, 4, wait_s=240, finish_s=300)
    a, b = deterministic_rows(res.full), deterministic_rows(res.victim)
    assert [r["step"] for r in a] == list(range(1, 21))
    assert [r["step"] for r in b] == list(range(1, 21))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after resume"
    sa = json.loads((res.full / "summary.json").read_text())
    sb = json.loads((res.victim / "summary.json").read_text())
    assert sb["resumed_from"] >= 4 and sa["resumed_from"] == 0
    assert len(res.rows_at_kill) >= 4


def test_nan_updates_skipped_counted_and_rolled_back(make_cfg, tmp_path):
    import dataclasses

    from jaxppo.trainer.ppo.algorithm import fit
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("guards.max_nan_steps=3", "data.eval_fraction=0")  # no held-out evaluation needed here
    run = build_run(cfg, devices=jax.devices()[:1])
    st = run.state.replay.storage                 # every token reward, advantage and loss becomes NaN
    st = st.replace(data=st.data.replace(score=st.data.score.at[:].set(jnp.nan)))
    run = dataclasses.replace(run, state=run.state.replace(replay=run.state.replay.replace(storage=st)))
    initial = jax.tree.map(np.asarray, run.ref_params)
    summary, final_state = fit(cfg, run=run)
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["train/nan_skipped"] for r in rows] == [1.0] * 20
    assert rows[-1]["train/nan_total"] == 20.0 and summary["nan_skipped_total"] == 20
    events = [e for e in _rows(tmp_path / "run" / "events.jsonl") if e["kind"] == "rollback"]
    assert [e["step"] for e in events] == [3, 6, 9, 12, 15, 18]
    final = jax.tree.map(np.asarray, final_state.actor)
    assert int(final_state.nan_total) == 20 and int(final_state.nan_streak) == 2   # zeroed at 18, NaN at 19, 20
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(initial), jax.tree.leaves(final)))
    ckpts = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert ckpts == [16, 20]   # every save happened (parameters stayed finite), keep_last=2


def test_heldout_reward_rises_with_is_and_per(make_cfg, tmp_path):
    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("importance.enabled=true", "replay.sampling=prioritized", "trainer.save_hf=true",
                   "trainer.plots=true", "trainer.eval_prompts=16", "trainer.eval_samples=2")
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    out = tmp_path / "run"
    assert summary["eval/reward_after"] > summary["eval/reward_before"]
    lo, hi = summary["eval/reward_gain_ci95"]
    assert lo > 0 and hi > lo
    assert summary["eval/kl"] > 0
    for p in ("metrics.jsonl", "summary.json", "hf/config.json", "hf/model.safetensors", "plots/reward.png"):
        assert (out / p).is_file(), p
    rows = _rows(out / "metrics.jsonl")
    names = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss", "actor/kl_coef",
             "actor/grad_norm", "actor/lr", "critic/vf_loss", "critic/vf_clipfrac", "critic/vf_explained_var",
             "critic/score/mean", "response_length/mean", "is/ess", "is/weight_mean", "is/weight_max",
             "is/clipped_frac", "replay/priority_mean", "replay/priority_max", "replay/beta",
             "replay/sample_efficiency", "perf/throughput", "train/nan_skipped"}
    assert names <= set(rows[0]), names - set(rows[0])
    assert all(np.isfinite(r[k]) for r in rows for k in names)


def test_guard_actions_are_applied_and_logged(make_cfg, tmp_path):
    """KL above the threshold → actor LR x guards.kl_lr_factor (default 0.1, compounding); perplexity above
    tolerance → rollback."""
    from jaxppo.trainer.ppo.algorithm import fit, train
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("guards.kl_threshold=1e-9", out=tmp_path / "kl")
    assert cfg.guards.kl_lr is None and cfg.guards.kl_lr_factor == 0.1
    run = build_run(cfg, devices=jax.devices()[:1])
    initial = run.state
    _, final_state = fit(cfg, run=run)
    rows = _rows(tmp_path / "kl" / "metrics.jsonl")
    cuts = [e for e in _rows(tmp_path / "kl" / "events.jsonl") if e["kind"] == "lower_lr"]
    # the guard fires when the KL crosses the threshold (again after dipping below it, e.g. right after a refresh)
    assert cuts and all(e["factor"] == 0.1 and e["kl"] > 1e-9 for e in cuts)
    assert cuts[0]["step"] < 20
    assert float(final_state.lr_scale) == pytest.approx(0.1 ** len(cuts), rel=1e-5) and float(final_state.lr_scale) < 1
    assert run.state is initial   # the Run is never written (its buffers were donated to the first step)
    for r in rows:
        if r["step"] > 2:   # after the warmup: the configured 5e-4 times 0.1 per cut made before this step
            n = sum(e["step"] < r["step"] for e in cuts)
            assert r["actor/lr"] == pytest.approx(5e-4 * 0.1 ** n, rel=1e-5)
    assert all(r["critic/lr"] > 1e-4 for r in rows if r["step"] > 2)      # the critic keeps its LR

    cfg = make_cfg("guards.ppl_every=5", "guards.ppl_tolerance=1e-9", "trainer.save_every=5", out=tmp_path / "ppl")
    train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    rows = _rows(tmp_path / "ppl" / "metrics.jsonl")
    rollbacks = [e for e in _rows(tmp_path / "ppl" / "events.jsonl") if e["kind"] == "rollback"]
    assert rollbacks and rollbacks[0]["step"] == 5 and rollbacks[0]["reason"] == "perplexity"
    assert all(e["step"] % 5 == 0 for e in rollbacks)
    assert [r["step"] for r in rows if "eval/perplexity" in r] == [5, 10, 15, 20]
    # each rollback restores the newest checkpoint whose perplexity check passed (step 0: the baseline)
    restored = [e for e in _rows(tmp_path / "ppl" / "events.jsonl") if e["kind"] == "rollback_restored"]
    passed = [0] + [s for s in (5, 10, 15, 20) if s not in {e["step"] for e in rollbacks}]
    assert [e["step"] for e in restored] == [e["step"] for e in rollbacks]
    assert all(e["verified"] and e["checkpoint_step"] == max(p for p in passed if p < e["step"]) for e in restored)


def test_log_every_step0_eval_consumption_and_wandb(make_cfg, tmp_path, monkeypatch):
    """trainer.log_every=3 writes steps 3, 6 and the last, plus every evaluation step; with trainer.eval_every the
    reference is evaluated at step 0 (eval/kl = 0, its reward = the summary's reward_before) with a bootstrap
    interval over prompts; train/samples_consumed|tokens_consumed are cumulative; trainer.logger=[wandb] writes
    an offline W&B run under the output folder."""
    pytest.importorskip("wandb")
    from jaxppo.trainer.evaluation import bootstrap_mean_ci, prompt_means
    from jaxppo.trainer.ppo.algorithm import fit
    from jaxppo.trainer.ppo.build import build_run

    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = make_cfg("trainer.log_every=3", "trainer.total_steps=7", "trainer.eval_every=5", "trainer.eval_prompts=6",
                   "trainer.eval_samples=2", "trainer.save_every=100", "trainer.logger=[console,wandb]")
    seen = []
    import jaxppo.trainer.evaluation as evaluation

    real_call = evaluation.HeldoutEval.__call__

    def spy(self, model, reference):   # keep each evaluation's raw rewards for an independent CI check
        r = real_call(self, model, reference)
        seen.append(np.asarray(r["rewards"], np.float64))
        return r

    monkeypatch.setattr(evaluation.HeldoutEval, "__call__", spy)
    summary, state = fit(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    out = tmp_path / "run"
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 3, 5, 6, 7]
    ev_keys = {"eval/reward_mean", "eval/reward_ci_lo", "eval/reward_ci_hi", "eval/kl", "eval/response_length"}
    assert set(rows[0]) == {"step"} | ev_keys                      # step 0: the reference only, before any update
    assert rows[0]["eval/kl"] == 0.0
    assert ev_keys <= set(rows[2]) and rows[2]["eval/kl"] > 0
    # evaluations: step 0 (reference, reused as "before"), step 5, the final "after"
    assert len(seen) == 3
    for row, rewards in ((rows[0], seen[0]), (rows[2], seen[1])):
        per_prompt = rewards.reshape(-1, 2).mean(axis=1)          # 2 samples per prompt, consecutive
        assert per_prompt.size == 6
        assert row["eval/reward_mean"] == pytest.approx(per_prompt.mean(), abs=1e-12)
        lo, hi = bootstrap_mean_ci(prompt_means(rewards, 2), seed=cfg.trainer.seed)
        assert (row["eval/reward_ci_lo"], row["eval/reward_ci_hi"]) == (lo, hi)
        assert lo <= row["eval/reward_mean"] <= hi
    assert summary["eval/reward_before"] == pytest.approx(rows[0]["eval/reward_mean"], abs=1e-12)
    for r in rows[1:]:
        assert r["train/samples_consumed"] == r["step"] * cfg.actor.ppo_mini_batch_size
    tokens = [r["train/tokens_consumed"] for r in rows[1:]]
    assert all(b > a for a, b in zip(tokens, tokens[1:])) and tokens[0] > 0
    assert summary["train/samples_consumed"] == 7 * 16 and summary["train/tokens_consumed"] == tokens[-1]
    # tokens: Σ over steps of response_length/mean x minibatch; at most 16 response tokens a row
    assert tokens[-1] <= 7 * 16 * 16
    assert list((out / "wandb").glob("offline-run-*")), sorted(p.name for p in (out / "wandb").iterdir())
    assert int(state.step) == 7


def test_last_step_evaluation_is_the_final_after(make_cfg, tmp_path, monkeypatch):
    """With trainer.eval_every dividing trainer.total_steps, the policy evaluated at the last step is the final
    comparison's "after": three evaluations in all (step 0 = reference = "before", step 2, step 4 = "after"), and
    the summary's reward_after is the last step's logged eval/reward_mean. Other parameter arrays (a rollback's
    restored ones; here a copy with equal values) are evaluated again."""
    from jaxppo.trainer.ppo.algorithm import _Evaluations, fit
    from jaxppo.trainer.ppo.build import build_run

    import jaxppo.trainer.evaluation as evaluation

    calls = []
    real_call = evaluation.HeldoutEval.__call__

    def spy(self, model, reference):
        calls.append(1)
        return real_call(self, model, reference)

    monkeypatch.setattr(evaluation.HeldoutEval, "__call__", spy)
    cfg = make_cfg("trainer.total_steps=4", "trainer.eval_every=2", "trainer.eval_prompts=4", "trainer.save_every=100")
    run = build_run(cfg, devices=jax.devices()[:1])
    summary, state = fit(cfg, run=run)
    rows = {r["step"]: r for r in _rows(tmp_path / "run" / "metrics.jsonl")}
    assert len(calls) == 3
    assert summary["eval/reward_after"] == pytest.approx(rows[4]["eval/reward_mean"], abs=1e-12)
    assert summary["eval/reward_before"] == pytest.approx(rows[0]["eval/reward_mean"], abs=1e-12)

    from jaxppo.models.eos import eos_ids

    evals = _Evaluations(run, eos_ids(run.reference().config, run.tokenizer))
    calls.clear()
    first = evals.policy(state.actor)
    assert evals.policy(state.actor) is first and len(calls) == 1           # same arrays: kept
    copied = jax.tree_util.tree_map(lambda a: a + 0, state.actor)            # equal values, other arrays
    evals.policy(copied)
    assert len(calls) == 2
