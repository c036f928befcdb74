"""The public surface of jaxppo.ops is exactly DESIGN.md section 4 plus the KL controllers."""

import jaxppo.ops as ops

DESIGN_NAMES = {"gae", "masked_mean", "masked_whiten", "entropy_from_logits", "logprobs_from_logits", "kl_penalty",
                "aggregate", "policy_loss", "value_loss", "importance_weights", "adaptive_kl_update"}
CONTROLLERS = {"FixedKLController", "AdaptiveKLController", "make_kl_controller", "update_kl_controller"}


def test_exports_exactly_the_design_api():
    assert set(ops.__all__) == DESIGN_NAMES | CONTROLLERS
    for name in ops.__all__:
        assert callable(getattr(ops, name)), name
        assert getattr(ops, name).__doc__, f"{name} has no docstring"
