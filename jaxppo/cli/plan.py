"""``python -m jaxppo.plan --config FILE [overrides] [--hbm-gib N] [--json OUT] [--devices N] [--no-compile]
[--target accelerator|cpu]``

Per-device memory of a config's run before renting hardware (an ahead-of-time compile check). The plan builds
the SAME train state and jitted step as ``jaxppo.train`` (``trainer.setup.abstract_core``, which shares
``build_core`` with ``build_run``) but abstractly: only the model's ``config.json`` is read (``model.path`` is a
directory holding it), no weights and no dataset. Shapes: ``data.max_prompt_length`` / ``max_response_length``
(the longest a run pads to), ``replay.capacity`` slots (rounded like the run does), ``actor.ppo_mini_batch_size``.

Per category, ``total`` is the global size and ``per_device`` the largest per-device sum, computed from the
shardings of the abstract state (each leaf's shard shape × itemsize on each device, summed per device, max over
devices), never from hand arithmetic:

- ``params_bytes``: actor + critic parameters; ``optimizer_bytes``: their optax states;
- ``replay_bytes``: buffer storage, priorities and sum-tree; ``reference_bytes``: the frozen reference policy
  (a copy of the actor's parameters kept for evaluation; with LoRA adapters, ``model.lora.rank > 0``: the ONE
  frozen base that policy, reference and critic share, quantized with ``model.lora.quantize_base``, while
  ``params_bytes`` / ``optimizer_bytes`` hold only the adapters and value head); ``scalars_bytes``: counters, RNG
  key, KL coefficient;
- ``temp_bytes``: XLA's temporary buffers (``memory_analysis().temp_size_in_bytes``, per device; activations,
  gradients, gathered weights, logits) of the largest of the three programs a run executes, each compiled here:
  the update step, the prepare pass and the behaviour (reference log-prob) pass; ``temp_by_phase`` lists all
  three. ``null`` with ``--no-compile``. Measured on an H200 (benchmarks/README.md "On a GPU"), the GPU plan bounded
  the peak of the runs that fit, within 0.03% for full weights, but not a quantized (NF4) base's behaviour pass;
- ``total_bytes``: the sum; ``fits``: ``per_device.total_bytes <= hbm_gib · 2^30`` (and the load's peak below,
  when there is one; ``null`` without ``--hbm-gib``);
- ``load`` (a quantized base, ``model.lora.quantize_base``; else ``null``): the peak of loading the float weights and
  quantizing them in place (``DecoderLayers.quantize``: projection after projection, each float stack released
  before the next): ``bytes`` = max over the projections ``t`` (in order) of the float model (``model.param_dtype``)
  + the actor's adapters − what the earlier projections saved (float − stored) + twice ``t``'s stored codes and
  scales (the per-layer parts and their stack) + one layer's float slice + the per-layer quantizer's temporaries
  (``memory_analysis`` of its compile on the plan's device); ``by_target`` lists each ``t``'s value. Counted for
  one device holding the whole model (the quantized examples' case); on a mesh it is divided by
  ``mesh.fsdp × mesh.tensor`` (an even split of the weights). Measured on the H200: see launch/README.md.

The mesh is the config's, over ``--devices`` devices (default its size). Unless ``JAX_PLATFORMS`` is set, the
plan runs on simulated CPU devices (``--xla_force_host_platform_device_count``), and its programs are an
accelerator's: on simulated devices (more than one CPU device) or with ``--target accelerator`` the models resolve
their layer layout and remat as an accelerator does (``models.config.resolve_layers``: a scanned stack, ``model.remat:
auto`` = nothing recomputed), not as the planning CPU would (16-bit stacks unrolled, "dots" for a scanned float32
stack). ``config.layers`` states what was compiled (``target``, ``stack``, ``remat_policy``), ``config.layout_note`` and
``config.remat_note`` each difference from a CPU run. A plan on one real CPU device (``--devices 1``) compiles the
CPU's layout unless ``--target accelerator``. ``temp_bytes`` stay the CPU compiler's estimate of those programs. That
mesh is the GLOBAL one of a multi-host run (``launch/multihost.py``: ``mesh.data × mesh.fsdp × mesh.tensor`` counts
the devices of all hosts): run the plan in one process, and its per-device bytes are what each chip holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

PROG = "python -m jaxppo.plan"
GiB = 2 ** 30
CATEGORIES = ("params_bytes", "optimizer_bytes", "replay_bytes", "reference_bytes", "scalars_bytes", "temp_bytes")


def tree_bytes(tree) -> tuple[int, int]:
    """``(per_device, total)`` bytes of a tree of ``ShapeDtypeStruct``/``jax.Array`` leaves with shardings:
    per device the sum over leaves of ``prod(shard shape) · itemsize`` on that device, max over devices."""
    import jax
    import numpy as np

    per: dict[Any, int] = {}
    total = 0
    for x in jax.tree.leaves(tree):
        item = np.dtype(x.dtype).itemsize
        total += math.prod(x.shape) * item
        for dev, idx in x.sharding.devices_indices_map(tuple(x.shape)).items():
            shard = math.prod(len(range(*s.indices(d))) for s, d in zip(idx, x.shape)) if idx else 1
            per[dev] = per.get(dev, 0) + shard * item
    return (max(per.values()) if per else 0), total


def read_model_config(path: str | Path, what: str = "model.path") -> dict:
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(f"{what}={path}: no config.json there (the plan needs only the model's config.json)")
    return json.loads(f.read_text())


def plan(cfg: Any, *, devices=None, hbm_gib: float | None = None, compile_step: bool = True,
         target: str | None = None) -> dict:
    """The memory plan of ``cfg`` on ``devices`` (default all): a JSON-able dict (see the module docstring). Its
    models resolve their layer layout and remat for ``target`` ("accelerator" or "cpu"; None: ``target_backend``
    of the devices), stated in ``config.layers``."""
    import jax

    from jaxppo.models.config import layout_backend

    devices = list(jax.devices() if devices is None else devices)
    target = target or target_backend(devices)
    with layout_backend(target):
        p = _plan(cfg, devices, hbm_gib, compile_step)
    p["config"].update(layers_for_target(cfg, target))
    return p


def _plan(cfg: Any, devices: list, hbm_gib: float | None, compile_step: bool) -> dict:
    import jax

    from jaxppo.trainer.mesh import mesh_from_config
    from jaxppo.trainer.ppo.abstract import abstract_core
    from jaxppo.trainer.ppo.build import check_config

    check_config(cfg, len(devices))
    m = cfg.mesh
    mesh, rules = mesh_from_config(m, devices)
    critic_hf = read_model_config(cfg.critic.model_path, "critic.model_path") \
        if cfg.critic.model_path and not cfg.critic.share_trunk else None
    t0 = time.perf_counter()
    core, actor_gd, _, ref = abstract_core(cfg, mesh, rules, read_model_config(cfg.model.path), critic_hf_config=critic_hf,
                                    prompt_len=cfg.data.max_prompt_length,
                                    response_len=cfg.data.max_response_length)
    s = core.state
    parts = {
        "params_bytes": tree_bytes((s.actor, s.critic)),
        "optimizer_bytes": tree_bytes((s.actor_opt, s.critic_opt)),
        "replay_bytes": tree_bytes(s.replay),
        "reference_bytes": tree_bytes(ref),
        "scalars_bytes": tree_bytes((s.step, s.rng, s.kl_coef, s.lr_scale, s.nan_total, s.nan_streak,
                                     s.data_cursor)),
    }
    build_s = time.perf_counter() - t0
    compile_s = None
    memory = None
    phases = None
    if compile_step:
        t0 = time.perf_counter()
        phases, memory = {}, {}
        for name, lowered in _phase_programs(cfg, core, actor_gd, s, ref).items():
            ma = lowered.compile().memory_analysis()
            phases[name] = int(ma.temp_size_in_bytes)
            memory[name] = {"argument_size_in_bytes": int(ma.argument_size_in_bytes),
                            "output_size_in_bytes": int(ma.output_size_in_bytes),
                            "alias_size_in_bytes": int(ma.alias_size_in_bytes),
                            "temp_size_in_bytes": int(ma.temp_size_in_bytes)}
        compile_s = time.perf_counter() - t0
        temp = max(phases.values())
        parts["temp_bytes"] = (temp, temp * len(devices))
    else:
        parts["temp_bytes"] = (None, None)
    load = load_peak(cfg, read_model_config(cfg.model.path), devices[0], model_shards=m.fsdp * m.tensor)
    per_device = {k: parts[k][0] for k in CATEGORIES}
    total = {k: parts[k][1] for k in CATEGORIES}
    for block in (per_device, total):
        block["total_bytes"] = sum(v for v in block.values() if v is not None)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(s.actor))
    lora = cfg.model.lora.rank > 0
    n_base = sum(math.prod(x.shape) for x in jax.tree.leaves(ref)) if lora else None
    platform = devices[0].platform
    return {
        "config": {"model.path": str(cfg.model.path), "mesh": {"data": m.data, "fsdp": m.fsdp, "tensor": m.tensor},
                   "param_dtype": cfg.model.param_dtype, "compute_dtype": cfg.model.compute_dtype,
                   "remat": cfg.model.remat, "share_trunk": cfg.critic.share_trunk,
                   "prompt_length": cfg.data.max_prompt_length, "response_length": cfg.data.max_response_length,
                   "ppo_mini_batch_size": cfg.actor.ppo_mini_batch_size,
                   "ppo_micro_batch_size": cfg.actor.ppo_micro_batch_size or cfg.actor.ppo_mini_batch_size,
                   "replay_slots": int(s.replay.capacity),
                   "lora_rank": int(cfg.model.lora.rank), "quantize_base": cfg.model.lora.quantize_base},
        "devices": {"count": len(devices), "platform": platform,
                    "simulated": platform == "cpu" and len(devices) > 1},
        "actor_parameters": int(n_params),   # with adapters: the actor's adapter parameters
        "base_parameters": n_base,           # with adapters: stored values of the shared frozen base
        "per_device": per_device,
        "total": total,
        "hbm_gib": hbm_gib,
        "fits": None if hbm_gib is None else bool(max(per_device["total_bytes"], load["bytes"] if load else 0)
                                                  <= hbm_gib * GiB),
        "load": load,                       # a quantized base: the peak of loading and quantizing (docstring)
        "temp_note": None if compile_step else "--no-compile: the step was not compiled, temp_bytes unknown "
                                          "(fits covers the persistent state only)",
        "temp_by_phase": phases,            # per device: the step, the prepare pass, the behaviour pass
        "memory_analysis": memory,
        "seconds": {"build": round(build_s, 2), "compile": None if compile_s is None else round(compile_s, 2)},
    }


def target_backend(devices) -> str:
    """The backend a plan on ``devices`` compiles for: "accelerator" on simulated CPU devices (more than one CPU
    device: a plan for GPUs or TPUs), else the devices' own platform (a real single-device CPU plan is the CPU's)."""
    platform = devices[0].platform
    return "accelerator" if platform == "cpu" and len(devices) > 1 else platform


def layers_for_target(cfg: Any, target: str) -> dict:
    """``{"layers", "layout_note", "remat_note"}`` of the plan's ``config``: how the policy's layer stack was
    compiled for ``target`` (``models.config.resolve_layers``: ``unroll``, ``remat_policy``), and, for a target
    other than the CPU, a note for each of the two that a CPU run of the same config resolves otherwise."""
    from jaxppo.models.config import resolve_layers
    from jaxppo.hf.from_config import lm_config

    lm = lm_config(read_model_config(cfg.model.path), cfg.model)
    unroll, policy = resolve_layers(lm, target)
    cpu_unroll, cpu_policy = resolve_layers(lm, "cpu")
    stack = lambda u: "unrolled" if u else "scanned"  # noqa: E731
    saved = {None: "nothing recomputed: every activation saved", "full": "each layer recomputed from its input",
             "dots": "only the matrix products saved"}
    layout_note = remat_note = None
    if target != "cpu" and unroll != cpu_unroll:
        layout_note = f"layer stack planned as on an accelerator ({stack(unroll)}); on a CPU it is {stack(cpu_unroll)}"
    if target != "cpu" and policy != cpu_policy:
        remat_note = (f"model.remat {cfg.model.remat!r} planned as on an accelerator ({saved[policy]}); on a CPU: "
                      f"{saved[cpu_policy]}")
    return {"layers": {"target": target, "stack": stack(unroll), "remat_policy": policy},
            "layout_note": layout_note, "remat_note": remat_note}


def load_peak(cfg: Any, hf_config: dict, device, *, model_shards: int = 1) -> dict | None:
    """The load-and-quantize peak of a run with a quantized base (module docstring, ``load``), or None."""
    import jax
    from flax import nnx

    from jaxppo.models import CausalLM
    from jaxppo.models.adapters import attach_lora
    from jaxppo.models.lora import QUANT_SUFFIXES, TARGETS, layer_quantizer, spec_from_config
    from jaxppo.hf.from_config import lm_config

    spec = spec_from_config(cfg.model.lora)
    if spec is None or spec.quantize_base is None:
        return None
    lm_cfg = lm_config(hf_config, cfg.model)
    nbytes = lambda tree: sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    float_lm = nnx.eval_shape(lambda: CausalLM(lm_cfg, rngs=nnx.Rngs(0)))
    quant_lm = nnx.eval_shape(lambda: attach_lora(CausalLM(lm_cfg, rngs=nnx.Rngs(0)), spec))
    fl, ql = float_lm.model.layers, quant_lm.model.layers
    adapters = nbytes([getattr(ql, f"{t}_lora_{x}").get_value() for t in spec.targets for x in "ab"])
    before = nbytes(nnx.state(float_lm)) + adapters
    by_target = {}
    for t in TARGETS:
        w = getattr(fl, t).get_value()
        f_t = nbytes(w)
        q_t = nbytes([getattr(ql, t + sfx).get_value() for sfx in ("",) + QUANT_SUFFIXES if hasattr(ql, t + sfx)])
        layer = jax.ShapeDtypeStruct(w.shape[1:], w.dtype)
        temp = jax.jit(layer_quantizer(t, spec.quantize_base)).trace(layer).lower(lowering_platforms=(device.platform,)).compile().memory_analysis()
        by_target[t] = (before + 2 * q_t + f_t // w.shape[0] + int(temp.temp_size_in_bytes)) // model_shards
        before += q_t - f_t
    return {"bytes": max(by_target.values()), "by_target": by_target}


def _phase_programs(cfg: Any, core, actor_gd, s, ref) -> dict:
    """The three jitted programs a run executes on the train state's devices, lowered on abstract arguments: the
    update ``step``, the ``prepare`` pass (proximal log-probs, values, advantages of the whole buffer in chunks of
    ``actor.ppo_micro_batch_size``) and the ``behaviour`` pass (reference log-probs of the training rows,
    ``data.behaviour_batch_size`` rows per call, on the reference policy: with adapters the base, adapters off)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxppo.models.adapters import merge_with_base
    from jaxppo.models.transformer import continuation_logprobs
    out = {"step": core.step.lower(s), "prepare": core.prepare.lower(s)}
    lora = cfg.model.lora.rank > 0   # adapters: the base (``ref``) with adapters shaped like the actor's
    graphdef, state = nnx.split(merge_with_base(actor_gd, s.actor, ref) if lora else merge_with_base(actor_gd, ref, None))
    b, P, R = cfg.data.behaviour_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length
    tok = lambda n: jax.ShapeDtypeStruct((b, n), jnp.int32)  # noqa: E731
    out["behaviour"] = continuation_logprobs.lower(graphdef, state, tok(P), tok(P), tok(R), tok(R))
    return out


def _base_note(p: dict) -> str:
    c = p["config"]
    if not c.get("lora_rank"):
        return ""
    q = c.get("quantize_base") or c["param_dtype"]
    return (f" (LoRA rank {c['lora_rank']} adapters) on a frozen {q} base of {p['base_parameters']:,} stored values"
            f" shared by policy, reference and critic (the 'reference' row)")


def format_table(p: dict) -> str:
    def gib(x):
        return "-" if x is None else f"{x / GiB:.2f}"

    d, m = p["devices"], p["config"]["mesh"]
    head = (f"mesh data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']} on {d['count']} "
            f"{'simulated ' if d['simulated'] else ''}{d['platform']} devices; actor {p['actor_parameters']:,} "
            f"parameters{_base_note(p)}; compile {p['seconds']['compile']} s")
    rows = [f"{'':<16}{'per device GiB':>16}{'total GiB':>12}"]
    for k in CATEGORIES + ("total_bytes",):
        rows.append(f"{k.removesuffix('_bytes'):<16}{gib(p['per_device'][k]):>16}{gib(p['total'][k]):>12}")
    if p.get("load"):
        rows.append(f"{'load (peak)':<16}{gib(p['load']['bytes']):>16}{'':>12}  loading the float weights and "
                    f"quantizing them ({p['config']['quantize_base']})")
    if p["fits"] is not None:
        rows.append(f"fits {p['hbm_gib']} GiB per device: {'yes' if p['fits'] else 'NO'}")
    if p["temp_note"]:
        rows.append(p["temp_note"])
    for note in ("layout_note", "remat_note"):
        if p["config"].get(note):
            rows.append(p["config"][note])
    return "\n".join([head, *rows])


# ---------------------------------------------------------------- the shipped examples' plans and the README table
REPO = Path(__file__).resolve().parents[2]   # jaxppo/cli/plan.py -> the repository
#: the plans' model.path: Qwen2.5-7B-Instruct's config.json (its shapes; the plan reads nothing else)
EXAMPLE_MODEL = "configs/examples/qwen2_5_7b_shapes/config.json"
README = "launch/README.md"
TABLE_BEGIN, TABLE_END = "<!-- plan table: begin -->", "<!-- plan table: end -->"


@dataclass(frozen=True)
class Layout:
    """One planned layout: a shipped example (``config``, under the repository) with ``overrides``, as launched by
    ``how``. Its budget is the config's ``mesh.hbm_gib``."""

    name: str
    config: str
    overrides: tuple[str, ...]
    how: str


#: every example in configs/examples/ and every launch layout launch/README.md documents
LAYOUTS: tuple[Layout, ...] = (
    Layout("qwen2_5_7b_fsdp8", "configs/examples/qwen2_5_7b_fsdp8.yaml", (), "`launch/gpu_8x.sh`: one host, 8 GPUs"),
    Layout("qwen2_5_7b_fsdp8_slurm_4x8", "configs/examples/qwen2_5_7b_fsdp8.yaml",
           ("mesh.data=4", "actor.ppo_micro_batch_size=32"), "`srun launch/multihost.py` (SLURM recipe): 4 hosts x 8 GPUs"),
    Layout("tpu_v5e_32", "configs/examples/tpu_v5e_32.yaml", (), "`launch/tpu_pod.sh`: TPU v5e-32, 8 hosts x 4 chips"),
    Layout("qwen2_5_7b_lora_80gb", "configs/examples/qwen2_5_7b_lora_80gb.yaml", (), "`python -m jaxppo.train`: one GPU"),
    Layout("qwen2_5_7b_qlora_24gb", "configs/examples/qwen2_5_7b_qlora_24gb.yaml", (), "`python -m jaxppo.train`: one GPU"),
)


def layout_config(layout: Layout, model: str | Path | None = None) -> Any:
    """The layout's config, ``model.path`` = ``model`` (default ``EXAMPLE_MODEL``, relative to the working
    directory when it is inside the repository)."""
    from jaxppo.config import load_config

    if model is None:
        model = REPO / EXAMPLE_MODEL
        if Path.cwd().resolve().is_relative_to(REPO):
            model = os.path.relpath(model)
    return load_config(REPO / layout.config, [f"model.path={model}", *layout.overrides])


def device_count(cfg: Any) -> int:
    return cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor


def plan_layout(layout: Layout, devices, *, model: str | Path | None = None, compile_step: bool = True) -> dict:
    """``plan`` of the layout for an accelerator on the first ``device_count`` of ``devices``, against the config's
    ``mesh.hbm_gib``."""
    cfg = layout_config(layout, model)
    return plan(cfg, devices=list(devices)[:device_count(cfg)], hbm_gib=cfg.mesh.hbm_gib, compile_step=compile_step,
                target="accelerator")


def _git_commit() -> str | None:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")


def _machine() -> dict:
    import platform

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else None
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0]}


def layout_record(layout: Layout, p: dict, *, load_before: list[float]) -> dict:
    """The JSON record of one layout's plan: what was planned, how, where and when, and the plan."""
    import datetime

    import jax

    return {"name": layout.name, "config": layout.config, "overrides": list(layout.overrides), "how": layout.how,
            "command": f"{PROG} --examples --out DIR",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": _machine(), "load": {"before": load_before, "after": list(os.getloadavg())},
            "git_commit": _git_commit(), "jax": jax.__version__, "plan": p}


def write_records(out: str | Path, devices, layouts: Sequence[Layout] = LAYOUTS, *,
                  compile_step: bool = True) -> list[dict]:
    """Plan every layout and write ``out/<name>.json``; returns the records."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recs = []
    for layout in layouts:
        load = list(os.getloadavg())
        rec = layout_record(layout, plan_layout(layout, devices, compile_step=compile_step), load_before=load)
        (out / f"{layout.name}.json").write_text(json.dumps(rec, indent=2) + "\n")
        print(f"{layout.name}:\n{format_table(rec['plan'])}\n", flush=True)
        recs.append(rec)
    return recs


def read_records(out: str | Path, layouts: Sequence[Layout] = LAYOUTS) -> list[dict]:
    """The records of ``layouts`` in ``out``, in ``layouts``' order (FileNotFoundError naming a missing one)."""
    return [json.loads((Path(out) / f"{layout.name}.json").read_text()) for layout in layouts]


def examples_table(records: Sequence[dict]) -> str:
    """launch/README.md's memory table of the records: per device GiB of each category, the three programs'
    temporaries, the total (and a quantized base's load peak) against the config's budget."""
    def g(x):
        return f"{x / GiB:.2f}"

    rows = ["| layout | launched by | mesh (devices) | params | AdamW | replay | reference | temp: step / prepare / "
            "behaviour | total per device | budget (`mesh.hbm_gib`) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        p = r["plan"]
        c, d, per = p["config"], p["devices"], p["per_device"]
        mesh = " × ".join(f"{k}={v}" for k, v in c["mesh"].items() if v > 1) or "1 device"
        over = "".join(f" `{o}`" for o in r["overrides"])
        t = p["temp_by_phase"]
        total = f"**{g(per['total_bytes'])}**" + (f"; load {g(p['load']['bytes'])}" if p.get("load") else "")
        rows.append(f"| `{Path(r['config']).name}`{over} | {r['how']} | {mesh} ({d['count']}) | {g(per['params_bytes'])}"
                    f" | {g(per['optimizer_bytes'])} | {g(per['replay_bytes'])} | {g(per['reference_bytes'])} | "
                    f"{g(t['step'])} / {g(t['prepare'])} / {g(t['behaviour'])} | {total} | {p['hbm_gib']:g} GiB: "
                    f"{'fits' if p['fits'] else '**does not fit**'} |")
    return "\n".join(rows)


def rewrite_table(text: str, table: str) -> str:
    """``text`` with what lies between ``TABLE_BEGIN`` and ``TABLE_END`` replaced by ``table``."""
    i, j = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    return text[:i] + "\n" + table + "\n" + text[j:]


def examples_main(argv: Sequence[str]) -> int:
    """``--examples [--out DIR] [--layouts NAME ...] [--no-compile] [--records-only | --table-only]``: plan the
    layouts (default all of ``LAYOUTS``) into DIR's records (not with ``--table-only``), then rewrite
    launch/README.md's table from DIR's records of all layouts (not with ``--records-only``)."""
    ap = argparse.ArgumentParser(prog=f"{PROG} --examples", description="Plan the shipped examples and launch layouts "
                                 "(JSON records) and rewrite launch/README.md's memory table from the records.")
    ap.add_argument("--examples", action="store_true", required=True)
    ap.add_argument("--out", default="results/plans", help="folder of the JSON records (default results/plans)")
    ap.add_argument("--layouts", nargs="+", choices=[lo.name for lo in LAYOUTS], default=None,
                    help="plan only these layouts (default: all)")
    ap.add_argument("--no-compile", action="store_true", help="skip the XLA compiles (temp_bytes null)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--records-only", action="store_true", help="write the records, leave the README")
    only.add_argument("--table-only", action="store_true", help="only rewrite the table from the records in --out")
    args = ap.parse_args(list(argv))
    if not args.table_only:
        layouts = [lo for lo in LAYOUTS if args.layouts is None or lo.name in args.layouts]
        n = max(device_count(layout_config(layout)) for layout in layouts)
        _ensure_devices(n)
        import jax

        if len(jax.devices()) < n:
            print(f"{PROG}: error: {n} devices needed but {len(jax.devices())} exist (run the command in a fresh "
                  "process)", file=sys.stderr)
            return 2
        write_records(args.out, jax.devices(), layouts, compile_step=not args.no_compile)
    if args.records_only:
        return 0
    readme = REPO / README
    readme.write_text(rewrite_table(readme.read_text(), examples_table(read_records(args.out))))
    print(f"{README}: table rewritten from {args.out}")
    return 0


def _ensure_devices(n: int) -> None:
    """Before jax starts its backend: simulate ``n`` CPU devices unless the user chose a platform."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if os.environ["JAX_PLATFORMS"] == "cpu":
        from jaxppo.parallel.mesh import simulated_devices_flags

        os.environ["XLA_FLAGS"] = simulated_devices_flags(os.environ.get("XLA_FLAGS", ""), n)


def main(argv: Sequence[str] | None = None) -> int:
    from jaxppo.cli.util import parse_args_and_config, run_cli

    if "--examples" in (sys.argv[1:] if argv is None else argv):
        return examples_main(sys.argv[1:] if argv is None else argv)

    def options(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--hbm-gib", type=float, default=None,
                        help="memory per device to check against (GiB; default: the config's mesh.hbm_gib)")
        ap.add_argument("--json", default=None, help="write the plan as JSON here")
        ap.add_argument("--devices", type=int, default=None, help="device count (default: the config's mesh size)")
        ap.add_argument("--no-compile", action="store_true", help="skip the XLA compile (temp_bytes reported as null)")
        ap.add_argument("--target", choices=("accelerator", "cpu"), default=None,
                        help="layer layout and remat to compile: an accelerator's or the CPU's (default: the "
                             "accelerator's on simulated devices, else the devices' own)")

    args, cfg = parse_args_and_config(PROG, "Per-device memory of a config's train state and compiled update step, on "
                                      "(simulated) devices, before renting hardware.", argv, add_arguments=options,
                                      config_required=True)
    m = cfg.mesh
    n = args.devices or m.data * m.fsdp * m.tensor
    _ensure_devices(n)
    import jax

    have = jax.devices()
    if len(have) < n:
        print(f"{PROG}: error: {n} devices needed but {len(have)} exist (jax was started before the plan could "
              "set --xla_force_host_platform_device_count; run the plan in a fresh process)", file=sys.stderr)
        return 2

    def report(p: dict) -> None:
        print(format_table(p))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(p, indent=2) + "\n")

    hbm_gib = args.hbm_gib if args.hbm_gib is not None else m.hbm_gib
    return run_cli(PROG, lambda: plan(cfg, devices=have[:n], hbm_gib=hbm_gib,
                                      compile_step=not args.no_compile, target=args.target), report)


if __name__ == "__main__":
    raise SystemExit(main())
