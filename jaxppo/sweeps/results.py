"""A sweep's tables: ``results.csv`` (one row per evaluation point of every run) and ``summary.csv``
(one row per variant, with its seed-paired comparison against the baseline). Host-side NumPy; no JAX.

Curves. For a finished run with batch size ``B`` (trajectories, or DPO pairs, per update step), the metric is
``eval/reward_mean`` (``command: train``) or the held-out pair accuracy ``eval/rewards/accuracies``
(``command: dpo``, which logs no held-out reward curve):

- step 0: for ``train``, ``eval/reward_before`` of ``summary.json`` (the reference policy's held-out reward, with
  the run's evaluation key; identical in every variant of the same seed), KL 0; for ``dpo``, the step-0 row of
  ``metrics.jsonl`` (the reference's held-out pair accuracy, logged when the run evaluates), else (older logs)
  the curve starts at its first evaluation;
- every row of ``metrics.jsonl`` after step 0 with the metric: its value and ``eval/kl``; a NaN value is kept as
  a **missing** evaluation (named in ``summary.csv``'s ``missing_evals``, never read as "not reached");
- ``samples = step x B``;
- ``tokens``: the trainer's cumulative ``train/tokens_consumed`` of that row (response tokens of the sampled
  minibatches). When a row lacks it (DPO, older logs): ``sum B x response_length/mean`` if every step up to
  there logged it, else ``samples x (data.max_prompt_length + data.max_response_length)`` (padded), marked
  ``tokens`` in the ``estimated`` column;
- ``wall_time_s``: update-step time up to that step: the harness's cumulative ``perf/train_time_s`` of that row
  (update steps only, evaluation excluded, carried across resumes). Older logs have only the step's own
  ``perf/step_time_s`` on the rows written; then ``sum_r perf/step_time_s(r) x (step_r - step_{r-1})`` over logged
  rows ``r`` (each logged step stands for the unlogged ones before it), exact when every step is logged and
  otherwise marked ``wall`` in ``estimated``. DPO logs ``train/tokens_consumed`` (chosen + rejected answer
  tokens) like PPO.

A failed run is one row with ``status=failed`` and its error; a run stopped by a signal with its checkpoint saved
(``failures.json`` status ``preempted``) ``status=preempted``; an unfinished one ``status=missing``.

Summary per variant over its finished seeds (curves ``y_k(x)`` on the shared grid ``x_0 < ... < x_m = budget``):

- ``final_reward_*``: mean of ``y_k(x_m)`` with its 95% t-interval over seeds, and ``final_seed_sd`` (ddof 1) —
  for the baseline this is the noise reference: how far two seeds of the same recipe land apart;
- ``auc_*``: ``normalized_auc`` (the average of the curve over the grid), mean and t-interval;
- paired against the baseline (:mod:`jaxppo.sweeps.stats`; seed ``k`` of both arms shares the evaluation key,
  the reference evaluation and the replay key), over the seeds finished in both arms with a non-missing value:
  the differences ``variant - baseline`` of the final value (``final_diff*``; ``final_diff_sd`` their sd, ddof 1,
  which sets the power line of the report), of the value at a quarter and
  half of the budget (``at25_diff*``, ``at50_diff*``, :func:`jaxppo.sweeps.stats.value_at`, inside the grid
  only) and of the AUC (``auc_diff*``), each with its 95% t-interval and exact sign-flip p-value;
- data efficiency (``target``, ``earlier``/``later``/``ties``, ``passage_p``, ``median_samples_to_target``,
  ``baseline_median_samples_to_target``, ``below_first_eval``, ``beyond_budget``):
  :func:`jaxppo.sweeps.stats.paired_first_passage` — per seed, the first evaluation at which each arm reaches
  half the pooled gain, censored below the first evaluation and beyond the budget, never interpolated or
  extrapolated. The former ``budget / samples_to_target`` ratio with its bootstrap interval is not reported: its
  A/A false-positive rate is far above 5% (``python -m jaxppo.sweeps.calibrate``, :mod:`jaxppo.sweeps.legacy`).

Reporting, shared by the notebooks (:mod:`jaxppo.sweeps.notebook`) and ``python -m jaxppo.sweeps.report``:
:func:`verdict` (the comparison rule), :func:`mismatch` (behaviour mismatch at an update step), :func:`format_ci`.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jaxppo.sweeps import family, stats

RESULT_COLUMNS = ("variant", "seed", "step", "samples", "tokens", "reward", "kl", "wall_time_s", "estimated",
                  "status", "error")
FRACTIONS = ((25, 0.25), (50, 0.5))   # the fixed budgets of the paired comparison besides the final one
_PAIR_KEYS = ("final_diff", "at25_diff", "at50_diff", "auc_diff")
SUMMARY_COLUMNS = (
    "variant", "metric", "n_seeds", "n_failed", "missing_evals", "final_reward_mean", "final_reward_ci95_lo",
    "final_reward_ci95_hi", "final_seed_sd", "final_kl_mean", "auc_mean", "auc_ci95_lo", "auc_ci95_hi", "n_pairs",
    "final_diff_sd",
    *(f"{k}{s}" for k in _PAIR_KEYS for s in ("", "_lo", "_hi", "_p", "_t_p")),
    "target", "earlier", "later", "ties", "passage_p", "median_samples_to_target",
    "baseline_median_samples_to_target", "below_first_eval", "beyond_budget", *family.COLUMNS)
METRICS = {"train": "eval/reward_mean", "dpo": "eval/rewards/accuracies"}


# ----------------------------------------------------------------------------- reading runs

@dataclass
class RunCurve:
    variant: str
    seed: int
    status: str  # ok | failed | preempted | missing
    error: str = ""
    steps: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    estimated: str = ""      # "tokens", "wall", "tokens,wall" or "": which counters are estimates

    @property
    def missing_steps(self) -> list[int]:
        return [s for s, r in zip(self.steps, self.reward) if math.isnan(r)]


def _read_jsonl(path: Path) -> list[dict]:
    from jaxppo.trainer.metrics_log import read_jsonl

    return read_jsonl(path) if path.is_file() else []


def read_run(run_dir: Path, variant: str, seed: int, batch_size: int, tokens_per_sample: int,
             failure: dict | None = None, command: str = "train") -> RunCurve:
    """The evaluation curve of one run folder (see the module docstring)."""
    if command not in METRICS:
        raise ValueError(f"read_run: command must be one of {', '.join(METRICS)}, got {command!r}")
    metric = METRICS[command]
    summ = run_dir / "summary.json"
    if not summ.is_file():
        if failure is not None:
            status = "preempted" if failure.get("status") == "preempted" else "failed"
            err = failure.get("error", status)
            tail = [ln for ln in str(failure.get("stderr_tail", "")).splitlines() if ln.strip()]
            return RunCurve(variant, seed, status, f"{err}: {tail[-1]}" if tail else err)
        return RunCurve(variant, seed, "missing", "not run yet")
    summary = json.loads(summ.read_text(encoding="utf-8"))
    if command == "train":
        if "eval/reward_before" not in summary:
            return RunCurve(variant, seed, "failed", f"{summ} has no eval/reward_before (no held-out prompts?)")
        c = RunCurve(variant, seed, "ok", steps=[0], samples=[0], tokens=[0.0],
                     reward=[_num_or_nan(summary["eval/reward_before"])], kl=[0.0], wall=[0.0])
    else:
        c = RunCurve(variant, seed, "ok")
    all_rows = _read_jsonl(run_dir / "metrics.jsonl")
    if command == "dpo":   # the DPO harness logs the reference's held-out metrics at step 0 (when it evaluates)
        first = [r for r in all_rows if r["step"] == 0 and metric in r]
        if first:
            c.steps, c.samples, c.tokens, c.wall = [0], [0], [0.0], [0.0]
            c.reward, c.kl = [_num_or_nan(first[-1][metric])], [0.0]
    rows = sorted((r for r in all_rows if r["step"] > 0), key=lambda r: r["step"])
    resp_sum, resp_complete, wall, prev, est = 0.0, True, 0.0, 0, set()
    for r in rows:
        step = int(r["step"])
        resp_complete = resp_complete and step == prev + 1 and "response_length/mean" in r
        if resp_complete:
            resp_sum += batch_size * float(r["response_length/mean"])
        if "perf/train_time_s" in r:   # the harness's cumulative clock: exact
            wall = float(r["perf/train_time_s"])
        else:
            if step != prev + 1:
                est.add("wall")
            wall += float(r.get("perf/step_time_s", 0.0)) * (step - prev)
        prev = step
        if metric not in r:
            continue
        if "train/tokens_consumed" in r:
            tok = float(r["train/tokens_consumed"])
        elif resp_complete:
            tok = resp_sum
        else:
            tok = float(step * batch_size * tokens_per_sample)
            est.add("tokens")
        c.steps.append(step)
        c.samples.append(step * batch_size)
        c.tokens.append(tok)
        c.reward.append(_num_or_nan(r[metric]))
        c.kl.append(_num_or_nan(r.get("eval/kl", math.nan)))
        c.wall.append(wall)
    c.estimated = ",".join(sorted(est))
    if not c.steps:
        return RunCurve(variant, seed, "failed", f"{run_dir / 'metrics.jsonl'} has no {metric} row")
    return c


def _num_or_nan(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def result_rows(curves: Iterable[RunCurve]) -> list[dict]:
    rows = []
    for c in curves:
        if c.status != "ok":
            rows.append({k: "" for k in RESULT_COLUMNS} | {"variant": c.variant, "seed": c.seed, "status": c.status,
                                                          "error": c.error})
            continue
        for i in range(len(c.steps)):
            miss = math.isnan(c.reward[i])
            rows.append({"variant": c.variant, "seed": c.seed, "step": c.steps[i], "samples": c.samples[i],
                         "tokens": round(c.tokens[i], 6), "reward": c.reward[i], "kl": c.kl[i],
                         "wall_time_s": round(c.wall[i], 6), "estimated": c.estimated, "status": "ok",
                         "error": "missing evaluation (NaN)" if miss else ""})
    return rows


# ----------------------------------------------------------------------------- statistics of arrays

def arm_stats(x: np.ndarray, y: np.ndarray) -> dict:
    """Per-arm columns of ``summary.csv`` from ``y [n_seeds, len(x)]`` (NaN = missing evaluation): final value
    mean / t-interval / seed sd over the seeds whose final value is present, AUC over the complete curves."""
    row = {k: math.nan for k in ("final_reward_mean", "final_reward_ci95_lo", "final_reward_ci95_hi",
                                 "final_seed_sd", "auc_mean", "auc_ci95_lo", "auc_ci95_hi")}
    fin = y[:, -1][np.isfinite(y[:, -1])]
    if fin.size:
        row["final_reward_mean"], row["final_reward_ci95_lo"], row["final_reward_ci95_hi"] = stats.t_interval(fin)
        row["final_seed_sd"] = float(fin.std(ddof=1)) if fin.size > 1 else math.nan
    complete = y[np.all(np.isfinite(y), axis=1)]
    if complete.size and x.size >= 2:
        aucs = [stats.normalized_auc(x, yk) for yk in complete]
        row["auc_mean"], row["auc_ci95_lo"], row["auc_ci95_hi"] = stats.t_interval(aucs)
    return row


def _put(row: dict, key: str, p: stats.Paired | None) -> None:
    if p is None:
        row[key] = row[key + "_lo"] = row[key + "_hi"] = row[key + "_p"] = row[key + "_t_p"] = math.nan
    else:
        row[key], row[key + "_lo"], row[key + "_hi"], row[key + "_p"], row[key + "_t_p"] = p.mean, p.lo, p.hi, p.p, p.p_t


def compare_arms(x: np.ndarray, yv: np.ndarray, yb: np.ndarray) -> dict:
    """The paired columns of ``summary.csv`` (module docstring) for two arms whose rows are the same seeds, in
    the same order, on the grid ``x``; NaN marks a missing evaluation (that seed leaves the comparisons that need
    it). Used by :func:`summarize` and by ``jaxppo.sweeps.calibrate`` (the same code is calibrated)."""
    x = np.asarray(x, np.float64)
    yv, yb = np.asarray(yv, np.float64), np.asarray(yb, np.float64)
    if yv.shape != yb.shape or yv.ndim != 2 or yv.shape[1] != x.size:
        raise ValueError(f"compare_arms: curves {yv.shape} / {yb.shape} on a grid of {x.size} points")
    row: dict = {"n_pairs": int(yv.shape[0])}

    def pair(a: np.ndarray, b: np.ndarray):
        ok = np.isfinite(a) & np.isfinite(b)
        return stats.paired(a[ok], b[ok]) if ok.sum() >= 1 else None

    _put(row, "final_diff", pair(yv[:, -1], yb[:, -1]))
    d = (yv[:, -1] - yb[:, -1])[np.isfinite(yv[:, -1] - yb[:, -1])]
    row["final_diff_sd"] = float(d.std(ddof=1)) if d.size >= 2 else math.nan
    for pct, f in FRACTIONS:
        at = f * x[-1]
        if at < x[0]:
            _put(row, f"at{pct}_diff", None)
            continue
        _put(row, f"at{pct}_diff", pair(_values_at(x, yv, at), _values_at(x, yb, at)))
    if x.size >= 2:
        def auc(y):
            return np.asarray([stats.normalized_auc(x, yk) if np.all(np.isfinite(yk)) else math.nan for yk in y])
        _put(row, "auc_diff", pair(auc(yv), auc(yb)))
        fp = stats.paired_first_passage(x, yv, yb)
        row.update(target=fp.target, earlier=fp.earlier, later=fp.later, ties=fp.ties, passage_p=fp.p,
                   median_samples_to_target=fp.variant_median, baseline_median_samples_to_target=fp.baseline_median,
                   below_first_eval=fp.variant_status[stats.CENSOR_BELOW],
                   beyond_budget=fp.variant_status[stats.CENSOR_BEYOND])
    else:
        _put(row, "auc_diff", None)
    return row


def _values_at(x: np.ndarray, y: np.ndarray, at: float) -> np.ndarray:
    return np.asarray([stats.value_at(x, yk, at) for yk in y])


# ----------------------------------------------------------------------------- summary

def _arm(curves: Sequence[RunCurve], v: str, budget: int) -> tuple[np.ndarray | None, dict[int, np.ndarray]]:
    ok = [c for c in curves if c.variant == v and c.status == "ok"]
    if not ok:
        return None, {}
    x = np.asarray(ok[0].samples, np.float64)
    for c in ok[1:]:
        if list(c.samples) != list(ok[0].samples):
            raise ValueError(f"variant {v}: seeds {ok[0].seed} and {c.seed} have different evaluation points "
                             f"({ok[0].samples} vs {c.samples})")
    if x[-1] != budget:
        raise ValueError(f"variant {v}: the last evaluation is at {x[-1]:g} samples, not the budget {budget}")
    return x, {c.seed: np.asarray(c.reward, np.float64) for c in ok}


def summarize(curves: Sequence[RunCurve], variants: Sequence[str], baseline: str, budget: int, *,
              metric: str = METRICS["train"], primary: str = family.PRIMARY_DEFAULT) -> list[dict]:
    """One summary row per variant (see the module docstring); the baseline's paired columns are empty. The
    family-wise columns (:mod:`jaxppo.sweeps.family`: the verdict from the ``primary`` test, Holm-adjusted p-values)
    are added over all variants at once."""
    bx, by = _arm(curves, baseline, budget)
    rows = []
    for v in variants:
        x, y = _arm(curves, v, budget)
        vc = [c for c in curves if c.variant == v]
        row = {k: math.nan for k in SUMMARY_COLUMNS} | {
            "variant": v, "metric": metric, "n_seeds": len(y), "n_failed": sum(c.status == "failed" for c in vc),
            "missing_evals": " ".join(f"seed{c.seed}@step{s}" for c in vc if c.status == "ok"
                                      for s in c.missing_steps), "n_pairs": 0}
        if x is None:
            rows.append(row)
            continue
        arr = np.stack([y[s] for s in sorted(y)])
        row.update(arm_stats(x, arr))
        kls = [c.kl[-1] for c in vc if c.status == "ok" and math.isfinite(c.kl[-1])]
        row["final_kl_mean"] = float(np.mean(kls)) if kls else math.nan
        if v != baseline and bx is not None:
            if list(bx) != list(x):
                raise ValueError(f"variant {v} is evaluated at {x.tolist()} samples, the baseline {baseline} at "
                                 f"{bx.tolist()}: paired comparisons need the same grid")
            seeds = sorted(set(y) & set(by))
            if seeds:
                row.update(compare_arms(x, np.stack([y[s] for s in seeds]), np.stack([by[s] for s in seeds])))
        rows.append(row)
    return family.apply(rows, baseline, primary)


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """``rows`` as CSV with a header; floats written with ``repr`` precision (NaN as ``nan``). Written to a file of
    this process and renamed over ``path``, so two sweeps of one folder finishing together never mix their rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
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
    curves = [read_run(r.out_dir, r.variant, r.seed, r.batch_size, r.tokens_per_sample, failures.get(r.key),
                       command=spec.command) for r in runs]
    out = Path(spec.output_dir)
    write_csv(out / "results.csv", result_rows(curves), RESULT_COLUMNS)
    summary = summarize(curves, list(spec.variants), spec.baseline, spec.budget_samples,
                        metric=METRICS[spec.command], primary=spec.primary)
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


def initial_eval_sd(results, variant: str) -> tuple[float, int]:
    """The spread of the evaluation alone: sd (ddof 1) over seeds of ``variant``'s held-out value at 0 samples,
    and the number of seeds, from ``results.csv`` rows (:func:`read_csv`) or :func:`result_rows`.

    At 0 samples every seed evaluates the same initial policy on the same prompts, only with its own evaluation
    key, so this sd is the noise of one evaluation (prompts x samples per prompt); the final seed sd contains it
    plus the training's spread. Rows that are not ``status == "ok"`` or whose value is NaN are left out; fewer
    than 2 seeds give NaN."""
    vals = []
    for r in results:
        if str(r.get("variant")) == variant and r.get("status", "ok") == "ok" and _float(r.get("samples")) == 0:
            v = _float(r.get("reward"))
            if math.isfinite(v):
                vals.append(v)
    return (float(np.std(vals, ddof=1)) if len(vals) >= 2 else math.nan), len(vals)


def summary_by_variant(summary) -> dict[str, dict]:
    """``{variant: row}`` of a summary: rows of ``summary.csv`` (:func:`read_csv`: strings), of :func:`summarize`,
    or a pandas DataFrame with those columns."""
    rows = summary.to_dict("records") if hasattr(summary, "to_dict") else list(summary)
    return {str(r["variant"]): dict(r) for r in rows}




def _num(row: dict, key: str) -> float:
    return _float(row.get(key, ""))


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def verdict(summary, variant: str, baseline: str, primary: str | None = None) -> str:
    """One sentence comparing ``variant`` with ``baseline`` (``summary``: see :func:`summary_by_variant`).

    Rule (:mod:`jaxppo.sweeps.family`): the verdict word comes from the sweep's primary test alone (``primary``,
    else the summary's ``primary`` column, else ``final``), its p-value Holm-adjusted over the sweep's variants;
    "not measurable" with fewer than 2 paired seeds. The secondary tests follow with their p-values Holm-adjusted
    over all secondary tests of the sweep; they describe, they are not findings. The family-wise error rates of
    both families are measured by ``python -m jaxppo.sweeps.calibrate``.
    """
    rows = summary_by_variant(summary)
    for name in (variant, baseline):
        if name not in rows:
            raise ValueError(f"verdict: variant {name!r} is not in the summary (variants: {', '.join(rows)})")
    prim = primary or str(rows[variant].get("primary") or "") or family.PRIMARY_DEFAULT
    if primary is not None or any(not str(r.get("primary") or "") for r in rows.values()):
        rows = {str(r["variant"]): r for r in family.apply(list(rows.values()), baseline, prim)}
    v, b = rows[variant], rows[baseline]
    n = int(_num(v, "n_pairs")) if math.isfinite(_num(v, "n_pairs")) else 0
    word = family.word(v, prim)
    head = f"{variant} vs {baseline}: final {_metric_name(v)} {_final_ci(v)} vs {_final_ci(b)}"
    if word == "not measurable":
        return f"{head}: not measurable (fewer than 2 seeds finished in both arms)."
    k = sum(1 for r in rows.values() if str(r["variant"]) != baseline)
    parts = {t: _test_text(v, t, n) for t in family.TESTS}
    over = f"over {k} variants" if k > 1 else "one variant: no adjustment"
    secondary = "; ".join(parts[t] for t in family.TESTS if t != prim and parts[t])
    missing = str(v.get("missing_evals", "") or "")
    return (f"{head}: {word} (primary, {family.NAMES[prim]}: {parts[prim]}; Holm {over})"
            + (f"; secondary, Holm-adjusted over {4 * k} tests: {secondary}" if secondary else "")
            + (f"; missing evaluations: {missing}" if missing and missing != "nan" else "") + ".")


def _test_text(v: dict, test: str, n: int) -> str:
    """One test of a variant's row as text: its difference (or first-passage counts), raw and Holm p."""
    holm = _num(v, f"{test}_p_holm")
    if test == "first_passage":
        if not math.isfinite(_num(v, "target")):
            return ""
        return (f"first reaches {_num(v, 'target'):.3f} earlier in {int(_num(v, 'earlier'))}, later in "
                f"{int(_num(v, 'later'))}, same evaluation in {int(_num(v, 'ties'))} of {n} seeds "
                f"(sign-flip p {_p(_num(v, 'passage_p'))}, Holm p {_p(holm)})")
    key = family.TESTS[test][0]
    if not math.isfinite(_num(v, key)):
        return ""
    label = {"final": "final difference", "at25": "difference at 25%", "at50": "difference at 50%",
             "auc": "AUC difference"}[test]
    return (f"{label} {format_ci(_num(v, key), _num(v, key + '_lo'), _num(v, key + '_hi'))}, {n} seeds "
            f"(t p {_p(_num(v, key + '_t_p'))}, Holm p {_p(holm)})")


def _final_ci(row: dict) -> str:
    return format_ci(_num(row, "final_reward_mean"), _num(row, "final_reward_ci95_lo"),
                     _num(row, "final_reward_ci95_hi"))


def _metric_name(row: dict) -> str:
    m = str(row.get("metric", "") or METRICS["train"])
    return "held-out pair accuracy" if m == METRICS["dpo"] else "held-out reward"
