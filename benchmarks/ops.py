"""GAE speed on CPU: per-timestep Python loops (verl style) vs jitted JAX formulations, side by side.

B=256, float32, random rewards/values, gamma=0.99, lam=0.95, two masks: ``prefix`` (right padding to a random
length per row: the layout of our responses) and ``holes`` (the same plus ~20% interior zeros). Variants:

* ``loop_numpy``  — reverse Python loop over t, a handful of numpy ``[B]`` vector ops per step.
* ``loop_torch``  — the same loop with torch tensors under ``no_grad`` (verl's ``compute_gae_advantage_return``
  structure; the real baseline a verl user runs).
* ``scan``        — ``gae_variants.gae_scan``: jitted reverse ``lax.scan`` over time-major data.
* ``scan_unrollK`` — the same with ``unroll=K``.
* ``associative`` — ``gae_associative``: two log-depth ``lax.associative_scan`` affine scans.
* ``chunkedC``    — ``gae_chunked``: two-level blocked scan with chunks of C steps.
* ``blockedC``    — ``gae_blocked``: loop-free block-Toeplitz matmuls, chunks of C (prefix masks only).
* ``gae``         — ``jaxppo.ops.gae``: ``gae_blocked`` for prefix masks, ``gae_scan`` otherwise (``lax.cond``).
* diagnostics: ``kernel_time_major`` (the scan alone on inputs already laid out ``[T, B]``, no layout change)
  and ``stream_floor`` (one fused elementwise op that reads the three inputs and writes two outputs once:
  the machine's memory-traffic floor for this problem).

Repeats are interleaved (every variant once per round) and the median per call is reported together with the
speed-up over both loops and the effective bandwidth ``5 * B * T * 4 bytes / time`` (read rewards, values,
mask; write advantages, returns).

    python benchmarks/ops.py [--lengths 1024 4096] [--rounds 15]

Writes ``benchmarks/results/ops.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.ops import gae
from gae_variants import gae_associative, gae_blocked, gae_chunked, gae_scan  # benchmarks/ (run as a script)

B = 256
GAMMA, LAM = 0.99, 0.95


def loop_numpy(r, v, m, gamma, lam):
    nextvalues = np.zeros(r.shape[0], r.dtype)
    lastgaelam = np.zeros(r.shape[0], r.dtype)
    out = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        cand = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = cand * m[:, t] + (1 - m[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = np.stack(out[::-1], axis=1)
    return adv, adv + v


def loop_torch(r, v, m, gamma, lam):
    import torch

    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        out = []
        for t in reversed(range(r.shape[-1])):
            delta = r[:, t] + gamma * nextvalues - v[:, t]
            cand = delta + gamma * lam * lastgaelam
            nextvalues = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
            lastgaelam = cand * m[:, t] + (1 - m[:, t]) * lastgaelam
            out.append(lastgaelam)
        adv = torch.stack(out[::-1], dim=1)
        return adv, adv + v


def _kernel_time_major(rt, vt, mt, gamma, lam):
    gl = gamma * lam

    def step(carry, x):
        lg, y = carry
        rr, vv, mm = x
        lg = jnp.where(mm, rr - vv + gamma * y + gl * lg, lg)
        return (lg, jnp.where(mm, vv, y)), lg

    z = jnp.zeros(rt.shape[1], rt.dtype)
    return jax.lax.scan(step, (z, z), (rt, vt, mt), reverse=True)[1]


def _stream_floor(r, v, m, gamma, lam):
    return r * m + gamma * v, v - lam * r


def timed(fn, args, block) -> float:
    t0 = time.perf_counter()
    out = fn(*args)
    block(out)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--loop-rounds", type=int, default=5, help="rounds for the (slow) Python loops")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ops.json"))
    args = ap.parse_args()

    import torch

    jax_variants = {
        "scan": gae_scan,
        "scan_unroll4": functools.partial(gae_scan, unroll=4),
        "scan_unroll16": functools.partial(gae_scan, unroll=16),
        "associative": gae_associative,
        "chunked16": functools.partial(gae_chunked, chunk=16),
        "chunked64": functools.partial(gae_chunked, chunk=64),
        "chunked256": functools.partial(gae_chunked, chunk=256),
        "gae": gae,
    }
    prefix_only = {"blocked16": functools.partial(gae_blocked, block=16),
                   "blocked32": functools.partial(gae_blocked, block=32),
                   "blocked64": functools.partial(gae_blocked, block=64)}
    rows = []
    for t_len in args.lengths:
        rng = np.random.default_rng(0)
        r = rng.normal(size=(B, t_len)).astype(np.float32)
        v = rng.normal(size=(B, t_len)).astype(np.float32)
        lengths = rng.integers(t_len // 4, t_len + 1, size=B)
        masks = {"prefix": (np.arange(t_len)[None, :] < lengths[:, None]).astype(np.float32)}
        masks["holes"] = masks["prefix"] * (rng.random((B, t_len)) > 0.2).astype(np.float32)
        tr, tv, tm = (torch.from_numpy(a) for a in (r, v, masks["holes"]))
        calls = {("loop_numpy", "holes"): (loop_numpy, (r, v, masks["holes"], GAMMA, LAM), lambda o: None),
                 ("loop_torch", "holes"): (loop_torch, (tr, tv, tm, GAMMA, LAM), lambda o: None)}
        jr, jv = jnp.asarray(r), jnp.asarray(v)
        for kind, m in masks.items():
            jm = jnp.asarray(m)
            for name, fn in {**jax_variants, **(prefix_only if kind == "prefix" else {})}.items():
                calls[(name, kind)] = (jax.jit(fn), (jr, jv, jm, GAMMA, LAM), jax.block_until_ready)
        time_major = (jnp.asarray(r.T), jnp.asarray(v.T), jnp.asarray(masks["holes"].T != 0))
        calls[("kernel_time_major", "holes")] = (jax.jit(_kernel_time_major), (*time_major, GAMMA, LAM),
                                                 jax.block_until_ready)
        calls[("stream_floor", "-")] = (jax.jit(_stream_floor), (jr, jv, jnp.asarray(masks["holes"]), GAMMA, LAM),
                                        jax.block_until_ready)
        wants = {kind: loop_numpy(r, v, m, GAMMA, LAM) for kind, m in masks.items()}

        errors = {}
        for key, (fn, a, block) in calls.items():  # warm-up / compile + correctness
            out = fn(*a)
            block(out)
            name, kind = key
            if name in jax_variants or name in prefix_only or name == "loop_torch":
                adv, ret = (np.asarray(o) for o in out)
                want_adv, want_ret = wants[kind]
                errors[key] = float(max(np.abs(adv - want_adv).max(), np.abs(ret - want_ret).max()))
        times = {key: [] for key in calls}
        for rnd in range(args.rounds):
            for key, (fn, a, block) in calls.items():
                if key[0].startswith("loop") and rnd >= args.loop_rounds:
                    continue
                times[key].append(timed(fn, a, block))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        nbytes = 5 * B * t_len * 4
        numpy_ms, torch_ms = med[("loop_numpy", "holes")], med[("loop_torch", "holes")]
        floor_ms = med[("stream_floor", "-")]
        for key in calls:
            rows.append({
                "T": t_len, "variant": key[0], "mask": key[1], "ms_median": med[key], "ms_min": min(times[key]) * 1e3,
                "speedup_vs_loop_numpy": numpy_ms / med[key], "speedup_vs_loop_torch": torch_ms / med[key],
                "effective_GBps": nbytes / (med[key] * 1e-3) / 1e9, "x_stream_floor": med[key] / floor_ms,
                "max_abs_err_vs_loop": errors.get(key),
            })

    header = (f"{'T':>5} {'variant':<18} {'mask':<7} {'ms':>9} {'x numpy':>8} {'x torch':>8} {'GB/s':>6} "
              f"{'x floor':>7} {'err':>8}")
    print(header)
    print("-" * len(header))
    for row in rows:
        err = "" if row["max_abs_err_vs_loop"] is None else f"{row['max_abs_err_vs_loop']:.1e}"
        print(f"{row['T']:>5} {row['variant']:<18} {row['mask']:<7} {row['ms_median']:>9.3f} "
              f"{row['speedup_vs_loop_numpy']:>8.1f} {row['speedup_vs_loop_torch']:>8.1f} "
              f"{row['effective_GBps']:>6.1f} {row['x_stream_floor']:>7.2f} "
              f"{err:>8}")
    result = {
        "benchmark": "gae", "batch": B, "dtype": "float32", "gamma": GAMMA, "lam": LAM,
        "bytes_per_call": {str(t): 5 * B * t * 4 for t in args.lengths},
        "rounds": args.rounds, "loop_rounds": args.loop_rounds,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "jax": jax.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "load_avg_1m": os.getloadavg()[0], "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
