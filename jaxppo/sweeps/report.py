"""``python -m jaxppo.sweeps.report [SWEEP ...] [--output-root runs/sweeps] [--markdown] [--readme README.md]``.

The Results table of finished sweeps, one row per (sweep, variant), read from ``<output_root>/<stem>/summary.csv``
(written by ``python -m jaxppo.sweep SWEEP`` with the sweep file's default variants) and the runs' ``metrics.jsonl``:

| setting (sweep) | variant | seeds | final held-out reward [95% CI] | final KL | efficiency vs baseline [95% CI] |
behaviour mismatch at step 1 |

- seeds: finished seeds / the sweep file's seeds, ``(k failed)`` when some failed;
- final held-out reward: mean over finished seeds with its 95% t-interval; final KL: mean KL(policy || reference)
  at the budget; efficiency: the data-efficiency ratio against the sweep's baseline with its seed-bootstrap
  interval (all from ``summary.csv``, see :mod:`jaxppo.sweeps.results`);
- behaviour mismatch at update step 1 (:func:`jaxppo.sweeps.results.mismatch`, mean over seeds):
  ``rollout_corr/kl`` where the variant logs it, else the token weights' ESS/N, else ``n/a``.

After the table, per sweep, the verdict of every non-baseline variant against the baseline
(:func:`jaxppo.sweeps.results.verdict`, the notebooks' rule). A sweep without ``summary.csv`` is listed as
"not run". Default output: the table and plain verdict lines; ``--markdown``: verdicts as a markdown list (the
block ``--readme`` writes). ``--readme FILE`` replaces the text between ``<!-- sweep-results:begin -->`` and
``<!-- sweep-results:end -->`` in FILE with that block. Exit status 2 on a bad sweep file or missing markers.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from jaxppo.sweeps.results import _float, format_ci, mismatch, read_csv, summary_by_variant, verdict
from jaxppo.sweeps.spec import SweepError, load_sweep

# the sweeps of the four notebooks (issue 12), in the README's order; quickstart_replay is the SmolLM2-135M one
DEFAULT_SWEEPS = tuple(f"configs/sweeps/{n}.yaml" for n in (
    "is_onpolicy", "is_offpolicy_t1.5", "is_offpolicy_t0.7", "per_decay", "stale_reuse", "quickstart_replay",
    "pf_filters", "critic_free"))
BEGIN, END = "<!-- sweep-results:begin -->", "<!-- sweep-results:end -->"
HEADER = ("setting (sweep)", "variant", "seeds", "final held-out reward [95% CI]", "final KL",
          "efficiency vs baseline [95% CI]", "behaviour mismatch at step 1")
RULE = ('Verdicts (final held-out reward, 95% t-intervals over seeds: "higher"/"lower" only when the intervals do '
        'not overlap, else "no difference measured"):')


def _mismatch_cell(m: dict) -> str:
    if "rollout_corr/kl" in m:
        return f"rollout_corr/kl {m['rollout_corr/kl']:.4f}"
    if "ess" in m:
        return f"ESS/N {m['ess']:.3f}"
    return "n/a"


def sweep_report(sweep_file: str | Path, output_root: str | Path) -> tuple[list[tuple[str, ...]], list[str]]:
    """``(table rows, verdict lines)`` of one sweep (see the module docstring); raises ``SweepError`` for an
    invalid sweep file."""
    spec = load_sweep(sweep_file)
    out = Path(output_root) / Path(sweep_file).stem
    path = out / "summary.csv"
    if not path.is_file():
        return [(spec.name, "not run (no summary.csv)", "", "", "", "", "")], []
    rows = read_csv(path)
    by_var = summary_by_variant(rows)
    mism = mismatch(out, list(by_var), spec.seeds, step=1)
    table = []
    for v, r in by_var.items():
        n_ok, n_failed = int(float(r["n_seeds"])), int(float(r["n_failed"]))
        seeds = f"{n_ok}/{len(spec.seeds)}" + (f" ({n_failed} failed)" if n_failed else "")
        kl = _float(r["final_kl_mean"])
        table.append((spec.name, v + (" (baseline)" if v == spec.baseline else ""), seeds,
                      format_ci(r["final_reward_mean"], r["final_reward_ci95_lo"], r["final_reward_ci95_hi"]),
                      "n/a" if math.isnan(kl) else f"{kl:.4f}",
                      format_ci(r["efficiency_ratio"], r["efficiency_ratio_ci95_lo"], r["efficiency_ratio_ci95_hi"],
                                nd=2),
                      _mismatch_cell(mism[v])))
    if spec.baseline not in by_var:
        return table, [f"{spec.name}: baseline {spec.baseline!r} is not in {path}"]
    verdicts = [f"{spec.name}: {verdict(rows, v, spec.baseline)}" for v in by_var if v != spec.baseline]
    return table, verdicts


def render(rows: Sequence[Sequence[str]], verdicts: Sequence[str], *, markdown: bool) -> str:
    """The markdown table (columns padded to a common width), then the verdicts: a ``- `` list when ``markdown``,
    indented lines otherwise."""
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(HEADER), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]
    if verdicts:
        out += ["", RULE, *((("- " if markdown else "  ") + v) for v in verdicts)]
    return "\n".join(out) + "\n"


def replace_between_markers(text: str, block: str, *, where: str) -> str:
    """``text`` with everything between the begin and end markers replaced by ``block`` (markers kept, each on
    its own line); ``ValueError`` naming ``where`` when a marker is missing, repeated or out of order."""
    nb, ne = text.count(BEGIN), text.count(END)
    if nb != 1 or ne != 1:
        raise ValueError(f"{where}: needs exactly one {BEGIN} and one {END} marker (found {nb} and {ne})")
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    if j < i:
        raise ValueError(f"{where}: {END} comes before {BEGIN}")
    return text[:i] + "\n" + block.rstrip("\n") + "\n" + text[j:]


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m jaxppo.sweeps.report"
    ap = argparse.ArgumentParser(prog=prog, description="The Results table (final reward, KL, data efficiency, "
                                 "behaviour mismatch, verdicts) of finished sweeps.")
    ap.add_argument("sweeps", nargs="*", default=list(DEFAULT_SWEEPS),
                    help="sweep files (default: the seven sweeps of the notebooks)")
    ap.add_argument("--output-root", default="runs/sweeps",
                    help="each sweep's outputs are read from <output-root>/<stem> (default runs/sweeps)")
    ap.add_argument("--markdown", action="store_true", help="verdicts as a markdown list (what --readme writes)")
    ap.add_argument("--readme", default=None, help=f"replace the text between {BEGIN} and {END} in this file")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    rows: list[tuple[str, ...]] = []
    verdicts: list[str] = []
    try:
        for f in args.sweeps:
            r, v = sweep_report(f, args.output_root)
            rows += r
            verdicts += v
    except SweepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    text = render(rows, verdicts, markdown=args.markdown)
    if args.readme is not None:
        path = Path(args.readme)
        if not path.is_file():
            print(f"{prog}: error: {path}: no such file", file=sys.stderr)
            return 2
        try:
            new = replace_between_markers(path.read_text(encoding="utf-8"), render(rows, verdicts, markdown=True),
                                          where=str(path))
        except ValueError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        path.write_text(new, encoding="utf-8")
        print(f"{prog}: wrote the table into {path}", file=sys.stderr)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
