"""``python -m jaxppo.train --config FILE [dotted.key=value ...]``: offline PPO (see ``jaxppo.trainer.ppo.algorithm``).

Bad input — a config error, a missing ``model.path``, an unreadable dataset or hub name, a checkpoint
written by another run or damaged beyond recovery — is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
from typing import Sequence

PROG = "python -m jaxppo.train"


def main(argv: Sequence[str] | None = None) -> int:
    from jaxppo.cli.util import parse_config_args, run_cli, setup_logging

    _, cfg = parse_config_args(PROG, "Offline PPO with importance sampling and prioritized replay.", argv)
    from jaxppo.trainer.checkpoint import CheckpointError
    from jaxppo.trainer.ppo.algorithm import train

    def work() -> dict:
        setup_logging(cfg.trainer.output_dir, "train.log")
        if cfg.reward.kind == "model":   # a wrong reward.model_path is reported before any model or data is loaded
            from jaxppo.rewards.model_io import check_reward_model_dir

            check_reward_model_dir(cfg.reward.model_path)
        return train(cfg)

    def report(summary: dict) -> None:
        keys = ("eval/reward_before", "eval/reward_after", "eval/reward_gain_ci95", "eval/kl", "time/total_s")
        print(json.dumps({k: summary[k] for k in keys if k in summary}))
        print(f"outputs in {cfg.trainer.output_dir}")

    return run_cli(PROG, work, report, errors=(CheckpointError,), config_error_form=True)


if __name__ == "__main__":
    raise SystemExit(main())
