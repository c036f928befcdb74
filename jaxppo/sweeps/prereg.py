"""``python -m jaxppo.sweeps.prereg FILE.yaml [--write]``: a pre-registered experiment, checked and analysed.

A pre-registration (``results/preregistered/<name>.yaml``) is committed before any of its runs and fixes what
the verdict will be read from::

    name: reuse
    hypothesis: "..."                     # in words
    sweeps:                               # level -> sweep file (one or more; the same variants and seeds in each)
      passes_1: configs/sweeps/reuse_p1.yaml
      passes_16: configs/sweeps/reuse_p16.yaml
    effects:                              # each effect: g = variant - baseline, final held-out value, per seed
      - {variant: is_token_tis, baseline: is_off}
    contrast: [passes_16, passes_1]       # optional: the primary test is g(first) - g(second), seed by seed
    seeds: 20                             # every sweep runs seeds 0 .. seeds - 1
    noise:                                # the committed sweep whose paired noise sets the power
      sweep: results/sweeps/is_onpolicy
      variant: is_token_truncate
      baseline: is_off
    smallest_effect_of_interest: 0.04     # the power is quoted for this effect
    secondary: ["..."]                    # in words; reported, never a verdict

Primary test. Without ``contrast``: for each effect, the paired t-test of ``g_k`` (``k`` the seeds finished in
both arms of the single sweep). With ``contrast = [a, b]``: the paired t-test of ``c_k = g_k(a) - g_k(b)`` over
the seeds finished in all four arms (seed ``k`` of every sweep shares the evaluation key and held-out prompts,
so ``c_k`` is paired). Several effects: their p-values are Holm-adjusted (:func:`jaxppo.sweeps.stats.holm`). The
verdict word: ``higher`` / ``lower`` when the adjusted p < 0.05, else ``no difference measured``; ``pending`` until
every run is finished.

Power (:func:`power`): the paired sd ``s`` of the final differences of ``noise.variant - noise.baseline`` in the
committed ``noise.sweep``; a contrast of two independent gains has sd ``sqrt(2) s``. The smallest effect detected
with 80% power at the 5% level with ``seeds`` pairs (:func:`jaxppo.sweeps.stats.min_detectable_effect`) and the
power at ``smallest_effect_of_interest`` (:func:`jaxppo.sweeps.stats.t_power`).

Secondary, wasted iterations (optional ``waste: {sweeps: {level: file}, variant, baseline}``): per level, the two
measures of :func:`jaxppo.sweeps.waste.run_waste` of every seed's run in both arms, their seed-paired differences
``variant - baseline`` with 95% t-intervals and paired t-test p-values, Holm-adjusted over the ``2 x levels`` tests.

``--write`` writes ``<name>.result.json`` beside the file (the power, each sweep's state and, when finished, the
primary test). Exit status 2 for a malformed file or a sweep file that disagrees with it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxppo.sweeps import stats
from jaxppo.sweeps.spec import SweepError, load_sweep

KEYS = {"name", "hypothesis", "sweeps", "effects", "contrast", "seeds", "noise", "smallest_effect_of_interest",
        "secondary", "registered", "design", "manipulation_check", "waste"}


class PreregError(ValueError):
    """A pre-registration file is malformed or disagrees with its sweep files."""


def load(path: str | Path) -> dict:
    """The pre-registration at ``path``, validated (module docstring) against its sweep files."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise PreregError(f"{p}: not found")
    doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise PreregError(f"{p}: expected a mapping")
    unknown = set(doc) - KEYS
    if unknown:
        raise PreregError(f"{p}: unknown keys {sorted(unknown)}")
    for k in ("name", "hypothesis", "sweeps", "effects", "seeds", "noise"):
        if k not in doc:
            raise PreregError(f"{p}: missing key {k!r}")
    if not isinstance(doc["sweeps"], dict) or not doc["sweeps"]:
        raise PreregError(f"{p}: sweeps must map levels to sweep files")
    contrast = doc.get("contrast")
    if contrast is not None and (len(contrast) != 2 or any(c not in doc["sweeps"] for c in contrast)):
        raise PreregError(f"{p}: contrast must name two levels of sweeps ({', '.join(doc['sweeps'])})")
    if contrast is None and len(doc["sweeps"]) != 1:
        raise PreregError(f"{p}: several sweeps need a contrast")
    seeds = list(range(int(doc["seeds"])))
    for level, f in doc["sweeps"].items():
        try:
            spec = load_sweep(f)
        except SweepError as e:
            raise PreregError(f"{p}: sweeps.{level}: {e}") from None
        if list(spec.seeds) != seeds:
            raise PreregError(f"{p}: sweeps.{level}: {f} runs seeds {list(spec.seeds)}, the pre-registration "
                              f"{doc['seeds']} seeds 0..{len(seeds) - 1}")
        if spec.primary != "final":
            raise PreregError(f"{p}: sweeps.{level}: {f} declares primary {spec.primary!r}; the pre-registered "
                              "effects are final held-out values")
        for e in doc["effects"]:
            for arm in (e["variant"], e["baseline"]):
                if arm not in spec.variants:
                    raise PreregError(f"{p}: sweeps.{level}: {f} has no variant {arm!r}")
    return doc


def _finals(sweep_dir: Path, budget: int) -> dict[str, dict[int, float]]:
    """``{variant: {seed: final value}}`` of a sweep's ``results.csv`` (finished evaluations at the budget)."""
    from jaxppo.sweeps.results import read_csv

    out: dict[str, dict[int, float]] = {}
    path = sweep_dir / "results.csv"
    if not path.is_file():
        return out
    for r in read_csv(path):
        if r["status"] == "ok" and r["reward"] not in ("", "nan") and float(r["samples"]) == budget:
            out.setdefault(r["variant"], {})[int(r["seed"])] = float(r["reward"])
    return out


def paired_sd(sweep_dir: str | Path, variant: str, baseline: str) -> tuple[float, int]:
    """The sd (ddof 1) of the seed-paired final differences ``variant - baseline`` of a committed sweep and the
    number of pairs, from its ``results.csv`` (the last evaluation point of each run)."""
    from jaxppo.sweeps.results import read_csv

    d = Path(sweep_dir)
    rows = [r for r in read_csv(d / "results.csv") if r["status"] == "ok" and r["reward"] not in ("", "nan")]
    last = max(float(r["samples"]) for r in rows)
    fin = _finals(d, int(last))
    seeds = sorted(set(fin.get(variant, {})) & set(fin.get(baseline, {})))
    if len(seeds) < 3:
        raise PreregError(f"noise: {d} has {len(seeds)} seeds finished in both {variant} and {baseline} (< 3)")
    diff = np.asarray([fin[variant][s] - fin[baseline][s] for s in seeds])
    return float(diff.std(ddof=1)), len(seeds)


def power(doc: dict) -> dict:
    """The power computation of a pre-registration (module docstring)."""
    n = doc["noise"]
    s, pairs = paired_sd(n["sweep"], n["variant"], n["baseline"])
    sd = s * math.sqrt(2.0) if doc.get("contrast") else s
    seeds = int(doc["seeds"])
    out = {"noise_sweep": n["sweep"], "noise_pairs": pairs, "paired_sd": s, "test_sd": sd, "seeds": seeds,
           "mde_80": stats.min_detectable_effect(sd, seeds), "mde_80_at_10_seeds": stats.min_detectable_effect(sd, 10)}
    eff = doc.get("smallest_effect_of_interest")
    if eff is not None:
        out["smallest_effect_of_interest"] = float(eff)
        out["power_at_smallest_effect"] = stats.t_power(float(eff), sd, seeds)
    return out


def analyse(doc: dict) -> dict:
    """The primary test of a pre-registration from its sweeps' committed ``results.csv`` (module docstring);
    ``{"state": "pending", ...}`` until every run of every named arm is finished."""
    seeds = list(range(int(doc["seeds"])))
    finals, state = {}, {}
    for level, f in doc["sweeps"].items():
        spec = load_sweep(f)
        fin = _finals(Path(spec.output_dir), spec.budget_samples)
        finals[level] = fin
        arms = {a for e in doc["effects"] for a in (e["variant"], e["baseline"])}
        state[level] = {a: len(fin.get(a, {})) for a in sorted(arms)}
    done = all(n == len(seeds) for lv in state.values() for n in lv.values())
    res: dict = {"state": "finished" if done else "pending", "finished_runs": state}
    if not done:
        return res
    tests = []
    for e in doc["effects"]:
        v, b = e["variant"], e["baseline"]
        if doc.get("contrast"):
            hi, lo = doc["contrast"]
            d = np.asarray([(finals[hi][v][k] - finals[hi][b][k]) - (finals[lo][v][k] - finals[lo][b][k])
                            for k in seeds])
            what = f"({v} - {b}) at {hi} minus at {lo}"
        else:
            (level,) = doc["sweeps"]
            d = np.asarray([finals[level][v][k] - finals[level][b][k] for k in seeds])
            what = f"{v} - {b}"
        m, lo_ci, hi_ci = stats.t_interval(d)
        tests.append({"effect": what, "mean": m, "lo": lo_ci, "hi": hi_ci, "p": stats.paired_t_pvalue(d),
                      "n": int(d.size)})
    for t, p in zip(tests, stats.holm([t["p"] for t in tests])):
        t["p_holm"] = p
        t["verdict"] = ("no difference measured" if not p < stats.ALPHA
                        else ("higher" if t["mean"] > 0 else "lower"))
    res["primary"] = tests
    if doc.get("waste"):
        res["secondary_waste"] = waste_analysis(doc["waste"], seeds)
    return res


def waste_analysis(spec: dict, seeds: list[int]) -> list[dict] | str:
    """The wasted-iterations secondary (module docstring): per noise level and metric the seed-paired difference
    variant - baseline (``mean``, t-interval ``lo``/``hi``, ``p``; ``p_holm`` over all of them) and the baseline's
    mean over seeds (``baseline_mean``); ``"pending"`` until every run it reads is finished."""
    from jaxppo.sweeps.waste import run_waste
    from jaxppo.trainer.metrics_log import read_jsonl

    tests = []
    for level, f in spec["sweeps"].items():
        sp = load_sweep(f)
        per_arm = {}
        for arm in (spec["variant"], spec["baseline"]):
            vals = []
            for k in seeds:
                run = Path(sp.output_dir) / "runs" / arm / f"seed{k}"
                if not (run / "summary.json").is_file():
                    return "pending"
                vals.append(run_waste(read_jsonl(run / "metrics.jsonl")))
            per_arm[arm] = vals
        for metric in ("zero_grad_token_frac", "low_grad_update_frac"):
            d = np.asarray([v[metric] - b[metric] for v, b in zip(per_arm[spec["variant"]], per_arm[spec["baseline"]])])
            m, lo, hi = stats.t_interval(d)
            tests.append({"level": level, "metric": metric, "mean": m, "lo": lo, "hi": hi,
                          "p": stats.paired_t_pvalue(d), "n": int(d.size),
                          "baseline_mean": float(np.mean([b[metric] for b in per_arm[spec["baseline"]]]))})
    for t, p in zip(tests, stats.holm([t["p"] for t in tests])):
        t["p_holm"] = p
    return tests


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m jaxppo.sweeps.prereg"
    ap = argparse.ArgumentParser(prog=prog, description="Check a pre-registered experiment against its sweep files, "
                                 "compute its power from committed noise and, once its sweeps are finished, its "
                                 "primary test.")
    ap.add_argument("file", help="results/preregistered/<name>.yaml")
    ap.add_argument("--write", action="store_true", help="write <name>.result.json beside the file")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        doc = load(args.file)
        out = {"name": doc["name"], "power": power(doc), **analyse(doc)}
    except (PreregError, SweepError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=1, sort_keys=True, default=float)
    if args.write:
        Path(args.file).with_suffix(".result.json").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
