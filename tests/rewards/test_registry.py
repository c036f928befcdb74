import numpy as np
import pytest

from jaxppo.config.schema import RewardConfig
from jaxppo.rewards.registry import available_rewards, get_reward_fn, register_reward, reward_fn_from_config


def test_builtin_names_and_options():
    assert {"vader", "length", "format", "model"} <= set(available_rewards())
    np.testing.assert_allclose(get_reward_fn("length", target_length=2)(["", ""], ["a b", "a"]), [0.0, -0.5])
    np.testing.assert_array_equal(get_reward_fn("format", pattern="x+")(["", ""], ["xx", "y"]), [1.0, 0.0])
    assert get_reward_fn("vader")(["p"], ["I love this wonderful gift!"])[0] > 0.5


def test_from_config():
    fn = reward_fn_from_config(RewardConfig(kind="length", target_length=3))
    np.testing.assert_allclose(fn([""], ["a b c"]), [0.0])
    fn = reward_fn_from_config(RewardConfig(kind="format", format_pattern="[a-z]+"))
    np.testing.assert_array_equal(fn(["", ""], ["abc", "Abc"]), [1.0, 0.0])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown reward 'sentiment'; available: .*vader"):
        get_reward_fn("sentiment")
    with pytest.raises(ValueError, match="reward 'vader': bad options"):
        get_reward_fn("vader", target_length=3)
    with pytest.raises(ValueError, match="needs path="):
        get_reward_fn("model")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("vader", lambda: None)


def test_register_new_reward():
    register_reward("test_const", lambda value=1.0: (lambda p, r: np.full(len(r), value, np.float32)))
    np.testing.assert_array_equal(get_reward_fn("test_const", value=2.0)(["a"], ["b"]), [2.0])
