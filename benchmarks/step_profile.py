"""Where jaxppo's float32 GRPO/PPO actor update spends its time: timed ablations of the step, one process.

``python benchmarks/step_profile.py --work DIR [--repeats 5] [--parts trunk,head,ent,step,opt]`` with ``DIR`` a
work folder of ``benchmarks/peers.py`` (``model/``, ``batch.npz``, ``spec.json``; e.g. written by
``benchmarks/peers.py --tools jaxppo --tasks grpo --work DIR``). Each part is a jitted function of the same
weights and batch (8 x (64+64) tokens), timed as the median of ``repeats`` calls after a warm-up call:

- ``trunk``: forward + backward of the decoder trunk only (a linear read-out of the response positions' hidden
  states);
- ``head``: ``trunk`` + the LM head on the R response positions + log-softmax gather (``ops.logprobs_from_logits``);
- ``ent``: ``head`` + the entropy term in the loss with coefficient 0 (the pre-fix step's gradient path);
- ``step_entgrad``: ``step`` with ``entropy_coeff = 1e-30`` (the entropy's backward in the gradient path: the cost
  of the step before the entropy left it at coefficient 0);
- ``step``: the whole update of ``benchmarks/peers/jaxppo_driver.py`` (``--task grpo``: the actor's; ``ppo``: actor
  then critic) (loss, gradient, clip, AdamW);
- ``opt``: the optimizer alone (``clip_by_global_norm -> adamw`` + apply) on gradients of the parameters' shape.

Differences of consecutive rows give the cost of each op group (the table in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "peers"))


def _time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def build_parts(work: str, parts: list[str], task: str = "grpo"):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import common
    import jaxppo_driver
    from jaxppo import ops
    from jaxppo.optim import split_params

    spec, b, model_dir = common.load_work(work)
    s = spec["shapes"]
    model = jaxppo_driver._load(model_dir, "float32")
    gd, params = split_params(model)
    ids = jnp.concatenate([jnp.asarray(b["rl_prompt"], jnp.int32), jnp.asarray(b["rl_response"], jnp.int32)], 1)
    resp = jnp.asarray(b["rl_response"], jnp.int32)
    p, r = s["rl_prompt"], s["rl_response"]
    mask = jnp.ones_like(ids)
    out = {}

    def hidden(q):
        m = nnx.merge(gd, q)
        return m, m.hidden_states(ids, mask)[:, p - 1:p + r - 1]

    def trunk(q, resp):
        _, h = hidden(q)
        return jnp.mean(h * 0.01)

    def head(q, resp, ent=False):
        m, h = hidden(q)
        z = m.logits_from_hidden(h).astype(jnp.float32)
        loss = -jnp.mean(ops.logprobs_from_logits(z, resp))
        if ent:
            loss = loss - 0.0 * jnp.mean(ops.entropy_from_logits(z))
        return loss

    fns = {"trunk": trunk, "head": head, "ent": lambda q, t: head(q, t, True)}
    for name in parts:
        if name in fns:
            g = jax.jit(jax.value_and_grad(fns[name]))
            out[name] = lambda g=g: jax.block_until_ready(g(params, resp))
        elif name == "step":
            _, _, update, _, _ = jaxppo_driver.build(task, "float32", spec, b, model_dir)
            out[name] = update
        elif name == "step_entgrad":
            out[name] = _entgrad_step(spec, b, model_dir, task)
        elif name == "opt":
            out[name] = _opt_update(jaxppo_driver._optimizer(spec["hparams"]), params)
    return out


def _entgrad_step(spec, b, model_dir, task):
    """The driver's ``task`` update (grpo or ppo) with ``entropy_coeff = 1e-30``: the entropy's backward is in the gradient path, as
    it was before the entropy left it at coefficient 0 (the cost of the old step, same process)."""
    import jaxppo_driver
    from jaxppo.trainer.ppo import hparams

    real = hparams.ActorHP
    hparams.ActorHP = lambda **kw: real(**{**kw, "entropy_coeff": 1e-30})
    try:
        return jaxppo_driver.build(task, "float32", spec, b, model_dir)[2]
    finally:
        hparams.ActorHP = real


def _opt_update(tx, params):
    """``clip_by_global_norm -> adamw`` + apply on fixed gradients, parameters and state donated."""
    import jax
    import jax.numpy as jnp
    import optax

    grads = jax.tree.map(lambda x: x * 1e-3, params)
    holder = {"p": jax.tree.map(jnp.copy, params)}
    holder["o"] = tx.init(holder["p"])

    def upd(p_, o_, g_):
        u, o_ = tx.update(g_, o_, p_)
        return optax.apply_updates(p_, u), o_

    ju = jax.jit(upd, donate_argnums=(0, 1))

    def run():
        holder["p"], holder["o"] = ju(holder["p"], holder["o"], grads)
        jax.block_until_ready(holder["p"])

    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the parts this many times (medians of all)")
    ap.add_argument("--task", default="grpo", choices=("grpo", "ppo"), help="the update of step/step_entgrad")
    ap.add_argument("--parts", default="trunk,head,ent,step_entgrad,step,opt")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    fns = build_parts(a.work, parts, a.task)
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(a.rounds):
        for k in parts:
            times[k].append(_time(fns[k], a.repeats))
    res = {"s": {k: statistics.median(v) for k, v in times.items()}, "all": times,
           "load": os.getloadavg()}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
