"""``jaxppo.plan``: per-device memory of a config's real (abstract) state and compiled step.

The Qwen2.5-7B examples are planned here without compiling (tests/test_plan_examples.py compiles one and checks
every example's committed plan against its budget); the compile is tested on stories260K's real config.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.config import load_config
from jaxppo.parallel import make_mesh
from jaxppo.cli.plan import GiB, format_table, plan, tree_bytes

REPO = Path(__file__).resolve().parents[1]
# Qwen/Qwen2.5-7B-Instruct config.json (the shapes only; tests/trainer/test_examples.py QWEN25_7B)
QWEN25_7B_HF = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
                "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
QWEN25_7B_PARAMS = 7_615_616_512
# stories260K by hand: tied embedding 512x64; 5 layers x (q 64x64, k 64x32, v 64x32, o 64x64, MLP 3x64x172,
# 2 norms of 64); final norm 64
STORIES_PARAMS = 512 * 64 + 5 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 172 + 2 * 64) + 64


@pytest.fixture
def qwen_dir(tmp_path) -> Path:
    d = tmp_path / "qwen7b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN25_7B_HF))
    return d


def test_tree_bytes_hand_cases():
    mesh = make_mesh(1, 8, 1, devices=jax.devices()[:8])
    even = jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(mesh, PartitionSpec("fsdp")))
    rep = jax.ShapeDtypeStruct((3,), np.int32, sharding=NamedSharding(mesh, PartitionSpec()))
    assert tree_bytes(even) == (4 * 4, 8 * 4 * 4)          # one row of 4 float32 per device
    assert tree_bytes(rep) == (12, 12)                      # replicated: whole array on every device
    assert tree_bytes({"a": even, "b": rep}) == (16 + 12, 128 + 12)
    # concrete arrays: the same numbers as their real shards
    x = jax.device_put(np.zeros((16, 2), np.float32), NamedSharding(mesh, PartitionSpec("fsdp")))
    assert tree_bytes(x) == (max(s.data.nbytes for s in x.addressable_shards), x.nbytes)


def test_stories260k_plan_compiles_and_counts(stories_model):
    cfg = load_config(REPO / "configs/smoke.yaml", [f"model.path={stories_model}", "mesh.data=1", "mesh.fsdp=1",
                                                    "mesh.tensor=1"])
    p = plan(cfg, devices=jax.devices()[:1], hbm_gib=1.0)
    assert p["actor_parameters"] == STORIES_PARAMS == 260032
    assert p["total"]["reference_bytes"] == p["per_device"]["reference_bytes"] == STORIES_PARAMS * 4
    # temporaries: the largest of the three programs a run executes (update step, prepare pass, behaviour pass),
    # each the compiled program's own memory_analysis()
    phases = p["temp_by_phase"]
    assert sorted(phases) == ["behaviour", "prepare", "step"] and min(phases.values()) > 0
    assert p["per_device"]["temp_bytes"] == max(phases.values())
    assert all(p["memory_analysis"][k]["temp_size_in_bytes"] == v for k, v in phases.items())
    # the behaviour pass's temporaries grow with data.behaviour_batch_size (its logits), the step's do not
    p2 = plan(load_config(REPO / "configs/smoke.yaml", [f"model.path={stories_model}", "mesh.data=1", "mesh.fsdp=1",
                                                         "mesh.tensor=1", "data.behaviour_batch_size=256"]),
              devices=jax.devices()[:1])
    assert p2["temp_by_phase"]["behaviour"] > 2 * phases["behaviour"]
    assert p2["temp_by_phase"]["step"] == phases["step"]
    for block in ("per_device", "total"):
        b = p[block]
        assert b["total_bytes"] == sum(b[k] for k in b if k != "total_bytes")
    assert p["fits"] is True and p["devices"] == {"count": 1, "platform": "cpu", "simulated": False}
    json.dumps(p)  # JSON-able


@pytest.mark.slow
def test_remat_auto_is_planned_for_the_target(stories_model):
    """On simulated devices (a plan for accelerators) model.remat 'auto' compiles the accelerator's program (nothing
    recomputed: the same temporaries as remat=false, and said so); a single real CPU device keeps the CPU's 'dots',
    whose update step saves less."""
    over = [f"model.path={stories_model}", "mesh.fsdp=1", "mesh.tensor=1"]
    temps = lambda p: p["temp_by_phase"]["step"]   # noqa: E731
    two = {r: plan(load_config(REPO / "configs/smoke.yaml", [*over, "mesh.data=2", f"model.remat={r}"]),
                   devices=jax.devices()[:2]) for r in ("auto", "false")}
    assert temps(two["auto"]) == temps(two["false"])
    assert "planned as on an accelerator" in two["auto"]["config"]["remat_note"]
    assert two["auto"]["config"]["remat"] == "auto" and two["false"]["config"]["remat_note"] is None
    assert two["auto"]["config"]["layers"] == {"target": "accelerator", "stack": "scanned", "remat_policy": None}
    assert "planned as on an accelerator" in format_table(two["auto"])
    one = {r: plan(load_config(REPO / "configs/smoke.yaml", [*over, "mesh.data=1", f"model.remat={r}"]),
                   devices=jax.devices()[:1]) for r in ("auto", "false")}
    assert one["auto"]["config"]["remat"] == "auto" and one["auto"]["config"]["remat_note"] is None
    assert one["auto"]["config"]["layers"] == {"target": "cpu", "stack": "scanned", "remat_policy": "dots"}
    assert temps(one["auto"]) < temps(one["false"])


@pytest.mark.slow
def test_layer_layout_is_planned_for_the_target(stories_model):
    """A 16-bit stack unrolls on the CPU and scans on an accelerator: on simulated devices the plan compiles the
    scanned stack (``config.layers``, the layout note in JSON and table), on one real CPU device the unrolled one,
    and the two are different programs with different temporaries."""
    over = [f"model.path={stories_model}", "mesh.fsdp=1", "mesh.tensor=1", "model.compute_dtype=bfloat16",
            "model.remat=false"]
    two = plan(load_config(REPO / "configs/smoke.yaml", [*over, "mesh.data=2"]), devices=jax.devices()[:2])
    one = plan(load_config(REPO / "configs/smoke.yaml", [*over, "mesh.data=1"]), devices=jax.devices()[:1])
    assert two["config"]["layers"] == {"target": "accelerator", "stack": "scanned", "remat_policy": None}
    assert two["config"]["layout_note"] == ("layer stack planned as on an accelerator (scanned); on a CPU it is "
                                            "unrolled")
    assert two["config"]["layout_note"] in format_table(two) and two["config"]["remat_note"] is None
    assert one["config"]["layers"] == {"target": "cpu", "stack": "unrolled", "remat_policy": None}
    assert one["config"]["layout_note"] is None and "layer stack" not in format_table(one)
    assert two["temp_by_phase"]["step"] != one["temp_by_phase"]["step"]


def test_layout_backend_builds_the_targets_program_and_its_own_cache_entry():
    """LMConfigs built inside ``layout_backend`` resolve as on that backend whatever traces them: the same jitted
    function lowers a while loop over the layers for the accelerator's config and none for the CPU's."""
    from flax import nnx

    from jaxppo.models import CausalLM, LMConfig
    from jaxppo.models.config import layout_backend, resolve_layers

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                 compute_dtype="bfloat16")
    with layout_backend("accelerator"):
        acc = LMConfig(**shape)
    cpu = LMConfig(**shape)
    assert (acc.backend, cpu.backend) == ("accelerator", None)
    assert (acc.unroll_layers, cpu.unroll_layers) == (False, True) == (resolve_layers(acc, "gpu")[0],
                                                                       resolve_layers(cpu, "cpu")[0])
    f = jax.jit(lambda gd, st, i: nnx.merge(gd, st)(i, jax.numpy.ones_like(i)), static_argnums=0)
    ids = jax.ShapeDtypeStruct((1, 4), np.int32)
    texts = {}
    for name, c in (("acc", acc), ("cpu", cpu)):
        gd, st = nnx.split(nnx.eval_shape(lambda c=c: CausalLM(c, rngs=nnx.Rngs(0))))
        texts[name] = f.lower(gd, st, ids).as_text()
    assert "while" in texts["acc"] and "while" not in texts["cpu"]


def test_gpu_example_fits_80gb_with_optimizer_at_its_eighth(qwen_dir):
    cfg = load_config(REPO / "configs/examples/qwen2_5_7b_fsdp8.yaml", [f"model.path={qwen_dir}"])
    p = plan(cfg, devices=jax.devices()[:8], hbm_gib=80e9 / GiB, compile_step=False)
    assert p["actor_parameters"] == QWEN25_7B_PARAMS
    per, tot = p["per_device"], p["total"]
    assert per["temp_bytes"] is None and tot["temp_bytes"] is None and p["temp_note"]
    # fp32 Adam: mu + nu = 2 x (actor + critic) parameters, split 8 ways (<= 1.15 x the 1/8 share)
    assert tot["optimizer_bytes"] >= 2 * tot["params_bytes"]
    assert per["optimizer_bytes"] <= 1.15 * tot["optimizer_bytes"] / 8
    assert per["params_bytes"] <= 1.15 * tot["params_bytes"] / 8
    assert tot["reference_bytes"] == QWEN25_7B_PARAMS * 4
    assert p["fits"] is True and p["devices"]["simulated"] is True and p["devices"]["count"] == 8


def test_tpu_example_cli_on_32_simulated_devices(qwen_dir, tmp_path):
    out = tmp_path / "plan.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-m", "jaxppo.plan", "--config", str(REPO / "configs/examples/tpu_v5e_32.yaml"),
                        f"model.path={qwen_dir}", "--hbm-gib", "16", "--no-compile", "--json", str(out)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())
    assert p["devices"] == {"count": 32, "platform": "cpu", "simulated": True}
    assert "32 simulated cpu devices" in r.stdout and "fits 16.0 GiB per device" in r.stdout
    per = p["per_device"]
    assert per["optimizer_bytes"] <= 1.15 * p["total"]["optimizer_bytes"] / 16   # fsdp=16 (data replicates)
    assert p["fits"] == (per["total_bytes"] <= 16 * GiB)


def test_cli_missing_config_json_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "jaxppo.plan", "--config", str(REPO / "configs/smoke.yaml"),
                        f"model.path={tmp_path}", "mesh.data=1", "mesh.fsdp=1", "--devices", "1"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and "model.path" in r.stderr and "config.json" in r.stderr


@pytest.mark.parametrize("fmt", ["nf4", "int8"])
def test_load_peak_of_a_quantized_base_by_hand(tmp_path, fmt):
    """The load-and-quantize peak (``plan.load_peak``) on a small Llama shape, from the byte counts by hand: the
    float32 model plus the adapters, minus what the projections quantized earlier saved, plus twice the current
    projection's codes and scales, one layer's float slice and the quantizer's compiled temporaries."""
    from jaxppo.models.lora import _N_IN
    from jaxppo.models.quant import quantize_int8, quantize_nf4_last
    from jaxppo.cli.plan import load_peak

    L, D, H, K, hd, F, V, r = 2, 128, 2, 1, 64, 256, 512, 4
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": D,
          "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": K,
          "tie_word_embeddings": True, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = load_config(REPO / "configs/smoke.yaml", [f"model.path={tmp_path}", f"model.lora.rank={r}",
                                                    f"model.lora.quantize_base={fmt}"])
    assert load_peak(load_config(REPO / "configs/smoke.yaml", [f"model.path={tmp_path}"]), hf, jax.devices()[0]) is None
    got = load_peak(cfg, hf, jax.devices()[0])
    shapes = {"q": (D, H, hd), "k": (D, K, hd), "v": (D, K, hd), "o": (H, hd, D), "gate": (D, F), "up": (D, F),
              "down": (F, D)}
    size = {t: int(np.prod(s)) for t, s in shapes.items()}
    n_in = {t: int(np.prod(s[:_N_IN[t]])) for t, s in shapes.items()}
    floats = 4 * (V * D + L * (sum(size.values()) + 2 * D) + D)            # tied embedding, layers, final norm
    adapters = 4 * L * sum(r * (n_in[t] + size[t] // n_in[t]) for t in shapes)
    before, want = floats + adapters, {}
    for t, s in shapes.items():
        if fmt == "nf4":
            stored = L * (size[t] // 2 + 4 * size[t] // 64)                 # two codes a byte + a float32 per 64
            fn = quantize_nf4_last
        else:
            stored = L * (size[t] + 4 * size[t] // n_in[t])                 # int8 codes + a float32 per output
            fn = lambda w, n=_N_IN[t]: quantize_int8(w, n_in=n)  # noqa: E731
        temp = jax.jit(fn).lower(jax.ShapeDtypeStruct(s, np.float32)).compile().memory_analysis().temp_size_in_bytes
        want[t] = before + 2 * stored + 4 * size[t] + temp
        before += stored - 4 * L * size[t]
    assert got == {"bytes": max(want.values()), "by_target": want}
    p = plan(cfg, devices=jax.devices()[:1], hbm_gib=1.0, compile_step=False)
    assert p["load"] == got and p["fits"] is True
    assert plan(cfg, devices=jax.devices()[:1], hbm_gib=0.999 * got["bytes"] / GiB, compile_step=False)["fits"] is False
