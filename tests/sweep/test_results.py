"""jaxppo.sweeps.results: reading run folders (cumulative counters, NaN evaluations, DPO), the per-variant summary
with its seed-paired comparisons (hand-computed), and the CSV round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.sweeps import results as R
from jaxppo.sweeps import stats


def _fake_run(d: Path, before: float | None, evals: dict[int, tuple[float, float]], steps: int, *,
              resp_len: float | None = 10.0, step_time: float = 0.5, log_every: int = 1, batch: int = 8,
              cumulative: bool = False, metric: str = "eval/reward_mean", clock: bool = False) -> None:
    """A run folder as the trainer writes it: rows every ``log_every`` steps, at evaluations and at the end."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({} if before is None else {"eval/reward_before": before}))
    tok = 0.0
    with open(d / "metrics.jsonl", "w") as fh:
        for s in range(1, steps + 1):
            tok += batch * (resp_len + s) if resp_len is not None else 0.0
            if not (s % log_every == 0 or s in evals or s == steps):
                continue
            row = {"step": s, "perf/step_time_s": step_time, "actor/pg_loss": "nan"}
            if resp_len is not None:
                row["response_length/mean"] = resp_len + s
            if cumulative:
                row["train/tokens_consumed"] = tok
            if clock:   # the harness's cumulative update-step time: here steps take 0.1 s x step number
                row["perf/train_time_s"] = 0.1 * s * (s + 1) / 2
            if s in evals:
                row[metric] = evals[s][0] if math.isfinite(evals[s][0]) else "nan"
                row["eval/kl"] = evals[s][1]
            fh.write(json.dumps(row) + "\n")


def test_read_run_hand_case(tmp_path):
    _fake_run(tmp_path / "a", 0.2, {2: (0.3, 0.01), 4: (0.5, 0.03)}, 4)
    c = R.read_run(tmp_path / "a", "v", 7, batch_size=8, tokens_per_sample=40)
    assert (c.status, c.steps, c.samples, c.reward, c.kl) == ("ok", [0, 2, 4], [0, 16, 32], [0.2, 0.3, 0.5],
                                                             [0.0, 0.01, 0.03])
    assert c.tokens == [0.0, 8 * (11 + 12), 8 * (11 + 12 + 13 + 14)]  # response tokens consumed
    assert c.wall == [0.0, 1.0, 2.0] and c.estimated == ""
    # the trainer also logs the reference's evaluation at step 0 (= eval/reward_before): not a second point
    text = (tmp_path / "a" / "metrics.jsonl").read_text()
    (tmp_path / "a" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.2, "eval/kl": 0.0})
                                                  + "\n" + text)
    c0 = R.read_run(tmp_path / "a", "v", 7, batch_size=8, tokens_per_sample=40)
    assert (c0.steps, c0.reward, c0.tokens, c0.wall) == (c.steps, c.reward, c.tokens, c.wall)
    _fake_run(tmp_path / "b", 0.2, {2: (0.3, 0.01)}, 2, resp_len=None)
    b = R.read_run(tmp_path / "b", "v", 0, 8, 40)
    assert b.tokens == [0.0, 16 * 40] and b.estimated == "tokens"  # padded fallback, marked
    miss = R.read_run(tmp_path / "c", "v", 0, 8, 40)
    assert (miss.status, miss.error) == ("missing", "not run yet")
    failed = R.read_run(tmp_path / "c", "v", 0, 8, 40,
                        {"error": "exit status 3", "stderr_tail": "x\nValueError: bad\n"})
    assert (failed.status, failed.error) == ("failed", "exit status 3: ValueError: bad")


def test_tokens_and_wall_with_log_every(tmp_path):
    """trainer.log_every=4: tokens come from the trainer's cumulative counter, wall time counts the unlogged steps
    (each logged step's time stands for the steps since the previous row). The earlier code summed the logged
    rows only: 4x too few tokens and too little time."""
    _fake_run(tmp_path / "a", 0.1, {8: (0.4, 0.02)}, 8, log_every=4, cumulative=True, step_time=0.5)
    c = R.read_run(tmp_path / "a", "v", 0, batch_size=8, tokens_per_sample=40)
    assert c.steps == [0, 8]
    assert c.tokens[-1] == pytest.approx(8 * sum(10 + s for s in range(1, 9)))
    assert c.wall[-1] == pytest.approx(8 * 0.5) and c.estimated == "wall"
    # without the cumulative counter (older logs, DPO): the padded estimate, never the sum of logged rows
    _fake_run(tmp_path / "b", 0.1, {8: (0.4, 0.02)}, 8, log_every=4, cumulative=False)
    b = R.read_run(tmp_path / "b", "v", 0, batch_size=8, tokens_per_sample=40)
    assert b.tokens[-1] == 8 * 8 * 40 and b.estimated == "tokens,wall"


def test_wall_time_is_the_cumulative_clock_when_logged(tmp_path):
    """With ``perf/train_time_s`` on the rows (the harness logs it), wall time is that clock, exact under
    log_every > 1: 0.1 + 0.2 + ... + 0.8 = 3.6 s at step 8, not 8 x the logged step's own time."""
    _fake_run(tmp_path / "a", 0.1, {4: (0.3, 0.0), 8: (0.4, 0.02)}, 8, log_every=4, cumulative=True,
              step_time=0.5, clock=True)
    c = R.read_run(tmp_path / "a", "v", 0, batch_size=8, tokens_per_sample=40)
    assert c.wall == pytest.approx([0.0, 1.0, 3.6]) and c.estimated == ""


def test_dpo_step_zero_row_starts_the_curve(tmp_path):
    """A DPO run that evaluated the reference at step 0 (accuracy 0: every implicit reward is 0) starts its curve
    there, like PPO's eval/reward_before."""
    _fake_run(tmp_path / "a", None, {4: (0.55, 0.0), 8: (0.6, 0.0)}, 8, metric="eval/rewards/accuracies")
    text = (tmp_path / "a" / "metrics.jsonl").read_text()
    (tmp_path / "a" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/rewards/accuracies": 0.0}) + "\n"
                                                  + text)
    c = R.read_run(tmp_path / "a", "v", 0, 8, 40, command="dpo")
    assert (c.steps, c.samples, c.reward) == ([0, 4, 8], [0, 32, 64], [0.0, 0.55, 0.6])


def test_a_nan_evaluation_is_missing_and_named_not_never_reached(tmp_path):
    curves = []
    for k, mid in enumerate((0.3, math.nan, 0.35)):
        _fake_run(tmp_path / "b" / str(k), 0.0, {2: (0.2, 0.0), 4: (mid, 0.0), 6: (0.5 + k / 100, 0.0)}, 6)
        _fake_run(tmp_path / "v" / str(k), 0.0, {2: (0.3, 0.0), 4: (0.5, 0.0), 6: (0.6 + k / 50, 0.0)}, 6)
        curves += [R.read_run(tmp_path / "b" / str(k), "base", k, 8, 40),
                   R.read_run(tmp_path / "v" / str(k), "var", k, 8, 40)]
    assert math.isnan(curves[2].reward[2]) and curves[2].missing_steps == [4]
    rows = {r["variant"]: r for r in R.summarize(curves, ["base", "var"], "base", 48)}
    assert rows["base"]["missing_evals"] == "seed1@step4" and rows["var"]["missing_evals"] == ""
    v = rows["var"]
    # final values are all present: 3 pairs; differences .1, .11, .12
    assert v["final_diff"] == pytest.approx(0.11) and v["n_pairs"] == 3
    assert v["final_diff_p"] == pytest.approx(2 / 8)   # all positive: the smallest 3-seed p
    # AUC needs the whole curve: seed 1 leaves it (2 pairs), and the first passage marks it not measured
    assert not math.isnan(v["auc_diff"])
    assert v["earlier"] + v["later"] + v["ties"] == 2
    assert "missing evaluations: seed1@step4" not in R.verdict(list(rows.values()), "var", "base")  # base's, not var's
    assert "seed1@step4" in R.summarize(curves, ["base", "var"], "var", 48)[0]["missing_evals"]
    res = R.result_rows(curves)
    assert [r["error"] for r in res if r["seed"] == 1 and r["variant"] == "base" and r["step"] == 4] == [
        "missing evaluation (NaN)"]


def _curves(tmp_path, arms: dict[str, list[list[float]]], every: int = 2, batch: int = 16):
    curves = []
    for name, per_seed in arms.items():
        for k, ys in enumerate(per_seed):
            ev = {every * (i + 1): (y, 0.1 * (i + 1)) for i, y in enumerate(ys[1:])}
            _fake_run(tmp_path / name / str(k), ys[0], ev, every * (len(ys) - 1), batch=batch)
            curves.append(R.read_run(tmp_path / name / str(k), name, k, batch, 32))
    return curves


def test_summary_hand_case(tmp_path):
    # budget 64, evaluations every 32 samples (batch 16: steps 2 and 4); step 0 shared within a seed
    base = [[0.0, 0.2, 0.4], [0.1, 0.4, 0.6], [0.0, 0.1, 0.5]]
    fast = [[0.0, 0.6, 0.7], [0.1, 0.4, 0.9], [0.0, 0.3, 0.6]]
    curves = _curves(tmp_path, {"uniform": base, "fast": fast})
    curves.append(R.RunCurve("fast", 9, "failed", "boom"))
    rows = {r["variant"]: r for r in R.summarize(curves, ["uniform", "fast"], "uniform", 64)}
    u, f = rows["uniform"], rows["fast"]
    assert (f["n_seeds"], f["n_failed"], u["n_failed"], f["n_pairs"], u["n_pairs"]) == (3, 1, 0, 3, 0)
    assert math.isnan(u["final_diff"])                     # the baseline has no paired columns
    # baseline noise reference: finals .4 .6 .5, mean .5, sd .1, t(2)=4.302653
    assert u["final_reward_mean"] == pytest.approx(0.5) and u["final_seed_sd"] == pytest.approx(0.1)
    assert u["final_reward_ci95_lo"] == pytest.approx(0.5 - 4.302653 * 0.1 / math.sqrt(3), abs=1e-6)
    # paired final differences .3 .3 .1: mean 7/30, sd sqrt(((.3-7/30)^2*2+(.1-7/30)^2)/2)
    d = np.array([0.3, 0.3, 0.1])
    half = 4.302653 * d.std(ddof=1) / math.sqrt(3)
    assert f["final_diff"] == pytest.approx(7 / 30)
    assert (f["final_diff_lo"], f["final_diff_hi"]) == pytest.approx((7 / 30 - half, 7 / 30 + half), abs=1e-6)
    assert f["final_diff_p"] == pytest.approx(0.25)
    # at 25% of the budget (16 samples, halfway between 0 and 32): fast .3 .25 .15, base .1 .25 .05 -> .2 0 .1
    assert f["at25_diff"] == pytest.approx(0.1)
    # at 50% (= the grid point 32): .4 0 .2
    assert f["at50_diff"] == pytest.approx(0.2)
    # AUC over [0, 64]: (a + 2b + c) / 4 per seed; fast - base = (2 db + dc) / 4 = (.8+.3)/4, (0+.3)/4, (.4+.1)/4
    assert f["auc_diff"] == pytest.approx(np.mean([1.1 / 4, 0.3 / 4, 0.5 / 4]))
    # first passage: pooled y0 = .2/6, pooled final = (1.5 + 2.2)/6; target = y0 + (ym - y0)/2
    y0, ym = 0.2 / 6, 3.7 / 6
    assert f["target"] == pytest.approx(y0 + (ym - y0) / 2)           # .325
    # fast reaches .325 at 32 (seeds 0, 1) and 64 (seed 2); base at 32 (seed 1) and 64 (seeds 0, 2)
    assert (f["earlier"], f["later"], f["ties"]) == (1, 0, 2)
    assert f["below_first_eval"] == 2 and f["beyond_budget"] == 0
    assert f["median_samples_to_target"] == 32 and f["baseline_median_samples_to_target"] == 64
    assert f["final_kl_mean"] == pytest.approx(0.2)
    v = R.verdict(list(rows.values()), "fast", "uniform")
    assert v.startswith("fast vs uniform: final held-out reward 0.733 [")
    # the primary (final) test: t = (7/30) sqrt(3) / sd = 3.5 with 2 df, two-sided p = 0.0728; one variant: Holm = raw
    assert f["final_diff_t_p"] == pytest.approx(0.072827, abs=1e-6) and f["final_p_holm"] == f["final_diff_t_p"]
    assert f["primary"] == "final" and f["verdict"] == "no difference measured"
    assert (": no difference measured (primary, final value: final difference 0.233 [-0.054, 0.520], 3 seeds "
            "(t p 0.073, Holm p 0.073); Holm one variant: no adjustment); secondary, Holm-adjusted over 4 tests: ") in v
    # the secondary family: at25, at50, auc, first passage, adjusted together (Holm over 4 p-values)
    sec = [f["at25_diff_t_p"], f["at50_diff_t_p"], f["auc_diff_t_p"], f["passage_p"]]
    assert [f["at25_p_holm"], f["at50_p_holm"], f["auc_p_holm"], f["first_passage_p_holm"]] == pytest.approx(
        stats.holm(sec))
    assert f["first_passage_p_holm"] == pytest.approx(1.0)   # sign-flip p of (1, 0, 0) is 1 before adjustment


def test_identical_non_monotone_arms_read_no_difference(tmp_path):
    """A non-monotone baseline (it peaks before the budget) and a variant identical to it: every paired
    comparison is 0 and the verdict is "no difference". The withdrawn ratio was budget / (first time the mean
    curve reached its own final value) = 64 / 20.27 = 3.16 for this pair, interpolated between step 0 and the first
    evaluation."""
    base = [[0.0, 0.5, 0.3], [0.0, 0.6, 0.4], [0.1, 0.5, 0.35]]
    curves = _curves(tmp_path, {"a": base, "b": [list(r) for r in base]})
    rows = {r["variant"]: r for r in R.summarize(curves, ["a", "b"], "a", 64)}
    b = rows["b"]
    assert (b["final_diff"], b["final_diff_lo"], b["final_diff_hi"], b["final_diff_p"]) == (0, 0, 0, 1)
    assert (b["earlier"], b["later"], b["ties"], b["passage_p"]) == (0, 0, 3, 1.0)
    assert ": no difference measured (primary, final value: final difference 0.000 [0.000, 0.000], 3 seeds" in R.verdict(
        list(rows.values()), "b", "a")
    assert "efficiency_ratio" not in R.SUMMARY_COLUMNS
    from jaxppo.sweeps.legacy import efficiency_ratio, first_crossing

    arr = np.asarray(base)
    assert efficiency_ratio(64, first_crossing([0, 32, 64], arr.mean(0), arr[:, -1].mean())) == pytest.approx(3.158,
                                                                                                           abs=1e-3)


def test_dpo_runs_summarize_on_held_out_pair_accuracy(tmp_path):
    """command: dpo: no eval/reward_mean curve; the held-out pair accuracy is the metric, from the first
    evaluation on when the log has no step-0 row (older DPO logs)."""
    curves = []
    for name, accs in (("b", [(0.55, 0.6), (0.5, 0.62), (0.52, 0.58)]), ("v", [(0.6, 0.7), (0.58, 0.66),
                                                                            (0.6, 0.64)])):
        for k, (a1, a2) in enumerate(accs):
            _fake_run(tmp_path / name / str(k), None, {4: (a1, 0.0), 8: (a2, 0.0)}, 8,
                      metric="eval/rewards/accuracies")
            curves.append(R.read_run(tmp_path / name / str(k), name, k, 8, 40, command="dpo"))
    assert curves[0].steps == [4, 8] and curves[0].samples == [32, 64] and curves[0].reward == [0.55, 0.6]
    rows = {r["variant"]: r for r in R.summarize(curves, ["b", "v"], "b", 64, metric=R.METRICS["dpo"])}
    assert rows["v"]["final_diff"] == pytest.approx(np.mean([0.1, 0.04, 0.06]))
    assert rows["v"]["metric"] == "eval/rewards/accuracies"
    assert math.isnan(rows["v"]["at25_diff"])         # 16 samples lies before the first evaluation: not measured
    assert rows["v"]["at50_diff"] == pytest.approx(np.mean([0.05, 0.08, 0.08]))
    assert "final held-out pair accuracy" in R.verdict(list(rows.values()), "v", "b")
    with pytest.raises(ValueError, match="command must be one of"):
        R.read_run(tmp_path / "b" / "0", "b", 0, 8, 40, command="sft")


def test_summary_with_a_variant_without_finished_runs(tmp_path):
    _fake_run(tmp_path / "u", 0.0, {2: (0.2, 0.1), 4: (0.4, 0.2)}, 4)
    curves = [R.read_run(tmp_path / "u", "uniform", 0, 16, 32), R.RunCurve("per", 0, "failed", "boom")]
    rows = R.summarize(curves, ["uniform", "per"], "uniform", 64)
    assert rows[1]["n_seeds"] == 0 and rows[1]["n_failed"] == 1 and math.isnan(rows[1]["final_reward_mean"])
    assert rows[0]["n_seeds"] == 1 and math.isnan(rows[0]["final_reward_ci95_lo"])
    assert "not measurable" in R.verdict(rows, "per", "uniform")


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


@given(st.integers(2, 6), st.integers(2, 7), st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_compare_arms_is_antisymmetric(n, m, seed):
    """Swapping variant and baseline negates every paired difference (and its interval) and keeps every p-value;
    adding the same curve to both arms changes nothing (the shared seed noise cancels)."""
    rng = np.random.default_rng(seed)
    x = np.arange(m, dtype=float) * 8.0
    a, b, shared = rng.normal(size=(n, m)), rng.normal(size=(n, m)), rng.normal(size=(n, m))
    f, g = R.compare_arms(x, a, b), R.compare_arms(x, b, a)
    for k in ("final_diff", "at25_diff", "at50_diff", "auc_diff"):
        assert f[k] == pytest.approx(-g[k], abs=1e-12)
        assert (f[k + "_lo"], f[k + "_hi"]) == pytest.approx((-g[k + "_hi"], -g[k + "_lo"]), abs=1e-12)
        assert f[k + "_p"] == pytest.approx(g[k + "_p"])
    h = R.compare_arms(x, a + shared, b + shared)
    assert h["final_diff"] == pytest.approx(f["final_diff"]) and h["final_diff_p"] == pytest.approx(f["final_diff_p"])
