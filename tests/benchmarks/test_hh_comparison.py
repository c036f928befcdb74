"""benchmarks/hh_comparison.py: the HH table is generated from the committed records, and a hand-made record
renders as stated."""

from __future__ import annotations

from pathlib import Path

from benchmarks.hh_comparison import METHODS, TABLE_BEGIN, TABLE_END, read_records, rewrite, table, train_wall

REPO = Path(__file__).resolve().parents[2]


def _record(method: str, gain: float) -> dict:
    label, config, _, data = METHODS[method]
    return {"method": method, "label": label, "config": config, "data": data, "train_wall_s": 90.0,
            "summary": {"train/samples_consumed": 4800 if method == "dpo" else 9600},
            "eval": {"eval/reward_reference": -0.1, "eval/reward_policy": -0.1 + gain, "eval/reward_gain": gain,
                     "eval/reward_gain_ci95": [gain - 0.1, gain + 0.1], "eval/kl": 0.25,
                     "eval/pair_accuracy": 0.6, "eval/pair_accuracy_ci95": [0.55, 0.65]}}


def test_rows_follow_the_method_order_and_count_answers():
    rows = table([_record("offline_ppo", 0.3), _record("dpo", 0.125)]).splitlines()[2:]
    assert rows[0].startswith("| DPO") and rows[1].startswith("| offline PPO")
    # DPO consumes 4,800 pairs = 9,600 answers; offline PPO 9,600 answers
    assert "| 9,600 |" in rows[0] and "| 9,600 |" in rows[1]
    assert "| -0.100 → +0.025 | +0.125 [+0.025, +0.225] | 0.25 | 0.600 [0.550, 0.650] | 1.5 min |" in rows[0]


def test_a_resumed_training_has_no_wall_time():
    rec = {**_record("kto", 0.2), "train_wall_s": None, "resumed_from": 150}
    [row] = table([rec]).splitlines()[2:]
    assert row.startswith("| KTO") and row.endswith("| not measured (resumed at step 150) |")
    assert train_wall(90.0, {"resumed_from": 150}) is None
    assert train_wall(90.0, {"resumed_from": 0}) == train_wall(90.0, {}) == 90.0


def test_the_committed_table_is_generated_from_the_records():
    doc = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    assert TABLE_BEGIN in doc and TABLE_END in doc
    assert rewrite(doc, table(read_records(REPO / "results" / "hh"))) == doc
