"""``python -m jaxppo.reward train|score --config FILE [dotted.key=value ...]``

- ``train``: Bradley-Terry reward model on the preference pairs of ``data.path`` (held-out
  ``data.eval_fraction`` of the prompts), trunk ``model.path``; writes the model folder and
  ``metrics.json`` (``eval/accuracy``, the data skip counters, timings) to ``trainer.output_dir``.
- ``score``: loads ``reward.model_path`` and scores ``data.path``: for ``data.schema=preference``
  it reports the accuracy on all usable pairs, for ``scored`` data it scores each (prompt,
  response) and, when the rows carry a score, the correlation with it. Writes
  ``trainer.output_dir/scores.jsonl`` and ``score_metrics.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxppo.config import Config


def score_dataset(cfg: Config) -> dict:
    """Score ``cfg.data`` with the reward model ``cfg.reward.model_path``; returns the metrics."""
    from jaxppo.data.pipeline import load_rows
    from jaxppo.rewards.model_io import load_reward_scorer

    if not cfg.reward.model_path:
        raise ValueError("reward.model_path is not set: give the folder written by `python -m jaxppo.reward train`")
    t0 = time.perf_counter()
    scorer = load_reward_scorer(cfg.reward.model_path, batch_size=cfg.reward.eval_batch_size)
    loaded = load_rows(cfg.data)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"model_path": cfg.reward.model_path, "data": cfg.data.path, "schema": loaded.schema}
    records = []
    if loaded.schema == "preference":
        rc, rj = scorer.score_pairs(loaded.rows)
        metrics.update({"accuracy": float(np.mean(rc > rj)), "margin": float(np.mean(rc - rj)),
                        "n_pairs": len(loaded.rows)})
        records = [{"index": p.index, "r_chosen": float(a), "r_rejected": float(b)}
                   for p, a, b in zip(loaded.rows, rc, rj)]
    else:
        r = scorer([x.prompt for x in loaded.rows], [x.response for x in loaded.rows])
        s = np.array([x.score for x in loaded.rows], np.float32)
        metrics.update({"n_rows": len(loaded.rows), "rm_score_mean": float(r.mean()), "rm_score_std": float(r.std())})
        if len(r) > 1 and r.std() > 0 and s.std() > 0:
            metrics["pearson_with_score"] = float(np.corrcoef(r, s)[0, 1])
        records = [{"index": x.index, "rm_score": float(v)} for x, v in zip(loaded.rows, r)]
    metrics.update(loaded.report.flat_metrics())
    metrics["data_report"] = loaded.report.to_dict()
    metrics["time_s"] = time.perf_counter() - t0
    with open(out / "scores.jsonl", "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    (out / "score_metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli_util import USER_ERRORS, parse_config_args, report_user_error, resolve_model_path, setup_logging

    prog = "python -m jaxppo.reward"
    command, cfg = parse_config_args(prog, "Train or apply a Bradley-Terry reward model.",
                                     argv, commands=("train", "score"))
    try:
        setup_logging(cfg.trainer.output_dir, f"reward_{command}.log")
        if command == "train":
            from jaxppo.rewards.model_training import train_reward_model

            m = train_reward_model(cfg, out_dir=cfg.trainer.output_dir, progress=cfg.trainer.progress,
                                   resolve_path=resolve_model_path).metrics
            print(f"eval/accuracy {m['eval/accuracy']:.4f} on {m['n_eval_pairs']} held-out pairs "
                  f"({m['n_eval_prompts']} prompts; before training {m['eval/accuracy_init']:.4f}, "
                  f"shorter-answer baseline {m['eval/length_baseline_accuracy']:.4f}); "
                  f"train {m['time/train_s']:.1f}s; wrote {Path(cfg.trainer.output_dir) / 'metrics.json'}")
        else:
            m = score_dataset(cfg)
            key = "accuracy" if "accuracy" in m else "rm_score_mean"
            print(f"{key} {m[key]:.4f}; wrote {Path(cfg.trainer.output_dir) / 'scores.jsonl'}")
    except USER_ERRORS as e:
        return report_user_error(prog, e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
