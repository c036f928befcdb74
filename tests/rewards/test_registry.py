import numpy as np
import pytest

from jaxppo.config.schema import RewardConfig
from jaxppo.rewards.registry import REWARDS, get_reward_fn, reward_fn_from_config


def test_builtin_names_and_options():
    assert {"vader", "length", "format", "model"} <= set(REWARDS.names())
    np.testing.assert_allclose(get_reward_fn("length", target_length=2)(["", ""], ["a b", "a"]), [0.0, -0.5])
    np.testing.assert_array_equal(get_reward_fn("format", pattern="x+")(["", ""], ["xx", "y"]), [1.0, 0.0])
    assert get_reward_fn("vader")(["p"], ["I love this wonderful gift!"])[0] > 0.5


def test_from_config():
    fn = reward_fn_from_config(RewardConfig(kind="length", target_length=3))
    np.testing.assert_allclose(fn([""], ["a b c"]), [0.0])
    fn = reward_fn_from_config(RewardConfig(kind="format", format_pattern="[a-z]+"))
    np.testing.assert_array_equal(fn(["", ""], ["abc", "Abc"]), [1.0, 0.0])
    with pytest.raises(ValueError, match="needs path="):
        reward_fn_from_config(RewardConfig(kind="model"))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown reward 'sentiment'; known: .*vader"):
        get_reward_fn("sentiment")
    with pytest.raises(ValueError, match="reward 'vader': bad options"):
        get_reward_fn("vader", target_length=3)
    with pytest.raises(ValueError, match="needs path="):
        get_reward_fn("model")
    with pytest.raises(ValueError, match="already registered"):
        REWARDS.register("vader")(lambda: None)


def test_register_new_reward_with_a_config_option():
    @REWARDS.register("test_const", options={"value": "target_length"})
    def test_const(value=1.0):
        return lambda p, r: np.full(len(r), value, np.float32)

    try:
        np.testing.assert_array_equal(get_reward_fn("test_const", value=2.0)(["a"], ["b"]), [2.0])
        np.testing.assert_array_equal(reward_fn_from_config(RewardConfig(kind="test_const", target_length=5))(
            ["a"], ["b"]), [5.0])
    finally:
        REWARDS.unregister("test_const")
