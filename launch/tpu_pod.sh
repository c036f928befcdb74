#!/usr/bin/env bash
# A Cloud TPU pod slice (e.g. v5e-32: 8 hosts x 4 chips): the same command on every host, through
# launch/multihost.py (jax.distributed.initialize() discovers the pod by itself).
#
#   bash launch/tpu_pod.sh TPU_NAME ZONE configs/examples/tpu_v5e_32.yaml [dotted.key=value ...]
#
# Environment: REPO_DIR (checkout on the TPU VMs, default ~/jaxppo), SETUP=1 first copies this checkout
# to every host and installs it (pip install -e . "jax[tpu]"), PROJECT (gcloud project, optional).
# Model and data paths in the config are read on every host: put them on each host's disk (or a shared
# filesystem) at the same path. Logs and plots are written by process 0 only.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 TPU_NAME ZONE CONFIG.yaml [dotted.key=value ...]" >&2
  exit 2
fi
TPU=$1
ZONE=$2
CONFIG=$3
shift 3
REPO_DIR=${REPO_DIR:-'~/jaxppo'}
GCLOUD=(gcloud compute tpus tpu-vm)
PROJECT_ARGS=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_ARGS=(--project "$PROJECT"); fi
cd "$(dirname "$0")/.."

if [[ "${SETUP:-0}" == "1" ]]; then
  "${GCLOUD[@]}" ssh "$TPU" --worker=all --zone "$ZONE" "${PROJECT_ARGS[@]}" --command "mkdir -p $REPO_DIR"
  "${GCLOUD[@]}" scp --recurse --worker=all --zone "$ZONE" "${PROJECT_ARGS[@]}" \
    pyproject.toml jaxppo configs launch "$TPU:$REPO_DIR/"
  "${GCLOUD[@]}" ssh "$TPU" --worker=all --zone "$ZONE" "${PROJECT_ARGS[@]}" --command \
    "cd $REPO_DIR && pip install -U 'jax[tpu]' && pip install -e ."
fi

# quote the overrides for the remote shell
ARGS=$(printf ' %q' --config "$CONFIG" "$@")
"${GCLOUD[@]}" ssh "$TPU" --worker=all --zone "$ZONE" "${PROJECT_ARGS[@]}" --command \
  "cd $REPO_DIR && TOKENIZERS_PARALLELISM=false python launch/multihost.py$ARGS"
