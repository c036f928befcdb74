"""Pluggable policy losses (``actor.policy_loss``), pure functions like the other registries.

One of the registries of ``jaxppo.registry`` (its table lists the others). A policy loss has one signature::

    loss_fn(logp, old_logp, advantages, mask, hp: ActorHP, weights) -> (loss, metrics)

with ``logp`` the current policy's response log-probs ``[B,R]``, ``old_logp`` the proximal (PPO "old") ones,
``weights`` the detached per-token loss weights ``[B,R]`` (PER × count × importance); ``metrics`` must hold
``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` (0-d), and may hold ``pg_zero_grad_frac`` (the share of
masked tokens whose loss term has no gradient; logged as ``waste/zero_grad_token_frac``). Register with::

    @POLICY_LOSSES.register("my_loss")
    def my_loss(logp, old_logp, advantages, mask, hp, weights): ...

``"ppo"``: ``ops.policy_loss`` (clipped surrogate ``max(−A·r, −A·clip(r, 1−ε_lo, 1+ε_hi))``, dual clip
``min(·, −A·c)`` for ``A < 0``, aggregated by ``hp.agg``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from jaxppo import ops
from jaxppo.registry import Registry

PolicyLossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]

#: name -> policy loss (see the module docstring); ``@POLICY_LOSSES.register(name)`` adds one
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


@POLICY_LOSSES.register("ppo")
def ppo_loss(logp, old_logp, advantages, mask, hp, weights):
    return ops.policy_loss(logp, old_logp, advantages, mask, clip_low=hp.clip_low, clip_high=hp.clip_high,
                           clip_c=hp.clip_c, agg=hp.agg, weights=weights)
