"""``python -m jaxppo.evaluate --config FILE [--policy PATH] trainer.output_dir=DIR [dotted.key=value ...]``

Compares a policy with the reference ``model.path`` on the held-out prompts of the config's dataset:

- the held-out rows are those of training (``jaxppo.data.split.split_data``: same ``data.*`` config
  and ``data.seed`` → same held-out prompt groups); one prompt per held-out group (its first row), at
  most ``trainer.eval_prompts`` — the prompts of the trainer's final evaluation;
- ``--policy PATH``: a Hugging Face folder (the trainer's export ``<run>/hf``) or ``.gguf`` file; default
  ``model.path`` (the reference evaluated against itself);
- each model samples one response per prompt with ``rollout.temperature`` / ``top_k`` / ``top_p`` and
  ``min(rollout.max_new_tokens, data.max_response_length)`` new tokens, both with the trainer's
  evaluation key ``fold_in(PRNGKey(trainer.seed), 10007)``; the responses are scored by ``reward.*``.

Writes ``DIR/eval.json``:

- ``eval/reward_policy``, ``eval/reward_reference``: mean rewards; ``eval/reward_gain`` = their difference;
- ``eval/reward_gain_ci95``: ``[low, high]`` paired per-prompt percentile bootstrap of the gain
  (``bootstrap_ci``, seed ``trainer.seed``);
- ``eval/kl``: ``Σ_bt m_bt (log π(y_bt) − log π_ref(y_bt)) / Σ_bt m_bt`` over the policy's samples (k1);
- ``eval/perplexity`` (``eval/perplexity_reference``): ``exp`` of the mean negative log-prob of the held-out
  dataset responses under the policy (the reference);
- ``eval/response_length_policy|reference``, ``n_prompts``, ``n_heldout_rows``, the paths and the config;
- with ``--pairs FILE`` (a preference-pair config, e.g. a DPO config on the same prompts):
  ``eval/pair_accuracy`` and ``eval/pair_accuracy_ci95``, the share of that config's held-out pairs whose
  implicit reward ``log π(y|x) − log π_ref(y|x)`` ranks the chosen answer first, with a bootstrap interval over
  held-out prompts (:func:`jaxppo.trainer.policy_eval.heldout_pair_accuracy`);

and ``DIR/eval_samples.jsonl`` (one line a prompt: ``prompt``, ``response_policy``,
``response_reference``, ``reward_policy``, ``reward_reference``), and prints a short table. The evaluation is
the trainers' own (``jaxppo.trainer.evaluation.heldout_eval`` / ``compare``), run by
:func:`jaxppo.trainer.policy_eval.evaluate`; this module parses the command line and reports. The mesh is
``mesh.data × mesh.fsdp × mesh.tensor`` of the first devices. Bad input (missing policy, no held-out
prompts, a policy whose vocabulary differs from the reference's) exits with status 2 and one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from jaxppo.trainer.policy_eval import evaluate

PROG = "python -m jaxppo.evaluate"


def format_table(r: dict[str, Any]) -> str:
    """The short console summary of an eval.json dict."""
    lo, hi = r["eval/reward_gain_ci95"]
    rows = [("", "reference", "policy"),
            ("reward (mean)", f"{r['eval/reward_reference']:.4f}", f"{r['eval/reward_policy']:.4f}"),
            ("response length", f"{r['eval/response_length_reference']:.1f}",
             f"{r['eval/response_length_policy']:.1f}"),
            ("held-out perplexity", f"{r['eval/perplexity_reference']:.3f}", f"{r['eval/perplexity']:.3f}")]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c:>10}" for a, b, c in rows]
    lines.append(f"reward gain {r['eval/reward_gain']:+.4f}  95% CI [{lo:+.4f}, {hi:+.4f}]  "
                 f"KL(policy||ref) {r['eval/kl']:.5f}  ({r['n_prompts']} held-out prompts)")
    if "eval/pair_accuracy" in r:
        plo, phi = r["eval/pair_accuracy_ci95"]
        lines.append(f"held-out pair accuracy {r['eval/pair_accuracy']:.3f}  95% CI [{plo:.3f}, {phi:.3f}]  "
                     f"({r['n_heldout_pairs']} pairs, {r['n_heldout_pair_prompts']} prompts)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for bad input)."""
    from jaxppo.cli.util import parse_config_args, run_cli, setup_logging

    args = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(prog=PROG, add_help=False)
    pre.add_argument("--policy", default=None)
    pre.add_argument("--pairs", default=None)
    known, rest = pre.parse_known_args(args)
    _, cfg = parse_config_args(PROG, "Evaluate a policy against the reference model.path on the held-out prompts. "
                               "--policy PATH: the policy (a HF folder such as <run>/hf, or a .gguf file; default "
                               "model.path). --pairs FILE: a preference-pair config whose held-out pairs give the "
                               "implicit-reward pair accuracy.", rest)

    def work() -> dict[str, Any]:
        from jaxppo.config import load_config

        setup_logging(cfg.trainer.output_dir, "evaluate.log")
        pairs_cfg = None if known.pairs is None else load_config(known.pairs)
        return evaluate(cfg, known.policy, pairs_cfg=pairs_cfg)

    def report(result: dict[str, Any]) -> None:
        print(format_table(result))
        print(f"wrote {Path(cfg.trainer.output_dir) / 'eval.json'} and eval_samples.jsonl")

    return run_cli(PROG, work, report)


if __name__ == "__main__":
    raise SystemExit(main())
