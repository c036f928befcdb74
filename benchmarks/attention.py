"""CPU time of the attention implementations that run on a CPU (``jaxppo.models.attention``: reference, xla) at the
SmolLM2-135M attention shape (9 query heads, 3 kv heads, head dim 64), forward + backward: the record behind
``models.attention.CPU_AUTO`` (what ``model.attention: auto`` runs on a CPU).

Timed: the jitted ``value_and_grad`` of ``sum(out · w)`` with respect to q, k and v for left-padded rows (random
lengths, ``SegmentMask`` of the padding mask), one per implementation, all compiled first; per round each is timed best
of 3 in turn (interleaved, so a load change hits all of them), and the record keeps every round, the medians and the
median per-round ratio of each implementation to the reference. The fused kernels (cudnn, splash, pallas_gpu) run on
their accelerators only (in the Pallas interpreter on a CPU, which is no measurement) and are not timed here.

    python benchmarks/attention.py [--batch 8] [--seq 128,512] [--dtypes float32] [--rounds 5]
                                   [--out results/attention_cpu.json]

Run it on an idle machine: the record carries the load average before and after, the machine, the date and the git
commit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import machine  # benchmarks/machine.py (run from the repository root: python benchmarks/attention.py)
from model import SMOLLM2_135M, write_json  # benchmarks/model.py

from jaxppo.models.attention import CPU_AUTO, SegmentMask, segment_attention

REPO = Path(__file__).resolve().parents[1]
CPU_IMPLEMENTATIONS = ("reference", "xla")


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def inputs(batch: int, seq: int, dtype: str, seed: int = 0):
    """q [B, T, 9, 64], k/v [B, T, 3, 64], loss weights, and the left-padding mask (lengths uniform in [T/4, T])."""
    h, kh = SMOLLM2_135M["num_attention_heads"], SMOLLM2_135M["num_key_value_heads"]
    hd = SMOLLM2_135M["hidden_size"] // h
    rng = np.random.default_rng(seed)
    q, k, v, w = (rng.standard_normal((batch, seq, n, hd)).astype(np.float32) for n in (h, kh, kh, h))
    lengths = rng.integers(max(1, seq // 4), seq + 1, size=batch)
    mask = (np.arange(seq)[None, :] >= seq - lengths[:, None]).astype(np.int32)
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), jnp.asarray(w), jnp.asarray(mask)


def step_fn(impl: str):
    """The jitted forward + backward of one implementation: ``(q, k, v, w, mask) -> (loss, (dq, dk, dv))``."""
    def loss(q, k, v, w, mask):
        out = segment_attention(q, k, v, SegmentMask(mask), impl)
        return jnp.sum(out.astype(jnp.float32) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def best_of(fn, n: int = 3) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", default="128,512", help="comma-separated lengths")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "results" / "attention_cpu.json"))
    args = ap.parse_args(argv)
    seqs = [int(s) for s in args.seq.split(",") if s.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    cases = [(dt, t) for dt in dtypes for t in seqs]
    load_before = list(os.getloadavg())
    compiled, compile_s = {}, {}
    for dt, t in cases:
        data = inputs(args.batch, t, dt)
        for impl in CPU_IMPLEMENTATIONS:
            fn = step_fn(impl)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*data))
            compile_s[f"{dt}/{t}/{impl}"] = time.perf_counter() - t0
            compiled[f"{dt}/{t}/{impl}"] = (fn, data)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({key: best_of(lambda fn=fn, data=data: fn(*data)) for key, (fn, data) in compiled.items()})
    medians = {key: statistics.median(r[key] for r in rounds) for key in compiled}
    ratios = {f"{dt}/{t}/{impl}": statistics.median(r[f"{dt}/{t}/{impl}"] / r[f"{dt}/{t}/reference"] for r in rounds)
              for dt, t in cases for impl in CPU_IMPLEMENTATIONS}
    fastest = {f"{dt}/{t}": min(CPU_IMPLEMENTATIONS, key=lambda i: medians[f"{dt}/{t}/{i}"]) for dt, t in cases}
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
           "machine": {**machine.describe(), "jax": jax.__version__, "loadavg_before": load_before,
                       "loadavg_after": list(os.getloadavg())},
           "config": {"batch": args.batch, "seq": seqs, "dtypes": dtypes, "rounds": args.rounds,
                      "heads": SMOLLM2_135M["num_attention_heads"], "kv_heads": SMOLLM2_135M["num_key_value_heads"],
                      "head_dim": SMOLLM2_135M["hidden_size"] // SMOLLM2_135M["num_attention_heads"],
                      "timed": "jit(value_and_grad) wrt q, k, v; best of 3 per round; left-padded rows"},
           "compile_and_first_call_s": compile_s, "rounds": rounds, "median_s": medians,
           "ratio_to_reference_median": ratios, "fastest": fastest, "cpu_auto": CPU_AUTO}
    print(f"attention fwd+bwd, batch {args.batch}, SmolLM2-135M heads (load avg {load_before[0]:.1f} -> "
          f"{res['machine']['loadavg_after'][0]:.1f}); ms, median of {args.rounds} rounds (best of 3 each)")
    for dt, t in cases:
        print(f"{dt:>9} T={t:<5}" + "".join(f"{impl:>11} {medians[f'{dt}/{t}/{impl}'] * 1e3:8.2f}"
                                            f" ({ratios[f'{dt}/{t}/{impl}']:.2f}x)" for impl in CPU_IMPLEMENTATIONS)
              + f"   fastest: {fastest[f'{dt}/{t}']}")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
