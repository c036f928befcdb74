"""Registry names in a config are checked once, by jaxppo.config_names, against the registries (not a list in the
schema): any registered name is accepted, an unknown one is a ConfigError naming the key and the known names, and
the commands run the check before loading any model."""

from __future__ import annotations

import numpy as np
import pytest

from jaxppo.config import ConfigError, load_config
from jaxppo.config_names import NAMED_KEYS, allowed_names, check_config_names
from jaxppo.rewards import REWARDS, reward_fn_from_config


def test_builtin_names_are_the_registries():
    assert allowed_names("algorithm.adv_estimator") == ("gae", "grpo", "reinforce_plus_plus",
                                                        "reinforce_plus_plus_baseline", "rloo")
    assert allowed_names("replay.priority") == ("abs_advantage", "group_variance", "td_error")
    assert allowed_names("actor.policy_loss") == ("ppo",)
    assert allowed_names("pf_ppo.filter") == ("best_of_n", "best_random", "best_worst", "dynamic_sampling", "none",
                                              "pow")
    assert allowed_names("pf_ppo.reweight_method") == ("max_min", "max_random", "none", "pow")
    assert allowed_names("reward.kind") == ("format", "length", "model", "vader")
    check_config_names(load_config(None))       # the defaults are registered names


@pytest.mark.parametrize("key", sorted(NAMED_KEYS))
def test_unknown_name_is_one_config_error_listing_the_known(key):
    cfg = load_config(None, [f"{key}=nope"])    # loading alone does not check registry names
    with pytest.raises(ConfigError, match=rf"^{key}: unknown .* 'nope'; known: {', '.join(allowed_names(key))} "):
        check_config_names(cfg)


def test_a_registered_reward_is_selectable_and_built_from_the_config():
    with pytest.raises(ConfigError, match=r"reward.kind: unknown reward 'exclaim'; known: format, length, model, "
                                          r"vader"):
        check_config_names(load_config(None, ["reward.kind=exclaim"]))

    @REWARDS.register("exclaim")
    def exclaim():
        return lambda prompts, responses: np.array([r.count("!") for r in responses], np.float32)

    try:
        cfg = load_config(None, ["reward.kind=exclaim"])
        check_config_names(cfg)
        np.testing.assert_array_equal(reward_fn_from_config(cfg.reward)(["p", "q"], ["a!!", "b"]), [2.0, 0.0])
    finally:
        REWARDS.unregister("exclaim")
    assert "exclaim" not in REWARDS


def test_commands_check_names_before_loading_a_model(tmp_path, capsys):
    """``model.path`` does not exist: the name error comes first, as a config error (exit 2)."""
    from jaxppo.cli.util import parse_args_and_config

    with pytest.raises(SystemExit) as e:
        parse_args_and_config("prog", "d", [f"model.path={tmp_path / 'missing'}", "actor.policy_loss=nope"])
    assert e.value.code == 2
    assert "config error: actor.policy_loss: unknown policy loss 'nope'; known: ppo" in capsys.readouterr().err


def test_the_schema_does_not_import_the_registries_of_upper_layers():
    """config validation imports neither rewards nor the trainer (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys; from jaxppo.config import load_config; load_config(None, ['reward.kind=anything']); "
            "print(sorted(m for m in sys.modules if m.startswith(('jaxppo.rewards', 'jaxppo.trainer'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
