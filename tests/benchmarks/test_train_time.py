"""benchmarks/train_time.py: the ABBA order, the paired ratio by hand, and one tiny pair end to end (the record's
fields; no timing is asserted)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import train_time as T
from tests.xla_flags import xla_flags


def test_abba_order():
    assert T.abba(3) == ["per_is", "uniform", "uniform", "per_is", "per_is", "uniform"]
    assert T.abba(2, ("packed", "padded")) == ["packed", "padded", "padded", "packed"]
    assert list(T.COMPARISONS["packing"]) == ["packed", "padded"] and T.ARMS is T.COMPARISONS["per_is"]


def test_paired_ratio_by_hand():
    # log ratios log 2, log 0.5 -> mean 0 -> ratio 1; sd = log 2 * sqrt 2, t(1) = 12.706
    r = T.paired_ratio([2.0, 1.0], [1.0, 2.0])
    half = 12.7062047 * math.log(2) * math.sqrt(2) / math.sqrt(2)
    assert r["ratio"] == pytest.approx(1.0) and r["pairs"] == 2
    assert r["lo"] == pytest.approx(math.exp(-half), rel=1e-6) and r["hi"] == pytest.approx(math.exp(half), rel=1e-6)
    assert math.isnan(T.paired_ratio([1.0], [2.0])["lo"])


@pytest.mark.slow
def test_one_tiny_pair_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))   # one CPU device, as a user's run; FAST_COMPILE
    out = tmp_path / "tt.json"
    over = ["trainer.total_steps=2", "trainer.eval_every=2", "trainer.eval_prompts=2", "critic.ppo_epochs=1",
            "rollout.max_prompts=10", "data.eval_fraction=0.2", "actor.ppo_mini_batch_size=8",
            "actor.ppo_micro_batch_size=8", f"data.path={tmp_path / 'data' / 'data.jsonl'}"]
    assert T.main(["--pairs", "1", "--out", str(out), *over]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert [r["arm"] for r in rec["runs"]] == ["per_is", "uniform"]
    assert all(r["train_s"] > 0 and len(r["load_before"]) == 3 for r in rec["runs"])
    assert rec["train_ratio"]["pairs"] == 1 and rec["train_ratio"]["ratio"] > 0
    assert {"date", "commit", "machine", "arms"} <= set(rec) and "loadavg" in rec["machine"]
