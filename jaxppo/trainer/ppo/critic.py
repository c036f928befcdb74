"""The PPO critic built beside a policy (:mod:`jaxppo.trainer.policy`), real or abstract, full weights or adapters.

- full weights: a ``ValueModel`` with a copy of the policy's trunk and a fresh value head, or one loaded from
  ``critic.model_path`` (its own checkpoint); ``critic.share_trunk``: a bare value head reading the policy's hidden
  states;
- adapters: a ``ValueModel`` on the policy's frozen base with its own adapters and value head (only those are
  trainable), or with ``critic.share_trunk`` a bare value head; ``critic.model_path`` is refused.

The critic's parameters are placed on the mesh like the policy's; abstract ones are ``ShapeDtypeStruct`` leaves
carrying those shardings.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from jaxppo.config import ConfigError
from jaxppo.models.adapters import TRAINABLE, lora_critic
from jaxppo.optim import split_params
from jaxppo.hf.from_config import lm_config
from jaxppo.trainer.policy import is_abstract, with_shardings
from jaxppo.trainer.ppo.state import make_critic


def check_critic_vocab(critic_vocab: int, policy_vocab: int) -> None:
    """ConfigError when the critic checkpoint (``critic.model_path``) has a smaller vocabulary than the policy: the
    critic reads the policy's token ids, and an id past its embedding table would be clamped silently under jit.
    (A larger one is allowed: checkpoints pad their embedding tables; the tokenizer itself is not compared.)"""
    if critic_vocab < policy_vocab:
        raise ConfigError(f"critic.model_path: its vocabulary has {critic_vocab} tokens, fewer than model.path's "
                          f"{policy_vocab}; the critic reads the policy's token ids, so it needs the same tokenizer")


def build_critic(cfg: Any, actor: nnx.Module, *, mesh, rules: dict, critic_hf_config: dict | None = None
                 ) -> tuple[Any, Any]:
    """``(critic_gd, trainable)`` of the critic of ``cfg.critic`` beside the policy module ``actor`` (loaded, or
    abstract: then ``critic.model_path`` is read from ``critic_hf_config``, its ``config.json`` contents)."""
    from jaxppo.models import CausalLM, ScalarHead, ValueModel, named_shardings, shard_model

    abstract = is_abstract(nnx.state(actor))
    lm_cfg, seed, share = actor.config, cfg.trainer.seed, cfg.critic.share_trunk
    own_model = bool(cfg.critic.model_path) and not share
    if lm_cfg.lora is not None:
        if own_model:
            raise ConfigError("model.lora.rank > 0 with critic.model_path: the critic shares the policy's frozen base "
                              "(its own adapters and value head); set critic.model_path=null")
        if share:
            make = lambda: ScalarHead(lm_cfg.hidden_size, rngs=nnx.Rngs(seed),  # noqa: E731
                                      std=lm_cfg.initializer_range, dtype=lm_cfg.param_dtype)
            gd, params = split_params(nnx.eval_shape(make) if abstract else make())
        elif abstract:
            gd, params, _ = nnx.split(nnx.eval_shape(lambda: ValueModel(lm_cfg, rngs=nnx.Rngs(seed))), TRAINABLE, ...)
        else:
            gd, params = lora_critic(lm_cfg, seed=seed)
        if abstract:
            return gd, with_shardings(params, mesh, rules)
        return gd, jax.device_put(params, named_shardings(params, mesh, rules))
    if abstract:
        if own_model:
            if critic_hf_config is None:
                raise ConfigError("critic.model_path is set: the plan needs that model's config.json too")
            critic_lm_cfg = lm_config(critic_hf_config, cfg.model)
            check_critic_vocab(critic_lm_cfg.vocab_size, lm_cfg.vocab_size)
            make = lambda: ValueModel.from_lm(CausalLM(critic_lm_cfg, rngs=nnx.Rngs(0)),  # noqa: E731
                                              rngs=nnx.Rngs(seed))
        else:
            make = lambda: make_critic(CausalLM(lm_cfg, rngs=nnx.Rngs(0)), share_trunk=share, seed=seed)  # noqa: E731
        gd, params = split_params(nnx.eval_shape(make))
        return gd, with_shardings(params, mesh, rules)
    if own_model:
        from jaxppo.hf.paths import resolve_model_path
        from jaxppo.hf.from_config import load_model

        critic_lm = load_model(cfg.model, resolve_model_path(cfg.critic.model_path), mesh=mesh, rules=rules,
                               remat=cfg.model.remat)
        check_critic_vocab(critic_lm.config.vocab_size, lm_cfg.vocab_size)
        critic = ValueModel.from_lm(critic_lm, rngs=nnx.Rngs(seed))
    else:
        critic = make_critic(actor, share_trunk=share, seed=seed)
    shard_model(critic, mesh, rules)
    return split_params(critic)


__all__ = ["build_critic", "check_critic_vocab"]
