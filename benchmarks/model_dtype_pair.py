"""float32 vs bfloat16 compute of jaxppo's model step in ONE process, interleaved (for a loaded machine).

``benchmarks/model.py --dtype float32,bfloat16 --frameworks jax`` times each dtype in its own process, which is
the fair measurement on an idle machine; under load the two processes see different loads. This script builds
both jitted steps (SmolLM2-135M shape, ``value_and_grad`` of the next-token loss on the T-1 predicting
positions, as in model.py), then alternates them ``--repeats`` times, so both see the same load; it reports
min and median per dtype and the speed-up ``float32 / bfloat16``, with the load average before and after.

    PYTHONPATH=. python benchmarks/model_dtype_pair.py [--layers 30] [--repeats 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.models import CausalLM, LMConfig

from model import SMOLLM2_135M, write_json  # benchmarks/model.py (run from benchmarks/ or with it on sys.path)


def make_step(layers: int, dtype: str):
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers, "compute_dtype": dtype})
    gd, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))

    def loss_fn(p, ids, mask):
        m = nnx.merge(gd, p)
        logits = m.logits_from_hidden(m.hidden_states(ids, mask)[:, :-1])
        tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)
    return jax.jit(jax.value_and_grad(loss_fn)), params


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model_dtype_pair.json"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, SMOLLM2_135M["vocab_size"], size=(args.batch, args.seq)), jnp.int32)
    mask = jnp.ones_like(ids)
    steps = {dt: make_step(args.layers, dt) for dt in ("float32", "bfloat16")}
    for f, p in steps.values():
        jax.block_until_ready(f(p, ids, mask))
    times = {dt: [] for dt in steps}
    load_before = list(os.getloadavg())
    for _ in range(args.repeats):
        for dt, (f, p) in steps.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(p, ids, mask))
            times[dt].append(time.perf_counter() - t0)
    res = {"config": vars(args), "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
           **{dt: {"min": min(v), "median": statistics.median(v), "all": v} for dt, v in times.items()}}
    res["speedup_bf16_over_f32_min"] = res["float32"]["min"] / res["bfloat16"]["min"]
    res["speedup_bf16_over_f32_median"] = res["float32"]["median"] / res["bfloat16"]["median"]
    print(f"float32 {res['float32']['min']:.2f}/{res['float32']['median']:.2f} s, bfloat16 "
          f"{res['bfloat16']['min']:.2f}/{res['bfloat16']['median']:.2f} s (min/median); bf16 speed-up "
          f"{res['speedup_bf16_over_f32_min']:.2f}x (min) {res['speedup_bf16_over_f32_median']:.2f}x (median); "
          f"load {load_before[0]:.1f} -> {res['loadavg_after'][0]:.1f}")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
