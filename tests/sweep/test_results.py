"""Sweep maths against hand-computed cases and independent NumPy references: t-intervals, AUC, first
crossing, efficiency bootstrap, reading run folders, the per-variant summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.sweeps import results as R

# Student t 0.975 quantiles from a printed table
T_TABLE = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 29: 2.0452}


@pytest.mark.parametrize("df, q", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df, q):
    assert R.t_quantile_975(df) == pytest.approx(q, abs=1e-4)


def test_t_interval_hand_case():
    # [1..5]: mean 3, s = sqrt(2.5) = 1.58114, half = 2.776445 * 1.58114 / sqrt(5) = 1.963243
    m, lo, hi = R.t_interval([1, 2, 3, 4, 5])
    assert m == 3.0 and lo == pytest.approx(3 - 1.963243, abs=1e-5) and hi == pytest.approx(3 + 1.963243, abs=1e-5)
    m, lo, hi = R.t_interval([0.7])
    assert m == 0.7 and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError, match="non-empty"):
        R.t_interval([])


@given(st.lists(st.floats(-10, 10), min_size=2, max_size=6))
def test_t_interval_matches_numpy(xs):
    x = np.asarray(xs)
    # the quantile itself is checked against the table above; here the s / sqrt(n) part
    half = R.t_quantile_975(x.size - 1) * np.sqrt(np.sum((x - x.mean()) ** 2) / (x.size - 1)) / np.sqrt(x.size)
    m, lo, hi = R.t_interval(xs)
    assert m == pytest.approx(x.mean(), abs=1e-9)
    assert lo == pytest.approx(x.mean() - half, rel=1e-9, abs=1e-9)
    assert hi == pytest.approx(x.mean() + half, rel=1e-9, abs=1e-9)


def test_auc_hand_case_and_errors():
    # trapezoids over [0, 32, 64]: 32*(0+1)/2 + 32*(1+3)/2 = 16 + 64 = 80; / 64 = 1.25
    assert R.normalized_auc([0, 32, 64], [0.0, 1.0, 3.0], 64) == pytest.approx(1.25)
    assert R.normalized_auc([0, 10], [2.0, 2.0], 10) == pytest.approx(2.0)  # constant curve: its value
    with pytest.raises(ValueError, match="strictly increasing"):
        R.normalized_auc([0, 0, 1], [1, 2, 3], 1)
    with pytest.raises(ValueError, match="same length"):
        R.normalized_auc([0, 1], [1, 2, 3], 1)


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12), st.integers(1, 50))
def test_auc_matches_numpy_trapezoid(ys, step):
    x = np.arange(len(ys)) * step
    budget = float(x[-1])
    assert R.normalized_auc(x, ys, budget) == pytest.approx(np.trapezoid(ys, x) / budget, rel=1e-9, abs=1e-12)


def test_first_crossing_hand_cases():
    x = [0, 32, 64, 96]
    assert R.first_crossing(x, [0.1, 0.3, 0.5, 0.4], 0.4) == pytest.approx(48.0)  # halfway from 0.3 to 0.5
    assert R.first_crossing(x, [0.1, 0.3, 0.5, 0.4], 0.5) == pytest.approx(64.0)  # exactly at a point
    assert R.first_crossing(x, [0.6, 0.3, 0.5, 0.4], 0.5) == 0.0  # already there at 0
    assert R.first_crossing(x, [0.1, 0.45, 0.2, 0.7], 0.4) == pytest.approx(32 * 0.3 / 0.35)  # first crossing
    assert math.isnan(R.first_crossing(x, [0.1, 0.3, 0.5, 0.4], 0.51))
    assert math.isnan(R.first_crossing(x, [0.1, 0.3, 0.5, 0.4], math.nan))


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=10), st.floats(-1, 1))
def test_first_crossing_properties(ys, target):
    x = np.arange(len(ys), dtype=float) * 16
    y = np.asarray(ys)
    s = R.first_crossing(x, y, target)
    if not np.any(y >= target):
        assert math.isnan(s)
        return
    i = int(np.argmax(y >= target))
    assert np.all(y[:i] < target)
    if i == 0:
        assert s == 0.0
    else:
        assert x[i - 1] <= s <= x[i] + 1e-9
        assert np.interp(s, x[i - 1:i + 1], y[i - 1:i + 1]) == pytest.approx(target, abs=1e-6)


def test_efficiency_ratio():
    assert R.efficiency_ratio(128, 64) == 2.0
    assert R.efficiency_ratio(128, math.nan) == 0.0
    assert R.efficiency_ratio(128, 0.0) == math.inf


def _bootstrap_reference(x, base_final, curves, budget, resamples, seed, same=False):
    """Independent re-implementation: the same draws, crossing via np.interp on the bracketing segment."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(resamples):
        b = rng.integers(0, len(base_final), len(base_final))
        v = b if same else rng.integers(0, len(curves), len(curves))
        target = np.mean(np.asarray(base_final)[b])
        y = np.asarray(curves)[v].mean(0)
        idx = np.nonzero(y >= target)[0]
        if idx.size == 0:
            out.append(0.0)
            continue
        i = idx[0]
        s = x[0] if i == 0 else np.interp(target, [y[i - 1], y[i]], [x[i - 1], x[i]])
        out.append(np.inf if s == 0 else budget / s)
    out = np.sort(out)
    n = len(out)
    # 'lower' / 'higher' order statistics of numpy.percentile
    return out[int(np.floor(0.025 * (n - 1)))], out[int(np.ceil(0.975 * (n - 1)))]


def test_bootstrap_is_deterministic_and_matches_a_reference():
    x = np.array([0.0, 32, 64, 96, 128])
    base_final = [0.40, 0.50, 0.45]
    curves = np.array([[0.1, 0.30, 0.42, 0.55, 0.60],
                       [0.1, 0.25, 0.50, 0.52, 0.58],
                       [0.1, 0.35, 0.40, 0.47, 0.62],
                       [0.1, 0.20, 0.30, 0.44, 0.50]])
    a = R.bootstrap_efficiency_ci(x, base_final, curves, 128, resamples=500, seed=3)
    assert a == R.bootstrap_efficiency_ci(x, base_final, curves, 128, resamples=500, seed=3)
    assert a != R.bootstrap_efficiency_ci(x, base_final, curves, 128, resamples=500, seed=4)
    assert a == pytest.approx(_bootstrap_reference(x, base_final, curves, 128, 500, 3), rel=1e-9)
    lo, hi = a
    point = R.efficiency_ratio(128, R.first_crossing(x, curves.mean(0), np.mean(base_final)))
    assert 0 < lo <= point <= hi


def _fake_run(d: Path, before: float, evals: dict[int, tuple[float, float]], steps: int, *,
              resp_len: float | None = 10.0, step_time: float = 0.5) -> None:
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"eval/reward_before": before}))
    with open(d / "metrics.jsonl", "w") as fh:
        for s in range(1, steps + 1):
            row = {"step": s, "perf/step_time_s": step_time, "actor/pg_loss": "nan"}
            if resp_len is not None:
                row["response_length/mean"] = resp_len + s
            if s in evals:
                row["eval/reward_mean"], row["eval/kl"] = evals[s]
            fh.write(json.dumps(row) + "\n")


def test_read_run_hand_case(tmp_path):
    _fake_run(tmp_path / "a", 0.2, {2: (0.3, 0.01), 4: (0.5, 0.03)}, 4)
    c = R.read_run(tmp_path / "a", "v", 7, batch_size=8, tokens_per_sample=40)
    assert (c.status, c.steps, c.samples, c.reward, c.kl) == ("ok", [0, 2, 4], [0, 16, 32], [0.2, 0.3, 0.5],
                                                             [0.0, 0.01, 0.03])
    assert c.tokens == [0.0, 8 * (11 + 12), 8 * (11 + 12 + 13 + 14)]  # response tokens consumed
    assert c.wall == [0.0, 1.0, 2.0]
    # the trainer also logs the reference's evaluation at step 0 (= eval/reward_before): not a second point
    text = (tmp_path / "a" / "metrics.jsonl").read_text()
    (tmp_path / "a" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.2, "eval/kl": 0.0})
                                                  + "\n" + text)
    c0 = R.read_run(tmp_path / "a", "v", 7, batch_size=8, tokens_per_sample=40)
    assert (c0.steps, c0.reward, c0.tokens, c0.wall) == (c.steps, c.reward, c.tokens, c.wall)
    _fake_run(tmp_path / "b", 0.2, {2: (0.3, 0.01)}, 2, resp_len=None)
    assert R.read_run(tmp_path / "b", "v", 0, 8, 40).tokens == [0.0, 16 * 40]  # padded fallback
    miss = R.read_run(tmp_path / "c", "v", 0, 8, 40)
    assert (miss.status, miss.error) == ("missing", "not run yet")
    failed = R.read_run(tmp_path / "c", "v", 0, 8, 40, {"error": "exit status 3", "stderr_tail": "x\nValueError: bad\n"})
    assert (failed.status, failed.error) == ("failed", "exit status 3: ValueError: bad")


def test_summary_hand_case(tmp_path):
    # budget 64, evaluations every 32 samples (batch 16: steps 2 and 4)
    base = [(0.0, {2: (0.2, 0.1), 4: (0.4, 0.2)}), (0.0, {2: (0.4, 0.1), 4: (0.6, 0.2)})]   # finals 0.4, 0.6
    fast = [(0.0, {2: (0.6, 0.3), 4: (0.7, 0.5)}), (0.0, {2: (0.4, 0.3), 4: (0.9, 0.7)})]   # mean curve 0,.5,.8
    curves = []
    for name, runs in (("uniform", base), ("fast", fast)):
        for k, (before, ev) in enumerate(runs):
            _fake_run(tmp_path / name / str(k), before, ev, 4)
            curves.append(R.read_run(tmp_path / name / str(k), name, k, 16, 32))
    curves.append(R.RunCurve("fast", 9, "failed", "boom"))
    rows = {r["variant"]: r for r in R.summarize(curves, ["uniform", "fast"], "uniform", 64, resamples=300, seed=0)}
    u, f = rows["uniform"], rows["fast"]
    assert u["target_reward"] == pytest.approx(0.5) and f["target_reward"] == pytest.approx(0.5)
    # uniform mean curve 0, .3, .5 reaches .5 at the budget: ratio 1
    assert u["samples_to_target"] == pytest.approx(64) and u["efficiency_ratio"] == pytest.approx(1.0)
    # fast mean curve 0, .5, .8 reaches .5 at 32 samples: ratio 2
    assert f["samples_to_target"] == pytest.approx(32) and f["efficiency_ratio"] == pytest.approx(2.0)
    # per seed: fast seed 0 crosses .5 at 32*.5/.6 = 26.667, seed 1 at 32 + 32*.1/.5 = 38.4
    assert f["seeds_reaching_target"] == 2
    assert f["samples_to_target_seed_mean"] == pytest.approx((32 * 0.5 / 0.6 + 38.4) / 2)
    assert u["seeds_reaching_target"] == 1  # seed 0 ends at 0.4
    assert (f["n_seeds"], f["n_failed"], u["n_failed"]) == (2, 1, 0)
    # final reward .8 +- t(1) * s / sqrt(2), s = sqrt(.02)
    half = 12.7062 * math.sqrt(0.02) / math.sqrt(2)
    assert f["final_reward_mean"] == pytest.approx(0.8)
    assert f["final_reward_ci95_lo"] == pytest.approx(0.8 - half, abs=1e-4)
    assert f["final_kl_mean"] == pytest.approx(0.6)
    # AUC of fast seed 0: (32*(0+.6)/2 + 32*(.6+.7)/2) / 64 = .475; seed 1: (32*.4/2 + 32*1.3/2) / 64 = .425
    assert f["auc_mean"] == pytest.approx(0.45)
    assert f["efficiency_ratio_ci95_lo"] <= 2.0 <= f["efficiency_ratio_ci95_hi"]


def test_summary_with_a_variant_without_finished_runs(tmp_path):
    _fake_run(tmp_path / "u", 0.0, {2: (0.2, 0.1), 4: (0.4, 0.2)}, 4)
    curves = [R.read_run(tmp_path / "u", "uniform", 0, 16, 32), R.RunCurve("per", 0, "failed", "boom")]
    rows = R.summarize(curves, ["uniform", "per"], "uniform", 64, resamples=10)
    assert rows[1]["n_seeds"] == 0 and rows[1]["n_failed"] == 1 and math.isnan(rows[1]["final_reward_mean"])
    assert rows[0]["n_seeds"] == 1 and math.isnan(rows[0]["final_reward_ci95_lo"])


def test_summary_rejects_curves_that_do_not_end_at_the_budget(tmp_path):
    _fake_run(tmp_path / "u", 0.0, {2: (0.2, 0.1)}, 4)
    curves = [R.read_run(tmp_path / "u", "uniform", 0, 16, 32)]
    with pytest.raises(ValueError, match="last evaluation is at 32 samples, not the budget 64"):
        R.summarize(curves, ["uniform"], "uniform", 64)


def test_csv_round_trip(tmp_path):
    rows = [{"variant": "a", "seed": 0, "reward": 0.1 + 0.2, "kl": math.nan}]
    R.write_csv(tmp_path / "r.csv", rows, ("variant", "seed", "reward", "kl"))
    back = R.read_csv(tmp_path / "r.csv")
    assert back == [{"variant": "a", "seed": "0", "reward": repr(0.1 + 0.2), "kl": "nan"}]
