"""Reward registry ``REWARDS`` (``reward.kind``): ``reward_fn_from_config(cfg.reward)`` and ``get_reward_fn(name,
**kw)`` return ``fn(prompts, responses) -> np.ndarray float32 [N]``.

An entry is a factory ``factory(**options) -> reward fn``; ``options`` of the decorator maps the factory's keyword
arguments to the fields of the ``reward`` config section that :func:`reward_fn_from_config` passes::

    @REWARDS.register("length", options={"target_length": "target_length"})
    def _length(target_length=32): ...

Built in: ``"vader"``, ``"length"`` (``reward.target_length``), ``"format"`` (``reward.format_pattern``) and
``"model"`` (``reward.model_path``: a reward-model directory written by ``python -m jaxppo.reward train``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxppo.registry import Registry
from jaxppo.rewards.functions import format_reward, length_reward, vader_reward

RewardFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class RewardEntry:
    """A registered reward: ``factory(**kw) -> reward fn`` and ``options`` (factory keyword -> ``reward.<field>``)."""

    name: str
    factory: Callable[..., RewardFn]
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def build(self, **kw: Any) -> RewardFn:
        """The reward function configured with ``kw`` (bad options: ``ValueError`` naming them)."""
        try:
            return self.factory(**kw)
        except TypeError as e:
            raise ValueError(f"reward {self.name!r}: bad options {sorted(kw)}: {e}") from None


def _entry(name: str, factory: Callable[..., RewardFn], *, options: Mapping[str, str] | None = None) -> RewardEntry:
    return RewardEntry(name, factory, dict(options or {}))


#: name -> :class:`RewardEntry`; ``@REWARDS.register(name, options={...})`` on a factory adds one
REWARDS: Registry[RewardEntry] = Registry("reward", wrap=_entry)


@REWARDS.register("vader")
def _vader() -> RewardFn:
    return vader_reward


@REWARDS.register("length", options={"target_length": "target_length"})
def _length(target_length: int = 32) -> RewardFn:
    return functools.partial(length_reward, target_length=target_length)


@REWARDS.register("format", options={"pattern": "format_pattern"})
def _format(pattern: str = r"[A-Z].*[.!?]") -> RewardFn:
    return functools.partial(format_reward, pattern=pattern)


@REWARDS.register("model", options={"path": "model_path"})
def _model(*, path: str | None = None, **kw: Any) -> RewardFn:
    if not path:
        raise ValueError("reward 'model' needs path= (reward.model_path): a directory written by "
                         "`python -m jaxppo.reward train`")
    from jaxppo.rewards.model_io import load_reward_scorer

    return load_reward_scorer(path, **kw)


def get_reward_fn(name: str, **kw: Any) -> RewardFn:
    """The reward function registered as ``name``, configured with ``kw``."""
    return REWARDS.get(name).build(**kw)


def reward_fn_from_config(reward_cfg: Any) -> RewardFn:
    """Reward function of a ``reward`` config section: ``reward.kind`` with the entry's options read from it."""
    entry = REWARDS.get(reward_cfg.kind)
    return entry.build(**{kw: getattr(reward_cfg, key) for kw, key in entry.options.items()})
