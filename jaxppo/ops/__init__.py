"""Pure RL maths for PPO on ``[B, T]`` arrays with a ``mask`` (1 on response tokens); verl numerics.

Public API (DESIGN.md section 4) plus the KL-coefficient controllers. Every function is jittable;
docstrings give the formulas. Modules: ``advantages`` (GAE), ``masked`` (masked reductions, whitening),
``logits`` (entropy, log-probs), ``kl`` (estimators, controllers), ``losses`` (aggregation, policy and value
losses), ``importance`` (behaviour importance weights).
"""

from jaxppo.ops.advantages import gae
from jaxppo.ops.importance import importance_weights
from jaxppo.ops.kl import (AdaptiveKLController, FixedKLController, adaptive_kl_update, kl_penalty,
                           make_kl_controller, update_kl_controller)
from jaxppo.ops.logits import entropy_from_logits, logprobs_from_logits
from jaxppo.ops.losses import aggregate, policy_loss, value_loss
from jaxppo.ops.masked import masked_mean, masked_whiten

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "adaptive_kl_update",
    "aggregate",
    "entropy_from_logits",
    "gae",
    "importance_weights",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "update_kl_controller",
    "value_loss",
]
