"""benchmarks/quickstart.py on a tiny job: the record's fields and how its times nest (no timing is asserted)."""

from __future__ import annotations

import pytest

import json

from benchmarks import quickstart as Q
from tests.xla_flags import xla_flags


@pytest.mark.slow
def test_a_tiny_main_job_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))   # one CPU device, as a user's run; FAST_COMPILE
    out = tmp_path / "qs.json"
    over = ["trainer.total_steps=2", "trainer.eval_prompts=2", "critic.ppo_epochs=1", "rollout.max_prompts=10",
            "data.eval_fraction=0.2", "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=8",
            "trainer.plots=false", "trainer.save_hf=false"]
    assert Q.main(["--config", "configs/smoke.yaml", "--out", str(out), *over]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert {"date", "commit", "machine", "config", "overrides", "command"} <= set(rec)
    assert "trainer.total_steps=2" in rec["command"] and rec["config"] == "configs/smoke.yaml"
    assert len(rec["load_before"]) == 3 and len(rec["load_after"]) == 3
    # the phases nest: updates within the loop, the loop and setup within the run, the run within the process
    inside = rec["update_steps_s"] + rec["time/evaluations_s"] + rec["time/perplexity_s"] + rec["time/checkpoints_s"]
    assert 0 < rec["update_steps_s"] and rec["time/evaluations_s"] > 0 and rec["time/perplexity_s"] > 0
    assert rec["time/checkpoints_s"] > 0 and inside <= rec["time/train_s"]
    assert (rec["time/setup_s"] + rec["time/train_s"] + rec["time/eval_s"] + rec["time/export_s"]
            <= rec["time/total_s"] <= rec["wall_s"])
    assert abs(rec["eval/reward_gain"] - (rec["eval/reward_after"] - rec["eval/reward_before"])) < 1e-9
    lo, hi = rec["eval/reward_gain_ci95"]
    assert lo <= rec["eval/reward_gain"] <= hi
