#!/usr/bin/env bash
# The 24 GB QLoRA example on a GPU (issue 18): one run of configs/examples/qwen2_5_7b_qlora_24gb.yaml on JAX's
# allocator capped at 24e9 bytes, with the optimized HLO and buffer assignment of the behaviour (reference log-prob)
# pass dumped and summarised (its largest buffers, any float32 instruction over 5e8 values):
#   OUT=/tmp/out bash benchmarks/device_qlora.sh [extra overrides via ARGS=...]
# results/device/run4_qwen7b_qlora_24gb.json and its _hlo.txt came from this script when the example still had
# data.behaviour_batch_size 32; run5_..._behaviour8.json is the same device_step run with data.behaviour_batch_size=8.
# A variant with jax.lax.optimization_barrier between each layer's sliced NF4 codes and their dequantization was run
# the same day and failed the same way (the barrier was not the issue; it is not in jaxppo).
set -u
OUT=${OUT:-results/device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
START=$(date +%s)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1)"
python3 -m pip list 2>/dev/null | grep -E "^(jax|jaxlib|flax|optax) " | tr -s ' '
ARGS=${ARGS:-"--config configs/examples/qwen2_5_7b_qlora_24gb.yaml --shape qwen2.5-7b --hbm-gb 24 --steps 2 --rows 32
      actor.ppo_mini_batch_size=16"}
HLO=/tmp/hlo; rm -rf $HLO
echo "== $(date -u +%T) the example, HLO of the behaviour pass dumped"
XLA_FLAGS="--xla_dump_to=$HLO --xla_dump_hlo_module_re=.*continuation_logprobs.* --xla_dump_hlo_as_text" \
  timeout 260 python3 benchmarks/device_step.py --json "$OUT/qlora_a.json" $ARGS > "$OUT/qlora_a.log" 2>&1
echo "   rc=$? ($(( $(date +%s) - START ))s)"; grep -v "^\s*$" "$OUT/qlora_a.log" | grep -v "^[WE]1\|allocation summary\|fragmentation" | tail -6
ls $HLO 2>/dev/null | head -20
# the largest buffers of each after-optimizations program, and the f32 instructions with more than 1e9 elements
python3 - <<'PY' > "$OUT/qlora_hlo_summary.txt" 2>&1
import glob, re
for f in sorted(glob.glob("/tmp/hlo/*buffer-assignment.txt")):
    txt = open(f).read()
    print("==", f.split("/")[-1], len(txt))
    m = re.search(r"Total bytes used: .*", txt); print(m.group(0) if m else "no total")
    sizes = sorted(((int(s), l.strip()[:300]) for l in txt.splitlines()
                    for s in re.findall(r"allocation \d+: size (\d+)", l)), reverse=True)[:8]
    for s, l in sizes: print(f"{s/2**30:8.2f} GiB  {l}")
for f in sorted(glob.glob("/tmp/hlo/*after_optimizations.txt")):
    print("==", f.split("/")[-1])
    for l in open(f):
        for shp in re.findall(r"f32\[([0-9,]+)\]", l.split("=")[0] if "=" in l else ""):
            n = 1
            for d in shp.split(","): n *= int(d)
            if n > 5e8: print(l.strip()[:400]); break
PY
head -c 6000 "$OUT/qlora_hlo_summary.txt"
O=$(realpath "$OUT"); (cd /tmp && tar -czf "$O/qlora_hlo.tgz" hlo/*continuation_logprobs*after_optimizations* 2>/dev/null); ls -la "$OUT/qlora_hlo.tgz"
grep -q '"phase": "done"' "$OUT/qlora_a.json" 2>/dev/null && echo "== ran to the end" || echo "== did not finish"
