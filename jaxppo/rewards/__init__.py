"""Rewards: the reward registry ``REWARDS`` (rule-based functions and a Bradley-Terry reward model).

``get_reward_fn(name, **kw)`` returns ``fn(prompts, responses) -> np.ndarray float32 [N]`` for
``"vader"``, ``"length"``, ``"format"`` and ``"model"`` (``path=`` a trained reward-model folder).
"""

from jaxppo.rewards.functions import format_reward, length_reward, vader_reward
from jaxppo.rewards.registry import REWARDS, get_reward_fn, reward_fn_from_config

__all__ = ["REWARDS", "format_reward", "get_reward_fn", "length_reward", "reward_fn_from_config", "vader_reward"]
