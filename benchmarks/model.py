"""Forward+backward throughput of jaxppo.models vs transformers' PyTorch Llama, plus MFU vs a large matmul.

Same configuration (SmolLM2-135M shape by default: 30 layers, d=576, 9 heads / 3 KV heads, MLP 1536,
vocab 49152, tied embeddings), same batch (8 x 128 tokens), float32, random init, next-token
cross-entropy loss averaged over tokens, gradients w.r.t. every parameter. The JAX loss slices the hidden
states to the T-1 predicting positions before the LM head (like the trainer's response pass), so no
[B, T, V] logits slice is copied and no padded gradient of it is built; ``--scan-layers`` picks
``lax.scan`` (true), unrolled layers (false) or the model default (auto, see ``LMConfig.unroll_layers``).

**Each framework runs in its own process** (``--framework jax|torch`` is the child mode): in one process
PyTorch's OpenMP threads keep spinning after each op and take the cores from XLA's thread pool, which made the
earlier same-process numbers an artefact. The parent imports neither framework; it runs ``--rounds`` rounds,
each a JAX child then a torch child (alternating, so both see similar machine load), and each child times
``--repeats`` steps after a warm-up, plus its own best 2048² matmul rate. Reported: medians over all repeats,
the load average before/after each child, peak RSS of each child.

Model FLOPs per step = 3 x forward FLOPs (backward = 2 x forward), forward FLOPs per token =
2 x (matmul parameters, LM head included) + 4 x layers x T x heads x head_dim (scores and
attention-weighted values over the full T x T, as both implementations compute them).
MFU = model FLOP/s / the best FLOP/s of a large matmul in the same framework's process.

    python benchmarks/model.py [--layers 30] [--batch 8] [--seq 128] [--repeats 5] [--rounds 2]
                               [--scan-layers auto|true|false] [--dtype float32|bfloat16|float32,bfloat16]
                               [--frameworks jax,torch] [--out benchmarks/results/model.json]

``--dtype float32,bfloat16 --frameworks jax`` reports the bfloat16 / float32 speed-up of jaxppo's own step
(``speedup_bf16_over_f32``: float32 median / bfloat16 median; each dtype in its own processes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py (run from benchmarks/ or with it on sys.path)

import numpy as np

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=8192)


def model_flops(layers: int, batch: int, seq: int, c: dict = SMOLLM2_135M) -> float:
    """Forward+backward FLOPs of one step (see the module docstring)."""
    d, h, k, f, v = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"],
                     c["vocab_size"])
    hd = d // h
    matmul_params = layers * (d * (h + 2 * k) * hd + h * hd * d + 3 * d * f) + d * v
    fwd_per_token = 2 * matmul_params + 4 * layers * seq * h * hd
    return 3.0 * fwd_per_token * batch * seq


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


def _batch(args):
    rng = np.random.default_rng(0)
    return rng.integers(0, SMOLLM2_135M["vocab_size"], size=(args.batch, args.seq)).astype(np.int64)


def measure_jax(args) -> dict:
    """Child: the jitted jaxppo step (``value_and_grad`` of the loss), ``args.repeats`` times after compiling."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxppo.models import CausalLM, LMConfig
    scan = {"auto": "auto", "true": True, "false": False}[args.scan_layers]
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": args.layers, "scan_layers": scan,
                      "compute_dtype": args.dtype})
    graphdef, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))

    def loss_fn(params, ids, mask):
        m = nnx.merge(graphdef, params)
        logits = m.logits_from_hidden(m.hidden_states(ids, mask)[:, :-1])
        tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)

    step = jax.jit(jax.value_and_grad(loss_fn))
    ids = jnp.asarray(_batch(args), jnp.int32)
    mask = jnp.ones_like(ids)
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, ids, mask))
    compile_s = time.perf_counter() - t0
    times = [time_call(lambda: jax.block_until_ready(step(params, ids, mask))) for _ in range(args.repeats)]
    a = jax.random.normal(jax.random.key(0), (args.matmul, args.matmul), jnp.float32).astype(args.dtype)
    mm = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    mm(a, a).block_until_ready()
    mm_s = min(time_call(lambda: mm(a, a).block_until_ready()) for _ in range(3))
    return {"step_s_all": times, "compile_s": compile_s, "matmul_flops_per_s": 2.0 * args.matmul ** 3 / mm_s,
            "version": jax.__version__, "unrolled": cfg.unroll_layers}


def measure_torch(args) -> dict:
    """Child: transformers' ``LlamaForCausalLM`` loss + ``backward``, ``args.repeats`` times after a warm-up."""
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    c = {k: v for k, v in SMOLLM2_135M.items() if k != "rope_theta"}  # jax is never imported in this process
    hf = transformers.LlamaConfig(**{**c, "num_hidden_layers": args.layers},
                                  rope_parameters={"rope_type": "default", "rope_theta": SMOLLM2_135M["rope_theta"]})
    torch.manual_seed(0)
    tm = transformers.LlamaForCausalLM(hf).float().train()
    ids = torch.tensor(_batch(args))
    mask = torch.ones_like(ids)

    def step():
        tm.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            out = tm(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()

    t0 = time.perf_counter()
    step()
    warm = time.perf_counter() - t0
    times = [time_call(step) for _ in range(args.repeats)]
    ta = torch.randn(args.matmul, args.matmul).to({"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype])
    mm_s = min(time_call(lambda: torch.matmul(ta, ta)) for _ in range(3))
    return {"step_s_all": times, "compile_s": warm, "matmul_flops_per_s": 2.0 * args.matmul ** 3 / mm_s,
            "version": torch.__version__, "threads": torch.get_num_threads()}


def child(args) -> None:
    before = list(os.getloadavg())
    res = (measure_jax if args.framework == "jax" else measure_torch)(args)
    res.update(loadavg_before=before, loadavg_after=list(os.getloadavg()),
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    Path(args.child_out).write_text(json.dumps(res))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per child process")
    ap.add_argument("--rounds", type=int, default=2, help="JAX child then torch child, this many times")
    ap.add_argument("--matmul", type=int, default=2048)
    ap.add_argument("--scan-layers", choices=("auto", "true", "false"), default="auto")
    ap.add_argument("--dtype", default="float32",
                    help="float32, bfloat16, or float32,bfloat16 (both, each in its own processes, and the "
                         "bfloat16/float32 speed-up). Compute dtype: bfloat16 = float32 parameters and loss, bfloat16 matmuls (JAX "
                         "model.compute_dtype, torch.autocast on CPU); the matmul peak is then a bfloat16 matmul")
    ap.add_argument("--frameworks", default="jax,torch",
                    help="comma-separated subset of jax,torch to run (the ratio needs both)")
    ap.add_argument("--framework", choices=("jax", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model.json"))
    args = ap.parse_args(argv)
    if args.framework:
        child(args)
        return {}
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    fws = tuple(f for f in ("jax", "torch") if f in args.frameworks.split(","))
    dtypes = tuple(args.dtype.split(","))
    if not fws:
        ap.error(f"--frameworks {args.frameworks!r} names neither jax nor torch")
    if not set(dtypes) <= {"float32", "bfloat16"}:
        ap.error(f"--dtype {args.dtype!r}: expected float32, bfloat16 or float32,bfloat16")
    runs = {(dt, fw): [] for dt in dtypes for fw in fws}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for dt in dtypes:
                for fw in fws:
                    out = Path(tmp) / f"{fw}{dt}{r}.json"
                    cmd = [sys.executable, __file__, "--framework", fw, "--child-out", str(out), "--dtype", dt]
                    for k in ("layers", "batch", "seq", "repeats", "matmul", "scan_layers"):
                        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
                    subprocess.run(cmd, check=True, env=env)
                    runs[dt, fw].append(json.loads(out.read_text()))
                    print(f"round {r} {fw} {dt}: {[round(t, 3) for t in runs[dt, fw][-1]['step_s_all']]} s "
                          f"(load {runs[dt, fw][-1]['loadavg_before'][0]:.1f})", flush=True)
    flops = model_flops(args.layers, args.batch, args.seq)
    tokens = args.batch * args.seq
    res = {"config": {"layers": args.layers, "hidden": SMOLLM2_135M["hidden_size"],
                      "heads": SMOLLM2_135M["num_attention_heads"], "kv_heads": SMOLLM2_135M["num_key_value_heads"],
                      "mlp": SMOLLM2_135M["intermediate_size"], "vocab": SMOLLM2_135M["vocab_size"],
                      "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "scan_layers": args.scan_layers,
                      "unrolled": runs[dtypes[0], "jax"][0]["unrolled"] if "jax" in fws else None,
                      "processes": "one per framework and dtype", "rounds": args.rounds, "repeats": args.repeats},
           "machine": {**machine.describe(),
                       **{fw: runs[dtypes[0], fw][0]["version"] for fw in fws}},
           "model_flops_per_step": flops}

    def summary(rs):
        times = [t for run in rs for t in run["step_s_all"]]
        t = statistics.median(times)
        peak = statistics.median(run["matmul_flops_per_s"] for run in rs)
        return {"step_s_median": t, "step_s_min": min(times), "step_s_all": times, "tokens_per_s": tokens / t,
                "model_flops_per_s": flops / t, "matmul_flops_per_s": peak, "mfu_vs_own_matmul": flops / t / peak,
                "compile_or_warmup_s": [run["compile_s"] for run in rs],
                "peak_rss_mb": max(run["peak_rss_mb"] for run in rs),
                "loadavg_before_after": [(run["loadavg_before"], run["loadavg_after"]) for run in rs]}
    by = {dt: {fw: summary(runs[dt, fw]) for fw in fws} for dt in dtypes}
    if len(dtypes) == 1:
        res.update(by[dtypes[0]])
    else:
        res["by_dtype"] = by
        res["speedup_bf16_over_f32"] = {fw: by["float32"][fw]["step_s_median"] / by["bfloat16"][fw]["step_s_median"]
                                        for fw in fws}
    print(f"\nfwd+bwd, {args.layers} layers, batch {args.batch}x{args.seq}, one process per framework and dtype, "
          f"{args.rounds} rounds x {args.repeats} repeats")
    print(f"{'impl':<22}{'dtype':>10}{'step s (median)':>16}{'step s (min)':>14}{'tokens/s':>12}{'GFLOP/s':>10}"
          f"{'MFU':>8}{'RSS MiB':>9}")
    for dt in dtypes:
        for fw, label in (("jax", "jaxppo (JAX/Flax NNX)"), ("torch", "transformers (torch)")):
            if fw in fws:
                r = by[dt][fw]
                print(f"{label:<22}{dt:>10}{r['step_s_median']:>16.3f}{r['step_s_min']:>14.3f}{r['tokens_per_s']:>12.0f}"
                      f"{r['model_flops_per_s'] / 1e9:>10.1f}{r['mfu_vs_own_matmul']:>8.1%}{r['peak_rss_mb']:>9.0f}")
    for dt in dtypes:
        if len(fws) == 2:
            sp = by[dt]["torch"]["step_s_median"] / by[dt]["jax"]["step_s_median"]
            spm = by[dt]["torch"]["step_s_min"] / by[dt]["jax"]["step_s_min"]
            if len(dtypes) == 1:
                res["speedup_jax_over_torch"], res["speedup_of_min_times"] = sp, spm
            else:
                by[dt]["speedup_jax_over_torch"] = sp
            print(f"{dt}: speed-up JAX / torch: {sp:.2f}x (ratio of medians), {spm:.2f}x (ratio of min times)")
    for fw, x in res.get("speedup_bf16_over_f32", {}).items():
        print(f"{fw}: bfloat16 / float32 speed-up {x:.2f}x (float32 median / bfloat16 median)")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
