"""PNG plots of a run's main curves from its ``metrics.jsonl`` (matplotlib, Agg backend, no pyplot state).

``plot_metrics(metrics_jsonl, out_dir)`` writes up to three figures, one subplot per metric, x = step:

* ``reward.png`` — ``critic/score/mean`` and every ``eval/*`` metric whose name contains
  "reward" or "score";
* ``kl.png`` — ``actor/ppo_kl``, ``actor/kl_loss``, ``eval/kl``;
* ``losses.png`` — ``actor/pg_loss``, ``critic/vf_loss``.

Metrics absent from the file are skipped, and a figure with none of its metrics is not written.
Non-finite values (stored as "nan"/"inf" strings) are left out of the curves.
"""

from __future__ import annotations

import math
from pathlib import Path

from jaxppo.trainer.metrics_log import read_jsonl

KL_KEYS = ("actor/ppo_kl", "actor/kl_loss", "eval/kl")
LOSS_KEYS = ("actor/pg_loss", "critic/vf_loss")
REWARD_KEYS = ("critic/score/mean",)


def _series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        for k, v in r.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            xs, ys = out.setdefault(k, ([], []))
            xs.append(int(r["step"]))
            ys.append(float(v))
    return out


def reward_keys(names) -> list[str]:
    """The reward-figure metrics among ``names``, in display order."""
    evals = sorted(k for k in names if k.startswith("eval/") and ("reward" in k or "score" in k))
    return [k for k in REWARD_KEYS if k in names] + evals


def _figure(series: dict, keys: list[str], title: str, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 2.4 * len(keys)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, k in zip(axes, keys):
        xs, ys = series[k]
        ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3, linewidth=1.2)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)
    return path


def plot_metrics(metrics_jsonl: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the reward / KL / loss PNGs of ``metrics_jsonl`` into ``out_dir``; returns the paths written."""
    metrics_jsonl = Path(metrics_jsonl)
    if not metrics_jsonl.is_file():
        raise FileNotFoundError(f"plot_metrics: {metrics_jsonl} does not exist")
    series = _series(read_jsonl(metrics_jsonl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, keys in (("reward", "reward", reward_keys(series)),
                              ("kl", "KL", [k for k in KL_KEYS if k in series]),
                              ("losses", "losses", [k for k in LOSS_KEYS if k in series])):
        if keys:
            written.append(_figure(series, keys, title, out_dir / f"{name}.png"))
    return written


__all__ = ["KL_KEYS", "LOSS_KEYS", "REWARD_KEYS", "plot_metrics", "reward_keys"]
