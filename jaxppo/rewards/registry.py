"""Reward registry: ``get_reward_fn(name, **kw) -> fn(prompts, responses) -> np.ndarray float32 [N]``.

Built in: ``"vader"``, ``"length"`` (``target_length=``), ``"format"`` (``pattern=``) and
``"model"`` (``path=`` a reward-model directory written by ``python -m jaxppo.reward train``).
:func:`register_reward` adds more; :func:`reward_fn_from_config` builds one from ``cfg.reward``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from jaxppo.rewards.functions import format_reward, length_reward, vader_reward

RewardFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]


def _model_factory(*, path: str | None = None, **kw: Any) -> RewardFn:
    if not path:
        raise ValueError("reward 'model' needs path= (reward.model_path): a directory written by "
                         "`python -m jaxppo.reward train`")
    from jaxppo.rewards.model_io import load_reward_scorer

    return load_reward_scorer(path, **kw)


_FACTORIES: dict[str, Callable[..., RewardFn]] = {
    "vader": lambda: vader_reward,
    "length": lambda target_length=32: functools.partial(length_reward, target_length=target_length),
    "format": lambda pattern=r"[A-Z].*[.!?]": functools.partial(format_reward, pattern=pattern),
    "model": _model_factory,
}


def register_reward(name: str, factory: Callable[..., RewardFn]) -> None:
    """Register ``factory(**kw) -> reward fn`` under ``name`` (an existing name is an error)."""
    if name in _FACTORIES:
        raise ValueError(f"reward {name!r} is already registered")
    _FACTORIES[name] = factory


def available_rewards() -> list[str]:
    return sorted(_FACTORIES)


def get_reward_fn(name: str, **kw: Any) -> RewardFn:
    """The reward function registered as ``name``, configured with ``kw``."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown reward {name!r}; available: {', '.join(available_rewards())}")
    try:
        return _FACTORIES[name](**kw)
    except TypeError as e:
        raise ValueError(f"reward {name!r}: bad options {sorted(kw)}: {e}") from None


def reward_fn_from_config(reward_cfg: Any) -> RewardFn:
    """Reward function of a :class:`~jaxppo.config.schema.RewardConfig` (``reward.kind`` and options)."""
    kind = reward_cfg.kind
    if kind == "length":
        return get_reward_fn("length", target_length=reward_cfg.target_length)
    if kind == "format":
        return get_reward_fn("format", pattern=reward_cfg.format_pattern)
    if kind == "model":
        return get_reward_fn("model", path=reward_cfg.model_path)
    return get_reward_fn(kind)
