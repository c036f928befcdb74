"""The run ``build_run`` would make, built abstractly for the memory plan (``jaxppo.plan``): models from
``config.json`` contents (no weights) with the same shardings, a buffer with the same storage shardings, and the
same ``build_core`` (optimizer states, jitted prepare and step). Every leaf is a ``ShapeDtypeStruct`` with a
sharding; nothing is allocated."""

from __future__ import annotations

from typing import Any

import jax

from jaxppo.hf.from_config import abstract_model
from jaxppo.trainer.policy import split_policy
from jaxppo.trainer.ppo.buffer_types import example_item
from jaxppo.trainer.ppo.build import build_core
from jaxppo.trainer.ppo.critic import build_critic
from jaxppo.trainer.ppo.hparams import StepHP, step_hparams
from jaxppo.trainer.ppo.windows import buffer_layout, make_replay


def abstract_replay(cfg: Any, mesh, capacity: int, example: Any):
    """``replay_lib.init(capacity, example, ...)`` as ``ShapeDtypeStruct`` leaves with the shardings the real
    buffer gets: the shapes from ``jax.eval_shape``, each leaf's sharding read off a tiny concrete buffer made by
    the same ``init`` on ``mesh`` (so every field, present or future, is sharded exactly as in a run)."""
    from jaxppo.parallel import batch_divisor

    def make(n, ex):
        return make_replay(cfg, n, ex, mesh)

    abstract = jax.eval_shape(lambda: make(capacity, example))
    tiny = make(batch_divisor(mesh), jax.tree.map(lambda v: jax.ShapeDtypeStruct((1,) * len(v.shape), v.dtype),
                                                  example))
    leaves, treedef = jax.tree.flatten(abstract)
    shardings = [x.sharding for x in jax.tree.leaves(tiny)]
    if len(shardings) != len(leaves):
        raise AssertionError("replay state structure depends on its capacity; cannot derive its shardings")
    return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                                        for a, s in zip(leaves, shardings)])


def abstract_core(cfg: Any, mesh, rules: dict, hf_config: dict, *, prompt_len: int, response_len: int,
                  n_rows: int | None = None, critic_hf_config: dict | None = None, hp: StepHP | None = None):
    """``(core, actor_gd, critic_gd, reference_weights)`` of the run ``build_run(cfg)`` would make, built abstractly
    (module doc): the policy of ``jaxppo.trainer.policy`` (``abstract_model``, ``split_policy``), the critic of
    ``critic.build_critic`` (``critic.model_path`` read from ``critic_hf_config``), a buffer of
    ``buffer_layout(cfg, n_rows or replay.capacity)`` slots. ``reference_weights``: what the reference holds beyond
    the train state (the copy of the parameters, or with adapters the frozen base). ``hp``: the config's
    ``step_hparams`` when the caller has them."""
    hp = step_hparams(cfg) if hp is None else hp
    actor = abstract_model(hf_config, cfg.model)
    pol = split_policy(actor, mesh=mesh, rules=rules)
    critic_gd = critic_params = None
    if hp.critic is not None:
        critic_gd, critic_params = build_critic(cfg, actor, mesh=mesh, rules=rules, critic_hf_config=critic_hf_config)
    _, capacity, chunk = buffer_layout(cfg, cfg.replay.capacity if n_rows is None else n_rows, mesh)
    rs = abstract_replay(cfg, mesh, capacity, example_item(prompt_len, response_len, critic=hp.critic is not None))
    core = build_core(cfg, mesh, pol.graphdef, pol.params, critic_gd, critic_params, rs, chunk=chunk, hp=hp,
                      base=pol.base)
    return core, pol.graphdef, critic_gd, pol.reference_weights


__all__ = ["abstract_core", "abstract_replay"]
