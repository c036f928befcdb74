#!/usr/bin/env bash
# Create one virtual environment per peer for benchmarks/peers.py, outside jaxppo's dependencies.
#
#   bash benchmarks/peers/setup.sh [tunix|trl|all]     (default: all)
#
# Where: $JAXPPO_PEERS_VENVS/<peer> when that variable is set, else benchmarks/peers/.venv-<peer>
# (git-ignored). benchmarks/peers.py looks in the same places (or takes --tunix-python / --trl-python).
# Every version the comparison depends on is pinned here and recorded by the drivers in every results/peers*.json record.
#   tunix: google-tunix 0.1.7 on jax/jaxlib 0.10.2 and flax 0.12.x (the JAX backend jaxppo uses; tunix
#          needs safetensors<0.8, the file format is the same)
#   trl:   trl 1.16.0 (+ peft 0.21.2 for the LoRA row) on torch 2.13.0 (CPU build: a bare `torch` would pull GBs of CUDA wheels)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
which_peers="${1:-all}"

venv_dir() {
  if [[ -n "${JAXPPO_PEERS_VENVS:-}" ]]; then echo "$JAXPPO_PEERS_VENVS/$1"; else echo "$here/.venv-$1"; fi
}

make_venv() {  # make_venv NAME PIP_ARGS...
  local name="$1"; shift
  local dir; dir="$(venv_dir "$name")"
  echo "== $name -> $dir"
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  "$dir/bin/python" -m pip install "$@"
  "$dir/bin/python" -m pip freeze > "$dir/freeze.txt"
  echo "== $name ready ($(wc -l < "$dir/freeze.txt") packages, list in $dir/freeze.txt)"
}

case "$which_peers" in
  tunix|all) make_venv tunix "google-tunix==0.1.7" "jax==0.10.2" "jaxlib==0.10.2" "flax>=0.12,<0.13" \
               "safetensors<0.8" "numpy" "psutil" ;;&
  trl|all) make_venv trl "torch==2.13.0" "trl==1.16.0" "transformers==5.25.0" "peft==0.21.2" "safetensors==0.8.0" \
             "numpy" "psutil" ;;
  tunix) ;;
  *) echo "usage: $0 [tunix|trl|all]" >&2; exit 2 ;;
esac
