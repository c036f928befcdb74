"""Helpers shared by the ablation notebooks: run a sweep, read its tables, and word its conclusion.

A notebook calls :func:`run_sweep` (``python -m jaxppo.sweep FILE --profile ci|full`` in a subprocess with one
simulated device, its output under ``OUTPUT_ROOT``), then :func:`load` (``results.csv`` → curves → the summary
of :func:`jaxppo.sweeps.results.summarize`), :func:`table`, :func:`plots`, :func:`mismatch` and
:func:`verdict`.

Rule used by :func:`verdict` (stated in every notebook): variant ``v`` vs the baseline ``b`` on the final held-out
reward, each with its 95% t-interval over seeds ``[lo, hi]``:

- ``lo_v > hi_b``: "higher than"; ``hi_v < lo_b``: "lower than" (the intervals do not overlap);
- otherwise "no difference measured" (overlapping intervals; this test is conservative: two intervals can overlap
  while a paired test would still find a difference);
- fewer than 2 finished seeds on either side: "not measurable" (no interval).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def _rel(p: str | Path) -> str:
    """``p`` relative to the repository root when it lies inside it (shorter, machine-independent output)."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def sweep_output_dir(sweep_file: str | Path, profile: str, output_root: str | Path) -> Path:
    """``<output_root>/<stem>`` for the full profile, ``<output_root>/<stem>_<profile>`` otherwise."""
    stem = Path(sweep_file).stem
    return Path(output_root) / (stem if profile == "full" else f"{stem}_{profile}")


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
    """Run (or resume) the sweep ``sweep_file`` with ``--profile <profile>`` into :func:`sweep_output_dir`.

    With ``profile == "full"`` and every run already finished, nothing is run: the tables are only read. The
    subprocess gets ``XLA_FLAGS=--xla_force_host_platform_device_count=1`` (one CPU device per run) and a
    compilation cache shared by every sweep under ``output_root`` (``JAX_COMPILATION_CACHE_DIR``, unless set).
    Raises ``RuntimeError`` with the tail of the output when no ``results.csv`` was written.
    """
    if profile not in ("ci", "full"):
        raise ValueError(f"PROFILE must be 'ci' or 'full', got {profile!r}")
    out = sweep_output_dir(sweep_file, profile, output_root)
    if profile == "full" and _finished(out):
        print(f"{_rel(out)}: every run finished; reading the tables only")
        return out
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str((Path(output_root) / "xla_cache").resolve()))
    argv = [sys.executable, "-m", "jaxppo.sweep", str(sweep_file), "--profile", profile, "--output-dir", str(out),
            "--jobs", str(jobs)]
    print("$", " ".join([*argv[1:7], _rel(out), *argv[8:]]))
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "seeds (< 5)" not in ln]
    if not (out / "results.csv").is_file():
        raise RuntimeError(f"sweep {sweep_file} (exit {proc.returncode}) wrote no results.csv:\n" + "\n".join(lines[-30:]))
    if proc.returncode != 0:
        print(f"(sweep exit status {proc.returncode}; the tables below are recomputed from results.csv)")
        print("\n".join(lines[-5:]))
    return out


def load(out: str | Path, sweep_file: str | Path, profile: str):
    """``(results DataFrame, summary DataFrame, curves)`` of the sweep in ``out``.

    ``results.csv`` rows are de-duplicated on (variant, seed, samples) keeping the last (a run that evaluates at
    step 0 itself repeats the step-0 point), then the summary is recomputed with
    :func:`jaxppo.sweeps.results.summarize` (final reward t-interval, AUC, data-efficiency ratio with its seed
    bootstrap), with the sweep file's baseline, budget and bootstrap settings.
    """
    import pandas as pd

    from jaxppo.sweeps.results import RunCurve, summarize
    from jaxppo.sweeps.spec import load_sweep

    spec = load_sweep(REPO / sweep_file if not Path(sweep_file).is_absolute() else sweep_file, profile=profile,
                      output_dir=str(out))
    res = pd.read_csv(Path(out) / "results.csv")
    ok = res[res["status"] == "ok"].drop_duplicates(["variant", "seed", "samples"], keep="last")
    ok = ok.sort_values(["variant", "seed", "samples"])
    curves = []
    for (v, s), g in ok.groupby(["variant", "seed"], sort=False):
        curves.append(RunCurve(v, int(s), "ok", steps=[int(x) for x in g["step"]], samples=[int(x) for x in g["samples"]],
                               tokens=list(g["tokens"].astype(float)), reward=list(g["reward"].astype(float)),
                               kl=list(g["kl"].astype(float)), wall=list(g["wall_time_s"].astype(float))))
    for _, r in res[res["status"] != "ok"].iterrows():
        curves.append(RunCurve(r["variant"], int(r["seed"]), str(r["status"]), str(r["error"])))
    summary = pd.DataFrame(summarize(curves, list(spec.variants), spec.baseline, spec.budget_samples,
                                     resamples=spec.bootstrap_resamples, seed=spec.bootstrap_seed))
    return ok.reset_index(drop=True), summary, curves, spec


def _ci(m: float, lo: float, hi: float, nd: int = 3) -> str:
    if not math.isfinite(m):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{m:.{nd}f} [no interval]"
    return f"{m:.{nd}f} [{lo:.{nd}f}, {hi:.{nd}f}]"


def table(summary):
    """The notebook's table: final reward (95% t-interval), final KL(policy || reference), data-efficiency
    ratio (95% seed bootstrap), seeds."""
    import pandas as pd

    rows = []
    for _, r in summary.iterrows():
        rows.append({"variant": r["variant"], "seeds": int(r["n_seeds"]), "failed": int(r["n_failed"]),
                     "final reward [95% CI]": _ci(r["final_reward_mean"], r["final_reward_ci95_lo"],
                                                  r["final_reward_ci95_hi"]),
                     "final KL": f"{r['final_kl_mean']:.4f}" if math.isfinite(r["final_kl_mean"]) else "n/a",
                     "AUC [95% CI]": _ci(r["auc_mean"], r["auc_ci95_lo"], r["auc_ci95_hi"]),
                     "efficiency ratio [95% CI]": _ci(r["efficiency_ratio"], r["efficiency_ratio_ci95_lo"],
                                                      r["efficiency_ratio_ci95_hi"], nd=2)})
    return pd.DataFrame(rows).set_index("variant")


def plots(curves, spec, out: str | Path) -> list[Path]:
    """Write and display reward-vs-samples and reward-vs-KL (jaxppo.sweeps.plots) for these curves."""
    from jaxppo.sweeps.plots import plot_sweep

    paths = plot_sweep(curves, list(spec.variants), Path(out) / "plots", title=spec.name)
    try:
        from IPython.display import Image, display

        for p in paths:
            display(Image(filename=str(p)))
    except ImportError:  # outside a notebook
        pass
    return paths


def mismatch(out: str | Path, variants: Sequence[str], seeds: Sequence[int], step: int = 1) -> dict[str, dict]:
    """Behaviour-policy mismatch at update ``step`` (mean over seeds), from each run's ``metrics.jsonl``:
    ``rollout_corr/kl`` (verl's E_t[log mu - log pi_prox], logged by rollout-correction variants), ``ess``
    (``is/ess``, or ``is_diag/ess`` when IS is off: the Kish ESS / N of the token weights pi_prox/mu) and the
    mean weight. Keys missing from a run are left out."""
    res: dict[str, dict] = {}
    for v in variants:
        acc: dict[str, list[float]] = {}
        for s in seeds:
            path = Path(out) / "runs" / v / f"seed{s}" / "metrics.jsonl"
            if not path.is_file():
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                if row.get("step") != step:
                    continue
                for key, name in (("rollout_corr/kl", "rollout_corr/kl"), ("is/ess", "ess"), ("is_diag/ess", "ess"),
                                  ("is/weight_mean", "weight_mean"), ("is_diag/weight_mean", "weight_mean")):
                    if key in row and not (key.startswith("is/") and f"is_diag/{key[3:]}" in row):
                        acc.setdefault(name, []).append(float(row[key]))
        res[v] = {k: sum(x) / len(x) for k, x in acc.items()}
    return res


def verdict(summary, variant: str, baseline: str) -> str:
    """One sentence comparing ``variant`` with ``baseline`` by the rule of the module docstring."""
    rows = {r["variant"]: r for _, r in summary.iterrows()}
    v, b = rows[variant], rows[baseline]
    vs = (f"{variant} vs {baseline}: final reward "
          f"{_ci(v['final_reward_mean'], v['final_reward_ci95_lo'], v['final_reward_ci95_hi'])} vs "
          f"{_ci(b['final_reward_mean'], b['final_reward_ci95_lo'], b['final_reward_ci95_hi'])}")
    vals = [v["final_reward_ci95_lo"], v["final_reward_ci95_hi"], b["final_reward_ci95_lo"], b["final_reward_ci95_hi"]]
    if not all(math.isfinite(x) for x in vals):
        word = "not measurable (fewer than 2 finished seeds)"
    elif v["final_reward_ci95_lo"] > b["final_reward_ci95_hi"]:
        word = "higher (the 95% intervals do not overlap)"
    elif v["final_reward_ci95_hi"] < b["final_reward_ci95_lo"]:
        word = "lower (the 95% intervals do not overlap)"
    else:
        word = "no difference measured (the 95% intervals overlap)"
    eff = ""
    if variant != baseline and math.isfinite(v["efficiency_ratio"]):
        eff = (f"; data-efficiency ratio "
               f"{_ci(v['efficiency_ratio'], v['efficiency_ratio_ci95_lo'], v['efficiency_ratio_ci95_hi'], nd=2)}")
    return f"{vs}: {word}{eff}."
