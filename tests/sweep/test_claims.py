"""jaxppo.sweeps.claims: docs/results.md's claims table is what the command generates from the committed records,
and each kind of cell by hand."""

from __future__ import annotations

import json

from pathlib import Path

from jaxppo.sweeps import claims as C
from jaxppo.sweeps import report as RP
from jaxppo.sweeps import results as R

REPO = Path(__file__).resolve().parents[2]
NAN = float("nan")


def test_committed_claims_table_is_the_generated_one(monkeypatch):
    monkeypatch.chdir(REPO)
    rows = C.render("results/claims.yaml")
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    assert f"{C.BEGIN}\n" + "\n".join(rows) + f"\n{C.END}" in text
    assert RP.replace_between_markers(text, "\n".join(rows) + "\n", where="x", markers=(C.BEGIN, C.END)) == text


def _summary(root: Path, rows: list[dict]) -> None:
    R.write_csv(root / "s" / "summary.csv", [{k: NAN for k in R.SUMMARY_COLUMNS} | r for r in rows],
                R.SUMMARY_COLUMNS)


def test_sweep_cell_primary_and_secondary_by_hand(tmp_path):
    _summary(tmp_path, [
        {"variant": "b", "n_pairs": 0, "primary": "final"},
        {"variant": "v", "n_pairs": 10, "primary": "final", "verdict": "higher", "final_diff": 0.05,
         "final_diff_lo": 0.01, "final_diff_hi": 0.09, "final_diff_sd": 0.04, "final_p_holm": 0.02,
         "auc_diff": 0.03, "auc_diff_lo": 0.0, "auc_diff_hi": 0.06, "auc_p_holm": 0.2, "earlier": 6, "later": 1,
         "ties": 3, "first_passage_p_holm": 0.04}])
    exp, cell = C.sweep_cell(tmp_path, {"sweep": "s", "variant": "v", "test": "final"})
    from jaxppo.sweeps.stats import min_detectable_effect

    power = min_detectable_effect(0.04, 10)
    assert exp == "`s`: v vs b, final value"
    assert cell == f"higher: 0.050 [0.010, 0.090], Holm p 0.020 (10 seeds; final {power:.3f})"
    _, cell = C.sweep_cell(tmp_path, {"sweep": "s", "variant": "v", "test": "auc"})
    assert cell.startswith("secondary: no difference measured: 0.030 [0.000, 0.060], Holm p 0.200")
    _, cell = C.sweep_cell(tmp_path, {"sweep": "s", "variant": "v", "test": "first_passage"})
    assert cell.startswith("secondary: earlier: earlier in 6, later in 1, same in 3, Holm p 0.040")
    assert C.sweep_cell(tmp_path, {"sweep": "nope", "variant": "v"})[1] == "not run"


def test_prereg_and_benchmark_cells_by_hand(tmp_path):
    (tmp_path / "pre").mkdir()
    (tmp_path / "pre" / "x.result.json").write_text(json.dumps({
        "state": "pending", "power": {"mde_80": 0.03, "seeds": 4},
        "finished_runs": {"a": {"u": 4, "v": 1}, "b": {"u": 0, "v": 0}}}))
    assert C.prereg_cell(tmp_path / "pre", "x")[1] == "pending: 5 of 16 runs finished (4 seeds; 0.030)"
    (tmp_path / "pre" / "y.result.json").write_text(json.dumps({
        "state": "finished", "power": {"mde_80": 0.03, "seeds": 4},
        "primary": [{"effect": "v - u", "verdict": "lower", "mean": -0.05, "lo": -0.08, "hi": -0.02, "p_holm": 0.01}]}))
    assert C.prereg_cell(tmp_path / "pre", "y")[1] == "v - u: lower, -0.050 [-0.080, -0.020], Holm p 0.010 (4 seeds; 0.030)"
    (tmp_path / "tt.json").write_text(json.dumps({"machine": {"loadavg": [0.5, 0.4, 0.3]},
                                                  "train_ratio": {"ratio": 0.9, "lo": 0.85, "hi": 0.95, "pairs": 6}}))
    assert C.benchmark_cell(tmp_path, "tt")[1] == ("faster: time ratio 0.900 [0.850, 0.950] over 6 ABBA pairs "
                                                  "(load 0.50)")
    assert C.benchmark_cell(tmp_path, "none")[1] == "not run"


def test_waste_cell_by_hand(tmp_path):
    """Holm p < 0.05 gives lower/higher by the sign; the baseline's share and the relative change follow the
    interval; a pending secondary or a missing file says so."""
    (tmp_path / "w.result.json").write_text(json.dumps({"state": "finished", "secondary_waste": [
        {"level": "sd_0", "metric": "zero_grad_token_frac", "mean": -0.02, "lo": -0.03, "hi": -0.01, "p_holm": 0.01,
         "n": 5, "baseline_mean": 0.2},
        {"level": "sd_0", "metric": "low_grad_update_frac", "mean": 0.1, "lo": -0.1, "hi": 0.3, "p_holm": 0.5, "n": 5,
         "baseline_mean": 0.0}]}))
    assert C.waste_cell(tmp_path, "w") == (
        "pre-registered `w`, wasted iterations (secondary)",
        "zero-gradient token share: sd_0 lower, -0.020 [-0.030, -0.010] of 0.200 (-10.0%), Holm p 0.010; "
        "low-gradient update share: sd_0 no difference measured, 0.100 [-0.100, 0.300], Holm p 0.500 "
        "(5 seeds, Holm over 2 tests)")
    (tmp_path / "p.result.json").write_text(json.dumps({"state": "finished", "secondary_waste": "pending"}))
    assert C.waste_cell(tmp_path, "p")[1] == "pending"
    assert C.waste_cell(tmp_path, "none")[1] == "not run"
