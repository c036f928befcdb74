"""PNG plots of one run from its ``metrics.jsonl`` (matplotlib, Agg backend, no pyplot state).

``plot_metrics(metrics_jsonl, out_dir, *, reward_before=None, summary=None)`` writes, x = step:

* ``reward.png`` — the story of the run: the **held-out reward** of the policy's own generations and the
  **KL to the reference** (``eval/kl``). The reward curve starts at step 0 with the reference's value
  (``reward_before``, else ``summary["eval/reward_before"]``, else an ``eval/reward_mean`` logged at step 0),
  then ``eval/reward_mean`` at each evaluation (``trainer.eval_every``) with its interval when
  ``eval/reward_ci_lo`` / ``eval/reward_ci_hi`` are logged at that step, and ends with the final evaluation
  of ``summary`` (``eval/reward_after`` at ``summary["steps"]``, interval ``reward_before + eval/reward_gain_ci95``:
  the paired-bootstrap CI of the gain over the fixed reference mean) unless the log already has that step;
* ``data.png`` — "offline minibatch score (data, not the policy)": ``critic/score/mean`` (``data/score/mean``
  with a critic-free estimator) is the score of the *sampled offline minibatch*, it moves with the sampler
  (prioritized replay, PF-PPO), not with the policy;
* ``kl.png`` — ``actor/ppo_kl``, ``actor/kl_loss``, ``eval/kl``;  ``losses.png`` — ``actor/pg_loss``,
  ``critic/vf_loss``;
* ``is.png`` — every ``is/*`` and ``rollout_corr/*`` metric (behaviour correction diagnostics);
* ``replay.png`` — every ``replay/*`` metric.

``summary`` is the dict the trainer writes to ``summary.json`` (or a path to it); when ``None`` a
``summary.json`` beside ``metrics.jsonl`` is read if present. Metrics absent from the file are skipped,
a figure with nothing to show is not written, and non-finite values (stored as "nan"/"inf") are left out.
:func:`figure_specs` returns what would be drawn (titles, series) without drawing it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

from jaxppo.trainer.metrics_log import DATA_SCORE_KEYS, read_jsonl

HELDOUT_REWARD = "eval/reward_mean"
HELDOUT_CI = ("eval/reward_ci_lo", "eval/reward_ci_hi")
HELDOUT_KL = "eval/kl"
DATA_SCORE = DATA_SCORE_KEYS[0]   # with a critic; a critic-free run logs DATA_SCORE_KEYS[1] instead
DATA_TITLE = "offline minibatch score (data, not the policy)"
KL_KEYS = ("actor/ppo_kl", "actor/kl_loss", "eval/kl")
LOSS_KEYS = ("actor/pg_loss", "critic/vf_loss")
IS_PREFIXES = ("is/", "rollout_corr/")
REPLAY_PREFIX = "replay/"


@dataclasses.dataclass
class Line:
    """One curve: ``ys`` at ``xs``; ``lo``/``hi`` the interval per point (``None`` where there is none)."""

    label: str
    xs: list[int]
    ys: list[float]
    lo: list[float | None] | None = None
    hi: list[float | None] | None = None


@dataclasses.dataclass
class Panel:
    title: str
    lines: list[Line]


@dataclasses.dataclass
class FigureSpec:
    name: str          # file stem: "<name>.png"
    title: str
    panels: list[Panel]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(rows: list[dict]) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of the finite numeric values (a later row of a step wins)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        for k, v in r.items():
            if k != "step" and _finite(v):
                out.setdefault(k, {})[int(r["step"])] = float(v)
    return out


def _line(label: str, points: Mapping[int, float]) -> Line:
    xs = sorted(points)
    return Line(label, xs, [points[x] for x in xs])


def _heldout_reward(series: dict, reward_before: float | None, summary: Mapping[str, Any]) -> Line | None:
    pts = dict(series.get(HELDOUT_REWARD, {}))
    lo_s, hi_s = (series.get(k, {}) for k in HELDOUT_CI)
    lo = {s: lo_s.get(s) for s in pts}
    hi = {s: hi_s.get(s) for s in pts}
    if reward_before is None and _finite(summary.get("eval/reward_before")):
        reward_before = float(summary["eval/reward_before"])
    if reward_before is not None and 0 not in pts:
        pts[0], lo[0], hi[0] = float(reward_before), None, None
    after, last = summary.get("eval/reward_after"), summary.get("steps")
    if _finite(after) and isinstance(last, int) and last not in pts:
        pts[last] = float(after)
        ci = summary.get("eval/reward_gain_ci95")
        ok = reward_before is not None and isinstance(ci, (list, tuple)) and len(ci) == 2 and all(map(_finite, ci))
        lo[last], hi[last] = ((reward_before + ci[0], reward_before + ci[1]) if ok else (None, None))
    if not pts:
        return None
    xs = sorted(pts)
    return Line("policy (held-out prompts)", xs, [pts[x] for x in xs], [lo[x] for x in xs], [hi[x] for x in xs])


def figure_specs(rows: list[dict], *, reward_before: float | None = None,
                 summary: Mapping[str, Any] | None = None) -> list[FigureSpec]:
    """The figures of the module docstring for the metric ``rows`` (as :func:`read_jsonl` returns them)."""
    if reward_before is not None and not _finite(reward_before):
        raise ValueError(f"plot_metrics: reward_before must be a finite number, got {reward_before!r}")
    summary = summary or {}
    series = _series(rows)
    specs: list[FigureSpec] = []

    panels = []
    reward = _heldout_reward(series, reward_before, summary)
    if reward is not None:
        panels.append(Panel(f"held-out reward ({HELDOUT_REWARD}; step 0 = reference)", [reward]))
    kl = dict(series.get(HELDOUT_KL, {}))
    last = summary.get("steps")
    if _finite(summary.get(HELDOUT_KL)) and isinstance(last, int) and last not in kl:
        kl[last] = float(summary[HELDOUT_KL])
    if kl and reward is not None and 0 in reward.xs and 0 not in kl:
        kl[0] = 0.0   # step 0 is the reference: KL(reference || reference) = 0
    if kl:
        panels.append(Panel(f"KL to the reference ({HELDOUT_KL})", [_line("policy", kl)]))
    if panels:
        specs.append(FigureSpec("reward", "held-out reward of the policy", panels))

    data_key = next((k for k in DATA_SCORE_KEYS if k in series), None)
    if data_key is not None:
        specs.append(FigureSpec("data", DATA_TITLE, [Panel(data_key, [_line(data_key, series[data_key])])]))

    def group(name: str, title: str, keys: list[str]) -> None:
        if keys:
            specs.append(FigureSpec(name, title, [Panel(k, [_line(k, series[k])]) for k in keys]))

    group("kl", "KL", [k for k in KL_KEYS if k in series])
    group("losses", "losses", [k for k in LOSS_KEYS if k in series])
    group("is", "importance sampling diagnostics",
          sorted(k for k in series if k.startswith(IS_PREFIXES)))
    group("replay", "replay diagnostics", sorted(k for k in series if k.startswith(REPLAY_PREFIX)))
    return specs


def _render(spec: FigureSpec, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 2.4 * len(spec.panels)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(spec.panels), 1, squeeze=False)[:, 0]
    for ax, panel in zip(axes, spec.panels):
        for ln in panel.lines:
            marker = "o" if len(ln.xs) < 20 else None
            ax.plot(ln.xs, ln.ys, marker=marker, markersize=3, linewidth=1.2, label=ln.label)
            if ln.lo is not None and ln.hi is not None:
                pts = [(x, y, lo, hi) for x, y, lo, hi in zip(ln.xs, ln.ys, ln.lo, ln.hi)
                       if lo is not None and hi is not None]
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                                yerr=[[max(p[1] - p[2], 0.0) for p in pts], [max(p[3] - p[1], 0.0) for p in pts]],
                                fmt="none", capsize=3, linewidth=1.0, label="95% interval")
        if len(panel.lines) > 1 or any(ln.lo is not None for ln in panel.lines):
            ax.legend(fontsize=7)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    fig.suptitle(spec.title, fontsize=10)
    fig.savefig(path, dpi=100)
    return path


def _load_summary(summary: Mapping[str, Any] | str | Path | None, metrics_jsonl: Path) -> Mapping[str, Any]:
    if isinstance(summary, Mapping):
        return summary
    path = Path(summary) if summary is not None else metrics_jsonl.with_name("summary.json")
    if summary is not None and not path.is_file():
        raise FileNotFoundError(f"plot_metrics: summary {path} does not exist")
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"plot_metrics: {path} is not a JSON object")
    return data


def plot_metrics(metrics_jsonl: str | Path, out_dir: str | Path, *, reward_before: float | None = None,
                 summary: Mapping[str, Any] | str | Path | None = None) -> list[Path]:
    """Write the figures of the module docstring into ``out_dir``; returns the paths written."""
    metrics_jsonl = Path(metrics_jsonl)
    if not metrics_jsonl.is_file():
        raise FileNotFoundError(f"plot_metrics: {metrics_jsonl} does not exist")
    specs = figure_specs(read_jsonl(metrics_jsonl), reward_before=reward_before,
                         summary=_load_summary(summary, metrics_jsonl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_render(spec, out_dir / f"{spec.name}.png") for spec in specs]


__all__ = ["DATA_SCORE", "DATA_SCORE_KEYS", "DATA_TITLE", "FigureSpec", "HELDOUT_CI", "HELDOUT_KL", "HELDOUT_REWARD",
           "KL_KEYS", "LOSS_KEYS", "Line", "Panel", "figure_specs", "plot_metrics"]
