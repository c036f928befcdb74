#!/usr/bin/env bash
# Driver of the pre-registered sweeps (results/preregistered/): run it from anywhere, e.g. under nice -n 19.
# Resumable: finished runs are never re-run by jaxppo.sweep. The behaviour policy of the off-policy experiment is
# made as its pre-registration states, with its ESS/N manipulation check (each probe appended to
# runs/sweep_data/probes.jsonl).
set -u
cd "$(dirname "$0")/../.."
export JAX_PLATFORMS=cpu
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
sweep() { log "sweep $1"; python3 -m jaxppo.sweep --config configs/sweeps/$1.yaml; log "sweep $1 rc=$?"; }
sweep reuse_p1
sweep reuse_p16
# off-policy behaviour policy mu (pre-registered procedure, with the ESS/N manipulation check)
if [ ! -f runs/sweep_data/offpolicy/data.jsonl ]; then
  steps=40
  while :; do
    log "mu with $steps PPO steps"
    [ -f runs/sweep_data/offpolicy_mu_train/data.jsonl ] || python3 -m jaxppo.collect --config configs/smoke.yaml \
        reward.kind=length reward.target_length=8 rollout.output_format=jsonl \
        trainer.output_dir=runs/sweep_data/offpolicy_mu_train
    rm -rf runs/sweep_data/mu runs/sweep_data/offpolicy
    python3 -m jaxppo.train --config configs/smoke.yaml data.path=runs/sweep_data/offpolicy_mu_train/data.jsonl \
        data.collect_if_missing=false reward.kind=length reward.target_length=8 trainer.total_steps=$steps \
        trainer.output_dir=runs/sweep_data/mu trainer.progress=false
    python3 -m jaxppo.collect --config configs/smoke.yaml model.path=runs/sweep_data/mu/hf reward.kind=vader \
        rollout.output_format=jsonl trainer.output_dir=runs/sweep_data/offpolicy
    rm -rf runs/sweep_data/probe
    python3 -m jaxppo.train --config configs/smoke.yaml data.path=runs/sweep_data/offpolicy/data.jsonl \
        data.collect_if_missing=false importance.enabled=false replay.sampling=uniform trainer.total_steps=1 \
        trainer.eval_every=1 trainer.eval_prompts=1 trainer.log_every=1 trainer.save_hf=false trainer.progress=false \
        trainer.output_dir=runs/sweep_data/probe
    ess=$(python3 -c "
import json
for l in open('runs/sweep_data/probe/metrics.jsonl'):
    r = json.loads(l)
    if r.get('step') == 1 and 'is_diag/ess' in r: print(r['is_diag/ess'])")
    log "probe: mu of $steps steps, is_diag/ess at step 1 = $ess"
    echo "{\"mu_ppo_steps\": $steps, \"is_diag_ess_step1\": ${ess:-null}, \"date\": \"$(date -u +%FT%TZ)\"}" >> runs/sweep_data/probes.jsonl
    if python3 -c "import sys; sys.exit(0 if '$ess' and float('$ess') <= 0.8 else 1)"; then break; fi
    [ $steps -ge 160 ] && { log "manipulation check failed at 160 steps"; break; }
    steps=$((steps * 2))
  done
fi
sweep offpolicy_other
sweep reuse_p4
sweep noisy_sd0
sweep noisy_sd10
sweep noisy_sd05
log ALL DONE
