"""Pluggable policy losses (``actor.policy_loss``), pure functions like the other registries.

The trainer's other registries live in ``jaxppo.ops``: advantage estimators (``ops.ADVANTAGE_ESTIMATORS``,
``ops.register_advantage_estimator``) and replay priorities (``ops.PRIORITY_FNS``). A policy loss has one
signature::

    loss_fn(logp, old_logp, advantages, mask, hp: ActorHP, weights) -> (loss, metrics)

with ``logp`` the current policy's response log-probs ``[B,R]``, ``old_logp`` the proximal (PPO "old") ones,
``weights`` the detached per-token loss weights ``[B,R]`` (PER × count × importance); ``metrics`` must hold
``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (0-d). Register with::

    @register_policy_loss("my_loss")
    def my_loss(logp, old_logp, advantages, mask, hp, weights): ...

``"ppo"``: ``ops.policy_loss`` (clipped surrogate ``max(−A·r, −A·clip(r, 1−ε_lo, 1+ε_hi))``, dual clip
``min(·, −A·c)`` for ``A < 0``, aggregated by ``hp.agg``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from jaxppo import ops

PolicyLossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]

#: name -> policy loss (see the module docstring)
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn(logp, old_logp, advantages, mask, hp, weights)`` under ``name``."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLossFn:
    """The registered policy loss ``name`` (``ValueError`` listing the known names otherwise)."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; known: {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]


@register_policy_loss("ppo")
def ppo_loss(logp, old_logp, advantages, mask, hp, weights):
    return ops.policy_loss(logp, old_logp, advantages, mask, clip_low=hp.clip_low, clip_high=hp.clip_high,
                           clip_c=hp.clip_c, agg=hp.agg, weights=weights)
