"""A manual check, not collected by pytest: train variants other than the CI test's smoke default
(GRPO + PF-PPO + token IS + prioritized replay; GAE + verl rollout correction + uniform replay; RLOO + sequence IS;
LoRA rank 8 with and without adapter dropout; GRPO with whole prompt groups, replay.group_size=4) under 2 processes x
4 devices vs 1 process x 8, 6 steps each; prints the worst relative differences.

    python -m jaxppo.train --config configs/smoke.yaml     # once: it collects runs/smoke_data/data.jsonl
    python -m tests.multihost.check_train_variants [OUT_DIR [VARIANT ...]]     # from the repository root
"""
import json
import sys
from pathlib import Path

from tests.multihost import procs
from tests.xla_flags import xla_flags

REPO = procs.REPO
data = REPO / "runs/smoke_data/data.jsonl"
base = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/check_train_variants")
base.mkdir(parents=True, exist_ok=True)
VARIANTS = {
    "grpo_pf_tokenis_per": ["algorithm.adv_estimator=grpo", "pf_ppo.enabled=true", "pf_ppo.filter=best_worst",
                            "importance.enabled=true", "replay.sampling=prioritized"],
    "rloo_uniform_seqis": ["algorithm.adv_estimator=rloo", "replay.sampling=uniform", "importance.level=sequence"],
    "gae_rollout_correction": ["importance.enabled=false", "algorithm.rollout_correction.rollout_is=token",
                               "algorithm.rollout_correction.rollout_is_threshold=2.0", "replay.sampling=uniform"],
    "lora": ["model.lora.rank=8"],
    "lora_dropout": ["model.lora.rank=8", "model.lora.dropout=0.1"],
    # whole prompt groups: a 32-row micro-batch puts 4 rows (one group) on each of the 8 batch shards
    "grpo_whole_groups": ["algorithm.adv_estimator=grpo", "replay.group_size=4", "actor.ppo_micro_batch_size=32",
                          "replay.sampling=prioritized"],
}
# XLA:CPU flags a variant needs: with adapter dropout, XLA's default concurrency-optimized CPU scheduler let the 8
# simulated devices of one process (data=2 x fsdp=4) enter two collectives in different orders (an fsdp all-gather
# and a data all-reduce of the step: every device waiting, the 40 s rendezvous timeout aborts; 3 of 3 runs, and the
# 2-process run hung); without it the run completes (launch/README.md)
XLA_EXTRA = {"lora_dropout": "--xla_cpu_enable_concurrency_optimized_scheduler=false"}
if len(sys.argv) > 2:     # only the named variants
    unknown = [v for v in sys.argv[2:] if v not in VARIANTS]
    if unknown:
        sys.exit(f"check_train_variants: unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    VARIANTS = {k: VARIANTS[k] for k in sys.argv[2:]}
RTOL = 1e-4          # on the losses (ppo_kl is near 0: its relative difference is reported, not checked)
failed = []
for name, extra in VARIANTS.items():
    common = ["--config", str(REPO / "configs/smoke.yaml"), f"data.path={data}", "data.collect_if_missing=false",
              "trainer.total_steps=6", "trainer.save_every=3", "trainer.eval_every=null", "trainer.eval_prompts=8",
              "trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false", "mesh.data=2", "mesh.fsdp=4", *extra]
    one, two = base / f"{name}_one", base / f"{name}_two"
    flags = XLA_EXTRA.get(name)

    def xla(d, flags=flags):
        return {} if flags is None else {"XLA_FLAGS": f"{xla_flags(d)} {flags}"}
    p1 = procs.start([sys.executable, "-m", "jaxppo.train", *common, f"trainer.output_dir={one}"], n=1, devices=8,
                     logdir=base / f"{name}_logs1", env={"JAXPPO_DISTRIBUTED": "0", **xla(8)})
    r1 = procs.wait(p1, timeout=900)
    p2 = procs.start(procs.python(str(REPO / "launch/multihost.py"), *common, f"trainer.output_dir={two}"), n=2, devices=4,
                     logdir=base / f"{name}_logs2", env=xla(4))
    r2 = procs.wait(p2, timeout=900)
    ok = all(r.returncode == 0 for r in r1 + r2)
    print(name, "exit codes", [r.returncode for r in r1 + r2])
    if not ok:
        for r in r1 + r2:
            print(r.describe()[-2000:])
        failed.append(f"{name}: a process failed")
        continue
    m1, m2 = procs.metrics_by_step(one), procs.metrics_by_step(two)
    worst = {}
    for s in m1:
        for k in ("actor/pg_loss", "actor/ppo_kl", "is/ess", "pf_ppo/kept_fraction"):
            if k in m1[s] and k in m2[s]:
                worst[k] = max(worst.get(k, 0.0), procs.rel_diff(m1[s][k], m2[s][k]))
    s1, s2 = json.loads((one / "summary.json").read_text()), json.loads((two / "summary.json").read_text())
    print(name, "steps", sorted(m2), "worst rel", worst, "reward_after", s1.get("eval/reward_after"), s2.get("eval/reward_after"))
    if sorted(m1) != sorted(m2) or worst.get("actor/pg_loss", 1.0) > RTOL or \
            s1.get("eval/reward_after") != s2.get("eval/reward_after"):
        failed.append(f"{name}: 2 processes differ from 1 (steps, pg_loss beyond {RTOL} or the final reward)")
if failed:
    sys.exit("check_train_variants FAILED:\n" + "\n".join(failed))
print("check_train_variants: every variant matches")
