"""Is one decoder layer's (and the LM head's) fwd+bwd just its GEMMs? Side by side in one process, so the ratio
survives load; with ``--dtypes float32,bfloat16`` also where a 16-bit step loses what its GEMMs gain.

Times, alternately over ``--rounds`` rounds (best of 3 calls each), for every dtype in ``--dtypes`` (float32
parameters; the compute dtype is what ``LMConfig.compute_dtype`` would give, the casts inside the jitted function
as in ``DecoderLayers``):
  * ``layer``: jitted ``grad`` of one ``jaxppo.models`` decoder block (SmolLM2-135M shape, batch 8 x 128);
  * ``gemms``: the same block's 7 projections, each one jitted forward + VJP of ``jaxppo.models.layers.dense``
    (the forward product, the input gradient and the weight gradient: 21 GEMMs, as the block lowers them in that
    dtype) on operands of the same shapes;
  * ``attention``: jitted ``grad`` of ``jaxppo.models.layers.attention`` alone (9 query / 3 KV heads, causal);
  * ``head``: jitted ``grad`` of the mean next-token cross-entropy through ``CausalLM.logits_from_hidden`` (tied
    49152 x 576 embedding) on 8 x 127 hidden states, as the peers' ``fwdbwd`` row computes it;
  * ``head_gemms``: that head's three GEMMs alone (forward + VJP of its product, no softmax).
``(gemms + attention) / layer`` near 1 means the block's time is its GEMMs and attention, nothing else; the
16-bit / float32 ratios of ``layer`` and ``gemms`` say how much of the GEMMs' gain reaches the block.

    python benchmarks/model_layer.py [--rounds 5] [--dtypes float32,bfloat16] [--out benchmarks/results/model_layer.json]
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
from jaxppo.models.layers import attention, attention_allowed, dense, positions_from_mask, rope_cos_sin
from jaxppo.models.transformer import _layer

import machine  # benchmarks/machine.py
from model import SMOLLM2_135M, write_json  # benchmarks/model.py (run from benchmarks/ or with it on sys.path)

PARTS = ("layer", "gemms", "attention", "head", "head_gemms")


def best_of(fn, n: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def dot_count(jitted, *args) -> int:
    """Dot products left in ``jitted``'s compiled program for ``args`` (XLA deletes a product whose result is
    unused, so this is what a timing of it really runs)."""
    return jitted.lower(*args).compile().as_text().count(" dot(")


def _vjp_call(f, *args):
    """Jitted forward + VJP of ``f`` (cotangent ones of the output's dtype): the forward product and both
    backward products, as they lower inside a training step. The forward output is returned too: unused, XLA
    would delete the forward product and the timing would miss a third of the GEMMs."""
    def run(*a):
        y, pull = jax.vjp(f, *a)
        return y, pull(jnp.ones_like(y))
    j = jax.jit(run)
    n = dot_count(j, *args)
    if n != 3:
        raise RuntimeError(f"model_layer: the compiled forward + VJP of {getattr(f, '__name__', f)!r} has {n} dot "
                           "products, not 3 (forward, input gradient, weight gradient)")
    return lambda: jax.block_until_ready(j(*args))


def build(cfg: LMConfig, dtype, batch: int, seq: int) -> dict:
    """name -> zero-argument callable running that part once in ``dtype`` (float32 parameters, cast inside)."""
    dt = jnp.dtype(dtype)
    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    params = {k: v[0] for k, v in model.model.layers.param_dict(None).items()}
    b, t, d = batch, seq, cfg.hidden_size
    mask = jnp.ones((b, t), jnp.int32)
    cos, sin = rope_cos_sin(positions_from_mask(mask), jnp.asarray(cfg.inv_freq()))
    allowed = attention_allowed(jnp.arange(t), jnp.arange(t), mask, None)
    x = jax.random.normal(jax.random.key(0), (b, t, d))

    def layer_loss(p, x):
        y, _ = _layer(cfg, {k: v.astype(dt) for k, v in p.items()}, x.astype(dt), cos, sin, allowed)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    layer = jax.jit(jax.grad(layer_loss, argnums=(0, 1)))
    keys = iter(jax.random.split(jax.random.key(1), 32))
    gemms = []
    for k, w in params.items():
        if w.ndim < 2:
            continue
        w2 = w.reshape(-1, w.shape[-1]) if k == "o" else w.reshape(w.shape[0], -1)
        xs = jax.random.normal(next(keys), (b, t, w2.shape[0]), dt)
        gemms.append(_vjp_call(dense, xs, w2.astype(dt)))
    h, kh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = jax.random.normal(jax.random.key(2), (b, t, h, hd), dt)
    kv = jax.random.normal(jax.random.key(3), (b, t, kh, hd), dt)
    att = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v, allowed).astype(jnp.float32) ** 2),
                           argnums=(0, 1, 2)))
    graphdef, state = nnx.split(model)
    ids = jax.random.randint(jax.random.key(4), (b, t), 0, cfg.vocab_size)
    hid = jax.random.normal(jax.random.key(5), (b, t - 1, d), dt)

    def head_loss(state, hid):
        logits = nnx.merge(graphdef, state).logits_from_hidden(hid)
        tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)

    head = jax.jit(jax.grad(head_loss, argnums=(0, 1)))
    return {"layer": lambda: jax.block_until_ready(layer(params, x)),
            "gemms": lambda: [g() for g in gemms],
            "attention": lambda: jax.block_until_ready(att(q, kv, kv)),
            "head": lambda: jax.block_until_ready(head(state, hid)),
            "head_gemms": _vjp_call(lambda st, hh: nnx.merge(graphdef, st).logits_from_hidden(hh), state, hid)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model_layer.json"))
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": 1})
    parts = {dt: build(cfg, dt, args.batch, args.seq) for dt in dtypes}
    load0 = os.getloadavg()[0]
    rounds = []
    for _ in range(args.rounds):
        r = {}
        for dt in dtypes:
            for name in PARTS:
                r[f"{dt}/{name}_s"] = best_of(parts[dt][name])
            r[f"{dt}/ratio"] = (r[f"{dt}/gemms_s"] + r[f"{dt}/attention_s"]) / r[f"{dt}/layer_s"]
        rounds.append(r)
    n = args.batch * args.seq
    d, f, hh, kh, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.head_dim)
    flops = 3 * 2 * n * d * (hh * hd + 2 * kh * hd + 3 * f) + 3 * 2 * n * hh * hd * d
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    res = {"config": {"batch": args.batch, "seq": args.seq, "hidden": d, "dtypes": dtypes},
           "machine": {**machine.describe(), "jax": jax.__version__, "loadavg_1m_before": load0,
                       "loadavg_1m_after": os.getloadavg()[0]},
           "rounds": rounds, "gemm_flops": flops,
           "medians": {k: med(k) for k in rounds[0]}}
    for dt in dtypes:
        res[f"{dt}/ratio_median"] = med(f"{dt}/ratio")
        res[f"{dt}/gemm_gflops_per_s_median"] = flops / med(f"{dt}/gemms_s") / 1e9
    if len(dtypes) > 1:
        lo, hi = dtypes[0], dtypes[1]
        res["speedup"] = {p: statistics.median(r[f"{lo}/{p}_s"] / r[f"{hi}/{p}_s"] for r in rounds) for p in PARTS}
    print(f"one decoder layer and the LM head, batch {args.batch}x{args.seq} "
          f"(load avg {load0:.1f} -> {res['machine']['loadavg_1m_after']:.1f}); ms, best of 3, median over rounds")
    print(f"{'dtype':>10}" + "".join(f"{p:>12}" for p in PARTS) + f"{'(G+A)/layer':>13}{'GEMM GFLOP/s':>14}")
    for dt in dtypes:
        print(f"{dt:>10}" + "".join(f"{med(f'{dt}/{p}_s') * 1e3:>12.1f}" for p in PARTS)
              + f"{res[f'{dt}/ratio_median']:>13.2f}{res[f'{dt}/gemm_gflops_per_s_median']:>14.0f}")
    if "speedup" in res:
        print(f"{dtypes[0]} / {dtypes[1]} (median of paired rounds): "
              + ", ".join(f"{p} {v:.2f}x" for p, v in res["speedup"].items()))
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
