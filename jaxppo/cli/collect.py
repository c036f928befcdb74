"""``python -m jaxppo.collect --config FILE trainer.output_dir=DIR [dotted.key=value ...]``

Builds an offline dataset (``DIR/data.parquet`` or ``data.jsonl``, and ``DIR/metadata.json``): what is
sampled, scored and written is documented in :mod:`jaxppo.data.collection`. The work is done by
:func:`jaxppo.data.collection.collect`; this module only parses the command line and reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

# the library functions live in jaxppo.data.collection; re-exported for callers of their old home
from jaxppo.data.collection import collect, read_prompts, sample_responses

PROG = "python -m jaxppo.collect"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli.util import parse_config_args, run_cli, setup_logging

    _, cfg = parse_config_args(PROG, "Sample an offline scored dataset from a behaviour model.", argv)

    def work() -> dict:
        setup_logging(cfg.trainer.output_dir, "collect.log")
        from jaxppo.rewards import reward_fn_from_config

        return collect(cfg, reward_fn_from_config(cfg.reward), progress=cfg.trainer.progress)

    def report(meta: dict) -> None:
        st, tm = meta["stats"], meta["timing_s"]
        print(f"wrote {meta['n_responses']} responses ({meta['n_prompts']} prompts x {meta['sampling']['n']}) to "
              f"{Path(cfg.trainer.output_dir) / meta['data_file']}; score mean {st['score_mean']:.4f} "
              f"std {st['score_std']:.4f}; mean length {st['response_length_mean']:.1f} tokens, "
              f"{100 * st['finished_fraction']:.0f}% ended with EOS; time {tm['total']:.1f}s "
              f"(generate {tm['generate']:.1f}s, {st['tokens_per_s']:.0f} tokens/s)")

    return run_cli(PROG, work, report)


__all__ = ["collect", "main", "read_prompts", "sample_responses"]


if __name__ == "__main__":
    raise SystemExit(main())
