"""benchmarks/packing.py: one tiny behaviour pass end to end (the record's fields; no timing is asserted), and a
failed arm kept in the record without a speed-up."""

from __future__ import annotations

import pytest

import json
from types import SimpleNamespace

from benchmarks import packing as K
from tests.xla_flags import xla_flags


@pytest.mark.slow
def test_a_tiny_behaviour_pass_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))   # one CPU device, as a user's run; FAST_COMPILE
    out = tmp_path / "packing.json"
    assert K.main(["--caps", "24,8", "--rows", "8", "--layers", "1", "--batch", "4", "--repeats", "1",
                   "--passes", "behaviour", "--out", str(out)]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["complete"] and {"date", "commit", "machine", "args"} <= set(rec)
    arms = {r["arm"]: r for r in rec["records"]}
    assert set(arms) == {"padded", "packed"}
    assert arms["padded"]["real_tokens"] == arms["packed"]["real_tokens"] > 0     # the same rows in both arms
    assert arms["packed"]["packed_slots"] <= arms["padded"]["padded_slots"] == 8 * (24 + 8)
    ratio = arms["packed"]["real_tokens_per_s"] / arms["padded"]["real_tokens_per_s"]
    assert rec["speedup_packed_over_padded"]["behaviour@24,8"] == ratio


def test_a_failed_arm_is_recorded_and_has_no_speed_up(tmp_path):
    args = SimpleNamespace(caps=["24,8"], passes="dpo", out=str(tmp_path / "k.json"), rows=8)
    ok = {"caps": [24, 8], "pass": "dpo", "arm": "padded_shared_prefix", "median_s": 2.5,
          "real_tokens_per_s": 10.0}
    failed = {"caps": [24, 8], "pass": "dpo", "arm": "padded", "error": "RESOURCE_EXHAUSTED: Out of memory"}
    packed = {"caps": [24, 8], "pass": "dpo", "arm": "packed", "median_s": 1.0, "real_tokens_per_s": 25.0}
    assert K.write_record(args, "2026-01-01T00:00:00+00:00", [ok, failed]) == {}
    assert not json.loads((tmp_path / "k.json").read_text())["complete"]
    # DPO's speed-up is against the trainer's shared-prefix layout, whatever happened to the padded stack
    assert K.write_record(args, "2026-01-01T00:00:00+00:00", [ok, failed, packed]) == {"dpo@24,8": 2.5}
    assert json.loads((tmp_path / "k.json").read_text())["complete"]


def test_merge_keeps_the_rows_not_remeasured_with_their_own_date_and_commit(tmp_path):
    out = tmp_path / "k.json"
    old = [{"caps": [24, 8], "pass": p, "arm": a, "real_tokens_per_s": v}
           for p, a, v in (("ppo", "padded", 1.0), ("ppo", "packed", 2.0), ("grpo", "padded", 3.0))]
    old.append({"caps": [48, 16], "pass": "ppo", "arm": "padded", "real_tokens_per_s": 4.0, "date": "D0", "commit": "c0"})
    out.write_text(json.dumps({"date": "D1", "commit": "c1", "records": old}))
    kept = K.kept_records(SimpleNamespace(caps=["24,8"], passes="ppo", out=str(out)))
    # (24,8) ppo is remeasured; (24,8) grpo keeps the file's date and commit, a record with its own keeps them
    assert kept == [{"caps": [24, 8], "pass": "grpo", "arm": "padded", "real_tokens_per_s": 3.0, "date": "D1",
                     "commit": "c1"},
                    {"caps": [48, 16], "pass": "ppo", "arm": "padded", "real_tokens_per_s": 4.0, "date": "D0",
                     "commit": "c0"}]
    assert K.kept_records(SimpleNamespace(caps=["24,8"], passes="ppo", out=str(tmp_path / "none.json"))) == []
    args = SimpleNamespace(caps=["24,8"], passes="ppo", out=str(out), rows=8)
    new = [{"caps": [24, 8], "pass": "ppo", "arm": a, "median_s": 1.0, "real_tokens_per_s": v, "date": "D2"}
           for a, v in (("padded", 5.0), ("packed", 15.0))]
    K.write_record(args, "D2", kept + new, n_kept=len(kept))
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["date"] == "D0" and doc["speedup_packed_over_padded"] == {"ppo@24,8": 3.0}
