"""Pure RL maths for PPO on ``[B, T]`` arrays with a ``mask`` (1 on response tokens); verl numerics.

Every function is jittable; docstrings give the formulas. Modules: ``advantages`` (GAE), ``masked`` (masked reductions, whitening),
``logits`` (entropy, log-probs), ``kl`` (estimators, the adaptive KL coefficient), ``losses`` (aggregation, policy and value
losses), ``importance`` (behaviour importance weights), ``group_advantages`` (critic-free estimators and the
``ADVANTAGE_ESTIMATORS`` registry), ``priorities`` (replay priorities, the ``PRIORITIES`` registry), ``rollout_correction``
(verl's rollout IS weights, rejection masks, off-policy diagnostics), ``dpo`` (DPO-family losses), ``kto`` (KTO on unpaired feedback), ``constants``
(``LOG_RATIO_CLAMP``, shared by ``kl``, ``losses`` and ``importance``; not exported, like the other
constants).
"""

from jaxppo.ops.advantages import gae
from jaxppo.ops.dpo import dpo_loss, rpo_nll
from jaxppo.ops.kto import kto_loss, kto_mismatched_order, kto_pair_loss, kto_reference_point
from jaxppo.ops.group_advantages import (ADVANTAGE_ESTIMATORS, AdvantageEstimator, AdvantageHParams, grpo_advantages,
                                         reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages)
from jaxppo.ops.importance import importance_weights
from jaxppo.ops.kl import adaptive_kl_update, kl_penalty
from jaxppo.ops.logits import entropy_from_logits, logprobs_from_logits
from jaxppo.ops.losses import aggregate, policy_loss, value_loss
from jaxppo.ops.masked import masked_mean, masked_whiten
from jaxppo.ops.priorities import PRIORITIES, Priority, priority_abs_advantage, priority_group_variance, priority_td_error
from jaxppo.ops.rollout_correction import offpolicy_metrics, rejection_mask, rollout_correction_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageHParams",
    "PRIORITIES",
    "Priority",
    "adaptive_kl_update",
    "aggregate",
    "dpo_loss",
    "entropy_from_logits",
    "gae",
    "grpo_advantages",
    "importance_weights",
    "kl_penalty",
    "kto_loss",
    "kto_mismatched_order",
    "kto_pair_loss",
    "kto_reference_point",
    "logprobs_from_logits",
    "masked_mean",
    "masked_whiten",
    "offpolicy_metrics",
    "policy_loss",
    "priority_abs_advantage",
    "priority_group_variance",
    "priority_td_error",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rejection_mask",
    "rloo_advantages",
    "rollout_correction_weights",
    "rpo_nll",
    "value_loss",
]
