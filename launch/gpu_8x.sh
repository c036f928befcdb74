#!/usr/bin/env bash
# One host, 8 GPUs, one process: offline PPO with the mesh of the config (e.g. fsdp=8).
#
#   bash launch/gpu_8x.sh configs/examples/qwen2_5_7b_fsdp8.yaml [dotted.key=value ...]
#
# Environment: NUM_GPUS (default 8) is checked against nvidia-smi; XLA_PYTHON_CLIENT_MEM_FRACTION
# (default 0.92) is the share of each GPU's memory JAX may use. Several hosts: run
# launch/multihost.py on each host instead (see launch/README.md).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 CONFIG.yaml [dotted.key=value ...]" >&2
  exit 2
fi
CONFIG=$1
shift
cd "$(dirname "$0")/.."

NUM_GPUS=${NUM_GPUS:-8}
if command -v nvidia-smi >/dev/null 2>&1; then
  found=$(nvidia-smi -L | grep -c '^GPU' || true)
  if [[ "$found" -lt "$NUM_GPUS" ]]; then
    echo "$0: expected $NUM_GPUS GPUs, nvidia-smi lists $found" >&2
    exit 1
  fi
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((NUM_GPUS - 1)))}
else
  echo "$0: nvidia-smi not found; is this a GPU host with jax[cuda12] installed?" >&2
  exit 1
fi

export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
# overlap the FSDP all-gathers / reduce-scatters with compute
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export TOKENIZERS_PARALLELISM=false

# the mesh comes from the config (mesh.data x mesh.fsdp x mesh.tensor must equal NUM_GPUS)
exec python -m jaxppo.train --config "$CONFIG" "$@"
