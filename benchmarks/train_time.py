"""Paired training time of two arms of one config: prioritized replay + importance sampling against uniform replay
without IS (the default), or packed against padded batches.

    python benchmarks/train_time.py [--compare per_is|packing] [--pairs 6] [--config configs/smoke.yaml]
                                    [--out results/train_time.json]

The same offline data and budget (the config's ``trainer.total_steps``), two arms (``COMPARISONS``) that differ
only in

- ``per_is``: ``per_is`` = ``replay.sampling=prioritized`` (the config's alpha and beta) with token-level truncated
  IS vs ``uniform`` = ``replay.sampling=uniform``, ``importance.enabled=false``;
- ``packing``: ``packed`` = ``data.packing=true`` vs ``padded`` = ``data.packing=false``.

Each run is ``python -m jaxppo.train`` in its own process (a fresh compile each time, no shared cache), evaluation
only at the end, and the arms alternate in ABBA order (``per_is, uniform, uniform, per_is, ...``) so a drift of the
machine's speed hits both. Per run it records the wall time of the process, the trainer's update-step time
(``time/train_s``: update steps only, with the first step's compile) and the time to the end of training. The
paired statistic is the log-ratio ``l_k = log(t_per_is,k / t_uniform,k)`` of the k-th pair; the record gives
``exp(mean l)`` with the 95% t-interval of the mean, so "PER + IS saves 25% of the training time" would read as a
ratio of 0.75 with an interval below 1. Run it on an idle machine: the record holds the load average before and
after every run, the machine (``benchmarks/machine.py``) and the git commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: comparison -> {arm: overrides}, the first arm the ratio's numerator
COMPARISONS = {
    "per_is": {"per_is": ["replay.sampling=prioritized", "importance.enabled=true", "importance.level=token",
                          "importance.mode=truncate"],
               "uniform": ["replay.sampling=uniform", "importance.enabled=false"]},
    "packing": {"packed": ["data.packing=true"], "padded": ["data.packing=false"]},
}
ARMS = COMPARISONS["per_is"]
WHAT = {"per_is": "training time, prioritized replay + token IS vs uniform replay without IS, ABBA pairs",
        "packing": "training time, packed vs padded batches (data.packing), ABBA pairs"}
COMMON = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false", "trainer.save_hf=false"]


def abba(pairs: int, arms: tuple[str, str] = ("per_is", "uniform")) -> list[str]:
    """The run order: ``A, B`` then ``B, A``, alternating, ``2 x pairs`` runs."""
    a, b = arms
    out: list[str] = []
    for k in range(pairs):
        out += [a, b] if k % 2 == 0 else [b, a]
    return out


def paired_ratio(a: list[float], b: list[float]) -> dict:
    """``exp(mean log(a_k / b_k))`` with the 95% t-interval of the mean log-ratio (NaN bounds for one pair)."""
    from jaxppo.sweeps.stats import t_interval

    logs = [math.log(x / y) for x, y in zip(a, b)]
    m, lo, hi = t_interval(logs)
    return {"ratio": math.exp(m), "lo": math.exp(lo) if math.isfinite(lo) else math.nan,
            "hi": math.exp(hi) if math.isfinite(hi) else math.nan, "pairs": len(logs)}



def run_one(config: str, arm: str, extra: list[str], out_dir: Path, arms: dict | None = None) -> dict:
    """One training run of ``arm`` (of ``arms``, default ``ARMS``) in its own process; its times from the process
    and its ``summary.json``."""
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "jaxppo.train", "--config", config, *COMMON, *(arms or ARMS)[arm], *extra,
           f"trainer.output_dir={out_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    summ = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    return {"arm": arm, "wall_s": wall, "train_s": float(summ["time/train_s"]), "total_s": float(summ["time/total_s"]),
            "first_step_s": float(summ.get("time/first_step_s", math.nan)),
            "reward_after": summ.get("eval/reward_after"), "load_before": load_before,
            "load_after": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smoke.yaml")
    ap.add_argument("--compare", choices=list(COMPARISONS), default="per_is")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", default="results/train_time.json")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides for both arms")
    args = ap.parse_args(argv)
    from benchmarks.machine import describe, git_commit

    arms = COMPARISONS[args.compare]
    a, b = list(arms)
    runs = []
    with tempfile.TemporaryDirectory(prefix="jaxppo_train_time_") as tmp:
        for i, arm in enumerate(abba(args.pairs, (a, b))):
            r = run_one(args.config, arm, list(args.overrides), Path(tmp) / f"{i:02d}_{arm}", arms)
            runs.append(r)
            print(f"{i:2d} {arm:8s} train {r['train_s']:.2f} s, wall {r['wall_s']:.2f} s, load {r['load_before'][0]:.2f}",
                  flush=True)
    per = {arm: [r for r in runs if r["arm"] == arm] for arm in arms}
    doc = {"what": WHAT[args.compare],
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(), "machine": describe(), "config": args.config, "overrides": list(args.overrides),
           "arms": arms, "runs": runs,
           "train_ratio": paired_ratio([r["train_s"] for r in per[a]], [r["train_s"] for r in per[b]]),
           "wall_ratio": paired_ratio([r["wall_s"] for r in per[a]], [r["wall_s"] for r in per[b]])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    t = doc["train_ratio"]
    print(f"{a} / {b} update-step time: {t['ratio']:.3f} [{t['lo']:.3f}, {t['hi']:.3f}] over {t['pairs']} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
