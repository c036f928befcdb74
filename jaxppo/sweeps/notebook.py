"""Helpers shared by the ablation notebooks (``from jaxppo.sweeps import notebook as sr``): run a sweep, read its
tables, and word its conclusion.

A notebook calls :func:`run_sweep` (a ``python -m jaxppo.sweep --config FILE`` subprocess with one simulated
device, its output under ``OUTPUT_ROOT``), then :func:`load` (``results.csv`` → curves → the summary of
:func:`jaxppo.sweeps.results.summarize`), :func:`table`, :func:`plots`, :func:`mismatch` and :func:`verdict`.

Profiles: ``"full"`` = the sweep file's own (default) variants, seeds and budget, no ``--profile`` argument, in
``<OUTPUT_ROOT>/<stem>`` (with ``OUTPUT_ROOT = results/sweeps``: the sweep file's ``output_dir``, committed, so a
notebook reads the runs of ``python -m jaxppo.sweep --config FILE`` and, once they are all finished, runs
nothing); ``"ci"`` = ``--profile ci`` (toy size) in ``<OUTPUT_ROOT>/<stem>_ci``, where an ``OUTPUT_ROOT`` inside
the committed ``results/`` folder means the same path under the git-ignored ``runs/`` (``runs/sweeps/<stem>_ci``:
toy runs are no records; :func:`jaxppo.sweeps.runner.scratch_path`), as does the compilation cache. The sweep files' ``--profile
extended`` (more variants, same ``<stem>`` folder) is never run by a notebook; :func:`load_extended` reads those
of its variants that ``python -m jaxppo.sweep --config FILE --profile extended`` has finished there.

:func:`mismatch` and :func:`verdict` are :mod:`jaxppo.sweeps.results`'s (one implementation for the notebooks and
``python -m jaxppo.sweeps.report``). Rule used by :func:`verdict` (:mod:`jaxppo.sweeps.family`): variant ``v`` vs
the baseline ``b`` on the sweep's primary test (default: the final held-out reward), seed by seed (seed ``k`` of
both shares the evaluation key, the reference evaluation and the replay key): the differences ``d_k = v_k - b_k``,
their paired t-test p-value Holm-adjusted over the sweep's variants:

- adjusted p < 0.05 and the mean difference above 0: "higher"; below 0: "lower";
- otherwise "no difference measured";
- fewer than 2 seeds finished in both: "not measurable".

The secondary tests (the values at 25% and 50% of the budget, the AUC, the first passage) are quoted with their
p-values Holm-adjusted together; the family-wise error rates are measured by ``python -m jaxppo.sweeps.calibrate``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from jaxppo.parallel.mesh import simulated_devices_flags
from jaxppo.sweeps.results import format_ci as _ci
from jaxppo.sweeps.results import mismatch, verdict
from jaxppo.sweeps.runner import scratch_path

__all__ = ["load", "load_extended", "mismatch", "plots", "run_sweep", "sweep_output_dir", "table", "verdict"]

PROFILES = ("ci", "full")
REPO = Path(__file__).resolve().parents[2]


def _rel(p: str | Path) -> str:
    """``p`` relative to the repository root when it lies inside it (shorter, machine-independent output)."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"PROFILE must be 'ci' or 'full', got {profile!r}")


def sweep_profile(profile: str) -> str | None:
    """The ``--profile`` of ``python -m jaxppo.sweep`` for a notebook PROFILE: ``None`` (the sweep file's default
    variants) for ``"full"``, ``"ci"`` for ``"ci"``."""
    _check_profile(profile)
    return None if profile == "full" else profile


def sweep_output_dir(sweep_file: str | Path, profile: str, output_root: str | Path) -> Path:
    """``<output_root>/<stem>`` for the full profile, ``<output_root>/<stem>_<profile>`` otherwise, moved out of a
    ``results/`` folder into ``runs/`` (:func:`jaxppo.sweeps.runner.scratch_path`): only full sweeps are records."""
    _check_profile(profile)
    stem = Path(sweep_file).stem
    if profile == "full":
        return Path(output_root) / stem
    return scratch_path(output_root) / f"{stem}_{profile}"


def _finished(out: Path) -> bool:
    import csv

    res = out / "results.csv"
    if not res.is_file():
        return False
    with open(res, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return bool(rows) and all(r["status"] == "ok" for r in rows)


def run_sweep(sweep_file: str | Path, profile: str, output_root: str | Path, *, jobs: int = 1,
              timeout_s: float | None = None) -> Path:
    """Run (or resume) the sweep ``sweep_file`` into :func:`sweep_output_dir`: ``"full"`` without ``--profile``
    (the sweep file's default variants), ``"ci"`` with ``--profile ci``.

    With ``profile == "full"`` and every run already finished, nothing is run: the tables are only read. The
    subprocess gets one simulated CPU device per run (``XLA_FLAGS``' other flags kept) and a
    compilation cache shared by every sweep under ``output_root`` (``JAX_COMPILATION_CACHE_DIR``, unless set; under
    ``runs/`` when ``output_root`` is in ``results/``).
    Raises ``RuntimeError`` with the tail of the output when no ``results.csv`` was written.
    """
    prof = sweep_profile(profile)
    out = sweep_output_dir(sweep_file, profile, output_root)
    if profile == "full" and _finished(out):
        print(f"{_rel(out)}: every run finished; reading the tables only")
        return out
    env = dict(os.environ)
    env["XLA_FLAGS"] = simulated_devices_flags(env.get("XLA_FLAGS", ""), 1)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(scratch_path(Path(output_root) / "xla_cache")))
    flags = ["--profile", prof] if prof is not None else []
    argv = [sys.executable, "-m", "jaxppo.sweep", "--config", str(sweep_file), *flags, "--output-dir", str(out),
            "--jobs", str(jobs)]
    print("$", " ".join(["-m", "jaxppo.sweep", "--config", str(sweep_file), *flags, "--output-dir", _rel(out),
                         "--jobs", str(jobs)]))
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "seeds (< 5)" not in ln]
    if not (out / "results.csv").is_file():
        raise RuntimeError(f"sweep {sweep_file} (exit {proc.returncode}) wrote no results.csv:\n"
                           + "\n".join(lines[-30:]))
    if proc.returncode != 0:
        print(f"(sweep exit status {proc.returncode}; the tables below are recomputed from results.csv)")
        print("\n".join(lines[-5:]))
    return out


def load(out: str | Path, sweep_file: str | Path, profile: str):
    """``(results DataFrame, summary DataFrame, curves, spec)`` of the sweep in ``out``.

    ``results.csv`` rows are de-duplicated on (variant, seed, samples) keeping the last (a run that evaluates at
    step 0 itself repeats the step-0 point), then the summary is recomputed with
    :func:`jaxppo.sweeps.results.summarize` (final reward t-interval, AUC, the seed-paired comparisons with the
    baseline), with the sweep file's baseline and budget, for the profile's variants only
    (rows of other variants in the same ``results.csv``, e.g. from ``--profile extended``, are left out).
    """
    spec = _spec(sweep_file, sweep_profile(profile), out)
    return _load(out, spec, list(spec.variants))


def load_extended(out: str | Path, sweep_file: str | Path):
    """The ``--profile extended`` variants of ``sweep_file`` that have at least one finished run in
    ``out/results.csv``, with the baseline: ``(results, summary, curves, spec)`` as :func:`load`, or ``None`` when
    no such variant has run or the file has no extended profile. Read only: nothing is run."""
    import pandas as pd

    from jaxppo.config import read_yaml

    path = Path(out) / "results.csv"
    raw = read_yaml(_sweep_path(sweep_file))
    if not path.is_file() or "extended" not in (raw.get("profiles") or {}):
        return None
    spec = _spec(sweep_file, "extended", out)
    default = _spec(sweep_file, None, out)
    res = pd.read_csv(path)
    done = set(res.loc[res["status"] == "ok", "variant"])
    extra = [v for v in spec.variants if v not in default.variants and v in done]
    return _load(out, spec, [spec.baseline, *extra]) if extra else None


def _sweep_path(sweep_file) -> Path:
    """A sweep file path, relative ones taken from the repository root."""
    return Path(sweep_file) if Path(sweep_file).is_absolute() else REPO / sweep_file


def _spec(sweep_file, profile, out):
    from jaxppo.sweeps.spec import load_sweep

    return load_sweep(_sweep_path(sweep_file), profile=profile, output_dir=str(out))


def _load(out, spec, variants: list[str]):
    import pandas as pd

    from jaxppo.sweeps.results import METRICS, RunCurve, summarize

    res = pd.read_csv(Path(out) / "results.csv")
    res = res[res["variant"].isin(variants)]
    ok = res[res["status"] == "ok"].copy()
    ok["reward"] = pd.to_numeric(ok["reward"], errors="coerce")   # a missing (NaN) evaluation stays NaN
    ok = ok.drop_duplicates(["variant", "seed", "samples"], keep="last")
    ok = ok.sort_values(["variant", "seed", "samples"])
    curves = []
    for (v, s), g in ok.groupby(["variant", "seed"], sort=False):
        curves.append(RunCurve(v, int(s), "ok", steps=[int(x) for x in g["step"]],
                               samples=[int(x) for x in g["samples"]],
                               tokens=list(g["tokens"].astype(float)), reward=list(g["reward"].astype(float)),
                               kl=list(g["kl"].astype(float)), wall=list(g["wall_time_s"].astype(float))))
    for _, r in res[res["status"] != "ok"].iterrows():
        curves.append(RunCurve(r["variant"], int(r["seed"]), str(r["status"]), str(r["error"])))
    summary = pd.DataFrame(summarize(curves, variants, spec.baseline, spec.budget_samples,
                                     metric=METRICS[spec.command], primary=spec.primary))
    return ok.reset_index(drop=True), summary, curves, spec


def table(summary):
    """The notebook's table: final reward (95% t-interval), final KL(policy || reference), AUC (95% t-interval),
    and against the baseline the seed-paired final difference (95% t-interval, sign-flip p) and the first-passage
    comparison (earlier/later/same evaluation)."""
    import pandas as pd

    rows = []
    for _, r in summary.iterrows():
        rows.append({"variant": r["variant"], "seeds": int(r["n_seeds"]), "failed": int(r["n_failed"]),
                     "final reward [95% CI]": _ci(r["final_reward_mean"], r["final_reward_ci95_lo"],
                                                  r["final_reward_ci95_hi"]),
                     "final KL": f"{r['final_kl_mean']:.4f}" if math.isfinite(r["final_kl_mean"]) else "n/a",
                     "AUC [95% CI]": _ci(r["auc_mean"], r["auc_ci95_lo"], r["auc_ci95_hi"]),
                     "paired final diff [95% CI]": _ci(r["final_diff"], r["final_diff_lo"], r["final_diff_hi"]),
                     "sign-flip p": "" if math.isnan(r["final_diff_p"]) else f"{r['final_diff_p']:.3f}",
                     "first reaches target earlier/later/same": "" if math.isnan(r["target"]) else
                     f"{int(r['earlier'])}/{int(r['later'])}/{int(r['ties'])}"})
    return pd.DataFrame(rows).set_index("variant")


def plots(curves, spec, out: str | Path, variants=None, subdir: str = "plots") -> list[Path]:
    """Write (into ``out/subdir``) and display reward-vs-samples and reward-vs-KL (jaxppo.sweeps.plots) for these
    curves, of ``variants`` (default: the spec's)."""
    from jaxppo.sweeps.plots import plot_sweep

    names = list(spec.variants) if variants is None else list(variants)
    paths = plot_sweep(curves, names, Path(out) / subdir, title=spec.name)
    try:
        from IPython.display import Image, display

        for p in paths:
            display(Image(filename=str(p)))
    except ImportError:  # outside a notebook
        pass
    return paths
