"""``python -m jaxppo.sweeps.report [SWEEP ...] [--output-root results/sweeps] [--out docs/results.md] [--print]``.

The Results tables of finished sweeps, generated only from committed files: ``<output_root>/<stem>/summary.csv``
(written by ``python -m jaxppo.sweep --config SWEEP``), the runs' ``metrics.jsonl`` under it (behaviour mismatch)
and the sweep's own A/A calibration ``<output_root>/<stem>/calibration.json`` (``--calibrate`` writes it first:
``python -m jaxppo.sweeps.calibrate --from <output_root>/<stem>``, the noise model fitted to that sweep, its number
of variants, seeds and primary test, normal and heavy-tailed noise). Per sweep, one table:

| variant | seeds | final reward [95% CI] | seed sd | final KL | paired final diff [95% CI], p | AUC diff [95% CI] |
first reaches target: earlier/later/same (median samples) | behaviour mismatch at step 1 |

- seeds: finished seeds / the sweep file's seeds, ``(k failed)`` when some failed;
- final reward (or DPO's held-out pair accuracy, named in the heading): mean over finished seeds with its 95%
  t-interval; seed sd (ddof 1): the spread of one recipe across seeds — the baseline's row is the noise reference;
- the paired columns compare the variant with the baseline seed by seed (:mod:`jaxppo.sweeps.results`): the
  difference of the final value with its 95% t-interval and exact sign-flip p-value, the AUC difference, and the
  first-passage comparison to half the pooled gain (seeds where the variant got there at an earlier / later / the
  same evaluation, sign-flip p, the variant's and the baseline's median grid samples; ``<= x_1`` when it was
  already there at the first evaluation, ``> budget`` when the median seed never got there);
- behaviour mismatch at update step 1 (:func:`jaxppo.sweeps.results.mismatch`): ``rollout_corr/kl`` where logged,
  else the token weights' ESS/N, else ``n/a``.

Under each table: the power line (the paired t-test's smallest final difference detected with 80% power at the
5% level, :func:`jaxppo.sweeps.stats.min_detectable_effect`, from the sweep's pooled sd of the paired final
differences and its seed count; the sign-flip test's smallest possible p), the calibration line
(:func:`calibration_line`: the family-wise false-claim rates of the primary verdicts and of the secondary tests on
synthetic A/A sweeps of this sweep's noise, with their exact intervals and whether they are within nominal by the
rule of :mod:`jaxppo.sweeps.calibrate`), the evaluation-noise line (:func:`noise_line`, from ``results.csv``: the
baseline's spread over seeds at 0 samples against its final seed sd), and one verdict line per variant
(:func:`jaxppo.sweeps.results.verdict`: the primary test gives the word, Holm-adjusted over the variants; the
secondary tests follow, Holm-adjusted together; :mod:`jaxppo.sweeps.family`). A sweep without ``summary.csv`` is
listed as "not run".

The block replaces the text between ``<!-- sweep-results:begin -->`` and ``<!-- sweep-results:end -->`` in
``--out`` (default ``docs/results.md``; created with the markers when missing; ``--readme FILE`` is the same
option under its old name); ``--print`` only prints it. Exit status 2 on a bad sweep file or broken markers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxppo.sweeps import family, stats
from jaxppo.sweeps.results import (_float, format_ci, initial_eval_sd, mismatch, read_csv, summary_by_variant,
                                   verdict)
from jaxppo.sweeps.spec import DEFAULT_ROOT, SweepError, load_sweep

# the sweeps of the four notebooks, in the Results order (quickstart_replay is the SmolLM2-135M one), then the
# finished sweeps of the pre-registered experiments (results/preregistered/)
DEFAULT_SWEEPS = tuple(f"configs/sweeps/{n}.yaml" for n in (
    "is_onpolicy", "is_offpolicy_t1.5", "is_offpolicy_t0.7", "per_decay", "stale_reuse", "quickstart_replay",
    "pf_filters", "critic_free", "reuse_p1", "reuse_p4", "reuse_p16", "offpolicy_other", "noisy_sd0",
    "noisy_sd05", "noisy_sd10"))
DEFAULT_OUT = "docs/results.md"
CALIBRATION_FILE = "calibration.json"   # in each sweep's output folder
BEGIN, END = "<!-- sweep-results:begin -->", "<!-- sweep-results:end -->"
HEADER = ("variant", "seeds", "final [95% CI]", "seed sd", "final KL", "paired final diff [95% CI], p",
          "AUC diff [95% CI]", "first reaches target: earlier/later/same, p (median samples)",
          "behaviour mismatch at step 1")
def rule(primary: str) -> str:
    """The sentence above a sweep's verdict lines."""
    return (f"Verdicts (primary test: {family.NAMES[primary]}, seed-paired, p-values Holm-adjusted over the sweep's "
            'variants: "higher"/"lower" when the adjusted p < 0.05, else "no difference measured"; the secondary tests '
            "are Holm-adjusted together and describe, they do not decide):")


def _mismatch_cell(m: dict) -> str:
    if "rollout_corr/kl" in m:
        return f"rollout_corr/kl {m['rollout_corr/kl']:.4f}"
    if "ess" in m:
        return f"ESS/N {m['ess']:.3f}"
    return "n/a"


def _p(x: float) -> str:
    return "" if math.isnan(x) else (f"p {x:.3f}" if x >= 0.001 else f"p {x:.1e}")


def _median(x: float, first: float, budget: float) -> str:
    if math.isnan(x):
        return f"> {budget:g}"
    return f"<= {x:g}" if x <= first else f"{x:g}"


def _passage_cell(r: dict, first: float, budget: float) -> str:
    if math.isnan(_float(r.get("target"))):
        return ""
    return (f"{int(_float(r['earlier']))}/{int(_float(r['later']))}/{int(_float(r['ties']))}, "
            f"{_p(_float(r['passage_p'])) or 'p n/a'} ({_median(_float(r['median_samples_to_target']), first, budget)}"
            f" vs {_median(_float(r['baseline_median_samples_to_target']), first, budget)})")


def power_line(rows: Sequence[dict], baseline: dict | None = None) -> str:
    """The line printed under a sweep's table (module docstring). When every paired difference is exactly 0 (the
    arms ran the same computation, e.g. an A/A sweep on a deterministic backend) the power is quoted for
    independent arms at the baseline's seed sd instead (paired sd ``sqrt(2) x seed sd``)."""
    num = den = 0.0
    ns = []
    for r in rows:
        n, sd = _float(r.get("n_pairs")), _float(r.get("final_diff_sd"))
        if n >= 2 and math.isfinite(sd):
            num += (n - 1) * sd * sd
            den += n - 1
            ns.append(int(n))
    if not ns:
        return "Power: not measurable (no variant has 2 seeds finished in both arms)."
    sd_d, n = math.sqrt(num / den), min(ns)
    seed_sd = _float((baseline or {}).get("final_seed_sd"))
    if sd_d > 0:
        line = (f"Power: with {n} paired seeds and the pooled sd {sd_d:.4f} of the paired final differences, the "
                f"paired t-test detects a final difference of {stats.min_detectable_effect(sd_d, n):.3f} with 80% "
                "power at the 5% level")
    elif math.isfinite(seed_sd) and seed_sd > 0:
        line = (f"Power: every paired final difference is exactly 0 (the arms ran the same computation); with "
                f"independent arms at the baseline's seed sd {seed_sd:.4f}, {n} paired seeds would detect a final "
                f"difference of {stats.min_detectable_effect(math.sqrt(2) * seed_sd, n):.3f} with 80% power at the 5% "
                "level")
    else:
        line = "Power: not estimable (every paired final difference and the baseline's seed sd are 0)"
    line += (f"; the exact sign-flip test's smallest p is {stats.min_sign_flip_p(n):.4g}"
             + (" (it cannot reach 0.05 with this many seeds)" if stats.min_sign_flip_p(n) > stats.ALPHA else "") + ".")
    return line


def calibration_line(cal: dict | None, path: str) -> str:
    """The calibration line under a sweep's table (module docstring), from the document of
    ``python -m jaxppo.sweeps.calibrate --from`` (``None``: not calibrated)."""
    if cal is None:
        return f"A/A calibration: not run for this sweep (no {path}; python -m jaxppo.sweeps.report --calibrate)."
    parts = []
    for d in cal["designs"]:
        fp, fs, u = d["family"]["fwer_primary"], d["family"]["fwer_secondary"], d["uncorrected_any"]
        parts.append(f"{d['tails']} noise: primary {_pct(fp)}, secondary {_pct(fs)} (uncorrected, any test: "
                     f"{u['rate']:.1%})")
    rule = cal.get("rule", {})
    return (f"A/A calibration ({path}: {cal['n']} synthetic sweeps per design with this sweep's fitted noise, "
            f"{cal['variants']} variant(s), {cal['designs'][0]['n_seeds']} seeds, primary {cal['primary']}): "
            f"family-wise false-claim rates, {'; '.join(parts)}; within the nominal 5% (exact "
            f"{rule.get('interval_level', 0.99):.0%} interval's lower end <= 5% and rate <= 5% + "
            f"{rule.get('mc_z', 2.576)} Monte Carlo errors): {'yes' if cal.get('family_ok') else 'NO'}; every single "
            f"test and coverage: {'yes' if cal.get('all_ok') else 'NO'}.")


def _pct(r: dict) -> str:
    lo, hi = r["interval"]
    return f"{r['rate']:.1%} [{lo:.1%}, {hi:.1%}]"


def noise_line(results: Sequence[dict], baseline: str, baseline_row: dict) -> str:
    """The evaluation-noise line under a sweep's table: the sd over seeds of the baseline's evaluation at 0
    samples (the same initial policy, each seed's own evaluation key: the noise of one evaluation,
    :func:`jaxppo.sweeps.results.initial_eval_sd`) against the baseline's final seed sd, which contains it."""
    sd0, n = initial_eval_sd(results, baseline)
    final = _float(baseline_row.get("final_seed_sd"))
    if math.isnan(sd0) or math.isnan(final):
        return f"Evaluation noise: not measurable ({n} seeds evaluated at 0 samples)."
    share = f"; the evaluation alone is {sd0 * sd0 / (final * final):.0%} of the final seed variance" if final > 0 else ""
    return (f"Evaluation noise: at 0 samples (the same initial policy, each seed's own evaluation key) the held-out "
            f"value varies with sd {sd0:.4f} over {n} seeds, against the baseline's final seed sd {final:.4f}{share}.")


def sweep_report(sweep_file: str | Path, output_root: str | Path) -> list[str]:
    """The markdown lines of one sweep (heading, table, power and calibration lines, verdicts); ``SweepError``
    for an invalid sweep file."""
    spec = load_sweep(sweep_file)
    out = Path(output_root) / Path(sweep_file).stem
    path = out / "summary.csv"
    metric = "held-out pair accuracy" if spec.command == "dpo" else "held-out reward"
    head = [f"#### {spec.name} ({metric}; baseline {spec.baseline}; primary test {spec.primary}; "
            f"{spec.budget_samples} samples, evaluated every {spec.eval.every_samples})", ""]
    if not path.is_file():
        return [*head, f"not run (no {path})", ""]
    rows = read_csv(path)
    by_var = summary_by_variant(rows)
    mism = mismatch(out, list(by_var), spec.seeds, step=1)
    table = []
    for v, r in by_var.items():
        n_ok, n_failed = int(float(r["n_seeds"])), int(float(r["n_failed"]))
        seeds = f"{n_ok}/{len(spec.seeds)}" + (f" ({n_failed} failed)" if n_failed else "")
        kl, sd = _float(r["final_kl_mean"]), _float(r["final_seed_sd"])
        base = v == spec.baseline
        table.append((v + (" (baseline)" if base else ""), seeds,
                      format_ci(r["final_reward_mean"], r["final_reward_ci95_lo"], r["final_reward_ci95_hi"]),
                      "n/a" if math.isnan(sd) else f"{sd:.3f}", "n/a" if math.isnan(kl) else f"{kl:.4f}",
                      "" if base else f"{format_ci(r['final_diff'], r['final_diff_lo'], r['final_diff_hi'])}, "
                                      f"{_p(_float(r['final_diff_p'])) or 'p n/a'}",
                      "" if base else format_ci(r["auc_diff"], r["auc_diff_lo"], r["auc_diff_hi"]),
                      "" if base else _passage_cell(r, spec.eval.every_samples, spec.budget_samples),
                      _mismatch_cell(mism[v])))
    lines = [*head, *render_table(table), ""]
    if spec.baseline not in by_var:
        return [*lines, f"baseline {spec.baseline!r} is not in {path}", ""]
    others = [r for v, r in by_var.items() if v != spec.baseline]
    cal_path = out / CALIBRATION_FILE
    cal = json.loads(cal_path.read_text(encoding="utf-8")) if cal_path.is_file() else None
    lines += [power_line(others, by_var[spec.baseline]), "", calibration_line(cal, cal_path.as_posix()), ""]
    if (out / "results.csv").is_file():
        lines += [noise_line(read_csv(out / "results.csv"), spec.baseline, by_var[spec.baseline]), ""]
    lines += [rule(spec.primary),
              *(f"- {verdict(rows, v, spec.baseline, spec.primary)}" for v in by_var if v != spec.baseline), ""]
    return lines


def calibrate_sweep(sweep_file: str | Path, output_root: str | Path, n: int = 2000, seed: int = 0) -> Path | None:
    """Run the A/A calibration of one finished sweep (``python -m jaxppo.sweeps.calibrate --from``: its fitted
    noise, variants, seeds and primary test; normal and heavy-tailed noise; no simulated power search, the power
    line is analytic) into its ``calibration.json``; ``None`` when the sweep has no ``summary.csv``."""
    from jaxppo.sweeps import calibrate

    spec = load_sweep(sweep_file)
    out = Path(output_root) / Path(sweep_file).stem
    if not (out / "summary.csv").is_file():
        return None
    model = calibrate.model_from_sweep(out)
    design = calibrate.sweep_design(out)
    seeds = [design["seeds"]] if design["seeds"] >= 2 else [len(spec.seeds)]
    doc = calibrate.run(model, seeds, n, seed, legacy_resamples=0, variants=design["variants"],
                        primary=spec.primary, tails=calibrate.TAILS, power_grid=0)
    doc["model"]["source"] = f"sweep {out.as_posix()} (baseline {spec.baseline})"
    path = out / CALIBRATION_FILE
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=float) + "\n", encoding="utf-8")
    return path


def render_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, columns padded to a common width."""
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(HEADER), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def replace_between_markers(text: str, block: str, *, where: str, markers: tuple[str, str] = (BEGIN, END)) -> str:
    """``text`` with everything between the begin and end markers replaced by ``block`` (markers kept, each on
    its own line); ``ValueError`` naming ``where`` when a marker is missing, repeated or out of order."""
    BEGIN, END = markers  # noqa: N806
    nb, ne = text.count(BEGIN), text.count(END)
    if nb != 1 or ne != 1:
        raise ValueError(f"{where}: needs exactly one {BEGIN} and one {END} marker (found {nb} and {ne})")
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    if j < i:
        raise ValueError(f"{where}: {END} comes before {BEGIN}")
    return text[:i] + "\n" + block.rstrip("\n") + "\n" + text[j:]


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m jaxppo.sweeps.report"
    ap = argparse.ArgumentParser(prog=prog, description="The Results tables (final value, seed-paired comparisons, "
                                 "power, verdicts) of finished sweeps, from their committed files.")
    ap.add_argument("sweeps", nargs="*", default=list(DEFAULT_SWEEPS),
                    help="sweep files (default: the sweeps of the notebooks)")
    ap.add_argument("--output-root", default=DEFAULT_ROOT,
                    help=f"each sweep's outputs are read from <output-root>/<stem> (default {DEFAULT_ROOT})")
    ap.add_argument("--calibrate", action="store_true",
                    help="first (re)write each finished sweep's A/A calibration (<output-root>/<stem>/calibration.json)")
    ap.add_argument("--calibration-sweeps", type=int, default=2000,
                    help="synthetic A/A sweeps per design with --calibrate (default 2000)")
    ap.add_argument("--out", "--readme", dest="out", default=DEFAULT_OUT,
                    help=f"replace the text between {BEGIN} and {END} in this file (default {DEFAULT_OUT}; "
                         "created when missing)")
    ap.add_argument("--claims", default=None,
                    help="also write the claims table (jaxppo.sweeps.claims) of this file, e.g. results/claims.yaml, "
                         "between the claims markers of --out")
    ap.add_argument("--print", dest="print_only", action="store_true", help="only print the block")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    lines: list[str] = []
    try:
        for f in args.sweeps:
            if args.calibrate:
                path = calibrate_sweep(f, args.output_root, n=args.calibration_sweeps)
                if path is not None:
                    print(f"{prog}: wrote {path}", file=sys.stderr)
            lines += sweep_report(f, args.output_root)
    except SweepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    block = "\n".join(lines).rstrip("\n") + "\n"
    if not args.print_only:
        path = Path(args.out)
        text = path.read_text(encoding="utf-8") if path.is_file() else f"# Results\n\n{BEGIN}\n{END}\n"
        try:
            new = replace_between_markers(text, block, where=str(path))
            if args.claims:
                from jaxppo.sweeps import claims

                rows = claims.render(args.claims, args.output_root)
                new = replace_between_markers(new, "\n".join(rows) + "\n", where=str(path),
                                              markers=(claims.BEGIN, claims.END))
        except ValueError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new, encoding="utf-8")
        print(f"{prog}: wrote the tables into {path}", file=sys.stderr)
    sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
