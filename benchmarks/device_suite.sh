#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md ("On a GPU"), one process per configuration, inside one time budget:
#
#   OUT=results/device BUDGET_S=540 [SUITE="attention memory"] bash benchmarks/device_suite.sh
#
# SUITE lists the sets to run, in order (default "attention"):
#   attention  the attention kernels against the reference einsum at the 1.5B head layout (benchmarks/attention.py:
#              time and largest difference, $OUT/attention_<shape>.json), then the 1.5B full-weight bf16 GRPO step
#              and the 7B LoRA step (80 GB example) with model.attention=cudnn against model.attention=reference (the
#              einsum every earlier device record ran), with data.packing=true as well where the schema has that
#              key; tokens/s and MFU in $OUT/<name>.json; last the kernels at the 7B head layout
#   memory     the earlier set: the 24 GB QLoRA example, 1.5B GRPO float32 vs bf16 compute, the 80 GB LoRA example
#              (model.attention as configured: auto, i.e. cudnn for bf16 compute on a GPU)
#
# Runs from the repository root with PYTHONPATH=$PWD. If the machine's flax/optax/chex do not import jaxppo, it
# retries with the wheels in .whl/ (flax 0.12.8, optax 0.2.8, chex 0.1.92: `pip download --no-deps` of the versions
# jaxppo is tested with) installed to /tmp/site. Each configuration writes $OUT/<name>.json (benchmarks/device_step.py)
# and is skipped when less than its own limit is left of BUDGET_S.
set -u
OUT=${OUT:-results/device}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
python3 -m pip list 2>/dev/null | grep -E "^(jax|jaxlib|flax|optax|chex|orbax-checkpoint|numpy) " | tr -s ' '
smoke() { timeout 120 python3 benchmarks/device_step.py --config configs/smoke.yaml --shape tiny --steps 1 \
            --json "$OUT/tiny.json" > "$OUT/tiny.log" 2>&1; }
if [ -n "${SKIP_SMOKE:-}" ]; then echo "== SKIP_SMOKE: no tiny run first"
elif ! smoke; then
  echo "== the machine's packages failed the tiny run (tail below); retrying with .whl/"
  tail -5 "$OUT/tiny.log"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
  smoke || { echo "== tiny run failed again"; tail -30 "$OUT/tiny.log"; exit 1; }
fi
[ -f "$OUT/tiny.log" ] && tail -3 "$OUT/tiny.log"

# name | own limit (s) | device_step arguments
run() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if (( l < limit )); then echo "== skip $name: ${l}s left < ${limit}s"; return; fi
  echo "== $(date -u +%T) $name"
  timeout "$limit" python3 benchmarks/device_step.py --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "   rc=$? ($(( $(date +%s) - START ))s)"; grep -v "^\s*$" "$OUT/$name.log" | tail -4
}
RL="data.max_prompt_length=512 data.max_response_length=512"
# device_step options first, then overrides (more overrides may follow, options may not)
GRPO="--config configs/smoke.yaml --shape qwen2.5-1.5b --steps 3 $RL algorithm.adv_estimator=grpo
      actor.ppo_mini_batch_size=16 actor.ppo_micro_batch_size=4"
LORA7="--config configs/examples/qwen2_5_7b_lora_80gb.yaml --shape qwen2.5-7b --hbm-gb 80 --steps 2 --rows 32
       --matmul actor.ppo_mini_batch_size=16"

kernels() {  # shape: benchmarks/attention.py at that head layout, bf16, 4 rows of 1024 and 2048 slots
  local l; l=$(left)
  if (( l < 90 )); then echo "== skip attention kernels $1: ${l}s left"; return; fi
  echo "== $(date -u +%T) attention kernels $1"
  timeout 90 python3 benchmarks/attention.py --shape "$1" --batch 4 --seq 1024,2048 --dtypes bfloat16 \
    --rounds 3 --out "$OUT/attention_$1.json" > "$OUT/attention_$1.log" 2>&1
  echo "   rc=$?"; grep -v "^\s*$" "$OUT/attention_$1.log" | tail -8
}

attention_suite() {
  kernels qwen2.5-1.5b
  # the fused kernel first: if the budget runs out, the baseline is the earlier records' (results/device/)
  # shellcheck disable=SC2086
  run qwen1p5b_grpo_bf16_cudnn 120 $GRPO model.compute_dtype=bfloat16 model.attention=cudnn
  # shellcheck disable=SC2086
  run qwen1p5b_grpo_bf16_reference 120 $GRPO model.compute_dtype=bfloat16 model.attention=reference
  # shellcheck disable=SC2086
  run qwen7b_lora_80gb_cudnn 200 $LORA7 model.attention=cudnn
  # shellcheck disable=SC2086
  run qwen7b_lora_80gb_reference 200 $LORA7 model.attention=reference
  if python3 -c "import dataclasses, sys; from jaxppo.config.schema import DataConfig
sys.exit(0 if 'packing' in {f.name for f in dataclasses.fields(DataConfig)} else 1)" 2>/dev/null; then
    # shellcheck disable=SC2086
    run qwen1p5b_grpo_bf16_cudnn_packed 120 $GRPO model.compute_dtype=bfloat16 model.attention=cudnn data.packing=true
    # shellcheck disable=SC2086
    run qwen7b_lora_80gb_cudnn_packed 200 $LORA7 model.attention=cudnn data.packing=true
  else
    echo "== no data.packing key in this checkout: packed runs skipped"
  fi
  kernels qwen2.5-7b
}

memory_suite() {
  # the 24 GB example: Qwen2.5-7B, LoRA rank 16 on an NF4 base, GAE critic on the same base, on an allocator capped
  # at 24e9 bytes (minibatch 16 instead of 64: the same micro-batch 1, so the same memory)
  run qwen7b_qlora_24gb 200 --config configs/examples/qwen2_5_7b_qlora_24gb.yaml --shape qwen2.5-7b --hbm-gb 24 \
      --steps 2 --rows 32 actor.ppo_mini_batch_size=16
  # Qwen2.5-1.5B, full weights (float32 parameters), GRPO: float32 compute vs bf16 compute (model.compute_dtype)
  # shellcheck disable=SC2086
  run qwen1p5b_grpo_f32 120 $GRPO
  # shellcheck disable=SC2086
  run qwen1p5b_grpo_bf16 120 $GRPO model.compute_dtype=bfloat16
  # the 80 GB example: Qwen2.5-7B, LoRA rank 16 on a bf16 base, on an allocator capped at 80e9 bytes
  # shellcheck disable=SC2086
  run qwen7b_lora_80gb 200 $LORA7
}

for suite in ${SUITE:-attention}; do
  case $suite in
    attention) attention_suite ;;
    memory) memory_suite ;;
    *) echo "== unknown suite $suite (attention, memory)" ;;
  esac
done
echo "== done in $(( $(date +%s) - START ))s"
