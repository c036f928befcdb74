"""``python -m jaxppo.sweeps.calibrate [--from SWEEP_DIR] [--n 2000] [--seeds 5 10] [--variants K] [--out FILE.json]``:
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
- ``legacy_efficiency_interval``: how often the withdrawn data-efficiency interval
  (:mod:`jaxppo.sweeps.legacy`, bootstrap with ``--legacy-resamples`` draws) lies entirely above or below 1
  (nominal 0.05); and ``legacy_ratio_ge_2``, how often its point ratio is >= 2 (for information).

Family-wise rates (:mod:`jaxppo.sweeps.family`), over sweeps of ``K`` variants against one baseline (``--variants``;
with ``--from``, the sweep's own ``K``):

- ``fwer_primary``: how often any variant's primary verdict (Holm-adjusted over the ``K`` variants) claims a
  difference (nominal <= 0.05);
- ``fwer_secondary``: how often any secondary test (Holm-adjusted over the ``4 K`` of them) has p < 0.05
  (nominal <= 0.05);
- ``uncorrected_any`` (information, not checked): how often any of the five tests of any variant has a raw
  p < 0.05, i.e. what reading every test as a finding would give.

Rule ("within nominal"). Each rate is ``k`` events in ``n`` synthetic sweeps (coverages: ``k`` misses, nominal
0.05). It is within nominal when both hold: (a) the lower end of its exact 99% Clopper-Pearson interval
(:func:`jaxppo.sweeps.stats.clopper_pearson`) is not above the nominal rate, and (b) its point estimate ``k / n`` is
at most the nominal rate plus 2.576 Monte Carlo standard errors, ``sqrt(nominal (1 - nominal) / n)``. A rate below
nominal passes (a level-0.05 test may reject less often; such a rate is marked ``conservative`` when the interval's
upper end is below nominal). Each check records ``ok``, its interval and the bound of (b).

Power: for every normal-noise design (``--seeds``; over its first 500 sweeps), the smallest effect ``delta`` (a
variant shifted by ``delta x / budget``: no change at step 0, ``delta`` at the budget) at which each comparison says "higher" in >= 80% of the sweeps,
searched on a grid of multiples of the seed sd (common random numbers), and the paired t-test's analytic value
(:func:`jaxppo.sweeps.stats.min_detectable_effect`) beside it.

Noise model. Seed ``k`` of arm ``a`` at evaluation ``j``: ``y = mu_j + sd_j (sqrt(rho_s) c_kj + sqrt(1 - rho_s)
e_akj)`` with ``c`` (shared by all arms of a seed: same evaluation key, reference evaluation and replay key)
and ``e`` (the arm's own) independent AR(1) sequences over ``j`` with coefficient ``rho_t``, unit variance, whose
innovations are standard normal (``tails = "normal"``) or Student t with 4 degrees of freedom scaled to unit
variance (``tails = "t4"``, heavy tails: every design is run with both);
the step-0 point is the reference evaluation and fully shared (``rho_s = 1`` there). Defaults (a quickstart-like
design): grid 0 and 8 evaluations up to a budget of 384 samples, ``mu`` rising from 0.25 by 0.15
(``1 - exp(-3 x / budget)``, normalised), ``sd = 0.065`` at every point, ``rho_s = 0`` (after step 0 the arms'
noise is independent; and the paired tests' level does not depend
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

from jaxppo.sweeps import family, stats
from jaxppo.sweeps.results import arm_stats, compare_arms

NOMINAL_FP = 0.05
NOMINAL_COVER = 0.95
INTERVAL = 0.99    # the Clopper-Pearson interval of rule (a)
MC_Z = 2.576       # rule (b): Monte Carlo standard errors above nominal
TAILS = ("normal", "t4")
POWER = 0.8
POWER_SWEEPS = 500  # the power search uses the first 500 synthetic sweeps of a normal-noise design
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


def _innovations(rng: np.random.Generator, shape: tuple[int, ...], tails: str) -> np.ndarray:
    if tails == "normal":
        return rng.standard_normal(shape)
    if tails == "t4":
        return rng.standard_t(4, shape) / math.sqrt(2.0)   # Var t_4 = 4 / (4 - 2) = 2
    raise ValueError(f"tails must be one of {TAILS}, got {tails!r}")


def _ar1(rng: np.random.Generator, shape: tuple[int, ...], rho: float, tails: str = "normal") -> np.ndarray:
    z = _innovations(rng, shape, tails)
    out = np.empty(shape)
    out[..., 0] = z[..., 0]
    for j in range(1, shape[-1]):
        out[..., j] = rho * out[..., j - 1] + math.sqrt(1 - rho * rho) * z[..., j]
    return out


def simulate_arms(model: NoiseModel, n_seeds: int, n_sweeps: int, rng: np.random.Generator, arms: int = 2,
                  tails: str = "normal") -> np.ndarray:
    """Curves of ``n_sweeps`` A/A sweeps with ``arms`` arms of one distribution, ``[arms, n_sweeps, n_seeds,
    len(x)]`` (module docstring: the seed noise ``c`` is shared by every arm of a seed)."""
    m = len(model.x)
    mu, sd = np.asarray(model.mu), np.asarray(model.sd)
    shared = _ar1(rng, (n_sweeps, n_seeds, m), model.rho_t, tails)
    own = _ar1(rng, (arms, n_sweeps, n_seeds, m), model.rho_t, tails)
    ws = np.full(m, math.sqrt(model.rho_s))
    wo = np.full(m, math.sqrt(1 - model.rho_s))
    ws[0], wo[0] = 1.0, 0.0     # the reference evaluation at step 0 is the same in every arm of a seed
    return mu + sd * (ws * shared + wo * own)


def simulate(model: NoiseModel, n_seeds: int, n_sweeps: int, rng: np.random.Generator,
             tails: str = "normal") -> tuple[np.ndarray, ...]:
    """``(variant, baseline)`` curves of ``n_sweeps`` two-arm A/A sweeps, each ``[n_sweeps, n_seeds, len(x)]``."""
    a = simulate_arms(model, n_seeds, n_sweeps, rng, 2, tails)
    return a[0], a[1]


def within_nominal(events: int, n: int, nominal: float) -> dict:
    """The rule of the module docstring for ``events`` in ``n`` sweeps against ``nominal``: ``ok``, the exact
    interval, the largest point estimate allowed by (b), and whether the rate is ``conservative``."""
    lo, hi = stats.clopper_pearson(int(events), n, INTERVAL)
    point = events / n
    bound = nominal + MC_Z * math.sqrt(nominal * (1 - nominal) / n)
    return {"ok": bool(lo <= nominal and point <= bound), "interval": [lo, hi], "interval_level": INTERVAL,
            "max_rate": bound, "conservative": bool(hi < nominal)}


def _rate(events: int, n: int, nominal_fp: float, what: str) -> dict:
    """A false-positive-type rate (events should be rare), judged by :func:`within_nominal`."""
    return {"rate": events / n, "events": int(events), "n": n, "nominal": nominal_fp,
            **within_nominal(events, n, nominal_fp), "what": what}


def _coverage(covered: int, n: int, what: str) -> dict:
    misses = n - covered
    return {"rate": covered / n, "events": int(misses), "n": n, "nominal": NOMINAL_COVER,
            **within_nominal(misses, n, 1 - NOMINAL_COVER), "what": what + " (events = misses)"}


def calibrate_design(model: NoiseModel, n_seeds: int, n: int, rng: np.random.Generator, *,
                     legacy_resamples: int = 200, power_grid: int = 24, variants: int = 1,
                     primary: str = family.PRIMARY_DEFAULT, tails: str = "normal") -> dict:
    """Rates and power of one design (``n_seeds`` seeds on the model's grid, ``variants`` variants against one
    baseline, innovations ``tails``) over ``n`` synthetic A/A sweeps. The per-test rates, coverages, legacy
    interval and power are those of the first variant against the baseline; the family-wise rates are over all
    variants (module docstring)."""
    from jaxppo.sweeps.legacy import efficiency_ci

    if variants < 1:
        raise ValueError(f"calibrate_design: variants must be >= 1, got {variants}")
    family.check_primary(primary)
    x = np.asarray(model.x)
    arms = simulate_arms(model, n_seeds, n, rng, variants + 1, tails)
    yb, yv = arms[0], arms[1]
    true_final = model.mu[-1]
    true_auc = stats.normalized_auc(x, model.mu)
    fp = {k: 0 for k in PAIR_KEYS}
    sf = {k: 0 for k in PAIR_KEYS}
    fw = {"primary": 0, "secondary": 0, "uncorrected": 0}
    secondary = [t for t in family.TESTS if t != primary]
    passage = cover_final = cover_auc = legacy_out = legacy_big = 0
    for i in range(n):
        rows = [{"variant": "base", "n_pairs": 0}]
        for a in range(1, variants + 1):
            rows.append({"variant": f"v{a}", **compare_arms(x, arms[a, i], yb[i])})
        rows = family.apply(rows, "base", primary)
        fw["primary"] += family.any_claim(rows, "base", [primary], adjusted=True)
        fw["secondary"] += family.any_claim(rows, "base", secondary, adjusted=True)
        fw["uncorrected"] += family.any_claim(rows, "base", list(family.TESTS), adjusted=False)
        row = rows[1]
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
    family_rates = {
        "fwer_primary": _rate(fw["primary"], n, NOMINAL_FP, f"any of {variants} variants' primary verdict "
                              f"({primary}, Holm over the variants) claims a difference"),
        "fwer_secondary": _rate(fw["secondary"], n, NOMINAL_FP, f"any of the {4 * variants} secondary tests "
                                "(Holm over them) has p < 0.05"),
    }
    uncorrected = {"rate": fw["uncorrected"] / n, "events": int(fw["uncorrected"]), "n": n,
                   "interval": list(stats.clopper_pearson(fw["uncorrected"], n, INTERVAL)),
                   "what": f"any raw p < 0.05 among the 5 tests of {variants} variants, no correction (information)"}
    legacy = {}
    if legacy_resamples:
        legacy["legacy_efficiency_interval"] = _rate(
            legacy_out, n, NOMINAL_FP, f"old data-efficiency ratio: bootstrap interval ({legacy_resamples} draws) "
            "excludes 1")
        legacy["legacy_ratio_ge_2"] = {"rate": legacy_big / n, "events": int(legacy_big), "n": n,
                                       "what": "old data-efficiency point ratio >= 2 (information)"}
    return {"n_seeds": n_seeds, "n_sweeps": n, "variants": variants, "primary": primary, "tails": tails,
            "rates": rates, "family": family_rates, "uncorrected_any": uncorrected, "legacy": legacy,
            "power": _power(model, x, yv[:POWER_SWEEPS], yb[:POWER_SWEEPS], n_seeds, power_grid)
            if tails == "normal" else None}


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
           "searched_up_to": float(deltas[-1]) if deltas.size else 0.0, "smallest_delta_80pct": found,
           "analytic_final_diff_t": stats.min_detectable_effect(sd_d, n_seeds) if n_seeds >= 2 else math.inf,
           "paired_sd_final": sd_d, "min_signflip_p": stats.min_sign_flip_p(n_seeds)}
    return out


def run(model: NoiseModel, seeds: Sequence[int], n: int, seed: int, legacy_resamples: int = 200, *,
        variants: int = 1, primary: str = family.PRIMARY_DEFAULT, tails: Sequence[str] = ("normal",),
        power_grid: int = 24) -> dict:
    """The calibration document written by the command: one design per seed count and tail shape
    (``power_grid = 0``: no simulated power search). ``all_ok``: every checked rate within nominal; ``family_ok``:
    the family-wise rates within nominal."""
    rng = np.random.default_rng(seed)
    designs = [calibrate_design(model, k, n, rng, legacy_resamples=legacy_resamples if t == "normal" else 0,
                                variants=variants, primary=primary, tails=t, power_grid=power_grid)
               for k in seeds for t in tails]
    ok = all(r["ok"] for d in designs for r in (*d["rates"].values(), *d["family"].values()))
    return {"model": asdict(model), "n": n, "seed": seed, "variants": variants, "primary": primary,
            "rule": {"interval_level": INTERVAL, "mc_z": MC_Z, "nominal": NOMINAL_FP}, "designs": designs,
            "all_ok": ok, "family_ok": all(r["ok"] for d in designs for r in d["family"].values()),
            "legacy_ok": all(d["legacy"].get("legacy_efficiency_interval", {"ok": True})["ok"] for d in designs)}


def sweep_design(sweep_dir: str | Path) -> dict:
    """What ``--from`` reads of a finished sweep besides its noise: the number of non-baseline variants
    (``summary.csv``), the seeds finished in the baseline (``results.csv``) and the primary test (``summary.csv``'s
    ``primary`` column, else ``final``)."""
    from jaxppo.sweeps.results import read_csv

    d = Path(sweep_dir)
    summ = read_csv(d / "summary.csv")
    base = [r["variant"] for r in summ if r.get("n_pairs") in ("0", "")]
    prim = next((r.get("primary") for r in summ if r.get("primary")), None) or family.PRIMARY_DEFAULT
    seeds = {r["seed"] for r in read_csv(d / "results.csv") if base and r["variant"] == base[0]
             and r.get("status", "ok") == "ok"}
    return {"variants": max(1, len(summ) - len(base)), "seeds": len(seeds), "primary": prim}


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m jaxppo.sweeps.calibrate"
    ap = argparse.ArgumentParser(prog=prog, description="False-positive rates (single and family-wise), coverages "
                                 "and power of the sweep report's statistics on synthetic A/A sweeps.")
    ap.add_argument("--from", dest="source", default=None, help="take the noise, the number of variants, the seed "
                    "count and the primary test from this sweep folder (results.csv + summary.csv); default: the "
                    "stated quickstart-like defaults")
    ap.add_argument("--points", type=int, default=8, help="defaults only: evaluations after step 0 (default 8)")
    ap.add_argument("--budget", type=float, default=384.0, help="defaults only: the budget in samples (384)")
    ap.add_argument("--sd", type=float, default=0.065, help="defaults only: the seed sd (0.065)")
    ap.add_argument("--n", type=int, default=2000, help="synthetic A/A sweeps per design (default 2000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="seeds per arm of each design (default: the sweep's with --from, else 5 10)")
    ap.add_argument("--variants", type=int, default=None,
                    help="variants against the baseline (default: the sweep's with --from, else 1)")
    ap.add_argument("--primary", default=None, choices=list(family.TESTS),
                    help="the primary test (default: the sweep's with --from, else final)")
    ap.add_argument("--tails", nargs="+", default=list(TAILS), choices=list(TAILS),
                    help="innovation shapes, one design each (default: normal t4)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    ap.add_argument("--legacy-resamples", type=int, default=200,
                    help="bootstrap draws of the old efficiency interval (0: skip it; default 200)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout only)")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        model = (model_from_sweep(args.source) if args.source
                 else default_model(args.budget, args.points, args.sd))
        design = sweep_design(args.source) if args.source else {"variants": 1, "seeds": 0, "primary": "final"}
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    seeds = args.seeds or ([design["seeds"]] if design["seeds"] >= 2 else [5, 10])
    variants = args.variants or design["variants"]
    if args.n < 10 or any(k < 2 for k in seeds) or variants < 1:
        ap.error("--n must be >= 10, every --seeds value >= 2 and --variants >= 1")
    doc = run(model, seeds, args.n, args.seed, args.legacy_resamples, variants=variants,
              primary=args.primary or design["primary"], tails=args.tails)
    text = json.dumps(doc, indent=1, sort_keys=True, default=float)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    for d in doc["designs"]:
        print(f"{d['n_seeds']} seeds, {d['variants']} variant(s), {d['tails']} noise, {d['n_sweeps']} A/A sweeps "
              f"({model.source}):")
        for k, r in {**d["family"], **d["rates"], **d["legacy"]}.items():
            flag = "" if "ok" not in r else ("ok" if r["ok"] else "FAIL")
            ci = f" [{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]" if "interval" in r else ""
            print(f"  {k:<28} {r['rate']:.3f}{ci} {flag}")
        u = d["uncorrected_any"]
        print(f"  {'uncorrected_any (info)':<28} {u['rate']:.3f} [{u['interval'][0]:.3f}, {u['interval'][1]:.3f}]")
        p = d["power"]
        if p is None:
            continue
        print("  80% power at delta: " + ", ".join(f"{k} {'-' if v is None else f'{v:.3f}'}"
                                                 for k, v in p["smallest_delta_80pct"].items())
              + f"; analytic final t {p['analytic_final_diff_t']:.3f}")
    print(f"family-wise rates within nominal: {doc['family_ok']}; every rate within nominal: {doc['all_ok']}")
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
