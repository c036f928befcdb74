"""Rollbacks go to the newest *verified* checkpoint (its policy passed the perplexity guard), which rotation keeps;
the replay buffer and the data cursor that names its rows are restored together. The policy-length guard in the
loop watches the policy's generations, not the offline minibatch."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(ckpt_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())


def test_rollback_restores_newest_verified_checkpoint_and_its_data_cursor(make_cfg, tmp_path, monkeypatch):
    from jaxppo.trainer import harness
    from jaxppo.trainer.checkpoint import Checkpointer
    from jaxppo.trainer.ppo import algorithm as loop
    from jaxppo.trainer.ppo.build import build_run

    # 120 training rows, a 32-row buffer window reloaded every 5 steps: the data cursor moves (0, 32, 64)
    cfg = make_cfg("trainer.save_every=2", "guards.ppl_every=6", "trainer.keep_last=2", "trainer.total_steps=12",
                   "replay.capacity=32", "replay.refresh_every=5")
    ppl_values = iter([10.0, 10.0, 1000.0])   # baseline (step 0), step 6 passes, step 12 fails -> rollback
    monkeypatch.setattr(harness, "heldout_ppl", lambda algo, params: next(ppl_values))
    run = build_run(cfg, devices=jax.devices()[:1])
    assert run.n_use == 32 and run.train["prompt_ids"].shape[0] > 64
    _, final = loop.fit(cfg, run=run)
    out = tmp_path / "run"
    events = _rows(out / "events.jsonl")
    assert [(e["step"], e["kind"]) for e in events] == [(12, "rollback"), (12, "rollback_restored")]
    restored = events[1]
    # the newest checkpoint before the failure is step 10, but only step 6 was perplexity-checked
    assert restored["checkpoint_step"] == 6 and restored["verified"] is True
    # keep_last=2 keeps 10 and 12; the verified 6 is protected from rotation (step 0 no longer needed)
    assert _steps(out / "checkpoints") == [6, 10, 12]
    ck = Checkpointer(out / "checkpoints", keep_last=2, async_save=False)
    assert ck.verified_steps() == [6]
    good, meta = ck.restore(6, run.state)
    ck.close()
    assert meta["verified"] is True
    # window 1 (steps 6..10) starts at row 32; at step 12 the loop was in window 2 (row 64)
    assert int(good.data_cursor) == 32 == restored["data_cursor"]
    assert int(final.data_cursor) == 32
    np.testing.assert_array_equal(np.asarray(final.replay.storage.data.row), np.asarray(good.replay.storage.data.row))
    for a, b in zip(jax.tree.leaves(final.actor), jax.tree.leaves(good.actor)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(final.step) == 12           # the step counter is kept


def test_length_guard_fires_on_policy_generations_not_on_data(make_cfg, tmp_path, monkeypatch):
    from jaxppo.trainer.ppo import algorithm as loop
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("trainer.eval_every=1", "trainer.total_steps=4", "trainer.save_every=100")
    policy_lengths = iter([4.0, 4.0, 4.0, 4.0, 9.0])   # step 0 (the reference), 1..4: doubles at step 4

    def fake_eval(self, model, reference):
        n = self.prompt_ids.shape[0]
        length = next(policy_lengths, 4.0)   # the summary's before/after evaluations come last
        return {"rewards": np.zeros(n, np.float32), "kl": 0.0, "response_length": length,
                "responses": ["x"] * n, "prompts": ["p"] * n}

    from jaxppo.trainer.evaluation import HeldoutEval

    monkeypatch.setattr(HeldoutEval, "__call__", fake_eval)
    run = build_run(cfg, devices=jax.devices()[:1])
    step = run.step
    calls = iter(range(100))

    def step_with_growing_data(state):   # the offline minibatch's length grows 4x a step
        state, metrics = step(state)
        return state, {**metrics, "response_length/mean": 2.0 * 4.0 ** next(calls)}

    import dataclasses

    loop.train(cfg, run=dataclasses.replace(run, step=step_with_growing_data))
    out = tmp_path / "run"
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]   # step 0: the reference's evaluation
    assert [r["response_length/mean"] for r in rows[1:]] == [2.0, 8.0, 32.0, 128.0]   # still logged as data
    assert [r["eval/response_length"] for r in rows] == [4.0, 4.0, 4.0, 4.0, 9.0]
    warnings = [e for e in _rows(out / "events.jsonl") if e["kind"] == "length_warning"]
    assert [(e["step"], e["key"]) for e in warnings] == [(4, "eval/response_length")]
    assert warnings[0]["running_mean"] == pytest.approx(4.0)


def test_length_probe_feeds_the_guard(make_cfg, tmp_path):
    from jaxppo.trainer.evaluation import generated_length, heldout_eval_prompts
    from jaxppo.trainer.ppo.algorithm import _LengthProbe, train
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("guards.length_probe_every=2", "guards.length_probe_prompts=3", "trainer.total_steps=4",
                   "trainer.save_every=100")
    from jaxppo.models.eos import eos_ids

    run = build_run(cfg, devices=jax.devices()[:1])
    probe = _LengthProbe(run, eos_ids(run.reference().config, run.tokenizer))
    assert probe.prompt_ids.shape[0] == 3 and not probe.due(1) and probe.due(2)
    before = probe(run.ref_params)
    # independent count: greedy generation of each prompt alone, tokens up to and including the first EOS
    from jaxppo.models import generate

    ids, mask = heldout_eval_prompts(run.heldout, 3, 1)
    eos = run.tokenizer.eos_token_id
    total = 0
    for i in range(3):
        out = generate(run.policy(run.ref_params), ids[i:i + 1].astype(np.int32), mask[i:i + 1].astype(np.int32),
                       jax.random.PRNGKey(7), max_new_tokens=16, temperature=0.0, eos_token_id=eos,
                       pad_token_id=0)
        toks = np.asarray(out.tokens)[0].tolist()
        total += (toks.index(eos) + 1) if eos in toks else len(toks)
    assert before == pytest.approx(total / 3)
    assert generated_length(run.policy(run.ref_params), ids, mask, max_new_tokens=16, eos_token_id=eos,
                            batch_size=2) == pytest.approx(before)   # batching does not matter
    train(cfg, run=run)
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "probe/response_length" in r] == [2, 4]
