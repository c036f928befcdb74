"""jaxppo.sweeps.calibrate: the report's statistics hold their nominal rates on synthetic A/A sweeps, and the
withdrawn data-efficiency interval does not (the calibration is the statistics' own test)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxppo.sweeps import calibrate as C


def test_report_statistics_are_within_their_binomial_bounds():
    doc = C.run(C.default_model(), seeds=[5, 10], n=150, seed=1, legacy_resamples=0)
    for d in doc["designs"]:
        for k, r in d["rates"].items():
            assert r["ok"], (d["n_seeds"], k, r)
    assert doc["all_ok"]
    five = doc["designs"][0]
    # with 5 seeds the exact sign-flip test cannot reject at 5% (smallest p 2/32)
    assert five["rates"]["final_diff_signflip"]["events"] == 0 and five["power"]["min_signflip_p"] == 2 / 32
    assert five["power"]["smallest_delta_80pct"]["final_diff_signflip"] is None


def test_the_old_efficiency_interval_fails_its_bound():
    """The earlier default design (grid 0/128/256/384, 5 seeds, sd 0.065): the old efficiency interval excludes 1 in
    far more than 5% of A/A sweeps."""
    doc = C.run(C.default_model(budget=384, points=3), seeds=[5], n=200, seed=0, legacy_resamples=200)
    legacy = doc["designs"][0]["legacy"]["legacy_efficiency_interval"]
    assert not legacy["ok"] and legacy["rate"] > 0.08 and not doc["legacy_ok"]
    assert doc["designs"][0]["legacy"]["legacy_ratio_ge_2"]["rate"] > 0.15
    assert doc["all_ok"]          # ... while the report's own statistics pass on the same sweeps


def test_simulated_power_matches_the_analytic_t_power():
    model = C.default_model()
    d = C.calibrate_design(model, 10, 300, np.random.default_rng(3), legacy_resamples=0)
    sim = d["power"]["smallest_delta_80pct"]["final_diff_t"]
    assert sim == pytest.approx(d["power"]["analytic_final_diff_t"], abs=model.sd[-1] / 4 + 1e-9)


def test_the_model_keeps_step_zero_shared_and_the_seed_sd():
    m = C.default_model(sd=0.1, rho_s=0.3)
    v, b = C.simulate(m, 4, 3000, np.random.default_rng(0))
    assert np.array_equal(v[:, :, 0], b[:, :, 0])                      # the reference evaluation is shared
    assert np.std(v[:, :, -1]) == pytest.approx(0.1, rel=0.05)
    assert np.corrcoef(v[:, :, -1].ravel(), b[:, :, -1].ravel())[0, 1] == pytest.approx(0.3, abs=0.05)


def test_cli_writes_json_and_reads_a_sweep(tmp_path):
    from jaxppo.sweeps.results import write_csv

    rng = np.random.default_rng(0)
    rows, summ = [], []
    for v in ("a", "b"):
        for s in range(4):
            for j, x in enumerate((0, 10, 20, 30)):
                rows.append({"variant": v, "seed": s, "samples": x, "reward": 0.1 * j + 0.05 * rng.normal(),
                             "status": "ok"})
        summ.append({"variant": v, "n_pairs": 0 if v == "a" else 4})
    write_csv(tmp_path / "results.csv", rows, ("variant", "seed", "samples", "reward", "status"))
    write_csv(tmp_path / "summary.csv", summ, ("variant", "n_pairs"))
    model = C.model_from_sweep(tmp_path)
    assert model.x == (0, 10, 20, 30) and "baseline a" in model.source and len(model.sd) == 4
    out = tmp_path / "cal.json"
    rc = C.main(["--from", str(tmp_path), "--n", "20", "--seeds", "4", "--legacy-resamples", "0", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert rc in (0, 1) and doc["n"] == 20 and doc["designs"][0]["n_seeds"] == 4
    assert not math.isnan(doc["designs"][0]["power"]["paired_sd_final"])
    assert C.main(["--from", str(tmp_path / "nope")]) == 2


def test_within_nominal_rule_by_hand():
    # 100 of 2000 (exactly 5%): the exact 99% interval's lower end is below 5%, the point at nominal -> ok
    r = C.within_nominal(100, 2000, 0.05)
    assert r["ok"] and r["max_rate"] == pytest.approx(0.05 + 2.576 * math.sqrt(0.05 * 0.95 / 2000))
    # 140 of 2000 (7%): the point is above 5% + 2.576 x 0.00487 = 6.25% and the interval's lower end above 5%
    r = C.within_nominal(140, 2000, 0.05)
    assert not r["ok"] and r["interval"][0] > 0.05
    # 0 of 2000: conservative, within nominal
    r = C.within_nominal(0, 2000, 0.05)
    assert r["ok"] and r["conservative"]
    # 8% of 500 (the old rule's largest accepted rate) is no longer within nominal
    assert not C.within_nominal(40, 500, 0.05)["ok"]


def test_family_wise_rates_with_three_variants():
    """Three variants against one baseline, A/A: reading every test uncorrected claims a difference in far more than
    5% of sweeps; the Holm-adjusted primary and secondary families stay within nominal."""
    d = C.calibrate_design(C.default_model(), 6, 300, np.random.default_rng(5), legacy_resamples=0, power_grid=0,
                           variants=3)
    assert d["uncorrected_any"]["rate"] > 0.2
    assert d["family"]["fwer_primary"]["ok"] and d["family"]["fwer_secondary"]["ok"]
    assert d["family"]["fwer_primary"]["rate"] <= 0.08 and d["family"]["fwer_secondary"]["rate"] <= 0.08


def test_heavy_tailed_noise_keeps_unit_variance_and_heavier_tails():
    m = C.default_model(sd=0.1)
    arms = C.simulate_arms(m, 8, 4000, np.random.default_rng(1), 2, "t4")
    last = arms[:, :, :, -1].ravel()
    assert np.std(last) == pytest.approx(0.1, rel=0.05)
    z = (last - m.mu[-1]) / 0.1
    assert np.mean(z ** 4) > 3.5          # excess kurtosis: a normal sample gives ~3
    with pytest.raises(ValueError, match="tails"):
        C.simulate_arms(m, 2, 2, np.random.default_rng(0), 2, "cauchy")
