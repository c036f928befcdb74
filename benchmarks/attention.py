"""Time of the attention implementations that run on this backend (``jaxppo.models.attention``; ``RUNS_ON``: on a
CPU reference and xla, on a GPU also cudnn and pallas_gpu, on a TPU also splash) at the SmolLM2-135M attention shape
(9 query heads, 3 kv heads, head dim 64; ``--shape qwen2.5-7b``: 28 / 4 / 128), forward + backward. On a CPU it is
the record behind ``models.attention.CPU_AUTO`` (what ``model.attention: auto`` runs there); on an accelerator it
also checks each fused kernel against the reference (largest absolute difference of the output on real rows and of
the gradients).

Timed: the jitted ``value_and_grad`` of ``sum(out · w)`` with respect to q, k and v for left-padded rows (random
lengths, ``SegmentMask`` of the padding mask), one per implementation, all compiled first; per round each is timed best
of 3 in turn (interleaved, so a load change hits all of them), and the record keeps every round, the medians and the
median per-round ratio of each implementation to the reference. An implementation that fails (a kernel the device
or shape does not take) is recorded with its error and left out of the timings. The fused kernels run on their
accelerators only (in the Pallas interpreter on a CPU, which is no measurement).

    python benchmarks/attention.py [--batch 8] [--seq 128,512] [--dtypes float32] [--rounds 5]
                                   [--shape smollm2-135m] [--out results/attention_cpu.json]

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
RUNS_ON = {"cpu": ("reference", "xla"), "gpu": ("reference", "xla", "cudnn", "pallas_gpu"),
           "tpu": ("reference", "xla", "splash")}
# (heads, kv heads, head dim)
HEADS = {"smollm2-135m": (SMOLLM2_135M["num_attention_heads"], SMOLLM2_135M["num_key_value_heads"],
                          SMOLLM2_135M["hidden_size"] // SMOLLM2_135M["num_attention_heads"]),
         "qwen2.5-1.5b": (12, 2, 128), "qwen2.5-7b": (28, 4, 128)}


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def inputs(batch: int, seq: int, dtype: str, heads: tuple[int, int, int], seed: int = 0):
    """q [B, T, H, hd], k/v [B, T, K, hd], loss weights, and the left-padding mask (lengths uniform in [T/4, T])."""
    h, kh, hd = heads
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


def max_diffs(got, want, mask) -> dict[str, float]:
    """Largest absolute difference of the loss, and of each gradient (dq on real rows), between two step results."""
    (lg, gg), (lw, gw) = got, want
    real = np.asarray(mask, bool)
    out = {"loss": float(abs(np.float32(lg) - np.float32(lw)))}
    for name, a, b in zip(("dq", "dk", "dv"), gg, gw):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        out[name] = float(np.max(np.abs(a[real] - b[real]))) if name == "dq" else float(np.max(np.abs(a - b)))
    return out


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
    ap.add_argument("--shape", choices=sorted(HEADS), default="smollm2-135m")
    ap.add_argument("--out", default=str(REPO / "results" / "attention_cpu.json"))
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    impls = RUNS_ON.get(backend, RUNS_ON["cpu"])
    seqs = [int(s) for s in args.seq.split(",") if s.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    cases = [(dt, t) for dt in dtypes for t in seqs]
    load_before = list(os.getloadavg())
    compiled, compile_s, errors, diffs = {}, {}, {}, {}
    for dt, t in cases:
        data = inputs(args.batch, t, dt, HEADS[args.shape])
        first = {}
        for impl in impls:
            key = f"{dt}/{t}/{impl}"
            fn = step_fn(impl)
            t0 = time.perf_counter()
            try:
                first[impl] = jax.block_until_ready(fn(*data))
            except Exception as e:  # noqa: BLE001 - a kernel the device or shape does not take is a result
                errors[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                continue
            compile_s[key] = time.perf_counter() - t0
            compiled[key] = (fn, data)
            if impl != "reference" and "reference" in first:
                diffs[key] = max_diffs(first[impl], first["reference"], data[4])
    rounds = []
    for _ in range(args.rounds):
        rounds.append({key: best_of(lambda fn=fn, data=data: fn(*data)) for key, (fn, data) in compiled.items()})
    medians = {key: statistics.median(r[key] for r in rounds) for key in compiled}
    ran = lambda dt, t: [i for i in impls if f"{dt}/{t}/{i}" in medians]  # noqa: E731
    ratios = {f"{dt}/{t}/{impl}": statistics.median(r[f"{dt}/{t}/{impl}"] / r[f"{dt}/{t}/reference"] for r in rounds)
              for dt, t in cases for impl in ran(dt, t) if f"{dt}/{t}/reference" in medians}
    fastest = {f"{dt}/{t}": min(ran(dt, t), key=lambda i: medians[f"{dt}/{t}/{i}"]) for dt, t in cases if ran(dt, t)}
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
           "backend": backend, "device": str(jax.devices()[0].device_kind),
           "machine": {**machine.describe(), "jax": jax.__version__, "loadavg_before": load_before,
                       "loadavg_after": list(os.getloadavg())},
           "config": {"batch": args.batch, "seq": seqs, "dtypes": dtypes, "rounds": args.rounds, "shape": args.shape,
                      "heads": HEADS[args.shape][0], "kv_heads": HEADS[args.shape][1],
                      "head_dim": HEADS[args.shape][2],
                      "timed": "jit(value_and_grad) wrt q, k, v; best of 3 per round; left-padded rows"},
           "compile_and_first_call_s": compile_s, "rounds": rounds, "median_s": medians,
           "ratio_to_reference_median": ratios, "fastest": fastest, "max_abs_diff_to_reference": diffs,
           "errors": errors, "cpu_auto": CPU_AUTO}
    print(f"attention fwd+bwd on {backend} ({res['device']}), batch {args.batch}, {args.shape} heads (load avg "
          f"{load_before[0]:.1f} -> {res['machine']['loadavg_after'][0]:.1f}); ms, median of {args.rounds} rounds "
          f"(best of 3 each), ratio to the reference")
    for dt, t in cases:
        print(f"{dt:>9} T={t:<5}" + "".join(f"{impl:>11} {medians[f'{dt}/{t}/{impl}'] * 1e3:8.2f}"
                                            f" ({ratios.get(f'{dt}/{t}/{impl}', float('nan')):.2f}x)"
                                            for impl in ran(dt, t))
              + f"   fastest: {fastest.get(f'{dt}/{t}')}")
    for key, diff in diffs.items():
        print(f"  {key}: max |diff| to the reference " + ", ".join(f"{k} {v:.2e}" for k, v in diff.items()))
    for key, err in errors.items():
        print(f"  {key} failed: {err}")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
