"""Compute dtypes and layer layouts of jaxppo's model step in ONE process, interleaved (for a noisy machine).

``benchmarks/model.py --dtype float32,bfloat16 --frameworks jax`` times each dtype in its own process, which is
the fair measurement on an idle machine; under load the two processes see different loads. This script builds
one jitted step per variant ``DTYPE:LAYOUT`` (SmolLM2-135M shape, ``value_and_grad`` of the next-token loss on
the T-1 predicting positions, as in model.py; ``LAYOUT`` is ``LMConfig.scan_layers``: ``scan``, ``unroll`` or
``auto``), records each one's compile + first call, then alternates them ``--repeats`` times, so all see the same
load; it reports min and median per variant, each variant's speed-up over the first one (ratio of medians and of
minima), and ``speedup_bf16_over_f32`` when the variants are exactly ``float32:auto,bfloat16:auto`` (the
default), with the load average before and after.

    PYTHONPATH=. python benchmarks/model_dtype_pair.py [--layers 30] [--repeats 5] [--out results.json]
    PYTHONPATH=. python benchmarks/model_dtype_pair.py --variants float32:scan,bfloat16:scan,bfloat16:unroll
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

import machine  # benchmarks/machine.py
from model import SMOLLM2_135M, write_json  # benchmarks/model.py (run from benchmarks/ or with it on sys.path)

LAYOUTS = {"scan": True, "unroll": False, "auto": "auto"}
DTYPES = ("float32", "bfloat16")


def parse_variants(text: str) -> list[tuple[str, str]]:
    """``"float32:scan,bfloat16:unroll"`` -> ``[("float32", "scan"), ("bfloat16", "unroll")]``; a bare dtype means
    ``auto``. Raises ``ValueError`` naming an unknown dtype or layout, or a repeated variant."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        dt, _, layout = item.partition(":")
        layout = layout or "auto"
        if dt not in DTYPES:
            raise ValueError(f"--variants: unknown dtype {dt!r} in {item!r}; expected one of {DTYPES}")
        if layout not in LAYOUTS:
            raise ValueError(f"--variants: unknown layout {layout!r} in {item!r}; expected one of {tuple(LAYOUTS)}")
        if (dt, layout) in out:
            raise ValueError(f"--variants: {item!r} given twice")
        out.append((dt, layout))
    if not out:
        raise ValueError("--variants: no variant given")
    return out


def make_step(layers: int, dtype: str, layout: str = "auto"):
    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers, "compute_dtype": dtype,
                      "scan_layers": LAYOUTS[layout]})
    gd, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))

    def loss_fn(p, ids, mask):
        m = nnx.merge(gd, p)
        logits = m.logits_from_hidden(m.hidden_states(ids, mask)[:, :-1])
        tgt = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)
    return jax.jit(jax.value_and_grad(loss_fn)), params, cfg.unroll_layers


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default="float32:auto,bfloat16:auto")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "model_dtype_pair.json"))
    args = ap.parse_args(argv)
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        ap.error(str(e))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, SMOLLM2_135M["vocab_size"], size=(args.batch, args.seq)), jnp.int32)
    mask = jnp.ones_like(ids)
    names = [f"{dt}:{lay}" for dt, lay in variants]
    steps, compile_s, unrolled, losses = {}, {}, {}, {}
    for name, (dt, lay) in zip(names, variants):
        f, p, unrolled[name] = make_step(args.layers, dt, lay)
        t0 = time.perf_counter()
        losses[name] = float(jax.block_until_ready(f(p, ids, mask))[0])
        compile_s[name] = time.perf_counter() - t0
        steps[name] = (f, p)
    times = {n: [] for n in names}
    load_before = list(os.getloadavg())
    for _ in range(args.repeats):
        for n, (f, p) in steps.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(p, ids, mask))
            times[n].append(time.perf_counter() - t0)
    res = {"config": vars(args), "machine": machine.describe(), "loadavg_before": load_before,
           "loadavg_after": list(os.getloadavg()),
           **{n: {"min": min(v), "median": statistics.median(v), "all": v, "compile_and_first_s": compile_s[n],
                  "unrolled": unrolled[n], "loss": losses[n]} for n, v in times.items()}}
    first = names[0]
    res["speedup_over_first"] = {n: {"median": res[first]["median"] / res[n]["median"],
                                     "min": res[first]["min"] / res[n]["min"]} for n in names}
    if names == ["float32:auto", "bfloat16:auto"]:
        res["speedup_bf16_over_f32_min"] = res["speedup_over_first"]["bfloat16:auto"]["min"]
        res["speedup_bf16_over_f32_median"] = res["speedup_over_first"]["bfloat16:auto"]["median"]
    print(f"{args.layers} layers, batch {args.batch}x{args.seq}, {args.repeats} interleaved repeats; load "
          f"{load_before[0]:.1f} -> {res['loadavg_after'][0]:.1f}")
    print(f"{'variant':<18}{'unrolled':>9}{'compile s':>11}{'min s':>9}{'median s':>10}{'vs first (med/min)':>21}")
    for n in names:
        r, s = res[n], res["speedup_over_first"][n]
        print(f"{n:<18}{str(r['unrolled']):>9}{r['compile_and_first_s']:>11.1f}{r['min']:>9.2f}{r['median']:>10.2f}"
              f"{s['median']:>13.2f}x / {s['min']:.2f}x")
    write_json(res, args.out)
    return res


if __name__ == "__main__":
    main()
