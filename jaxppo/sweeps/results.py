"""A sweep's tables: ``results.csv`` (one row per evaluation point of every run) and ``summary.csv``
(one row per variant). Host-side NumPy; no JAX.

Curves. For a finished run with batch size ``B`` (trajectories per update step):

- step 0: ``eval/reward_before`` of ``summary.json`` (the reference policy's held-out reward, evaluated
  with the same prompts and sampling key as every later point), KL 0;
- every row of ``metrics.jsonl`` with ``eval/reward_mean`` after step 0 (the trainer's step-0 row is that same
  reference evaluation): reward ``eval/reward_mean``, KL ``eval/kl``;
- ``samples = step x B``; ``tokens`` = response tokens consumed, ``sum_{s <= step} B x
  response_length/mean_s`` when every step logs ``response_length/mean``, else ``samples x
  (data.max_prompt_length + data.max_response_length)`` (padded); ``wall_time_s`` = the sum of
  ``perf/step_time_s`` over steps ``<= step`` (update steps only, evaluation excluded).

A failed run is one row with ``status=failed`` and its error; an unfinished one ``status=missing``.

Summary per variant ``v`` over its finished seeds ``k = 1..n`` (curves ``y_k(x)`` on the shared grid
``x_0 = 0 < x_1 < ... < x_m = budget``):

- final reward: mean ``ybar`` of ``y_k(x_m)`` and its 95% **t-interval** ``ybar -+ t_{0.975, n-1} s / sqrt(n)``
  (``s`` the sample standard deviation, ddof 1; NaN when ``n < 2``);
- AUC: ``(1 / budget) integral_0^budget y_k dx`` by the trapezoid rule (the average reward over the budget),
  mean and t-interval over seeds;
- target ``R*`` = the baseline variant's mean final reward; ``samples_to_target`` = the first ``x`` at which
  the seed-mean curve ``ybar(x)`` reaches ``R*``, linearly interpolated between the two grid points that
  bracket the first crossing (0 if ``ybar(0) >= R*``, NaN if never); ``seeds_reaching_target`` and
  ``samples_to_target_seed_mean`` give the same per seed (mean over the seeds that reach it);
- data-efficiency ratio ``budget / samples_to_target`` (the baseline needs its whole budget to reach its
  own final reward; > 1: the variant gets there with fewer trajectories; 0 when it never does), with a
  95% percentile **bootstrap** interval (order statistics: the 2.5% one rounded down, the 97.5% one
  rounded up, no interpolation): each of ``resamples`` draws resamples the baseline's seeds (for
  ``R*``) and the variant's seeds (for ``ybar``) with replacement, using ``numpy.random.default_rng(seed)``.

Reporting, shared by the notebooks (``notebooks/sweep_report.py``) and ``python -m jaxppo.sweeps.report``:
:func:`verdict` (the comparison rule), :func:`mismatch` (behaviour mismatch at an update step), :func:`format_ci`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

RESULT_COLUMNS = ("variant", "seed", "step", "samples", "tokens", "reward", "kl", "wall_time_s", "status", "error")
SUMMARY_COLUMNS = ("variant", "n_seeds", "n_failed", "final_reward_mean", "final_reward_ci95_lo",
                   "final_reward_ci95_hi", "final_kl_mean", "auc_mean", "auc_ci95_lo", "auc_ci95_hi",
                   "target_reward", "samples_to_target", "seeds_reaching_target", "samples_to_target_seed_mean",
                   "efficiency_ratio", "efficiency_ratio_ci95_lo", "efficiency_ratio_ci95_hi")


# ----------------------------------------------------------------------------- statistics

def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    return float(t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: mean -+ t_{0.975, n-1} * s / sqrt(n), s with ddof 1; NaN bounds when n < 2."""
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"t_interval needs a non-empty 1-D sequence, got shape {x.shape}")
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = t_quantile_975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


def normalized_auc(x: Sequence[float], y: Sequence[float], budget: float) -> float:
    """``(1 / budget) * sum_i (x_{i+1} - x_i) (y_i + y_{i+1}) / 2`` (trapezoid rule)."""
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if xa.shape != ya.shape or xa.ndim != 1 or xa.size < 2:
        raise ValueError(f"normalized_auc needs two 1-D arrays of the same length >= 2, got {xa.shape}, {ya.shape}")
    if np.any(np.diff(xa) <= 0):
        raise ValueError("normalized_auc: x must be strictly increasing")
    if budget <= 0:
        raise ValueError(f"normalized_auc: budget must be > 0, got {budget}")
    return float(np.sum(np.diff(xa) * (ya[1:] + ya[:-1]) / 2.0) / budget)


def first_crossing(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The first ``x`` at which the piecewise-linear curve through ``(x_i, y_i)`` reaches ``target``.

    ``x_0`` if ``y_0 >= target``; else, for the first ``i`` with ``y_i >= target``,
    ``x_{i-1} + (target - y_{i-1}) (x_i - x_{i-1}) / (y_i - y_{i-1})``; NaN if no point reaches it
    (or ``target`` is NaN).
    """
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if xa.shape != ya.shape or xa.ndim != 1 or xa.size == 0:
        raise ValueError(f"first_crossing needs two 1-D arrays of the same non-zero length, got {xa.shape}, "
                         f"{ya.shape}")
    if not math.isfinite(target):
        return math.nan
    hit = np.nonzero(ya >= target)[0]
    if hit.size == 0:
        return math.nan
    i = int(hit[0])
    if i == 0:
        return float(xa[0])
    x0, x1, y0, y1 = xa[i - 1], xa[i], ya[i - 1], ya[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def efficiency_ratio(budget: float, samples_to_target: float) -> float:
    """``budget / samples_to_target``; 0 when the target is never reached (NaN samples), inf at 0 samples."""
    if math.isnan(samples_to_target):
        return 0.0
    return math.inf if samples_to_target == 0 else float(budget / samples_to_target)


def bootstrap_efficiency_ci(x: Sequence[float], base_final: Sequence[float], curves: np.ndarray, budget: float,
                            *, resamples: int, seed: int, same: bool = False) -> tuple[float, float]:
    """95% percentile interval of ``efficiency_ratio`` over seed resamples (see the module docstring).

    ``base_final``: the baseline's final reward per seed; ``curves``: ``[n_seeds, len(x)]`` of the variant.
    ``same=True`` (the variant is the baseline): one resample of the seeds serves both.
    Each draw: ``b = rng.integers(0, len(base_final), len(base_final))``, then (unless ``same``)
    ``v = rng.integers(0, n_seeds, n_seeds)``.
    """
    bf = np.asarray(base_final, np.float64)
    cv = np.asarray(curves, np.float64)
    if bf.ndim != 1 or bf.size == 0 or cv.ndim != 2 or cv.shape[0] == 0 or cv.shape[1] != len(x):
        raise ValueError(f"bootstrap_efficiency_ci: base_final {bf.shape} / curves {cv.shape} / x {len(x)} mismatch")
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    for i in range(resamples):
        b = rng.integers(0, bf.size, bf.size)
        v = b if same else rng.integers(0, cv.shape[0], cv.shape[0])
        ratios[i] = efficiency_ratio(budget, first_crossing(x, cv[v].mean(axis=0), float(bf[b].mean())))
    # order statistics, no interpolation (ratios may be inf): lo rounds down, hi rounds up
    return float(np.percentile(ratios, 2.5, method="lower")), float(np.percentile(ratios, 97.5, method="higher"))


# ----------------------------------------------------------------------------- reading runs

@dataclass
class RunCurve:
    variant: str
    seed: int
    status: str  # ok | failed | missing
    error: str = ""
    steps: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)


def _read_jsonl(path: Path) -> list[dict]:
    from jaxppo.trainer.metrics_log import read_jsonl

    return read_jsonl(path)


def read_run(run_dir: Path, variant: str, seed: int, batch_size: int, tokens_per_sample: int,
             failure: dict | None = None) -> RunCurve:
    """The evaluation curve of one run folder (see the module docstring)."""
    summ = run_dir / "summary.json"
    if not summ.is_file():
        if failure is not None:
            err = failure.get("error", "failed")
            tail = [ln for ln in str(failure.get("stderr_tail", "")).splitlines() if ln.strip()]
            return RunCurve(variant, seed, "failed", f"{err}: {tail[-1]}" if tail else err)
        return RunCurve(variant, seed, "missing", "not run yet")
    summary = json.loads(summ.read_text(encoding="utf-8"))
    if "eval/reward_before" not in summary:
        return RunCurve(variant, seed, "failed", f"{summ} has no eval/reward_before (no held-out prompts?)")
    c = RunCurve(variant, seed, "ok", steps=[0], samples=[0], tokens=[0.0],
                 reward=[float(summary["eval/reward_before"])], kl=[0.0], wall=[0.0])
    # step 0 (the trainer's evaluation of the reference before any update) is the summary's eval/reward_before
    rows = sorted((r for r in _read_jsonl(run_dir / "metrics.jsonl") if r["step"] > 0), key=lambda r: r["step"])
    resp_logged = bool(rows) and all("response_length/mean" in r for r in rows)
    tok = wall = 0.0
    for r in rows:
        step = int(r["step"])
        tok += batch_size * float(r["response_length/mean"]) if resp_logged else batch_size * tokens_per_sample
        wall += float(r.get("perf/step_time_s", 0.0))
        if "eval/reward_mean" in r:
            c.steps.append(step)
            c.samples.append(step * batch_size)
            c.tokens.append(tok)
            c.reward.append(float(r["eval/reward_mean"]))
            c.kl.append(float(r.get("eval/kl", math.nan)))
            c.wall.append(wall)
    return c


def result_rows(curves: Iterable[RunCurve]) -> list[dict]:
    rows = []
    for c in curves:
        if c.status != "ok":
            rows.append({k: "" for k in RESULT_COLUMNS} | {"variant": c.variant, "seed": c.seed, "status": c.status,
                                                          "error": c.error})
            continue
        for i in range(len(c.steps)):
            rows.append({"variant": c.variant, "seed": c.seed, "step": c.steps[i], "samples": c.samples[i],
                         "tokens": round(c.tokens[i], 6), "reward": c.reward[i], "kl": c.kl[i],
                         "wall_time_s": round(c.wall[i], 6), "status": "ok", "error": ""})
    return rows


# ----------------------------------------------------------------------------- summary

def summarize(curves: Sequence[RunCurve], variants: Sequence[str], baseline: str, budget: int, *,
              resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One summary row per variant (see the module docstring)."""
    by_var = {v: [c for c in curves if c.variant == v] for v in variants}

    def grid(v: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        ok = [c for c in by_var[v] if c.status == "ok"]
        if not ok:
            return None, None
        x = np.asarray(ok[0].samples, np.float64)
        for c in ok[1:]:
            if list(c.samples) != list(ok[0].samples):
                raise ValueError(f"variant {v}: seeds {ok[0].seed} and {c.seed} have different evaluation points "
                                 f"({ok[0].samples} vs {c.samples})")
        if x[-1] != budget:
            raise ValueError(f"variant {v}: the last evaluation is at {x[-1]:g} samples, not the budget {budget}")
        return x, np.asarray([c.reward for c in ok], np.float64)

    bx, by = grid(baseline)
    target = float(by[:, -1].mean()) if by is not None else math.nan
    rows = []
    for v in variants:
        x, y = grid(v)
        n_failed = sum(c.status == "failed" for c in by_var[v])
        row = {k: math.nan for k in SUMMARY_COLUMNS} | {"variant": v, "n_seeds": 0, "n_failed": n_failed,
                                                        "target_reward": target, "seeds_reaching_target": 0}
        if y is None:
            rows.append(row)
            continue
        ok = [c for c in by_var[v] if c.status == "ok"]
        row["n_seeds"] = y.shape[0]
        row["final_reward_mean"], row["final_reward_ci95_lo"], row["final_reward_ci95_hi"] = t_interval(y[:, -1])
        row["final_kl_mean"] = float(np.mean([c.kl[-1] for c in ok]))
        aucs = [normalized_auc(x, yk, budget) for yk in y]
        row["auc_mean"], row["auc_ci95_lo"], row["auc_ci95_hi"] = t_interval(aucs)
        if math.isfinite(target):
            s = first_crossing(x, y.mean(axis=0), target)
            per_seed = np.asarray([first_crossing(x, yk, target) for yk in y])
            reached = per_seed[~np.isnan(per_seed)]
            row["samples_to_target"] = s
            row["seeds_reaching_target"] = int(reached.size)
            row["samples_to_target_seed_mean"] = float(reached.mean()) if reached.size else math.nan
            row["efficiency_ratio"] = efficiency_ratio(budget, s)
            lo, hi = bootstrap_efficiency_ci(x, by[:, -1], y, budget, resamples=resamples, seed=seed,
                                             same=(v == baseline))
            row["efficiency_ratio_ci95_lo"], row["efficiency_ratio_ci95_hi"] = lo, hi
        rows.append(row)
    return rows


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """``rows`` as CSV with a header; floats written with ``repr`` precision (NaN as ``nan``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in columns})
    tmp.replace(path)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def write_results(spec, runs, failures: dict[str, dict]) -> tuple[list[RunCurve], list[dict]]:
    """Read every run of ``runs`` (``RunSpec``s of ``spec``) and write ``results.csv`` and ``summary.csv``
    into ``spec.output_dir``; returns the curves and the summary rows."""
    curves = [read_run(r.out_dir, r.variant, r.seed, r.batch_size, r.tokens_per_sample, failures.get(r.key))
              for r in runs]
    out = Path(spec.output_dir)
    write_csv(out / "results.csv", result_rows(curves), RESULT_COLUMNS)
    summary = summarize(curves, list(spec.variants), spec.baseline, spec.budget_samples,
                        resamples=spec.bootstrap_resamples, seed=spec.bootstrap_seed)
    write_csv(out / "summary.csv", summary, SUMMARY_COLUMNS)
    return curves, summary


# ----------------------------------------------------------------------------- reporting (notebooks, README table)

def _float(x) -> float:
    """``float(x)``; NaN for ``None`` or ``""`` (an empty CSV cell)."""
    return math.nan if x is None or x == "" else float(x)


def format_ci(mean: float, lo: float, hi: float, nd: int = 3) -> str:
    """``"m [lo, hi]"`` with ``nd`` decimals; ``"n/a"`` for a NaN mean, ``"m [no interval]"`` for NaN bounds
    (fewer than 2 seeds); an infinite value is written ``inf``. Values may be CSV strings (``""``: NaN)."""
    m, lo, hi = _float(mean), _float(lo), _float(hi)
    if math.isnan(m):
        return "n/a"
    if math.isnan(lo) or math.isnan(hi):
        return f"{m:.{nd}f} [no interval]"
    return f"{m:.{nd}f} [{lo:.{nd}f}, {hi:.{nd}f}]"


def mismatch(out: str | Path, variants: Sequence[str], seeds: Sequence[int], step: int = 1) -> dict[str, dict]:
    """Behaviour-policy mismatch at update ``step``, mean over the seeds that logged it, per variant, from
    ``<out>/runs/<variant>/seed<k>/metrics.jsonl``:

    - ``rollout_corr/kl``: verl's ``E_t[log mu - log pi_prox]`` (logged by rollout-correction variants);
    - ``ess``: the Kish ESS / N of the token weights ``pi_prox / mu``, ``(sum w)^2 / (N sum w^2)``: ``is_diag/ess``
      when logged (IS off: the weights that would be applied), else ``is/ess``;
    - ``weight_mean``: ``is_diag/weight_mean``, else ``is/weight_mean``.

    Keys no run logged are left out (a variant without any run folder maps to ``{}``).
    """
    res: dict[str, dict] = {}
    for v in variants:
        acc: dict[str, list[float]] = {}
        for s in seeds:
            path = Path(out) / "runs" / v / f"seed{s}" / "metrics.jsonl"
            if not path.is_file():
                continue
            for row in _read_jsonl(path):
                if row.get("step") != step:
                    continue
                for key, name in (("rollout_corr/kl", "rollout_corr/kl"), ("is/ess", "ess"), ("is_diag/ess", "ess"),
                                  ("is/weight_mean", "weight_mean"), ("is_diag/weight_mean", "weight_mean")):
                    if key in row and not (key.startswith("is/") and f"is_diag/{key[3:]}" in row):
                        acc.setdefault(name, []).append(float(row[key]))
        res[v] = {k: sum(x) / len(x) for k, x in acc.items()}
    return res


def summary_by_variant(summary) -> dict[str, dict]:
    """``{variant: row}`` of a summary: rows of ``summary.csv`` (:func:`read_csv`: strings), of :func:`summarize`,
    or a pandas DataFrame with those columns."""
    rows = summary.to_dict("records") if hasattr(summary, "to_dict") else list(summary)
    return {str(r["variant"]): dict(r) for r in rows}


def _num(row: dict, key: str) -> float:
    return _float(row.get(key, ""))


def verdict(summary, variant: str, baseline: str) -> str:
    """One sentence comparing ``variant`` with ``baseline`` on the final held-out reward (``summary``: see
    :func:`summary_by_variant`).

    Rule, with each side's 95% t-interval over seeds ``[lo, hi]``: ``lo_v > hi_b`` -> "higher", ``hi_v < lo_b``
    -> "lower" (the intervals do not overlap); otherwise "no difference measured" (overlapping or touching
    intervals; conservative: intervals can overlap while a paired test would still find a difference); a NaN
    bound on either side (fewer than 2 finished seeds) -> "not measurable". The variant's data-efficiency ratio
    with its interval is appended unless it is NaN (``inf``: the variant starts at or above the target).
    """
    rows = summary_by_variant(summary)
    for name in (variant, baseline):
        if name not in rows:
            raise ValueError(f"verdict: variant {name!r} is not in the summary (variants: {', '.join(rows)})")
    v, b = rows[variant], rows[baseline]
    vlo, vhi, blo, bhi = (_num(v, "final_reward_ci95_lo"), _num(v, "final_reward_ci95_hi"),
                          _num(b, "final_reward_ci95_lo"), _num(b, "final_reward_ci95_hi"))
    vs = (f"{variant} vs {baseline}: final reward {format_ci(_num(v, 'final_reward_mean'), vlo, vhi)} vs "
          f"{format_ci(_num(b, 'final_reward_mean'), blo, bhi)}")
    if not all(math.isfinite(x) for x in (vlo, vhi, blo, bhi)):
        word = "not measurable (fewer than 2 finished seeds)"
    elif vlo > bhi:
        word = "higher (the 95% intervals do not overlap)"
    elif vhi < blo:
        word = "lower (the 95% intervals do not overlap)"
    else:
        word = "no difference measured (the 95% intervals overlap)"
    eff = ""
    ratio = _num(v, "efficiency_ratio")
    if variant != baseline and not math.isnan(ratio):
        eff = (f"; data-efficiency ratio "
               f"{format_ci(ratio, _num(v, 'efficiency_ratio_ci95_lo'), _num(v, 'efficiency_ratio_ci95_hi'), nd=2)}")
    return f"{vs}: {word}{eff}."
