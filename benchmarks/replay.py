"""Prioritized replay step time: jaxppo.replay vs flashbax's prioritised item buffer, side by side.

One step = ``sample(256)`` + ``update_priorities(256)`` (flashbax: ``sample`` + ``set_priorities``) on a
full buffer of N items with random priorities, timed two ways for each library:

- per call: the step jitted on its own with its state donated, called from Python (includes JAX's
  per-call dispatch, ~17 µs for an identity step on this state);
- in graph: ``STEPS_PER_SCAN`` steps inside one jitted ``lax.scan`` (state donated), per step: the
  cost inside a jitted training step, which is how ``jaxppo.trainer`` uses the buffer.

jaxppo's step also computes the PER importance weights (flashbax has none). Repeats are interleaved
(jaxppo, flashbax, jaxppo, ...); the median and the minimum per-step time over repeats are reported,
with the ratios (also the median of the per-repeat ratios). No PRNG call is timed outside the buffers'
own sampling; the stand-in |δ| depends on the sample's weights, as in a training step.

    python benchmarks/replay.py [--sizes 1000 50000 1000000] [--steps 200] [--repeats 7]

Writes ``benchmarks/results/replay.json``. flashbax is a benchmark-only dependency (``pip install
flashbax --no-deps``, extra ``bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib.metadata import version as _dist_version
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxppo import replay

BATCH = 256
STEPS_PER_SCAN = 100
ALPHA = 0.6
EPS = 1e-6
ITEM_LEN = 8


def make_items(n: int, key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"tokens": jax.random.randint(k1, (n, ITEM_LEN), 0, 1000, jnp.int32),
            "score": jax.random.normal(k2, (n,), jnp.float32)}


def fake_td(indices: jax.Array, depends_on: jax.Array) -> jax.Array:
    """Stand-in |δ| in [0, 3): a cheap integer hash of the sampled slots (no PRNG call in the timed
    step: on CPU a threefry call costs more than the buffer operations being measured). The ``0·x``
    term makes the update depend on the sample's probabilities/weights, as the loss does in training
    (otherwise XLA may copy the donated priorities to order the reads before the in-place write)."""
    h = (indices.astype(jnp.uint32) * jnp.uint32(2654435761)) >> 16
    return h.astype(jnp.float32) * (3.0 / 65536.0) + 0.0 * depends_on


def jaxppo_setup(n: int, key: jax.Array, leaf_fanout: int | None):
    example = {"tokens": jnp.zeros((ITEM_LEN,), jnp.int32), "score": jnp.zeros((), jnp.float32)}
    state = replay.init(n, example, alpha=ALPHA, eps=EPS, leaf_fanout=leaf_fanout)
    ka, kp = jax.random.split(key)
    state = replay.add(state, make_items(n, ka), priorities=jax.random.exponential(kp, (n,)))

    def step(state, key):
        s = replay.sample(state, key, BATCH, beta=0.4)
        td = fake_td(s.indices, s.weights)
        return replay.update_priorities(state, s.indices, td), s.weights.sum()

    return state, step


def flashbax_setup(n: int, key: jax.Array):
    import flashbax as fbx
    buf = fbx.make_prioritised_item_buffer(max_length=n, min_length=1, sample_batch_size=BATCH,
                                           add_batches=True, priority_exponent=ALPHA, device="cpu")
    example = {"tokens": jnp.zeros((ITEM_LEN,), jnp.int32), "score": jnp.zeros((), jnp.float32)}
    state = buf.init(example)
    ka, kp = jax.random.split(key)
    state = jax.jit(buf.add, donate_argnums=0)(state, make_items(n, ka))
    state = jax.jit(buf.set_priorities, donate_argnums=0)(
        state, jnp.arange(n, dtype=jnp.int32), jax.random.exponential(kp, (n,)) + EPS)

    def step(state, key):
        s = buf.sample(state, key)
        td = fake_td(s.indices, s.probabilities)
        return buf.set_priorities(state, s.indices, td + EPS), s.probabilities.sum()   # it applies ^alpha

    return state, step


def in_graph(step):
    """``len(keys)`` steps in one jitted scan; returns the final state and the last output."""
    def run(state, keys):
        state, outs = jax.lax.scan(step, state, keys)
        return state, outs[-1]
    return jax.jit(run, donate_argnums=0)


def time_steps(step, state, keys) -> tuple[float, object]:
    state, out = step(state, keys[0])           # compile + warm up
    jax.block_until_ready((state, out))
    t0 = time.perf_counter()
    for k in keys:
        state, out = step(state, k)
    jax.block_until_ready((state, out))
    return (time.perf_counter() - t0) / len(keys), state


def bench(n: int, steps: int, repeats: int, leaf_fanout: int | None, with_flashbax: bool) -> dict:
    key = jax.random.key(n)
    keys = list(jax.random.split(jax.random.key(1), steps))
    scan_keys = [jax.random.split(jax.random.key(2), STEPS_PER_SCAN)] * max(1, steps // STEPS_PER_SCAN)
    setups = {"jaxppo": lambda: jaxppo_setup(n, key, leaf_fanout)}
    if with_flashbax:
        setups["flashbax"] = lambda: flashbax_setup(n, key)
    runners = {}
    for name, setup in setups.items():
        state, step = setup()
        runners[(name, "call")] = [jax.jit(step, donate_argnums=0), state, [], keys, 1]
        state, _ = setup()
        runners[(name, "graph")] = [in_graph(step), state, [], scan_keys, STEPS_PER_SCAN]
    for _ in range(repeats):                       # interleaved: jaxppo, flashbax, jaxppo, ...
        for mode in ("call", "graph"):
            for name in setups:
                r = runners[(name, mode)]
                t, r[1] = time_steps(r[0], r[1], r[3])
                r[2].append(t / r[4])
    layout = runners[("jaxppo", "call")][1].layout   # static, readable after the arrays were donated
    row = {"N": n, "tree": "x".join(map(str, (layout.top, *reversed(layout.fanouts))))}
    for (name, mode), r in runners.items():
        sfx = "" if mode == "call" else "_graph"
        row[f"{name}{sfx}_us"] = statistics.median(r[2]) * 1e6
        row[f"{name}{sfx}_us_min"] = min(r[2]) * 1e6
    if with_flashbax:
        for mode, sfx in (("call", ""), ("graph", "_graph")):
            ours, fb = runners[("jaxppo", mode)][2], runners[("flashbax", mode)][2]
            row[f"speedup{sfx}"] = statistics.median(fb) / statistics.median(ours)
            row[f"speedup{sfx}_min"] = min(fb) / min(ours)
            # per-repeat ratios (each pair measured back to back): robust to slow drifts in machine load
            row[f"speedup{sfx}_paired_median"] = statistics.median(f / o for f, o in zip(fb, ours))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 50_000, 1_000_000])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--leaf-fanout", type=int, default=None, help="override jaxppo's leaf row size")
    ap.add_argument("--no-flashbax", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "replay.json"))
    args = ap.parse_args()

    rows = [bench(n, args.steps, args.repeats, args.leaf_fanout, not args.no_flashbax) for n in args.sizes]
    header = (f"{'N':>9} {'tree (top x ... x leaf)':>24} {'mode':>6} {'jaxppo us (med/min)':>20} "
              f"{'flashbax us (med/min)':>22} {'speedup med/min/paired':>23}")
    print(header)
    for r in rows:
        for mode, sfx in (("call", ""), ("graph", "_graph")):
            ours = f"{r[f'jaxppo{sfx}_us']:.1f} / {r[f'jaxppo{sfx}_us_min']:.1f}"
            fb = (f"{r[f'flashbax{sfx}_us']:.1f} / {r[f'flashbax{sfx}_us_min']:.1f}"
                  if f"flashbax{sfx}_us" in r else "-")
            sp = (f"{r[f'speedup{sfx}']:.2f} / {r[f'speedup{sfx}_min']:.2f} / "
                  f"{r[f'speedup{sfx}_paired_median']:.2f}" if f"speedup{sfx}" in r else "-")
            print(f"{r['N']:>9} {r['tree']:>24} {mode:>6} {ours:>20} {fb:>22} {sp:>23}")
    meta = {"batch": BATCH, "alpha": ALPHA, "steps": args.steps, "repeats": args.repeats,
            "jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "step": "sample(256) + update_priorities(256), jitted, donated",
            "steps_per_scan": STEPS_PER_SCAN,
            "loadavg_after": os.getloadavg()}
    try:
        import flashbax
        meta["flashbax"] = getattr(flashbax, "__version__", None) or _dist_version("flashbax")
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
