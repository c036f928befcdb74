"""``python -m jaxppo.prompts --config FILE --side train|heldout --out PROMPTS.jsonl [dotted.key=value ...]``

Writes the distinct prompts of a preference config's pairs (``data.schema=preference``, e.g.
``configs/dpo_hh_stories260k.yaml``) on one side of its by-prompt split, one ``{"prompt": ...}`` object a line in
file order: the ``rollout.prompts`` file of a collection that must not sample evaluation prompts. The split is
DPO's own (``jaxppo.trainer.dpo.algorithm.split_pairs``: ``data.eval_fraction``, ``data.seed``), which the reward model
and ``configs/hh_offline_stories260k.yaml`` share, so ``--side train`` keeps every prompt those runs hold out out of
the collected data. Prints the counts; bad input exits with status 2 and one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

PROG = "python -m jaxppo.prompts"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli.util import parse_args_and_config, run_cli
    from jaxppo.config import ConfigError

    def options(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--side", choices=("train", "heldout"), required=True)
        ap.add_argument("--out", required=True, help="output .jsonl file")

    args, cfg = parse_args_and_config(PROG, "Prompts of one side of a preference config's by-prompt split.", argv,
                                      add_arguments=options, config_required=True)

    def work() -> tuple[int, int, int, int, Path]:
        if cfg.data.schema != "preference":
            raise ConfigError(f"data.schema must be 'preference' (pairs split by prompt), got {cfg.data.schema!r}")
        from jaxppo.hf import load_tokenizer
        from jaxppo.hf.paths import tokenizer_path
        from jaxppo.trainer.dpo.algorithm import pair_prompts

        train, heldout, n_unsplit = pair_prompts(cfg, load_tokenizer(tokenizer_path(cfg.model)))
        keep = train if args.side == "train" else heldout
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in keep), encoding="utf-8")
        return len(train), len(heldout), n_unsplit, len(keep), out

    def report(counts: tuple[int, int, int, int, Path]) -> None:
        n_train, n_held, n_unsplit, n_keep, out = counts
        print(f"{n_train} training prompts, {n_held} held-out prompts, {n_unsplit} in neither (not tokenized); "
              f"wrote the {n_keep} {args.side} prompts to {out}")

    return run_cli(PROG, work, report)


if __name__ == "__main__":
    raise SystemExit(main())
