"""A sweep's figures (matplotlib Agg, no pyplot state), from its finished runs' curves.

- ``reward_vs_samples.png``: per variant, the seed-mean held-out reward against trajectories consumed, with
  a band of the per-point 95% t-interval over seeds (no band with one seed; a missing evaluation leaves its seed
  out of that point);
- ``reward_vs_kl.png``: the reward-KL frontier — per variant, the seed-mean (KL, reward) at each evaluation
  point joined in sample order, the final point marked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxppo.sweeps.results import RunCurve
from jaxppo.sweeps.stats import t_interval


def _variant_arrays(curves: Sequence[RunCurve], variant: str):
    ok = [c for c in curves if c.variant == variant and c.status == "ok"]
    if not ok or any(list(c.samples) != list(ok[0].samples) for c in ok):
        return None
    return (np.asarray(ok[0].samples, np.float64), np.asarray([c.reward for c in ok], np.float64),
            np.asarray([c.kl for c in ok], np.float64))


def _interval(col: np.ndarray) -> tuple[float, float, float]:
    ok = col[np.isfinite(col)]   # a missing (NaN) evaluation leaves that seed out of that point
    return t_interval(ok) if ok.size else (math.nan, math.nan, math.nan)


def plot_sweep(curves: Sequence[RunCurve], variants: Sequence[str], out_dir: str | Path,
               title: str = "") -> list[Path]:
    """Write the two figures into ``out_dir``; returns the paths written (none if no run finished)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = {v: a for v in variants if (a := _variant_arrays(curves, v)) is not None}
    if not data:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig = Figure(figsize=(6.4, 4.2), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for v, (x, y, _) in data.items():
        stats = [_interval(y[:, j]) for j in range(y.shape[1])]
        mean = np.asarray([s[0] for s in stats])
        line, = ax.plot(x, mean, marker="o", markersize=3, linewidth=1.3, label=f"{v} (n={y.shape[0]})")
        lo, hi = np.asarray([s[1] for s in stats]), np.asarray([s[2] for s in stats])
        if not np.all(np.isnan(lo)):
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
    ax.set_xlabel("trajectories consumed (minibatch x steps)")
    ax.set_ylabel("held-out reward (mean over seeds, 95% t-interval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{title} reward vs samples".strip(), fontsize=10)
    paths.append(out / "reward_vs_samples.png")
    _save(fig, paths[-1])

    fig = Figure(figsize=(6.4, 4.2), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for v, (_, y, k) in data.items():
        km, ym = np.nanmean(k, axis=0), np.nanmean(y, axis=0)
        line, = ax.plot(km, ym, marker="o", markersize=3, linewidth=1.0, label=v)
        if math.isfinite(km[-1]):
            ax.plot([km[-1]], [ym[-1]], marker="*", markersize=11, color=line.get_color())
    ax.set_xlabel("KL(policy || reference) on held-out prompts")
    ax.set_ylabel("held-out reward (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{title} reward vs KL (star: final)".strip(), fontsize=10)
    paths.append(out / "reward_vs_kl.png")
    _save(fig, paths[-1])
    return paths


def _save(fig, path: Path) -> None:
    """``fig`` as a PNG at ``path``, written to a file of this process and renamed over ``path`` (two sweeps of one
    folder may write their plots at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
