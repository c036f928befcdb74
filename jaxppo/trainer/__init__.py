"""The trainers and the run harness they share.

``jaxppo.trainer`` (the harness): ``harness`` (the step loop, guards, perplexity checks, verified checkpoints with
the damaged-checkpoint fallback, rollback, NaN streaks, logging cadence), ``run_dir`` (run folder and resume),
``run_folder`` (the output folder's checks and its one-writer lock), ``preemption`` (save and exit on SIGTERM/SIGINT),
``checkpoint``, ``guards``, ``metrics_log`` / ``trackers`` / ``plots`` (logging), ``evaluation`` / ``policy_eval``
(held-out evaluation), ``micro`` (the strided micro-batch
split and the batch-axis constraint) and ``mesh`` (the run's device mesh from its config). The trainers plug
into it side by side and never import each other:
``jaxppo.trainer.ppo`` (offline PPO) and ``jaxppo.trainer.dpo`` (offline DPO).
"""
