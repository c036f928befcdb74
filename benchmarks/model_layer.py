"""Is one decoder layer's fwd+bwd just its GEMMs? Side by side in one process, so the ratio survives load.

Times, alternately over ``--rounds`` rounds (best of 3 calls each):
  * ``layer``: jitted ``grad`` of one ``jaxppo.models`` decoder block (SmolLM2-135M shape, batch 8 x 128, float32);
  * ``gemms``: the same block's 21 GEMMs (7 projections x forward, input gradient, weight gradient), each a
    separate jitted ``jnp.dot`` on operands of the same shapes;
  * ``attention``: jitted ``grad`` of ``jaxppo.models.layers.attention`` alone (9 query / 3 KV heads, causal).
``(gemms + attention) / layer`` near 1 means the block's time is its GEMMs and attention, nothing else.

    python benchmarks/model_layer.py [--rounds 5] [--out benchmarks/results/model_layer.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo.models import CausalLM, LMConfig
from jaxppo.models.layers import attention, attention_allowed, positions_from_mask, rope_cos_sin
from jaxppo.models.transformer import _layer

from model import SMOLLM2_135M, write_json  # benchmarks/model.py (run from benchmarks/ or with it on sys.path)


def best_of(fn, n: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model_layer.json"))
    args = ap.parse_args(argv)
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": 1})
    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    params = {k: v[0] for k, v in model.model.layers.param_dict(None).items()}
    b, t, d = args.batch, args.seq, cfg.hidden_size
    mask = jnp.ones((b, t), jnp.int32)
    cos, sin = rope_cos_sin(positions_from_mask(mask), jnp.asarray(cfg.inv_freq()))
    allowed = attention_allowed(jnp.arange(t), jnp.arange(t), mask, None)
    x = jax.random.normal(jax.random.key(0), (b, t, d))
    layer = jax.jit(jax.grad(lambda p, x: jnp.sum(_layer(cfg, p, x, cos, sin, allowed)[0] ** 2), argnums=(0, 1)))

    n = b * t
    shapes = [(w.shape[0], int(w.size // w.shape[0])) for k, w in params.items() if w.ndim >= 2 and k != "o"]
    o = params["o"]
    shapes.append((int(o.size // o.shape[-1]), o.shape[-1]))
    keys = iter(jax.random.split(jax.random.key(1), 3 * len(shapes)))
    gemms = []
    for din, dout in shapes:
        xs = jax.random.normal(next(keys), (n, din))
        w = jax.random.normal(next(keys), (din, dout))
        g = jax.random.normal(next(keys), (n, dout))
        gemms += [(jax.jit(lambda a, w: a @ w), (xs, w)), (jax.jit(lambda g, w: g @ w.T), (g, w)),
                  (jax.jit(lambda a, g: a.T @ g), (xs, g))]
    h, kh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = jax.random.normal(jax.random.key(2), (b, t, h, hd))
    kv = jax.random.normal(jax.random.key(3), (b, t, kh, hd))
    att = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v, allowed) ** 2), argnums=(0, 1, 2)))

    def run_gemms():
        for f, a in gemms:
            f(*a).block_until_ready()

    rounds = []
    for _ in range(args.rounds):
        lt = best_of(lambda: jax.block_until_ready(layer(params, x)))
        gt = best_of(run_gemms)
        at = best_of(lambda: jax.block_until_ready(att(q, kv, kv)))
        rounds.append({"layer_s": lt, "gemms_s": gt, "attention_s": at, "ratio": (gt + at) / lt})
    flops = sum(3 * 2 * n * din * dout for din, dout in shapes)
    res = {"config": {"batch": b, "seq": t, "hidden": d, "gemm_shapes": shapes, "n_gemms": len(gemms)},
           "machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "loadavg_1m": os.getloadavg()[0]},
           "rounds": rounds, "ratio_median": statistics.median(r["ratio"] for r in rounds),
           "gemm_flops": flops,
           "gemm_gflops_per_s_median": flops / statistics.median(r["gemms_s"] for r in rounds) / 1e9}
    print(f"one decoder layer, batch {b}x{t}, float32 (load avg {res['machine']['loadavg_1m']:.1f})")
    print(f"{'round':>5}{'layer ms':>10}{'21 GEMMs ms':>13}{'attention ms':>14}{'(G+A)/layer':>13}")
    for i, r in enumerate(rounds):
        print(f"{i:>5}{r['layer_s'] * 1e3:>10.1f}{r['gemms_s'] * 1e3:>13.1f}{r['attention_s'] * 1e3:>14.1f}"
              f"{r['ratio']:>13.2f}")
    print(f"median (GEMMs + attention) / layer = {res['ratio_median']:.2f}; "
          f"GEMMs alone {res['gemm_gflops_per_s_median']:.0f} GFLOP/s")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
