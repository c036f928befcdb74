"""``python -m jaxppo.reward train|score|to-scored --config FILE [dotted.key=value ...]``

- ``train``: Bradley-Terry reward model on the preference pairs of ``data.path`` (held-out
  ``data.eval_fraction`` of the prompts), trunk ``model.path``; writes the model folder and
  ``metrics.json`` (``eval/accuracy``, the data skip counters, timings) to ``trainer.output_dir``.
- ``score`` and ``to-scored``: :func:`jaxppo.rewards.scoring.score_dataset` (``scores.jsonl``,
  ``score_metrics.json``) and :func:`jaxppo.rewards.scoring.preference_to_scored` (``scored.jsonl``: each distinct
  answer once, per-prompt ``group_id``, the reward model's score or the answer's win rate; ``to_scored_metrics.json``);
  their outputs are listed in :mod:`jaxppo.rewards.scoring`'s docstring. The data report is printed.

Offline PPO on such a file: the behaviour policy μ (the humans who wrote the answers) is unknown, so
the trainer takes the behaviour log-probs from the reference policy: π_prox/μ becomes π_prox/π_ref.
Importance sampling then corrects for the policy's drift from the reference, not for the true
(human) behaviour distribution; human answers can have very low log-probs under the reference, and
truncated importance sampling keeps the ratios bounded but the data stay off-policy.

Conversational data (chat messages) is rendered with the reward model's saved tokenizer and its chat
template (see :mod:`jaxppo.data.conversation`).

This module parses the command line and reports; the work is done by
:func:`jaxppo.rewards.model_training.train_reward_model` and :mod:`jaxppo.rewards.scoring`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

# the library functions live in jaxppo.rewards.scoring; re-exported for callers of their old home
from jaxppo.rewards.scoring import preference_to_scored, score_dataset, score_texts, scored_records  # noqa: F401


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli.util import parse_config_args, run_cli, setup_logging
    from jaxppo.data.report import data_summary
    from jaxppo.hf.paths import resolve_model_path

    prog = "python -m jaxppo.reward"
    command, cfg = parse_config_args(prog, "Train or apply a Bradley-Terry reward model, or turn preference pairs "
                                           "into a scored dataset.",
                                     argv, commands=("train", "score", "to-scored"))

    def work() -> None:
        if command == "score" or (command == "to-scored" and cfg.reward.model_path):
            from jaxppo.rewards.model_io import check_reward_model_dir

            check_reward_model_dir(cfg.reward.model_path)   # before any model or data is loaded
        setup_logging(cfg.trainer.output_dir, f"reward_{command}.log")
        if command == "train":
            from jaxppo.rewards.model_training import train_reward_model

            m = train_reward_model(cfg, out_dir=cfg.trainer.output_dir, progress=cfg.trainer.progress,
                                   resolve_path=resolve_model_path).metrics
            if not cfg.trainer.progress:   # with progress the report was printed before training
                print(data_summary(m["data_report"]))
            lo, hi = m["eval/accuracy_ci95"]
            print(f"eval/accuracy {m['eval/accuracy']:.4f} [95% interval over prompts {lo:.4f}, {hi:.4f}] on "
                  f"{m['n_eval_pairs']} held-out pairs ({m['n_eval_prompts']} prompts; before training "
                  f"{m['eval/accuracy_init']:.4f}; pick-the-shorter-answer {m['eval/length_baseline_accuracy']:.4f}, "
                  f"pick-the-longer-answer {m['eval/longer_baseline_accuracy']:.4f}); "
                  f"train {m['time/train_s']:.1f}s; wrote {Path(cfg.trainer.output_dir) / 'metrics.json'}")
            for w in m["warnings"]:
                print(w)
        elif command == "to-scored":
            m = preference_to_scored(cfg)
            print(data_summary(m["data_report"]))
            how = {"reward_model": f"reward-model scores ({cfg.reward.model_path}; pair accuracy "
                                   f"{m.get('accuracy', float('nan')):.4f})",
                   "rating": "the rows' ratings as scores (no reward.model_path)",
                   "win_rate": "win-rate scores (wins / pairs; no reward.model_path)"}[m["score_source"]]
            print(f"wrote {m['n_rows']} scored rows (each distinct answer once; {m['n_prompts']} prompt groups) "
                  f"from {m['n_pairs']} pairs with {how} to {m['output']}; no behaviour log-probs: training takes "
                  "them from the reference policy")
        else:
            m = score_dataset(cfg)
            print(data_summary(m["data_report"]))
            key = "accuracy" if "accuracy" in m else "rm_score_mean"
            print(f"{key} {m[key]:.4f}; wrote {Path(cfg.trainer.output_dir) / 'scores.jsonl'}")

    return run_cli(prog, work)


if __name__ == "__main__":
    raise SystemExit(main())
