"""PNG plots of a DPO run from its ``metrics.jsonl`` (the figures of ``jaxppo.trainer.plots``, DPO's metrics).

``plot_dpo(metrics_jsonl, out_dir, summary)`` writes, x = step:

* ``dpo_loss.png`` — ``loss`` (training minibatch) and ``eval/loss`` (held-out pairs);
* ``dpo_rewards.png`` — implicit rewards ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins`` and the pair
  accuracy ``rewards/accuracies``, each with its held-out ``eval/...`` curve when logged;
* ``dpo_logps.png`` — ``logps/chosen`` and ``logps/rejected``;

plus the PPO trainer's ``reward.png`` (held-out reward before/after and KL, from ``summary``) when it applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from jaxppo.trainer.metrics_log import read_jsonl
from jaxppo.trainer.plots import (
    FigureSpec,
    Panel,
    _line,
    _render,
    _series,
    plot_metrics,
)

REWARD_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
LOGP_KEYS = ("logps/chosen", "logps/rejected")


def dpo_figure_specs(rows: list[dict]) -> list[FigureSpec]:
    """What :func:`plot_dpo` draws for the metric ``rows`` (figures with nothing to show are left out)."""
    series = _series(rows)

    def panel(key: str) -> Panel | None:
        lines = [_line(name, series[k]) for name, k in (("train", key), ("held-out", f"eval/{key}")) if k in series]
        return Panel(key, lines) if lines else None

    specs = []
    for name, title, keys in (("dpo_loss", "DPO loss", ("loss",)), ("dpo_rewards", "implicit rewards", REWARD_KEYS),
                              ("dpo_logps", "policy log-probs of the answers", LOGP_KEYS)):
        panels = [p for p in map(panel, keys) if p is not None]
        if panels:
            specs.append(FigureSpec(name, title, panels))
    return specs


def plot_dpo(metrics_jsonl: str | Path, out_dir: str | Path, summary: Mapping[str, Any] | None = None) -> list[Path]:
    """Write the figures of the module doc into ``out_dir``; returns the paths written."""
    metrics_jsonl = Path(metrics_jsonl)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [_render(spec, out_dir / f"{spec.name}.png") for spec in dpo_figure_specs(read_jsonl(metrics_jsonl))]
    return paths + plot_metrics(metrics_jsonl, out_dir, summary=dict(summary or {}))
