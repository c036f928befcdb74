"""``python -m jaxppo.train --config FILE [dotted.key=value ...]``: offline PPO (see ``jaxppo.trainer.loop``)."""

from __future__ import annotations

import json
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from jaxppo.cli_util import parse_config_args, setup_logging
    from jaxppo.config import ConfigError

    _, cfg = parse_config_args("python -m jaxppo.train", "Offline PPO with importance sampling and prioritized "
                               "replay.", argv)
    setup_logging(cfg.trainer.output_dir, "train.log")
    from jaxppo.trainer.loop import train

    try:
        summary = train(cfg)
    except ConfigError as e:
        raise SystemExit(f"python -m jaxppo.train: config error: {e}") from None
    keys = ("eval/reward_before", "eval/reward_after", "eval/reward_gain_ci95", "eval/kl", "time/total_s")
    print(json.dumps({k: summary[k] for k in keys if k in summary}))
    print(f"outputs in {cfg.trainer.output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
