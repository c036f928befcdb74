"""``python -m jaxppo.sweep --config SWEEP.yaml [--profile NAME] [--jobs N] [--print-commands] [--results-only]
[--slurm OUT.sbatch [--slurm-time T] [--slurm-cpus N] ...]``.

(``python -m jaxppo.sweep SWEEP.yaml``, the file as a positional argument, still works and warns: deprecated.)

Seeds x variants of one base config (the sweep file format is in :mod:`jaxppo.sweeps.spec`). Every run is
an ordinary ``python -m jaxppo.train`` (or ``jaxppo.dpo``) run in ``<output_dir>/runs/<variant>/seed<k>``
(default ``output_dir``: ``results/sweeps/<name>``, committed); rerunning the same command resumes the sweep:
finished runs (a ``summary.json``, e.g. committed from another machine) are skipped, a killed run continues from
its checkpoint, failed runs are retried. The whole sweep file is validated (every run's config loaded) before
any run starts.

Outputs in ``output_dir``: ``results.csv`` (variant, seed, step, samples, tokens, reward, kl, wall_time_s,
status, error), ``summary.csv`` (per variant: final reward mean and 95% t-interval, AUC, and the seed-paired
comparison with the baseline; see :mod:`jaxppo.sweeps.results`), ``failures.json``,
``plots/reward_vs_samples.png``, ``plots/reward_vs_kl.png``.

``--slurm OUT.sbatch`` writes a SLURM array job whose task i runs the i-th pending run (:mod:`jaxppo.sweeps.slurm`)
and exits; its ``#SBATCH`` resources come from the sweep file's ``slurm:`` mapping (``partition``, ``time``,
``gpus``, ``cpus``, ``mem``, ``max_parallel``), each overridden by its ``--slurm-*`` flag. ``--jobs N`` runs N
runs side by side, the CPU cores split between them.

A run that exits 75 (stopped by SIGTERM / SIGINT with its checkpoint saved, :mod:`jaxppo.trainer.preemption`) is
recorded as ``preempted`` (``failures.json`` status, the ``status`` column of ``results.csv`` and the summary), not
as failed; the next invocation resumes it from that checkpoint. SIGTERM / SIGINT to the sweep itself starts no new
run and waits for the running ones (:mod:`jaxppo.sweeps.runner`).

Exit status: 0 when every run finished, 1 when some failed (the tables are written with the others), 75 when
none failed but some were preempted or the sweep was stopped by a signal (rerun to continue), 2 for an invalid
sweep file.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path


PROG = "python -m jaxppo.sweep"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Multi-seed sweeps of jaxppo runs with data-efficiency "
                                 "curves (resumable).")
    ap.add_argument("--config", default=None, help="sweep file (YAML), e.g. configs/sweeps/per_alpha.yaml")
    ap.add_argument("sweep", nargs="?", default=None, help=argparse.SUPPRESS)  # deprecated positional form
    ap.add_argument("--profile", default=None, help="merge profiles.<NAME> of the sweep file (e.g. ci)")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="runs in parallel (default 1)")
    ap.add_argument("--output-dir", default=None, help="override the sweep file's output_dir")
    ap.add_argument("--print-commands", action="store_true",
                    help="print one shell command per run (for a cluster job array) and exit")
    ap.add_argument("--pending", action="store_true", help="with --print-commands: only runs without summary.json")
    ap.add_argument("--results-only", action="store_true", help="only (re)write the tables and plots")
    ap.add_argument("--slurm", default=None, metavar="OUT.sbatch",
                    help="write a SLURM array job (task i runs the i-th pending run) and exit")
    ap.add_argument("--slurm-time", default=None,
                    help="with --slurm: #SBATCH --time, e.g. 02:00:00 (overrides the sweep file's slurm.time)")
    ap.add_argument("--slurm-cpus", type=int, default=None, help="with --slurm: #SBATCH --cpus-per-task")
    ap.add_argument("--slurm-mem", default=None, help="with --slurm: #SBATCH --mem, e.g. 16G")
    ap.add_argument("--slurm-gpus", type=int, default=None, help="with --slurm: #SBATCH --gpus-per-task")
    ap.add_argument("--slurm-partition", default=None, help="with --slurm: #SBATCH --partition")
    ap.add_argument("--slurm-max-parallel", type=int, default=None, help="with --slurm: at most N tasks at once")
    return ap


def _sweep_file(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The sweep file from ``--config`` or the deprecated positional form (which warns)."""
    if args.config is not None and args.sweep is not None:
        ap.error("give the sweep file once, as --config FILE")
    if args.config is None and args.sweep is None:
        ap.error("the following arguments are required: --config")
    if args.config is None:
        print(f"{PROG}: warning: the positional sweep file is deprecated; use --config {args.sweep}", file=sys.stderr)
    return args.config or args.sweep


def _load(sweep_file: str, args: argparse.Namespace):
    """``(spec, runs)`` of the sweep file, its warnings printed; raises ``SweepError``."""
    from jaxppo.sweeps.spec import load_sweep, plan_runs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = load_sweep(sweep_file, profile=args.profile, output_dir=args.output_dir)
    for w in caught:
        print(f"{PROG}: warning: {w.message}", file=sys.stderr)
    return spec, plan_runs(spec)


def _write_slurm(args: argparse.Namespace, spec, runs) -> int:
    """Write the SLURM array script of the pending runs; the exit status."""
    from jaxppo.sweeps.slurm import pending_runs, resources, slurm_script

    try:
        res = resources(spec, time=args.slurm_time, cpus=args.slurm_cpus, mem=args.slurm_mem, gpus=args.slurm_gpus,
                        partition=args.slurm_partition, max_parallel=args.slurm_max_parallel)
        text = slurm_script(spec, runs, res)
        Path(args.slurm).write_text(text, encoding="utf-8")
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    n = len(pending_runs(spec, runs))
    print(f"wrote {args.slurm}: a SLURM array of {n} tasks (the pending runs of {len(runs)}); submit it with "
          f"sbatch {args.slurm}")
    return 0


def _report(spec, runs, stopped) -> int:
    """Write the tables and plots, print the summary and the runs that did not finish; the exit status (0 all
    finished, 1 some failed, 75 none failed but some were preempted or the sweep was stopped)."""
    from jaxppo.sweeps.plots import plot_sweep
    from jaxppo.sweeps.results import write_results
    from jaxppo.sweeps.runner import read_failures
    from jaxppo.trainer.preemption import PREEMPTED_EXIT

    failures = {k: v for k, v in read_failures(spec.output_dir).items() if k in {r.key for r in runs}}
    curves, summary = write_results(spec, runs, failures)
    plot_sweep(curves, list(spec.variants), Path(spec.output_dir) / "plots", title=spec.name)
    _print_summary(summary)
    out = Path(spec.output_dir)
    print(f"results: {out / 'results.csv'}, {out / 'summary.csv'}, plots in {out / 'plots'}")
    bad = [c for c in curves if c.status != "ok"]
    for c in bad:
        print(f"{c.status.upper()}: {c.variant}/seed{c.seed}: {c.error}", file=sys.stderr)
    if stopped is not None:
        print(f"{PROG}: {stopped}", file=sys.stderr)
    if any(c.status == "failed" for c in bad):
        print(f"{len(bad)} of {len(curves)} runs did not finish; rerun the same command to retry them "
              f"(details in {out / 'failures.json'})", file=sys.stderr)
        return 1
    if bad:
        preempted = sum(c.status == "preempted" for c in bad)
        print(f"{len(bad)} of {len(curves)} runs did not finish ({preempted} preempted with their checkpoint saved); "
              "rerun the same command to continue them", file=sys.stderr)
        return PREEMPTED_EXIT if stopped is not None or preempted else 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from jaxppo.sweeps.spec import SweepError

    ap = _parser()
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    sweep_file = _sweep_file(ap, args)
    try:
        spec, runs = _load(sweep_file, args)
    except SweepError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.slurm:
        return _write_slurm(args, spec, runs)
    if args.print_commands:
        from jaxppo.sweeps.runner import command_line, is_done

        for r in runs:
            if not (args.pending and is_done(r)):
                print(command_line(spec, r))
        return 0
    stopped = None
    if not args.results_only:
        from jaxppo.sweeps.runner import SweepStopped, run_sweep

        try:
            run_sweep(spec, runs, jobs=args.jobs)
        except SweepError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
        except SweepStopped as e:
            stopped = e
    return _report(spec, runs, stopped)


def _print_summary(rows) -> None:
    from jaxppo.sweeps.results import format_ci

    print(f"{'variant':<24} {'n':>3} {'final [95% CI]':>26} {'AUC':>7} {'paired final diff [95% CI], p':>36}")
    for r in rows:
        diff = "-" if r["final_diff"] != r["final_diff"] else (   # NaN: the baseline, or nothing paired
            f"{format_ci(r['final_diff'], r['final_diff_lo'], r['final_diff_hi'])}, p {r['final_diff_p']:.3f}")
        print(f"{r['variant']:<24} {r['n_seeds']:>3} "
              f"{format_ci(r['final_reward_mean'], r['final_reward_ci95_lo'], r['final_reward_ci95_hi']):>26} "
              f"{r['auc_mean']:>7.3f} {diff:>36}")


if __name__ == "__main__":
    raise SystemExit(main())
