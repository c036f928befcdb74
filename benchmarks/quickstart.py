"""Wall time of the main job (README's first command after the install) from nothing, with its phases and result.

    python benchmarks/quickstart.py [--config configs/quickstart.yaml] [--out results/quickstart.json] [overrides ...]

Runs ``python -m jaxppo.train --config CONFIG`` in its own process with ``trainer.output_dir`` and ``data.path`` in a
fresh temporary folder, so the data is collected as on a first run and no compile cache or behaviour-log-prob cache is
reused. The record holds the process's wall time and, from the run's ``summary.json`` and ``metrics.jsonl``:

- ``setup_s`` (config, model load, data collection when ``data.collect_if_missing``, tokenization, the behaviour
  pass, building the run), ``train_s`` (the step loop: updates, refreshes of the buffer window, the evaluations at
  ``trainer.eval_every``, perplexity checks, checkpoints), ``first_step_s`` (the first update, with its compile),
  and inside ``train_s`` the phases ``evaluations_s`` (the held-out evaluations, step 0 included),
  ``perplexity_s`` (the perplexity checks and their baseline), ``checkpoints_s`` (waits for checkpoint writes);
  ``eval_s`` (the final before/after evaluation), ``export_s`` (``hf/`` and plots), ``total_s``
  (``jaxppo.trainer.harness``);
- ``update_steps_s``: the update steps' own time (the last step's ``perf/train_time_s``), the refreshes of the buffer
  window included (dispatched before a step, waited for inside it);
- the result: ``eval/reward_before``, ``eval/reward_after``, the gain and its paired bootstrap 95% interval.

Run it on an idle machine: the record carries the load average before and after, the machine
(``benchmarks/machine.py``), the date and the git commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SUMMARY_KEYS = ("time/setup_s", "time/train_s", "time/first_step_s", "time/evaluations_s", "time/perplexity_s",
                "time/checkpoints_s", "time/eval_s", "time/export_s", "time/total_s", "eval/reward_before",
                "eval/reward_after", "eval/reward_gain", "eval/reward_gain_ci95", "eval/kl")


def run_main_job(config: str, overrides: list[str], folder: Path) -> dict:
    """The job in its own process under ``folder``; its wall time, the summary keys and the update steps' time."""
    cmd = [sys.executable, "-m", "jaxppo.train", "--config", config, f"trainer.output_dir={folder / 'run'}",
           f"data.path={folder / 'data' / 'data.jsonl'}", "trainer.progress=false", *overrides]
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise RuntimeError(f"the main job failed with exit code {proc.returncode}: {tail[0]}")
    summary = json.loads((folder / "run" / "summary.json").read_text(encoding="utf-8"))
    steps = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    cumulative = [r["perf/train_time_s"] for r in steps if "perf/train_time_s" in r]   # the last step is logged
    return {"command": cmd[1:], "wall_s": wall, "load_before": load_before, "load_after": list(os.getloadavg()),
            "update_steps_s": float(cumulative[-1]) if cumulative else None,
            **{k: summary.get(k) for k in SUMMARY_KEYS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--out", default="results/quickstart.json")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the job")
    args = ap.parse_args(argv)
    from benchmarks.machine import describe, git_commit

    with tempfile.TemporaryDirectory(prefix="jaxppo_quickstart_") as tmp:
        rec = run_main_job(args.config, list(args.overrides), Path(tmp))
    doc = {"what": "wall time of the main job from nothing (data collected, nothing cached), its phases and result",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(), "machine": describe(), "config": args.config, "overrides": list(args.overrides),
           **rec}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{args.config}: {rec['wall_s']:.1f} s wall (setup {rec['time/setup_s']:.1f} s, loop "
          f"{rec['time/train_s']:.1f} s of which updates {rec['update_steps_s']:.1f} s, evaluations "
          f"{rec['time/evaluations_s']:.1f} s, perplexity {rec['time/perplexity_s']:.1f} s, checkpoints "
          f"{rec['time/checkpoints_s']:.1f} s); gain {rec['eval/reward_gain']} {rec['eval/reward_gain_ci95']}; "
          f"load {rec['load_before'][0]:.2f} -> {rec['load_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
