"""The GPU records (results/device/*.json, earlier attempts in results/archive/device/) say what benchmarks/README.md
and launch/README.md say of them (their tables are generated from them: tests/test_benchmark_tables.py), and the
hand-checkable formulas of benchmarks/device_step.py (model FLOPs) are right."""

import json
from pathlib import Path

import pytest

from benchmarks.device_step import SHAPES, adapter_flops, forward_flops, step_model_flops, table
from benchmarks.tables import DEVICE_CURRENT

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted((ROOT / "results" / "device").glob("run*.json"))


def _rec(name):
    for folder in (ROOT / "results" / "device", ROOT / "results" / "archive" / "device"):
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    raise FileNotFoundError(name)


def test_current_records_are_the_folder():
    assert sorted(DEVICE_CURRENT) == sorted(f.stem for f in RUNS)
    assert table([(f.stem, json.loads(f.read_text())) for f in RUNS]).count("\n") == len(RUNS) + 1


def test_what_the_docs_read_from_the_records():
    bf16, f32 = _rec("run2_qwen1p5b_grpo_bf16"), _rec("run2_qwen1p5b_grpo_f32")
    assert f32["s_per_step"] / bf16["s_per_step"] > 1.5   # bf16 compute pays on the GPU
    # the plan matches the measured peak of the full-weight runs
    for r in (bf16, f32, _rec("run1_qwen1p5b_grpo_bf16_micro8")):
        peak = r["memory_after_steps"]["peak_bytes_in_use"]
        assert abs(r["plan_total_bytes"] - peak) <= 1e-3 * peak
    lora = _rec("run3_qwen7b_lora_80gb")
    assert lora["phase"] == "done" and lora["plan_total_bytes"] >= lora["memory_after_steps"]["peak_bytes_in_use"]
    # a QLoRA run peaks at the load; the plan's load estimate bounds it
    q6 = _rec("run6_qwen7b_qlora_24gb_behaviour8")
    assert q6["phase"] == "done" and q6["finite_losses"] and "data.behaviour_batch_size=8" in q6["overrides"]
    peak = q6["memory_after_steps"]["peak_bytes_in_use"]
    assert peak == q6["memory_after_adapters"]["peak_bytes_in_use"] <= q6["memory_cap"]["cap_bytes"]
    assert peak <= q6["plan_load_bytes"] <= 1.05 * peak
    example = " ".join((ROOT / "configs" / "examples" / "qwen2_5_7b_qlora_24gb.yaml").read_text().split())
    assert "behaviour_batch_size: 8 " in example and f"{q6['s_per_step']:.2f} s per step" in example
    assert f"peak {peak / 2 ** 30:.2f} GiB" in example
    # before the arrays were compacted, the 32-row behaviour block did not fit a fragmented allocator; after, it runs
    q4 = _rec("run4_qwen7b_qlora_24gb")
    block = q4["plan_temp_by_phase"]["behaviour"]
    used, limit = q4["memory_at_error"]["bytes_in_use"], q4["memory_at_error"]["bytes_limit"]
    assert f"{block / 2 ** 30:.2f}GiB" in q4["error"] and limit - used > block
    hlo = (ROOT / "results" / "archive" / "device" / "run4_qwen7b_qlora_24gb_hlo.txt").read_text()
    assert f"size {block}, page 0, preallocated-temp" in hlo   # the program's one big block is the planned one
    q6b = _rec("run6_qwen7b_qlora_24gb_behaviour32")
    assert "RESOURCE_EXHAUSTED" in q6b["error"] and f"{block / 2 ** 30:.2f}GiB" in q6b["error"]
    q8 = _rec("run8_qwen7b_qlora_24gb_behaviour32_compact")
    assert q8["phase"] == "done" and "data.behaviour_batch_size=32" in q8["overrides"]
    assert q8["plan_temp_by_phase"]["behaviour"] == block
    # bf16 parameters on a float32 master: faster than bf16 compute on float32 parameters, lower peak
    b7 = _rec("run7_qwen1p5b_grpo_bf16params")
    assert b7["param_dtype"] == "bfloat16" and b7["finite_losses"] and b7["s_per_step"] < bf16["s_per_step"]
    assert b7["memory_after_steps"]["peak_bytes_in_use"] < bf16["memory_after_steps"]["peak_bytes_in_use"]
    # per bf16 value (2 B): a float32 master (4 B) and two float32 moments (8 B), plus a few scalars (counts, LR)
    assert 0 <= b7["plan_parts"]["optimizer_bytes"] - 6 * b7["plan_parts"]["params_bytes"] < 1024
    # the float32 run at micro-batch 8 failed where the plan said it would not fit the allocator
    f8 = _rec("run1_qwen1p5b_grpo_f32_micro8")
    assert f8["plan_total_bytes"] > f8["memory_at_error"]["bytes_limit"] and "RESOURCE_EXHAUSTED" in f8["error"]


def test_forward_flops_by_hand():
    hf = SHAPES["tiny"]   # d 64, f 128, L 2, 4 heads of 16, 2 KV heads, V 512
    out = forward_flops(hf, 3, 5, head="lm")
    n_body = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)
    assert out == {"body": 2.0 * n_body * 8, "attention": 2.0 * 2 * 64 * 8 * 8, "head": 2.0 * 64 * 512 * 5}
    assert forward_flops(hf, 3, 5, head="value")["head"] == 2.0 * 64 * 8
    # rank 2 on q (64 -> 64) and down (128 -> 64): 2 r (in + out) per token and layer
    assert adapter_flops(hf, 2, ("q", "down"), 8) == 2 * 8 * (2 * 2 * 128 + 2 * 2 * 192)


@pytest.mark.parametrize("lora", [0, 4])
def test_step_model_flops_by_hand(lora):
    hf = SHAPES["tiny"]
    fa = sum(forward_flops(hf, 3, 5, head="lm").values())
    fv = sum(forward_flops(hf, 3, 5, head="value").values())
    got = step_model_flops(hf, prompt_len=3, response_len=5, actor_sequences=6, critic_sequences=24, lora_rank=lora,
                           lora_targets=("q",))
    if lora:
        ad = adapter_flops(hf, 4, ("q",), 8)
        assert got == 6 * (2 * fa + 3 * ad) + 24 * (2 * fv + 3 * ad)
    else:
        assert got == 6 * 3 * fa + 24 * 3 * fv
    assert step_model_flops(hf, prompt_len=3, response_len=5, actor_sequences=6) == 6 * 3 * fa


@pytest.mark.slow
def test_device_step_runs_the_training_path_on_cpu(tmp_path):
    """benchmarks/device_step.py end to end on the CPU (the toy shape, LoRA on an int8 base with the shared-base
    critic): the run's own prepare and step run, losses are finite and the JSON record has the fields the table reads."""
    from benchmarks.device_step import main

    out = tmp_path / "rec.json"
    rc = main(["--config", str(ROOT / "configs/examples/qwen2_5_7b_lora_80gb.yaml"), "--shape", "tiny", "--steps", "1",
               "--no-plan-compile", "--json", str(out), "data.max_prompt_length=16", "data.max_response_length=16",
               "actor.ppo_mini_batch_size=8", "model.lora.quantize_base=int8", "critic.ppo_epochs=1"])
    rec = json.loads(out.read_text())
    assert rc == 0 and rec["phase"] == "done", rec.get("traceback")
    assert rec["finite_losses"] and rec["lora_rank"] == 16 and rec["quantize_base"] == "int8" and rec["critic"]
    assert rec["s_per_step"] > 0 and rec["model_flops_per_step"] == step_model_flops(
        SHAPES["tiny"], prompt_len=16, response_len=16, actor_sequences=8, critic_sequences=8, lora_rank=16,
        lora_targets=("q", "k", "v", "o", "gate", "up", "down"))
    assert rec["plan_total_bytes"] > 0 and "actor/pg_loss" in rec["metrics"]
    assert table([("cpu", rec)]).count("\n") == 2
