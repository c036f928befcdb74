"""Offline preference data (HH-RLHF) four ways, one evaluation: DPO, KTO, offline PPO on the human answers and
collect-then-PPO, each run from its shipped config, each policy evaluated by the same command.

    python benchmarks/hh_comparison.py [--methods dpo kto offline_ppo collect_ppo] [--out results/hh]
    python benchmarks/hh_comparison.py --table          # docs/results.md's HH table from the records

Run from the repository root of a clone next to ``../shared``. The preparation steps are the configs' own header
commands (skipped when their output exists): the Bradley-Terry reward model (``configs/rm_hh_stories260k.yaml``),
the pairs as RM-scored answers (``reward to-scored``, for offline PPO), the pairs as unpaired win-rate rows (for
KTO) and DPO's training-side prompts (for collect-then-PPO). Each method then trains in its own process and
``jaxppo evaluate --config configs/hh_offline_stories260k.yaml --policy <run>/hf --pairs
configs/dpo_hh_stories260k.yaml`` evaluates it: the reward model's score of sampled answers on the same held-out
prompts (gain over the reference with a paired bootstrap interval), KL to the reference, and the implicit-reward
accuracy on the same held-out pairs. One record per method, ``<out>/<method>.json``: the command, the training
wall time, the training summary's and the evaluation's figures, the date, the machine, the load average before and
after, and the git commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVAL_CONFIG = "configs/hh_offline_stories260k.yaml"
PAIRS_CONFIG = "configs/dpo_hh_stories260k.yaml"
RM_DIR = "runs/rm_hh_stories260k"

#: preparation: (output that marks it done, command); the configs' header commands
PREPARE: list[tuple[str, list[str]]] = [
    (f"{RM_DIR}/reward_config.json", ["reward", "train", "--config", "configs/rm_hh_stories260k.yaml",
                                     f"trainer.output_dir={RM_DIR}"]),
    ("runs/hh_scored/scored.jsonl", ["reward", "to-scored", "--config", PAIRS_CONFIG, f"reward.model_path={RM_DIR}",
                                     "trainer.output_dir=runs/hh_scored"]),
    ("runs/hh_unpaired/scored.jsonl", ["reward", "to-scored", "--config", PAIRS_CONFIG, "reward.model_path=null",
                                       "trainer.output_dir=runs/hh_unpaired"]),
    ("runs/hh_prompts.jsonl", ["prompts", "--config", PAIRS_CONFIG, "--side", "train", "--out",
                               "runs/hh_prompts.jsonl"]),
]

#: method -> (label, config, training command, what it trains on)
METHODS: dict[str, tuple[str, str, str, str]] = {
    "dpo": ("DPO (sigmoid, β 0.1)", "configs/dpo_hh_stories260k.yaml", "dpo", "human pairs"),
    "kto": ("KTO (β 0.1)", "configs/kto_hh_stories260k.yaml", "dpo", "human answers, unpaired (chosen = desirable)"),
    "offline_ppo": ("offline PPO on the human answers", "configs/hh_offline_stories260k.yaml", "train",
                    "human answers, RM-scored"),
    "collect_ppo": ("collect-then-PPO", "configs/hh_rlhf_stories260k.yaml", "train",
                    "stories260K samples on the training prompts, RM-scored"),
}

#: summary keys kept in a record (those present)
SUMMARY_KEYS = ("train/samples_consumed", "train/tokens_consumed", "n_train", "n_heldout", "n_train_pairs",
                "n_heldout_pairs", "eval/rewards/accuracies", "eval/rewards/accuracies_ci95", "time/total_s",
                "time/train_s")
EVAL_KEYS = ("eval/reward_reference", "eval/reward_policy", "eval/reward_gain", "eval/reward_gain_ci95", "eval/kl",
             "eval/perplexity", "eval/perplexity_reference", "eval/pair_accuracy", "eval/pair_accuracy_ci95",
             "n_prompts", "samples_per_prompt", "n_heldout_pairs", "n_heldout_pair_prompts")

TABLE_BEGIN, TABLE_END = "<!-- hh:begin -->", "<!-- hh:end -->"


def jaxppo(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "jaxppo.cli", *args]


def run(cmd: list[str]) -> float:
    """Run ``cmd`` at the repository root; its wall time in seconds (an error names the command and its last line)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise SystemExit(f"hh_comparison: {' '.join(cmd[2:])} failed ({proc.returncode}): {last}")
    return time.perf_counter() - t0



def train_wall(seconds: float, summary: dict) -> float | None:
    """The training's wall time: ``seconds``, or None when the run resumed after some steps of an earlier process
    (``summary["resumed_from"]`` > 0; resumed at step 0, every step ran in this process)."""
    return None if summary.get("resumed_from") else seconds


def measure(method: str, out: Path) -> dict:
    """Train ``method`` from its config into ``runs/hh/<method>``, evaluate it, write ``out/<method>.json``."""
    from benchmarks.machine import describe, git_commit

    label, config, command, data = METHODS[method]
    run_dir = f"runs/hh/{method}"
    train_cmd = [command, "--config", config, f"trainer.output_dir={run_dir}", "trainer.progress=false"]
    load_before = list(os.getloadavg())
    train_s = run(jaxppo(train_cmd))
    load_after = list(os.getloadavg())
    eval_dir = f"runs/hh/eval/{method}"
    eval_cmd = ["evaluate", "--config", EVAL_CONFIG, "--policy", f"{run_dir}/hf", "--pairs", PAIRS_CONFIG,
                f"trainer.output_dir={eval_dir}"]
    run(jaxppo(eval_cmd))
    summary = json.loads((REPO / run_dir / "summary.json").read_text(encoding="utf-8"))
    ev = json.loads((REPO / eval_dir / "eval.json").read_text(encoding="utf-8"))
    rec = {"what": "HH-RLHF comparison: one method trained from its config, evaluated by the common command",
           "method": method, "label": label, "config": config, "data": data,
           "train_command": "jaxppo " + " ".join(train_cmd), "eval_command": "jaxppo " + " ".join(eval_cmd),
           "train_wall_s": train_wall(train_s, summary),
           "resumed_from": summary.get("resumed_from"),
           "summary": {k: summary[k] for k in SUMMARY_KEYS if k in summary},
           "eval": {k: ev[k] for k in EVAL_KEYS if k in ev},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(), "machine": describe(), "load_before": load_before, "load_after": load_after}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{method}.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return rec


def _interval(v) -> str:
    lo, hi = v
    return f"[{lo:+.3f}, {hi:+.3f}]"


def _wall(r: dict) -> str:
    if r.get("train_wall_s") is None:
        return f"not measured (resumed at step {r.get('resumed_from')})"
    return f"{r['train_wall_s'] / 60:.1f} min"


def table(records: list[dict]) -> str:
    """The markdown table of the records (the method order of :data:`METHODS`)."""
    head = ("| method | trains on | answers consumed | held-out RM score: reference → policy | gain [95% CI] | KL "
            "| held-out pair accuracy [95% CI] | training wall time |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    if not records:
        return head + "\n| (no records: run `python benchmarks/hh_comparison.py`) | | | | | | | |"
    order = {m: i for i, m in enumerate(METHODS)}
    rows = []
    for r in sorted(records, key=lambda r: order.get(r["method"], len(order))):
        e, s = r["eval"], r["summary"]
        consumed = s.get("train/samples_consumed")
        if r["config"].endswith("dpo_hh_stories260k.yaml") and consumed is not None:
            consumed = 2 * consumed        # a pair is two answers
        acc = e.get("eval/pair_accuracy")
        acc_s = "n/a" if acc is None else f"{acc:.3f} {_interval(e['eval/pair_accuracy_ci95']).replace('+', '')}"
        rows.append(f"| {r['label']} (`{r['config']}`) | {r['data']} | "
                    f"{'n/a' if consumed is None else f'{int(consumed):,}'} | "
                    f"{e['eval/reward_reference']:+.3f} → {e['eval/reward_policy']:+.3f} | "
                    f"{e['eval/reward_gain']:+.3f} {_interval(e['eval/reward_gain_ci95'])} | {e['eval/kl']:.2f} | "
                    f"{acc_s} | {_wall(r)} |")
    return head + "\n" + "\n".join(rows)


def read_records(out: Path) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(out).glob("*.json"))]


def rewrite(text: str, tbl: str) -> str:
    """``text`` with the part between the table markers replaced by ``tbl``."""
    a, b = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    return text[:a] + "\n" + tbl + "\n" + text[b:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="results/hh")
    ap.add_argument("--table", action="store_true", help="only rewrite docs/results.md's table from the records")
    ap.add_argument("--doc", default="docs/results.md")
    args = ap.parse_args(argv)
    out = REPO / args.out
    if not args.table:
        for done, cmd in PREPARE:
            if not (REPO / done).exists():
                print(f"prepare: jaxppo {' '.join(cmd)}", flush=True)
                run(jaxppo(cmd))
        for m in args.methods:
            print(f"train + evaluate: {m}", flush=True)
            rec = measure(m, out)
            print(f"  gain {rec['eval']['eval/reward_gain']:+.3f}, wall {_wall(rec)}", flush=True)
    doc = REPO / args.doc
    doc.write_text(rewrite(doc.read_text(encoding="utf-8"), table(read_records(out))), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
