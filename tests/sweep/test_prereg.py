"""jaxppo.sweeps.prereg: the committed pre-registrations agree with their sweep files and their quoted power is
recomputed from the committed noise; the primary test by hand on a synthetic finished pair of sweeps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxppo.sweeps import prereg as P
from jaxppo.sweeps import results as R
from jaxppo.sweeps import stats

REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "results" / "preregistered").glob("*.yaml"))


def test_three_preregistrations_are_committed():
    assert {f.stem for f in FILES} >= {"reuse", "noisy_reward", "offpolicy"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_committed_preregistration_matches_its_sweeps_and_power(path, monkeypatch):
    monkeypatch.chdir(REPO)
    doc = P.load(path)
    pw = P.power(doc)
    # the paired sd, by hand from the committed results.csv of the noise sweep
    n = doc["noise"]
    rows = [r for r in R.read_csv(REPO / n["sweep"] / "results.csv") if r["status"] == "ok"]
    last = max(float(r["samples"]) for r in rows)
    fin = {(r["variant"], r["seed"]): float(r["reward"]) for r in rows if float(r["samples"]) == last}
    seeds = sorted({s for v, s in fin if v == n["variant"]} & {s for v, s in fin if v == n["baseline"]})
    d = np.asarray([fin[(n["variant"], s)] - fin[(n["baseline"], s)] for s in seeds])
    sd = float(d.std(ddof=1)) * (math.sqrt(2) if doc.get("contrast") else 1.0)
    assert pw["test_sd"] == pytest.approx(sd, rel=1e-12)
    assert pw["mde_80"] == pytest.approx(stats.min_detectable_effect(sd, int(doc["seeds"])), rel=1e-9)
    # the committed result file is the command's output for the committed sweeps
    committed = json.loads(path.with_suffix(".result.json").read_text(encoding="utf-8"))
    assert committed["power"] == pytest.approx(pw)
    assert committed["state"] == P.analyse(doc)["state"]


def _finished_sweep(root: Path, name: str, gains: list[float], base: list[float]) -> Path:
    """A sweep file and a results.csv whose final values are ``base`` (arm a) and ``base + gains`` (arm b)."""
    out = root / "out" / name
    f = root / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"base": str(REPO / "configs" / "smoke.yaml"), "seeds": list(range(len(gains))),
                                 "variants": {"a": [], "b": []}, "baseline": "a", "eval": {"every_samples": 32},
                                 "budget": {"samples": 256}, "output_dir": str(out)}), encoding="utf-8")
    rows = []
    for v, vals in (("a", base), ("b", [x + g for x, g in zip(base, gains)])):
        for s, y in enumerate(vals):
            rows += [{"variant": v, "seed": s, "samples": 0, "reward": 0.1, "status": "ok"},
                     {"variant": v, "seed": s, "samples": 256, "reward": y, "status": "ok"}]
    R.write_csv(out / "results.csv", rows, ("variant", "seed", "samples", "reward", "status"))
    return f


def test_contrast_by_hand(tmp_path):
    lo = _finished_sweep(tmp_path, "lo", [0.0, 0.01, -0.01, 0.02, 0.0], [0.5, 0.4, 0.6, 0.5, 0.55])
    hi = _finished_sweep(tmp_path, "hi", [0.04, 0.06, 0.05, 0.07, 0.05], [0.3, 0.5, 0.6, 0.4, 0.5])
    doc = {"name": "t", "hypothesis": "h", "sweeps": {"hi": str(hi), "lo": str(lo)}, "effects": [
        {"variant": "b", "baseline": "a"}], "contrast": ["hi", "lo"], "seeds": 5, "noise": {}}
    res = P.analyse(doc)
    # c_k = g_hi - g_lo = .04 .05 .06 .05 .05: mean .05, sd sqrt(.0002 / 4), t = .05 sqrt(5) / sd = 15.81 (4 df)
    from scipy.stats import t as student

    (t,) = res["primary"]
    assert res["state"] == "finished" and t["mean"] == pytest.approx(0.05) and t["n"] == 5
    tt = 0.05 * math.sqrt(5) / math.sqrt(0.0002 / 4)
    assert t["p"] == pytest.approx(2 * student.sf(tt, 4), rel=1e-6) and t["verdict"] == "higher"
    doc["contrast"] = ["lo", "hi"]
    assert P.analyse(doc)["primary"][0]["verdict"] == "lower"


def test_several_effects_are_holm_adjusted_and_pending_until_finished(tmp_path):
    one = _finished_sweep(tmp_path, "one", [0.03, 0.01, 0.05, 0.02, 0.04], [0.5] * 5)
    doc = {"name": "t", "hypothesis": "h", "sweeps": {"x": str(one)}, "seeds": 5, "noise": {},
           "effects": [{"variant": "b", "baseline": "a"}, {"variant": "b", "baseline": "a"}]}
    res = P.analyse(doc)
    d = [0.03, 0.01, 0.05, 0.02, 0.04]
    p = stats.paired_t_pvalue(d)
    assert [t["p"] for t in res["primary"]] == pytest.approx([p, p])
    assert [t["p_holm"] for t in res["primary"]] == pytest.approx(stats.holm([p, p]))
    doc["seeds"] = 6    # a sixth seed is not finished
    assert P.analyse(doc) == {"state": "pending", "finished_runs": {"x": {"a": 5, "b": 5}}}


def test_a_disagreeing_sweep_file_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load((REPO / "results" / "preregistered" / "reuse.yaml").read_text(encoding="utf-8"))
    doc["seeds"] = 7
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert P.main([str(bad)]) == 2
    assert "runs seeds" in capsys.readouterr().err


def test_waste_secondary_by_hand(tmp_path):
    """Two seeds, one level: per seed the run's mean zero-grad share and low-gradient share, paired variant - base."""
    f = _finished_sweep(tmp_path, "w", [0.0, 0.0], [0.5, 0.5])
    out = tmp_path / "out" / "w"
    z = {("a", 0): (0.1, 0.3), ("a", 1): (0.2, 0.2), ("b", 0): (0.3, 0.5), ("b", 1): (0.6, 0.4)}
    for (arm, k), (z1, z2) in z.items():
        run = out / "runs" / arm / f"seed{k}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text("{}")
        rows = [{"step": 1, "waste/zero_grad_token_frac": z1, "actor/grad_norm": 1.0},
                {"step": 2, "waste/zero_grad_token_frac": z2, "actor/grad_norm": 0.05 if arm == "b" else 1.0}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tests = P.waste_analysis({"sweeps": {"x": str(f)}, "variant": "b", "baseline": "a"}, [0, 1])
    zero, low = tests
    # zero-grad means: a .2 .2, b .4 .5 -> differences .2 .3; low-gradient: a 0 0, b 1 1 -> differences 1 1
    assert zero["metric"] == "zero_grad_token_frac" and zero["mean"] == pytest.approx(0.25)
    assert zero["baseline_mean"] == pytest.approx(0.2) and low["baseline_mean"] == 0.0   # the baseline arm a
    assert low["mean"] == pytest.approx(1.0) and low["p"] == 0.0
    assert [t["p_holm"] for t in tests] == pytest.approx(stats.holm([zero["p"], low["p"]]))
    assert P.waste_analysis({"sweeps": {"x": str(f)}, "variant": "b", "baseline": "a"}, [0, 1, 2]) == "pending"
