"""``python -m jaxppo.sweeps.calibrate [--from SWEEP_DIR] [--n 500] [--seeds 5 10] [--out FILE.json]``:
the error rates of every verdict and interval the sweep report prints, measured on synthetic A/A sweeps.

An A/A sweep has two arms drawn from the same distribution, so every "higher"/"lower" is a false positive and
every interval should cover the true value. Each synthetic sweep is summarized by the report's own code
(:func:`jaxppo.sweeps.results.compare_arms` and :func:`jaxppo.sweeps.results.arm_stats`), and the rates written are:

- ``*_diff_t``: how often the 95% t-interval of a paired difference excludes 0 (the verdict's "higher"/"lower";
  nominal 0.05) — final value, value at 25% and 50% of the budget, AUC;
- ``*_diff_signflip``: how often the exact sign-flip p-value is < 0.05 (nominal <= 0.05; 0 when ``n <= 5``);
- ``first_passage``: how often the first-passage comparison's sign-flip p is < 0.05 (nominal <= 0.05);
- ``final_ci_coverage`` / ``auc_ci_coverage``: how often an arm's 95% t-interval covers the true mean final value
  / true AUC (nominal 0.95; the baseline's interval is the report's noise reference);
- ``legacy_efficiency_interval``: how often the pre-issue-19 data-efficiency interval
  (:mod:`jaxppo.sweeps.legacy`, bootstrap with ``--legacy-resamples`` draws) lies entirely above or below 1
  (nominal 0.05); and ``legacy_ratio_ge_2``, how often its point ratio is >= 2 (for information).

A rate passes when its count of events is within the 99.8% binomial quantile of its nominal rate over ``n`` sweeps
(false-positive rates: count <= ``binom.ppf(0.998, n, 0.05)``; coverages: misses <= the same bound), i.e. the
nominal rate plus Monte-Carlo error (0.998: about 0.05 / the 22 checks of a design, so that a correct statistic
rarely trips one of them by chance). Each check records ``ok``.

Power: for every design (``--seeds``), the smallest effect ``delta`` (a variant shifted by ``delta x / budget``:
no change at step 0, ``delta`` at the budget) at which each comparison says "higher" in >= 80% of the sweeps,
searched on a grid of multiples of the seed sd (common random numbers), and the paired t-test's analytic value
(:func:`jaxppo.sweeps.stats.min_detectable_effect`) beside it.

Noise model. Seed ``k`` of arm ``a`` at evaluation ``j``: ``y = mu_j + sd_j (sqrt(rho_s) c_kj + sqrt(1 - rho_s)
e_akj)`` with ``c`` (shared by the two arms of a seed: same evaluation key, reference evaluation and replay key)
and ``e`` (the arm's own) independent AR(1) sequences over ``j`` with coefficient ``rho_t``, unit variance;
the step-0 point is the reference evaluation and fully shared (``rho_s = 1`` there). Defaults (the quickstart
of issue 19): grid 0 and 8 evaluations up to a budget of 384 samples, ``mu`` rising from 0.25 by 0.15
(``1 - exp(-3 x / budget)``, normalised), ``sd = 0.065`` at every point, ``rho_s = 0`` (after step 0 the arms'
noise is independent, as in issue 19's review; no measured value yet, and the paired tests' level does not depend
on it, only their power, which this makes conservative), ``rho_t = 0.6``.
``--from SWEEP_DIR`` takes the grid, ``mu`` (the baseline's seed mean) and ``sd_j`` (the baseline's seed sd per
point) from a sweep's ``results.csv`` / ``summary.csv``, ``rho_t`` from the lag-1 autocorrelation of the
baseline's seed residuals, and ``rho_s`` from the correlation of the same-seed residuals of the baseline and the
other variants after step 0 (each clipped to [0, 0.95]; defaults when not estimable).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxppo.sweeps import stats
from jaxppo.sweeps.results import arm_stats, compare_arms

NOMINAL_FP = 0.05
NOMINAL_COVER = 0.95
QUANTILE = 0.998   # ~22 checks per design x 2 designs: ~5-10% chance that one trips on Monte-Carlo error alone
POWER = 0.8
PAIR_KEYS = ("final_diff", "at25_diff", "at50_diff", "auc_diff")


@dataclass(frozen=True)
class NoiseModel:
    x: tuple[float, ...]
    mu: tuple[float, ...]
    sd: tuple[float, ...]
    rho_s: float
    rho_t: float
    source: str

    def __post_init__(self):
        if not (len(self.x) == len(self.mu) == len(self.sd)) or len(self.x) < 2:
            raise ValueError(f"NoiseModel: x, mu, sd must have the same length >= 2, got {len(self.x)}, "
                             f"{len(self.mu)}, {len(self.sd)}")
        if not all(s >= 0 for s in self.sd) or not (0 <= self.rho_s <= 1) or not (-1 < self.rho_t < 1):
            raise ValueError(f"NoiseModel: sd >= 0, rho_s in [0, 1], rho_t in (-1, 1); got {self}")


def default_model(budget: float = 384.0, points: int = 8, sd: float = 0.065, rho_s: float = 0.0,
                  rho_t: float = 0.6) -> NoiseModel:
    """The stated defaults (module docstring)."""
    x = np.linspace(0.0, budget, points + 1)
    shape = (1 - np.exp(-3 * x / budget)) / (1 - math.exp(-3))
    return NoiseModel(tuple(x), tuple(0.25 + 0.15 * shape), tuple(np.full(x.size, sd)), rho_s, rho_t, "defaults")


def model_from_sweep(sweep_dir: str | Path) -> NoiseModel:
    """The noise model of a finished sweep folder (module docstring)."""
    from jaxppo.sweeps.results import read_csv

    d = Path(sweep_dir)
    for f in ("results.csv", "summary.csv"):
        if not (d / f).is_file():
            raise ValueError(f"--from {d}: no {f} (run python -m jaxppo.sweep --config FILE --results-only first)")
    summ = read_csv(d / "summary.csv")
    bases = [r["variant"] for r in summ if r.get("n_pairs") in ("0", "")]
    if len(bases) != 1:
        raise ValueError(f"--from {d}: cannot tell the baseline from summary.csv (rows with n_pairs 0: {bases})")
    base = bases[0]
    rows = [r for r in read_csv(d / "results.csv") if r["status"] == "ok" and r["reward"] not in ("", "nan")]
    curves: dict[str, dict[int, dict[float, float]]] = {}
    for r in rows:
        curves.setdefault(r["variant"], {}).setdefault(int(r["seed"]), {})[float(r["samples"])] = float(r["reward"])
    if base not in curves or len(curves[base]) < 3:
        raise ValueError(f"--from {d}: the baseline {base!r} needs >= 3 finished seeds to estimate seed noise")
    x = sorted(next(iter(curves[base].values())))
    yb = {s: np.asarray([c[xx] for xx in x]) for s, c in curves[base].items() if sorted(c) == x}
    arr = np.stack(list(yb.values()))
    mu, sd = arr.mean(0), arr.std(0, ddof=1)
    res = arr - mu
    rt = _corr(res[:, 1:-1].ravel(), res[:, 2:].ravel())
    pairs_b, pairs_v = [], []
    for v, per in curves.items():
        if v == base:
            continue
        vv = {s: np.asarray([c[xx] for xx in x]) for s, c in per.items() if sorted(c) == x and s in yb}
        if len(vv) >= 3:
            va = np.stack(list(vv.values()))
            ba = np.stack([yb[s] for s in vv])
            pairs_v.append((va - va.mean(0))[:, 1:].ravel())
            pairs_b.append((ba - ba.mean(0))[:, 1:].ravel())
    rs = _corr(np.concatenate(pairs_b), np.concatenate(pairs_v)) if pairs_b else math.nan
    dm = default_model()
    return NoiseModel(tuple(x), tuple(mu), tuple(np.maximum(sd, 1e-9)),
                      dm.rho_s if math.isnan(rs) else float(np.clip(rs, 0, 0.95)),
                      dm.rho_t if math.isnan(rt) else float(np.clip(rt, 0, 0.95)), f"sweep {d} (baseline {base})")


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 3 or np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def _ar1(rng: np.random.Generator, shape: tuple[int, ...], rho: float) -> np.ndarray:
    z = rng.standard_normal(shape)
    out = np.empty(shape)
    out[..., 0] = z[..., 0]
    for j in range(1, shape[-1]):
        out[..., j] = rho * out[..., j - 1] + math.sqrt(1 - rho * rho) * z[..., j]
    return out


def simulate(model: NoiseModel, n_seeds: int, n_sweeps: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``(variant, baseline)`` curves of ``n_sweeps`` A/A sweeps, each ``[n_sweeps, n_seeds, len(x)]``."""
    m = len(model.x)
    mu, sd = np.asarray(model.mu), np.asarray(model.sd)
    shared = _ar1(rng, (n_sweeps, n_seeds, m), model.rho_t)
    own = _ar1(rng, (2, n_sweeps, n_seeds, m), model.rho_t)
    ws = np.full(m, math.sqrt(model.rho_s))
    wo = np.full(m, math.sqrt(1 - model.rho_s))
    ws[0], wo[0] = 1.0, 0.0     # the reference evaluation at step 0 is the same in both arms of a seed
    arms = mu + sd * (ws * shared + wo * own)
    return arms[0], arms[1]


def _bound(n: int, rate: float) -> int:
    from scipy.stats import binom

    return int(binom.ppf(QUANTILE, n, rate))


def _rate(events: int, n: int, nominal_fp: float, what: str) -> dict:
    """A false-positive-type rate (events should be rare): ok when ``events <= binom.ppf(QUANTILE, n, nominal)``."""
    b = _bound(n, nominal_fp)
    return {"rate": events / n, "events": int(events), "n": n, "nominal": nominal_fp, "max_events": b,
            "ok": bool(events <= b), "what": what}


def _coverage(covered: int, n: int, what: str) -> dict:
    b = _bound(n, 1 - NOMINAL_COVER)
    return {"rate": covered / n, "events": int(n - covered), "n": n, "nominal": NOMINAL_COVER, "max_events": b,
            "ok": bool(n - covered <= b), "what": what + " (events = misses)"}


def calibrate_design(model: NoiseModel, n_seeds: int, n: int, rng: np.random.Generator, *,
                     legacy_resamples: int = 200, power_grid: int = 24) -> dict:
    """Rates and power of one design (``n_seeds`` seeds on the model's grid) over ``n`` synthetic A/A sweeps."""
    from jaxppo.sweeps.legacy import efficiency_ci

    x = np.asarray(model.x)
    yv, yb = simulate(model, n_seeds, n, rng)
    true_final = model.mu[-1]
    true_auc = stats.normalized_auc(x, model.mu)
    fp = {k: 0 for k in PAIR_KEYS}
    sf = {k: 0 for k in PAIR_KEYS}
    passage = cover_final = cover_auc = legacy_out = legacy_big = 0
    for i in range(n):
        row = compare_arms(x, yv[i], yb[i])
        for k in PAIR_KEYS:
            if not math.isnan(row[k + "_lo"]) and (row[k + "_lo"] > 0 or row[k + "_hi"] < 0):
                fp[k] += 1
            sf[k] += row[k + "_p"] < stats.ALPHA
        passage += row["passage_p"] < stats.ALPHA
        a = arm_stats(x, yb[i])
        cover_final += a["final_reward_ci95_lo"] <= true_final <= a["final_reward_ci95_hi"]
        cover_auc += a["auc_ci95_lo"] <= true_auc <= a["auc_ci95_hi"]
        if legacy_resamples:
            r, lo, hi = efficiency_ci(x, yb[i][:, -1], yv[i], x[-1], resamples=legacy_resamples, rng=rng)
            legacy_out += lo > 1 or hi < 1
            legacy_big += r >= 2
    rates = {f"{k}_t": _rate(fp[k], n, NOMINAL_FP, f"{k}: paired 95% t-interval excludes 0 ('higher'/'lower')")
             for k in PAIR_KEYS}
    rates.update({f"{k}_signflip": _rate(sf[k], n, NOMINAL_FP, f"{k}: exact sign-flip p < 0.05") for k in PAIR_KEYS})
    rates["first_passage"] = _rate(passage, n, NOMINAL_FP, "first passage to half the pooled gain: sign-flip p < 0.05")
    rates["final_ci_coverage"] = _coverage(cover_final, n, "an arm's 95% t-interval covers the true final value")
    rates["auc_ci_coverage"] = _coverage(cover_auc, n, "an arm's 95% t-interval covers the true AUC")
    legacy = {}
    if legacy_resamples:
        legacy["legacy_efficiency_interval"] = _rate(
            legacy_out, n, NOMINAL_FP, f"old data-efficiency ratio: bootstrap interval ({legacy_resamples} draws) "
            "excludes 1")
        legacy["legacy_ratio_ge_2"] = {"rate": legacy_big / n, "events": int(legacy_big), "n": n,
                                       "what": "old data-efficiency point ratio >= 2 (information)"}
    return {"n_seeds": n_seeds, "n_sweeps": n, "rates": rates, "legacy": legacy,
            "power": _power(model, x, yv, yb, n_seeds, power_grid)}


def _power(model: NoiseModel, x: np.ndarray, yv: np.ndarray, yb: np.ndarray, n_seeds: int, grid: int) -> dict:
    """Smallest ``delta`` (grid of multiples of the final seed sd) with >= 80% "higher" per comparison."""
    sd = float(model.sd[-1])
    deltas = sd * np.arange(1, grid + 1) / 4.0          # 0.25 sd ... grid/4 sd
    ramp = x / x[-1]
    found: dict[str, float | None] = {k: None for k in (*(f"{k}_t" for k in PAIR_KEYS),
                                                         *(f"{k}_signflip" for k in PAIR_KEYS), "first_passage")}
    hits_at = {}
    for dlt in deltas:
        shifted = yv + dlt * ramp
        hits = {k: 0 for k in found}
        for i in range(yv.shape[0]):
            row = compare_arms(x, shifted[i], yb[i])
            for k in PAIR_KEYS:
                hits[f"{k}_t"] += row[k + "_lo"] > 0
                hits[f"{k}_signflip"] += row[k + "_p"] < stats.ALPHA and row[k] > 0
            hits["first_passage"] += row["passage_p"] < stats.ALPHA and row["earlier"] > row["later"]
        for k, h in hits.items():
            if found[k] is None and h / yv.shape[0] >= POWER:
                found[k] = float(dlt)
                hits_at[k] = h / yv.shape[0]
        if all(v is not None for v in found.values()):
            break
    d_final = (yv[:, :, -1] - yb[:, :, -1])
    sd_d = float(np.sqrt(np.mean(np.var(d_final, axis=1, ddof=1))))
    out = {"effect": "variant + delta * samples / budget (delta at the budget, 0 at step 0)",
           "searched_up_to": float(deltas[-1]), "smallest_delta_80pct": found,
           "analytic_final_diff_t": stats.min_detectable_effect(sd_d, n_seeds) if n_seeds >= 2 else math.inf,
           "paired_sd_final": sd_d, "min_signflip_p": stats.min_sign_flip_p(n_seeds)}
    return out


def run(model: NoiseModel, seeds: Sequence[int], n: int, seed: int, legacy_resamples: int = 200) -> dict:
    """The calibration document written by the command."""
    rng = np.random.default_rng(seed)
    designs = [calibrate_design(model, k, n, rng, legacy_resamples=legacy_resamples) for k in seeds]
    ok = all(r["ok"] for d in designs for r in d["rates"].values())
    return {"model": asdict(model), "n": n, "seed": seed, "quantile": QUANTILE, "designs": designs,
            "all_ok": ok, "legacy_ok": all(d["legacy"].get("legacy_efficiency_interval", {"ok": True})["ok"]
                                          for d in designs)}


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m jaxppo.sweeps.calibrate"
    ap = argparse.ArgumentParser(prog=prog, description="False-positive rates, coverages and power of the sweep "
                                 "report's statistics on synthetic A/A sweeps.")
    ap.add_argument("--from", dest="source", default=None, help="take the noise from this sweep folder "
                    "(results.csv + summary.csv); default: the stated quickstart-like defaults")
    ap.add_argument("--points", type=int, default=8, help="defaults only: evaluations after step 0 (default 8)")
    ap.add_argument("--budget", type=float, default=384.0, help="defaults only: the budget in samples (384)")
    ap.add_argument("--sd", type=float, default=0.065, help="defaults only: the seed sd (0.065)")
    ap.add_argument("--n", type=int, default=500, help="synthetic A/A sweeps per design (default 500)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 10], help="seeds per arm of each design (5 10)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    ap.add_argument("--legacy-resamples", type=int, default=200,
                    help="bootstrap draws of the old efficiency interval (0: skip it; default 200)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout only)")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.n < 10 or any(k < 2 for k in args.seeds):
        ap.error("--n must be >= 10 and every --seeds value >= 2")
    try:
        model = (model_from_sweep(args.source) if args.source
                 else default_model(args.budget, args.points, args.sd))
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    doc = run(model, args.seeds, args.n, args.seed, args.legacy_resamples)
    text = json.dumps(doc, indent=1, sort_keys=True, default=float)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    for d in doc["designs"]:
        print(f"{d['n_seeds']} seeds, {d['n_sweeps']} A/A sweeps ({model.source}):")
        for k, r in {**d["rates"], **d["legacy"]}.items():
            flag = "" if "ok" not in r else ("ok" if r["ok"] else "FAIL")
            print(f"  {k:<28} {r['rate']:.3f} {flag}")
        p = d["power"]
        print("  80% power at delta: " + ", ".join(f"{k} {'-' if v is None else f'{v:.3f}'}"
                                                 for k, v in p["smallest_delta_80pct"].items())
              + f"; analytic final t {p['analytic_final_diff_t']:.3f}")
    print(f"all report statistics within their nominal rates: {doc['all_ok']}")
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
