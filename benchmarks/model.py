"""Forward+backward throughput of jaxppo.models vs transformers' PyTorch Llama, plus MFU vs a large matmul.

Same configuration (SmolLM2-135M shape by default: 30 layers, d=576, 9 heads / 3 KV heads, MLP 1536,
vocab 49152, tied embeddings), same batch (8 x 128 tokens), float32, random init, next-token
cross-entropy loss averaged over tokens, gradients w.r.t. every parameter. The JAX loss slices the hidden
states to the T-1 predicting positions before the LM head (like the trainer's response pass), so no
[B, T, V] logits slice is copied and no padded gradient of it is built; ``--scan-layers`` picks
``lax.scan`` (true), unrolled layers (false) or the model default (auto, see ``LMConfig.unroll_layers``).
The two frameworks are timed alternately in one process (the machine is shared and noisy); the median step
time is reported.

Model FLOPs per step = 3 x forward FLOPs (backward = 2 x forward), forward FLOPs per token =
2 x (matmul parameters, LM head included) + 4 x layers x T x heads x head_dim (scores and
attention-weighted values over the full T x T, as both implementations compute them).
MFU = model FLOP/s / the best FLOP/s of a large float32 matmul (max of jnp.dot and torch.matmul),
measured right before each pair of steps; speed-up and MFU are medians of the per-repeat values.

    python benchmarks/model.py [--layers 30] [--batch 8] [--seq 128] [--repeats 5] [--scan-layers auto|true|false]
                               [--out benchmarks/results/model.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxppo.models import CausalLM, LMConfig

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=8192)


def model_flops(cfg: LMConfig, batch: int, seq: int) -> float:
    """Forward+backward FLOPs of one step (see the module docstring)."""
    d, h, k, hd, f, v, layers = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                 cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers)
    matmul_params = layers * (d * (h + 2 * k) * hd + h * hd * d + 3 * d * f) + d * v
    fwd_per_token = 2 * matmul_params + 4 * layers * seq * h * hd
    return 3.0 * fwd_per_token * batch * seq


def jax_step_fn(model: CausalLM):
    graphdef, params = nnx.split(model)

    def loss_fn(params, ids, mask):
        m = nnx.merge(graphdef, params)
        logits = m.logits_from_hidden(m.hidden_states(ids, mask)[:, :-1])
        tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - tgt
        return jnp.mean(nll)

    step = jax.jit(jax.value_and_grad(loss_fn))
    return step, params


def torch_model(cfg: LMConfig):
    import transformers
    hf = transformers.LlamaConfig(**{k: v for k, v in cfg.to_hf().items() if k not in ("architectures", "dtype")})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(hf).float().train()


def write_json(res: dict, path: str | Path) -> None:
    """Write a benchmark's result dict as indented JSON (creating the folder) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


def time_call(fn, n: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--matmul", type=int, default=2048)
    ap.add_argument("--scan-layers", choices=("auto", "true", "false"), default="auto")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="compute dtype: bfloat16 = float32 parameters and loss, bfloat16 matmuls (JAX "
                         "model.compute_dtype, torch.autocast on CPU); the matmul peak is then a bfloat16 matmul")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model.json"))
    args = ap.parse_args(argv)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)

    scan = {"auto": "auto", "true": True, "false": False}[args.scan_layers]
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": args.layers, "scan_layers": scan,
                      "compute_dtype": args.dtype})
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    rng = np.random.default_rng(0)
    ids_np = rng.integers(0, cfg.vocab_size, size=(args.batch, args.seq)).astype(np.int64)
    mask_np = np.ones_like(ids_np)

    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    step, params = jax_step_fn(model)
    ids, mask = jnp.asarray(ids_np, jnp.int32), jnp.asarray(mask_np, jnp.int32)
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, ids, mask))
    jax_compile = time.perf_counter() - t0

    tm = torch_model(cfg)
    tids, tmask = torch.tensor(ids_np), torch.tensor(mask_np)

    def torch_step():
        tm.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            out = tm(input_ids=tids, attention_mask=tmask, labels=tids)
        out.loss.backward()
        return out.loss

    torch_step()  # warm-up
    a = jax.random.normal(jax.random.key(0), (args.matmul, args.matmul), jnp.float32).astype(args.dtype)
    mm = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    mm(a, a).block_until_ready()
    ta = torch.randn(args.matmul, args.matmul).to(tdtype)
    mm_flops = 2.0 * args.matmul ** 3
    # paired measurements: each repeat times the matmuls, then one JAX step, then one torch step, so
    # every ratio compares runs that saw (nearly) the same machine load
    jax_times, torch_times, mm_rates = [], [], []
    for _ in range(args.repeats):
        jt = min(time_call(lambda: mm(a, a).block_until_ready()) for _ in range(3))
        tt = min(time_call(lambda: torch.matmul(ta, ta)) for _ in range(3))
        mm_rates.append(max(mm_flops / jt, mm_flops / tt))
        jax_times.append(time_call(lambda: jax.block_until_ready(step(params, ids, mask))))
        torch_times.append(time_call(torch_step))
    rates = {"jax": mm_flops / jt, "torch": mm_flops / tt}

    flops = model_flops(cfg, args.batch, args.seq)
    tokens = args.batch * args.seq
    peak = statistics.median(mm_rates)
    res = {"config": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                      "kv_heads": cfg.num_key_value_heads, "mlp": cfg.intermediate_size, "vocab": cfg.vocab_size,
                      "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "scan_layers": args.scan_layers,
                      "unrolled": cfg.unroll_layers},
           "machine": {"cpus": threads, "platform": platform.platform(), "jax": jax.__version__,
                       "torch": torch.__version__, "loadavg_1m": os.getloadavg()[0]},
           "model_flops_per_step": flops}
    for name, times in (("jax", jax_times), ("torch", torch_times)):
        t = statistics.median(times)
        res[name] = {"step_s_median": t, "step_s_min": min(times), "step_s_all": times, "tokens_per_s": tokens / t,
                     "model_flops_per_s": flops / t,
                     "mfu_vs_best_matmul": statistics.median(flops / s / r for s, r in zip(times, mm_rates))}
    res["jax"]["compile_s"] = jax_compile
    res["matmul"] = {"n": args.matmul, "best_flops_per_s_each_repeat": mm_rates, "median_best_flops_per_s": peak,
                     "last_jax_flops_per_s": rates["jax"], "last_torch_flops_per_s": rates["torch"]}
    res["speedup_jax_over_torch"] = statistics.median(t / j for j, t in zip(jax_times, torch_times))
    res["speedup_of_min_times"] = min(torch_times) / min(jax_times)
    res["goals"] = {"speedup_ge_1.3": res["speedup_jax_over_torch"] >= 1.3,
                    "mfu_ge_0.5": res["jax"]["mfu_vs_best_matmul"] >= 0.5}

    print(f"\nfwd+bwd, {cfg.num_hidden_layers} layers d={cfg.hidden_size} V={cfg.vocab_size}, batch {args.batch}x"
          f"{args.seq} {args.dtype}, {'unrolled' if cfg.unroll_layers else 'scanned'} layers, {threads} CPU threads "
          f"(load avg {res['machine']['loadavg_1m']:.1f})")
    print(f"{'impl':<22}{'step s (median)':>16}{'step s (min)':>14}{'tokens/s':>12}{'GFLOP/s':>10}{'MFU':>8}")
    for name, label in (("jax", "jaxppo (JAX/Flax NNX)"), ("torch", "transformers (torch)")):
        r = res[name]
        print(f"{label:<22}{r['step_s_median']:>16.3f}{r['step_s_min']:>14.3f}{r['tokens_per_s']:>12.0f}"
              f"{r['model_flops_per_s'] / 1e9:>10.1f}{r['mfu_vs_best_matmul']:>8.1%}")
    print(f"{'matmul ' + str(args.matmul) + ' (best)':<22}{'':>16}{'':>14}{'':>12}{peak / 1e9:>10.1f}"
          "   (median over repeats of max(jnp.dot, torch.matmul))")
    print(f"speed-up JAX / torch: {res['speedup_jax_over_torch']:.2f}x (median of paired ratios), "
          f"{res['speedup_of_min_times']:.2f}x (ratio of min times); JAX compile {jax_compile:.1f}s")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
