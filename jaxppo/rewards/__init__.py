"""Rewards: a registry of rule-based reward functions and a Bradley-Terry reward model.

``get_reward_fn(name, **kw)`` returns ``fn(prompts, responses) -> np.ndarray float32 [N]`` for
``"vader"``, ``"length"``, ``"format"`` and ``"model"`` (``path=`` a trained reward-model folder).
"""

from jaxppo.rewards.functions import format_reward, length_reward, vader_reward
from jaxppo.rewards.registry import available_rewards, get_reward_fn, register_reward, reward_fn_from_config

__all__ = ["available_rewards", "format_reward", "get_reward_fn", "length_reward", "register_reward",
           "reward_fn_from_config", "vader_reward"]
