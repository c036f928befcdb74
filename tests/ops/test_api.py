"""The public surface of jaxppo.ops: the PPO maths, the critic-free estimators and
their registry, replay priorities, verl's rollout correction and the DPO family."""

import jaxppo.ops as ops

DESIGN_NAMES = {"gae", "masked_mean", "masked_whiten", "entropy_from_logits", "logprobs_from_logits", "kl_penalty",
                "aggregate", "policy_loss", "value_loss", "importance_weights", "adaptive_kl_update"}
ESTIMATORS = {"grpo_advantages", "rloo_advantages", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages"}
PRIORITIES = {"priority_abs_advantage", "priority_group_variance", "priority_td_error"}
ROLLOUT_CORRECTION = {"rollout_correction_weights", "rejection_mask", "offpolicy_metrics"}
DPO = {"dpo_loss", "rpo_nll", "kto_loss", "kto_mismatched_order", "kto_pair_loss",
       "kto_reference_point"}
# registries and records (not functions)
DATA = {"ADVANTAGE_ESTIMATORS", "AdvantageEstimator", "AdvantageHParams", "PRIORITIES", "Priority"}


def test_exports_exactly_the_public_api():
    assert set(ops.__all__) == DESIGN_NAMES | ESTIMATORS | PRIORITIES | ROLLOUT_CORRECTION | DPO | DATA
    for name in set(ops.__all__) - DATA:
        assert callable(getattr(ops, name)), name
        assert getattr(ops, name).__doc__, f"{name} has no docstring"


def test_the_unused_kl_controller_pytrees_are_gone():
    """The trainer keeps the KL coefficient in TrainState.kl_coef and updates it with adaptive_kl_update."""
    for name in ("FixedKLController", "AdaptiveKLController", "make_kl_controller", "update_kl_controller"):
        assert not hasattr(ops, name), name


def test_registries_name_the_documented_entries():
    assert set(ops.ADVANTAGE_ESTIMATORS) >= {"gae", "grpo", "rloo", "reinforce_plus_plus",
                                             "reinforce_plus_plus_baseline"}
    assert set(ops.PRIORITIES) >= {"td_error", "abs_advantage", "group_variance"}
