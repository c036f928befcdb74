"""Large-scale example configs: Qwen2.5-7B parameter shardings divide evenly on their meshes, memory per device.

Nothing is allocated: the models are built with ``nnx.eval_shape``; the 8-GPU example is checked on a real
mesh of the 8 simulated CPU devices (including an XLA compile of the sharded Adam update, whose per-device
argument bytes must match the arithmetic), the 32-chip TPU example on a ``jax.sharding.AbstractMesh``.
Run with ``-s`` to see the per-device memory table.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding

from jaxppo.config import load_config
from jaxppo.models import CausalLM, LMConfig, named_shardings, partition_specs
from jaxppo.parallel import MESH_AXES, make_mesh, merged_rules

REPO = Path(__file__).resolve().parents[2]
GiB = 2 ** 30

# Qwen/Qwen2.5-7B-Instruct config.json (the shapes only)
QWEN25_7B = dict(architecture="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                 max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
QWEN25_7B_PARAMS = 7_615_616_512  # as reported for the HF checkpoint

# example -> (device count, per-device budget in GiB for fp32 weights + grads + Adam of everything trained
# plus the frozen reference: what must fit next to activations)
EXAMPLES = {
    "configs/examples/qwen2_5_7b_fsdp8.yaml": (8, 40.0),   # 80 GB GPUs
    "configs/examples/tpu_v5e_32.yaml": (32, 12.0),        # v5e: 16 GiB HBM per chip
}


def _abstract_models(cfg):
    from jaxppo.trainer.ppo.state import make_critic

    lm_cfg = LMConfig(**QWEN25_7B, param_dtype=cfg.model.param_dtype, compute_dtype=cfg.model.compute_dtype,
                      remat=cfg.model.remat)

    def build():
        actor = CausalLM(lm_cfg, rngs=nnx.Rngs(0))
        return actor, make_critic(actor, share_trunk=cfg.critic.share_trunk, seed=0)

    actor, critic = nnx.eval_shape(build)
    return nnx.state(actor, nnx.Param), nnx.state(critic, nnx.Param)


def _shard_shape(shape, spec, mesh_shape: dict) -> tuple[int, ...]:
    """Per-device block shape; asserts every sharded dimension divides evenly (independent arithmetic)."""
    out = []
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        k = math.prod(mesh_shape[a] for a in axes)
        assert dim % k == 0, f"dimension {i} of size {dim} is not divisible by mesh axes {axes} (= {k})"
        out.append(dim // k)
    return tuple(out)


def _per_device_bytes(state, specs, mesh_shape) -> tuple[int, int]:
    """(elements per device, bytes per device) of the parameters in ``state``."""
    n = b = 0
    for x, spec in zip(jax.tree.leaves(state), jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.P))):
        e = math.prod(_shard_shape(x.shape, spec, mesh_shape))
        n += e
        b += e * np.dtype(x.dtype).itemsize
    return n, b


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_example_config_shardings_divide_and_fit(path):
    from jaxppo.trainer.ppo.build import check_config

    cfg = load_config(REPO / path)
    n_dev, budget = EXAMPLES[path]
    m = cfg.mesh
    mesh_shape = dict(zip(MESH_AXES, (m.data, m.fsdp, m.tensor)))
    check_config(cfg, n_dev)  # the trainer's own mesh/batch rules
    rules = merged_rules(cfg.mesh.rules)
    actor, critic = _abstract_models(cfg)
    n_actor = sum(math.prod(x.shape) for x in jax.tree.leaves(actor))
    assert n_actor == QWEN25_7B_PARAMS
    a_specs, c_specs = partition_specs(actor, rules), partition_specs(critic, rules)
    a_elems, a_bytes = _per_device_bytes(actor, a_specs, mesh_shape)
    c_elems, c_bytes = _per_device_bytes(critic, c_specs, mesh_shape)
    # FSDP must really split the weights: per-device share close to 1/fsdp of the model
    assert a_elems <= n_actor / m.fsdp * 1.01
    # every large leaf is sharded
    for x, spec in zip(jax.tree.leaves(actor), jax.tree.leaves(a_specs, is_leaf=lambda s: isinstance(s, jax.P))):
        if math.prod(x.shape) > 1e6:
            assert any(e is not None for e in spec), f"leaf of shape {x.shape} is replicated"

    # the library's NamedShardings give the same blocks, on a real (8) or abstract (32) mesh
    if n_dev == len(jax.devices()):
        mesh = make_mesh(m.data, m.fsdp, m.tensor)
        shardings = jax.tree.leaves(named_shardings(actor, mesh, rules),
                                    is_leaf=lambda s: isinstance(s, NamedSharding))
    else:
        mesh = AbstractMesh((m.data, m.fsdp, m.tensor), MESH_AXES)
        shardings = [NamedSharding(mesh, s) for s in
                     jax.tree.leaves(a_specs, is_leaf=lambda s: isinstance(s, jax.P))]
    for x, s in zip(jax.tree.leaves(actor), shardings):
        assert s.shard_shape(x.shape) == _shard_shape(x.shape, s.spec, mesh_shape)

    # memory per device: trained weights x (param + grad + 2 Adam moments, moments in the param dtype)
    # plus the frozen reference copy of the actor weights
    item = np.dtype(cfg.model.param_dtype).itemsize
    trained = (a_elems + c_elems) * (3 * item) + a_bytes + c_bytes
    total = trained + a_bytes
    print(f"\n{path}: mesh data={m.data} fsdp={m.fsdp} tensor={m.tensor}; per device: actor {a_bytes / GiB:.2f} GiB "
          f"+ Adam {2 * a_elems * item / GiB:.2f} + grads {a_elems * item / GiB:.2f}; critic "
          f"{'(shared trunk) ' if cfg.critic.share_trunk else ''}{c_bytes / GiB:.2f} GiB (+Adam+grads "
          f"{3 * c_elems * item / GiB:.2f}); reference {a_bytes / GiB:.2f}; total {total / GiB:.2f} GiB")
    assert total / GiB < budget


def test_gpu_example_adam_update_compiles_sharded_with_expected_bytes():
    """XLA's own per-device argument size of the sharded AdamW update equals the arithmetic above."""
    cfg = load_config(REPO / "configs/examples/qwen2_5_7b_fsdp8.yaml")
    m = cfg.mesh
    mesh = make_mesh(m.data, m.fsdp, m.tensor)
    rules = merged_rules(cfg.mesh.rules)
    actor, _ = _abstract_models(cfg)
    sh = named_shardings(actor, mesh, rules)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), actor, sh)
    tx = optax.adamw(cfg.actor.optim.lr)
    opt = jax.eval_shape(tx.init, params)

    def update(p, o, g):
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o

    compiled = jax.jit(update, in_shardings=(sh, None, sh), donate_argnums=(0, 1)).lower(params, opt, params).compile()
    stats = compiled.memory_analysis()
    _, a_bytes = _per_device_bytes(actor, partition_specs(actor, rules), dict(zip(MESH_AXES, (m.data, m.fsdp, m.tensor))))
    # params + grads + mu + nu (fp32), plus the int32 step count
    assert stats.argument_size_in_bytes == pytest.approx(4 * a_bytes, rel=1e-6)
    assert 4 * a_bytes / GiB == pytest.approx(4 * QWEN25_7B_PARAMS * 4 / 8 / GiB, rel=0.01)


def test_launch_scripts_parse_and_readme_names_the_examples():
    import subprocess

    for p in ("launch/gpu_8x.sh", "launch/tpu_pod.sh"):
        r = subprocess.run(["bash", "-n", str(REPO / p)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["bash", str(REPO / p)], capture_output=True, text=True)  # no arguments
        assert r.returncode == 2 and "usage" in r.stderr
    readme = (REPO / "launch/README.md").read_text()
    for path in EXAMPLES:
        assert Path(path).name in readme


def test_multihost_environment_switch(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("multihost", REPO / "launch/multihost.py")
    mh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mh)
    assert mh.distributed_kwargs({}) == {}
    env = {"JAXPPO_COORDINATOR": "h0:1234", "JAXPPO_NUM_PROCESSES": "4", "JAXPPO_PROCESS_ID": "2",
           "JAXPPO_LOCAL_DEVICE_IDS": "0,1"}
    assert mh.distributed_kwargs(env) == dict(coordinator_address="h0:1234", num_processes=4, process_id=2,
                                              local_device_ids=[0, 1])
    with pytest.raises(SystemExit, match="JAXPPO_PROCESS_ID"):
        mh.distributed_kwargs({"JAXPPO_COORDINATOR": "h0:1", "JAXPPO_NUM_PROCESSES": "2"})
    with pytest.raises(SystemExit) as e:  # --help reaches the trainer's argument parser without initialising
        mh.main(["--help"])
    assert e.value.code == 0


# LoRA examples: ONE GPU each; the plan from the real code path (abstract_core -> build_core), persistent state only
# here (the 7B compile takes minutes; launch/README.md has the compiled plans with XLA's temporaries)
LORA_EXAMPLES = {
    "configs/examples/qwen2_5_7b_lora_80gb.yaml": (80e9, None),
    "configs/examples/qwen2_5_7b_qlora_24gb.yaml": (24e9, "nf4"),
}


@pytest.mark.parametrize("path", sorted(LORA_EXAMPLES))
def test_lora_examples_fit_one_gpu_by_the_plan(path, tmp_path):
    import json

    from jaxppo.cli.plan import GiB, plan
    from tests.test_plan import QWEN25_7B_HF

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B_HF))
    hbm, fmt = LORA_EXAMPLES[path]
    cfg = load_config(REPO / path, [f"model.path={tmp_path}"])
    assert cfg.model.lora.rank == 16 and cfg.model.lora.quantize_base == fmt and not cfg.critic.share_trunk
    p = plan(cfg, devices=jax.devices()[:1], hbm_gib=hbm / GiB, compile_step=False)
    per = p["per_device"]
    # adapters of the actor: rank 16 x (in + out) of the 7 projections x 28 layers
    d, f, kv = 3584, 18944, 4 * 128
    assert p["actor_parameters"] == 16 * 28 * ((d + d) + 2 * (d + kv) + (d + d) + 2 * (d + f) + (f + d))
    assert p["base_parameters"] is not None
    # one base, in the stated format: bf16 2 bytes/value, or NF4's 0.5 byte + a float32 per 64 on the projections
    proj = 28 * (d * d * 2 + d * kv * 2 + 3 * d * f)
    rest = QWEN25_7B_PARAMS - proj
    want = 2 * QWEN25_7B_PARAMS if fmt is None else 2 * rest + proj // 2 + 4 * proj // 64
    assert abs(per["reference_bytes"] - want) < 1e-3 * want, (per["reference_bytes"], want)
    # actor + critic adapters (float32, the same shapes) + the bf16 value head [3584, 1] + bias: nothing else
    assert per["params_bytes"] == 2 * 4 * p["actor_parameters"] + 2 * (d + 1)
    assert per["total_bytes"] < hbm * (0.6 if fmt is None else 0.5)     # room left for the step's temporaries
    assert p["fits"] is True
