"""``python -m jaxppo.dpo --config FILE [dotted.key=value ...]`` — offline DPO on preference pairs.

The DPO family of ``jaxppo.ops.dpo_loss`` (``dpo.loss_type``: sigmoid, hinge, ipo, robust, sigmoid_norm; ``dpo.beta``,
``dpo.label_smoothing``, ``dpo.rpo_alpha``) trained on the pairs of ``data.path`` (``data.schema=preference``) with
the models, mesh, checkpoints, guards, logs and held-out evaluation of the PPO trainer; see
:mod:`jaxppo.trainer.dpo.algorithm` for what is written under ``trainer.output_dir``. Bad input (config values, files,
data, unusable checkpoints) exits with status 2 and one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

PROG = "python -m jaxppo.dpo"


def format_summary(s: dict[str, Any], *, unpaired: bool = False) -> str:
    """The short console summary of a DPO ``summary.json`` dict. ``unpaired`` (``dpo.loss_type=kto``): the counts
    are labelled rows and the accuracy is the share whose implicit reward lies on their label's side of ``z0``."""
    lines = []
    if "eval/rewards/accuracies" in s:
        lo, hi = s["eval/rewards/accuracies_ci95"]
        what, unit = ("label accuracy (implicit reward on the label's side of z0)", "rows") if unpaired else \
            ("pair accuracy (implicit reward)", "pairs")
        lines.append(f"held-out {what} {s['eval/rewards/accuracies']:.4f} "
                     f"95% CI [{lo:.4f}, {hi:.4f}] on {s['n_heldout_pairs']} {unit}; margin "
                     f"{s['eval/rewards/margins']:+.4f}; training {unit} {s['train/rewards/accuracies']:.4f}")
    if "eval/reward_after" in s:
        lo, hi = s["eval/reward_gain_ci95"]
        lines.append(f"held-out reward {s['eval/reward_before']:.4f} -> {s['eval/reward_after']:.4f} "
                     f"(gain 95% CI [{lo:+.4f}, {hi:+.4f}]), KL(policy||ref) {s['eval/kl']:.4f}")
    lines.append(f"time {s['time/total_s']:.1f}s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli.util import parse_config_args, run_cli, setup_logging
    from jaxppo.trainer.checkpoint import CheckpointError

    _, cfg = parse_config_args(PROG, "Offline DPO (TRL's loss family) on preference pairs.", argv)

    def work() -> dict[str, Any]:
        setup_logging(cfg.trainer.output_dir, "dpo.log")
        from jaxppo.trainer.dpo.algorithm import train_dpo

        return train_dpo(cfg)

    def report(summary: dict[str, Any]) -> None:
        print(format_summary(summary, unpaired=cfg.dpo.loss_type == "kto"))
        print(f"wrote {Path(cfg.trainer.output_dir) / 'summary.json'}")

    return run_cli(PROG, work, report, errors=(CheckpointError,))


if __name__ == "__main__":
    raise SystemExit(main())
