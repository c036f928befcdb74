"""The claims table of docs/results.md: each claim of the source article, the experiments that test it, their
verdicts, intervals and power, generated from committed files only.

``results/claims.yaml`` lists the claims::

    claims:
      - claim: "Importance sampling gives 2-3x data efficiency"
        evidence:                                   # each item: a committed sweep's test, or a pre-registration
          - {sweep: is_onpolicy, variant: is_token_truncate, test: first_passage}
          - {prereg: reuse}
        caveat: "stories260K on the smoke data"

A sweep item reads ``results/sweeps/<sweep>/summary.csv`` (the family-wise columns of
:mod:`jaxppo.sweeps.family`): the test's word (the sweep's primary test gives the verdict; any other test is quoted
as secondary), its estimate and 95% interval (first passage: earlier / later / same counts), the Holm-adjusted p,
the number of seeds and the 80% power of the paired t-test for the final value
(:func:`jaxppo.sweeps.stats.min_detectable_effect` with the row's ``final_diff_sd``). A pre-registration item reads
``results/preregistered/<name>.result.json`` (``python -m jaxppo.sweeps.prereg --write``): "pending" with the runs
finished so far, or its primary tests; with ``secondary: waste`` its wasted-iterations secondary instead (per noise
level the paired difference of the zero-gradient token share and of the low-gradient update share, with the
baseline's share, Holm-adjusted over all of them). A benchmark item reads ``results/<name>.json`` (``benchmarks/<name>.py``:
a paired time ratio with its interval). Anything not yet run is "not run".
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from jaxppo.sweeps import family, stats
from jaxppo.sweeps.results import _float, format_ci, read_csv, summary_by_variant

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
DEFAULT_FILE = "results/claims.yaml"
HEADER = ("claim", "experiment", "verdict [95% CI], Holm p (seeds; 80% power at)", "scale")


def _p(x: float) -> str:
    return "n/a" if math.isnan(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def sweep_cell(root: Path, item: dict) -> tuple[str, str]:
    """``(experiment, verdict)`` cells of a sweep item (module docstring)."""
    name, variant, test = item["sweep"], item["variant"], item.get("test", "final")
    family.check_primary(test)
    path = root / name / "summary.csv"
    exp = f"`{name}`: {variant}"
    if not path.is_file():
        return exp, "not run"
    rows = summary_by_variant(read_csv(path))
    if variant not in rows:
        raise ValueError(f"claims: sweep {name} has no variant {variant!r} (variants: {', '.join(rows)})")
    r = rows[variant]
    primary = str(r.get("primary") or family.PRIMARY_DEFAULT)
    base = next((v for v, x in rows.items() if _float(x.get("n_pairs")) == 0), "?")
    n = int(_float(r.get("n_pairs"))) if math.isfinite(_float(r.get("n_pairs"))) else 0
    holm = _float(r.get(f"{test}_p_holm"))
    word = str(r.get("verdict") or family.word(r, primary)) if test == primary else "secondary: " + family.word(r, test)
    if test == "first_passage":
        est = (f"earlier in {int(_float(r['earlier']))}, later in {int(_float(r['later']))}, same in "
               f"{int(_float(r['ties']))}")
    else:
        key = family.TESTS[test][0]
        est = format_ci(r[key], r[key + "_lo"], r[key + "_hi"])
    sd = _float(r.get("final_diff_sd"))
    power = f"{stats.min_detectable_effect(sd, n):.3f}" if n >= 2 and sd > 0 else "n/a"
    what = family.NAMES[test]
    return (f"{exp} vs {base}, {what}",
            f"{word}: {est}, Holm p {_p(holm)} ({n} seeds; final {power})")


def prereg_cell(prereg_dir: Path, name: str) -> tuple[str, str]:
    """``(experiment, verdict)`` cells of a pre-registration item (module docstring)."""
    exp = f"pre-registered `{name}` (results/preregistered/{name}.yaml)"
    path = prereg_dir / f"{name}.result.json"
    if not path.is_file():
        return exp, "not run"
    res = json.loads(path.read_text(encoding="utf-8"))
    pw = res.get("power", {})
    power = f"{pw['mde_80']:.3f}" if "mde_80" in pw else "n/a"
    if res.get("state") != "finished":
        done = sum(n for lv in res.get("finished_runs", {}).values() for n in lv.values())
        total = len(res.get("finished_runs", {})) and sum(
            len(lv) for lv in res["finished_runs"].values()) * int(pw.get("seeds", 0))
        return exp, f"pending: {done} of {total} runs finished ({pw.get('seeds', '?')} seeds; {power})"
    parts = [f"{t['effect']}: {t['verdict']}, {format_ci(t['mean'], t['lo'], t['hi'])}, Holm p {_p(t['p_holm'])}"
             for t in res["primary"]]
    return exp, "; ".join(parts) + f" ({pw.get('seeds', '?')} seeds; {power})"


WASTE_NAMES = {"zero_grad_token_frac": "zero-gradient token share", "low_grad_update_frac": "low-gradient update share"}


def waste_cell(prereg_dir: Path, name: str) -> tuple[str, str]:
    """``(experiment, verdict)`` cells of a pre-registration's wasted-iterations secondary (module docstring): the
    word is "lower" / "higher" when the Holm-adjusted p < 0.05, else "no difference measured"."""
    exp = f"pre-registered `{name}`, wasted iterations (secondary)"
    path = prereg_dir / f"{name}.result.json"
    res = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    tests = res.get("secondary_waste")
    if not isinstance(tests, list):
        return exp, "pending" if path.is_file() else "not run"
    parts = []
    for metric, label in WASTE_NAMES.items():
        cells = []
        for t in (t for t in tests if t["metric"] == metric):
            word = "no difference measured" if t["p_holm"] >= 0.05 else ("lower" if t["mean"] < 0 else "higher")
            base = t.get("baseline_mean")
            of = "" if not base else f" of {base:.3f} ({100 * t['mean'] / base:+.1f}%)"
            cells.append(f"{t['level']} {word}, {format_ci(t['mean'], t['lo'], t['hi'])}{of}, Holm p {_p(t['p_holm'])}")
        parts.append(f"{label}: " + "; ".join(cells))
    n = tests[0]["n"] if tests else "?"
    return exp, "; ".join(parts) + f" ({n} seeds, Holm over {len(tests)} tests)"


def benchmark_cell(results_dir: Path, name: str) -> tuple[str, str]:
    """``(experiment, verdict)`` cells of a benchmark item: the record ``results/<name>.json`` of
    ``benchmarks/<name>.py`` (its paired ``train_ratio``: variant / baseline time with a 95% interval)."""
    exp = f"`benchmarks/{name}.py` (results/{name}.json)"
    path = results_dir / f"{name}.json"
    if not path.is_file():
        return exp, "not run"
    rec = json.loads(path.read_text(encoding="utf-8"))
    r = rec["train_ratio"]
    word = ("no difference measured" if not (r["hi"] < 1 or r["lo"] > 1)
            else ("faster" if r["hi"] < 1 else "slower"))
    load = rec.get("machine", {}).get("loadavg", [math.nan])[0]
    return exp, (f"{word}: time ratio {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] over {r['pairs']} ABBA pairs "
                 f"(load {load:.2f})")


def render(claims_file: str | Path, sweeps_root: str | Path = "results/sweeps",
           prereg_dir: str | Path = "results/preregistered") -> list[str]:
    """The markdown lines of the claims table (module docstring)."""
    import yaml

    doc = yaml.safe_load(Path(claims_file).read_text(encoding="utf-8"))
    rows = []
    for c in doc["claims"]:
        for i, item in enumerate(c["evidence"]):
            if "prereg" in item and item.get("secondary") == "waste":
                exp, verdict = waste_cell(Path(prereg_dir), item["prereg"])
            elif "prereg" in item:
                exp, verdict = prereg_cell(Path(prereg_dir), item["prereg"])
            elif "benchmark" in item:
                exp, verdict = benchmark_cell(Path(prereg_dir).parent, item["benchmark"])
            else:
                exp, verdict = sweep_cell(Path(sweeps_root), item)
            rows.append((c["claim"] if i == 0 else "", exp, verdict, c.get("caveat", "") if i == 0 else ""))
    return table(rows)


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [line(HEADER), "|" + "|".join("---" for _ in HEADER) + "|", *(line(r) for r in rows)]
