"""Building a PPO run from a config: mesh, policy and critic, data, replay buffer, optimizers and the jitted
functions.

``build_run(cfg)`` returns a :class:`Run` whose ``state`` is the initial ``TrainState`` (placed on the mesh) and
whose ``prepare`` / ``step`` are the jitted prepare and update functions. The algorithm plug-in
(``jaxppo.trainer.ppo.algorithm``) drives it; tests use it directly. The policy comes from ``jaxppo.trainer.policy``
(full weights or adapters), the critic from ``jaxppo.trainer.ppo.critic``, the buffer windows from
``jaxppo.trainer.ppo.windows``; ``step_hparams(cfg)`` is worked out once, by :func:`check_config`, and handed to
every builder.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo import replay as replay_lib
from jaxppo.config import ConfigError
from jaxppo.optim import init_optimizer, lr_schedule, make_optimizer, replicate_leaves, shardings_of
from jaxppo.parallel import batch_divisor
from jaxppo.trainer.harness import check_rows
from jaxppo.trainer.micro import check_mesh
from jaxppo.trainer.policy import LoadedPolicy, Policy, PolicyRun, load_policy, split_policy
from jaxppo.data.split import split_data
from jaxppo.trainer.ppo.buffer_types import BufferItem, example_item, zero_prepared
from jaxppo.trainer.ppo.critic import build_critic
from jaxppo.trainer.ppo.hparams import StepHP, step_hparams
from jaxppo.trainer.ppo.prepare import make_prepare_fn, pf_filter
from jaxppo.trainer.ppo.state import TrainState
from jaxppo.trainer.ppo.steps import make_train_step
from jaxppo.trainer.ppo.windows import (
    buffer_layout,
    check_whole_groups,
    group_order,
    group_windows,
    make_replay,
    prompt_group_size,
    window_items,
    window_slots,
)

logger = logging.getLogger("jaxppo.trainer")


@dataclasses.dataclass
class Run(PolicyRun):
    cfg: Any
    mesh: Any
    rules: dict
    tokenizer: Any
    model_path: str
    parts: Policy                # the policy's graphdef, reference and (adapters) frozen base
    critic_gd: Any               # None without a critic (critic-free advantage estimator)
    state: TrainState
    prepare: Any                 # jitted state -> state
    step: Any                    # jitted state -> (state, metrics)
    train: dict[str, np.ndarray]  # training rows (+ ref_logp, filter_w)
    heldout: dict[str, np.ndarray]
    n_use: int                   # most dataset rows a buffer window holds (min(rows, replay.capacity))
    capacity: int                # buffer slots (n_use rounded up)
    report: Any = None           # the data report (rows seen, kept, skipped by reason)
    windows: list = dataclasses.field(default_factory=list)  # dataset rows of each buffer window (whole groups)
    pf_stats: dict = dataclasses.field(default_factory=dict)  # e.g. {"pf_ppo/dropped_groups": n}
    params_trainable: int = 0    # parameters that get gradients (actor + critic)
    params_total: int = 0        # all parameters (the base counted once)

    @property
    def tokens_per_step(self) -> int:
        return int(self.cfg.actor.ppo_mini_batch_size * (self.train["prompt_ids"].shape[1]
                                                         + self.train["response_ids"].shape[1]))

    def param_summary(self) -> dict[str, int]:
        return {"model/params_trainable": int(self.params_trainable), "model/params_total": int(self.params_total)}


def check_config(cfg: Any, n_devices: int) -> StepHP:
    """Cross-section checks that need the device count (ConfigError naming the key); returns the step's
    hyper-parameters (``step_hparams(cfg)``, which checks the estimator / priority / importance rules)."""
    a = cfg.actor
    check_mesh(cfg.mesh, n_devices, a.ppo_micro_batch_size or a.ppo_mini_batch_size,
               "actor.ppo_micro_batch_size (or ppo_mini_batch_size)")
    if cfg.pf_ppo.enabled and cfg.pf_ppo.filter == "none" and cfg.pf_ppo.reweight_method == "none":
        raise ConfigError("pf_ppo.enabled=true needs pf_ppo.filter or pf_ppo.reweight_method other than 'none'")
    if cfg.importance.lower is not None and cfg.importance.mode != "mask":
        raise ConfigError("importance.lower is only used with importance.mode=mask")
    hp = step_hparams(cfg)
    n, shards = cfg.replay.group_size, cfg.mesh.data * cfg.mesh.fsdp
    micro = a.ppo_micro_batch_size or a.ppo_mini_batch_size
    if n > 1 and (micro // shards) % n:
        raise ConfigError(f"replay.group_size={n}: each of the mesh's {shards} batch shards holds "
                          f"{micro // shards} rows of a micro-batch (actor.ppo_micro_batch_size / (mesh.data x "
                          f"mesh.fsdp)), which must be a multiple of the group size so no group is split")
    return hp


def ensure_data(cfg: Any) -> None:
    """With ``data.collect_if_missing`` and no file at ``data.path``: run ``jaxppo.collect`` to make it."""
    dc = cfg.data
    if dc.path is None:
        raise ConfigError("data.path is not set: give a scored dataset file (or set data.collect_if_missing=true "
                          "with a data.path to create)")
    p = Path(dc.path)
    if p.exists() or not dc.collect_if_missing:
        return
    from jaxppo.data.collection import collect
    from jaxppo.rewards import reward_fn_from_config

    fmt = {".parquet": "parquet", ".jsonl": "jsonl"}.get(p.suffix)
    if fmt is None or p.name not in ("data.parquet", "data.jsonl"):
        raise ConfigError(f"data.collect_if_missing: data.path must end in data.parquet or data.jsonl, got {p}")
    logger.info("data.path %s is missing: collecting it (jaxppo.data.collection)", p)
    ccfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(p.parent)),
                               rollout=dataclasses.replace(cfg.rollout, output_format=fmt))
    collect(ccfg, reward_fn_from_config(cfg.reward), progress=cfg.trainer.progress)


@dataclasses.dataclass
class Core:
    """The train state and the jitted functions built from (concrete or abstract) sharded parameters."""
    state: TrainState
    actor_tx: Any
    critic_tx: Any   # None without a critic
    prepare: Any   # jitted state -> state
    step: Any      # jitted state -> (state, metrics)


def build_core(cfg: Any, mesh, actor_gd, actor_params, critic_gd, critic_params, replay_state, *,
               chunk: int, hp: StepHP, base=None, prompt_group: int | None = None) -> Core:
    """Optimizers, the initial ``TrainState`` and the jitted prepare/step: ONE code path for ``build_run``
    (concrete arrays on ``mesh``) and ``jaxppo.plan`` (``ShapeDtypeStruct`` leaves carrying their shardings,
    nothing allocated). Optimizer states are sharded like their parameters (``init_optimizer``); the scalar
    fields are replicated. ``critic_params=None`` (critic-free estimator): no critic optimizer, ``critic`` and
    ``critic_opt`` None. ``base``: the frozen base of models with adapters (``actor_params`` / ``critic_params``
    are then only their trainable parts), an argument of the jitted functions (``jaxppo.trainer.with_base``).
    ``hp``: the config's ``step_hparams``. ``prompt_group``: rows per prompt in the buffer's layout
    (``windows.prompt_group_size``; default ``replay.group_size``), which the prepare pass runs each prompt once
    for."""
    from jax.sharding import NamedSharding, PartitionSpec

    if (critic_params is None) != (hp.critic is None):
        raise ValueError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} "
                         f"{'needs' if hp.critic is not None else 'takes no'} critic parameters")
    abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves((actor_params, critic_params)))
    rep = NamedSharding(mesh, PartitionSpec())
    total = cfg.trainer.total_steps
    actor_tx = make_optimizer(cfg.actor.optim, total, actor_params)   # 16-bit parameters: a float32 master copy
    critic_tx = None if critic_params is None else make_optimizer(cfg.critic.optim, total, critic_params)

    def scalar(fn):
        if abstract:
            out = jax.eval_shape(fn)
            return jax.ShapeDtypeStruct(out.shape, out.dtype, sharding=rep)
        return jax.device_put(fn(), rep)

    state = TrainState(
        step=scalar(lambda: jnp.zeros((), jnp.int32)),
        actor=actor_params, actor_opt=init_optimizer(actor_tx, actor_params, mesh),
        critic=critic_params,
        critic_opt=None if critic_tx is None else init_optimizer(critic_tx, critic_params, mesh), replay=replay_state,
        rng=scalar(lambda: jax.random.PRNGKey(cfg.trainer.seed)),
        kl_coef=scalar(lambda: jnp.float32(cfg.algorithm.kl_ctrl.kl_coef)),
        lr_scale=scalar(lambda: jnp.ones((), jnp.float32)), nan_total=scalar(lambda: jnp.zeros((), jnp.int32)),
        nan_streak=scalar(lambda: jnp.zeros((), jnp.int32)), data_cursor=scalar(lambda: jnp.zeros((), jnp.int32)))
    if not abstract:
        state = replicate_leaves(state, mesh)
    shardings = shardings_of(state)
    capacity = replay_state.capacity
    prepare = make_prepare_fn(actor_gd, critic_gd, chunk=min(chunk, capacity), state_shardings=shardings, hp=hp,
                              base=base, packed=bool(cfg.data.packing), group_size=prompt_group)
    step = make_train_step(hp, actor_gd, critic_gd, actor_tx, critic_tx, lr_schedule(cfg.actor.optim, total),
                           None if critic_tx is None else lr_schedule(cfg.critic.optim, total),
                           state_shardings=shardings, mesh=mesh, base=base, packed=bool(cfg.data.packing))
    return Core(state=state, actor_tx=actor_tx, critic_tx=critic_tx, prepare=prepare, step=step)


def build_run(cfg: Any, *, devices=None) -> Run:
    """Everything a run needs, from ``cfg`` (models loaded, data tokenized, buffer filled, jits built).

    The training rows are ordered so each prompt group is contiguous (``windows.group_order``) and cut into buffer
    windows of whole groups (``windows.group_windows``); with a critic-free estimator no critic is built."""
    devices = list(jax.devices() if devices is None else devices)
    hp = check_config(cfg, len(devices))
    ensure_data(cfg)
    loaded = load_policy(cfg, devices)
    train, heldout, report = split_data(cfg, loaded.tokenizer, reference_path=loaded.model_path,
                                        reference=loaded.model)
    return assemble_run(cfg, loaded, train, heldout, report, hp=hp)


def assemble_run(cfg: Any, loaded: LoadedPolicy, train: dict[str, np.ndarray], heldout: dict[str, np.ndarray],
                 report, *, hp: StepHP) -> Run:
    """:func:`build_run` after its I/O: from the loaded (sharded) policy (``trainer.policy.load_policy``) — with its
    adapters attached (``models.adapters.with_adapters``) when ``model.lora`` asks for them — and the tokenized
    training / held-out rows to the run (reference log-probs, PF-PPO weights, the filled buffer, the policy split of
    ``trainer.policy.split_policy``, the critic, jitted prepare and step). ``hp``: the config's ``step_hparams``
    (:func:`check_config`). ``benchmarks/device_step.py`` calls it with random weights and synthetic
    rows: the same path as training."""
    from jaxppo.data import compute_behaviour_logprobs
    from jaxppo.models.lora import spec_from_config

    mesh, rules, actor_model = loaded.mesh, loaded.rules, loaded.model
    spec = spec_from_config(cfg.model.lora)
    if spec is not None and actor_model.config.lora is None:
        raise ValueError("assemble_run: model.lora.rank > 0 but the policy has no adapters; attach them first "
                         "(with_adapters), before any reference pass")
    n_rows = int(train["prompt_ids"].shape[0])
    check_rows(report, n_rows, int(heldout["prompt_ids"].shape[0]), min_train=cfg.actor.ppo_mini_batch_size,
               min_train_key="actor.ppo_mini_batch_size", eval_fraction=cfg.data.eval_fraction)
    if not np.isfinite(train["score"]).all():
        raise ValueError("data: non-finite scores in the training rows")
    order = group_order(train["group_id"])
    train = {k: np.asarray(v)[order] for k, v in train.items()}
    train["row"] = np.arange(n_rows, dtype=np.int32)
    if cfg.replay.group_size > 1:
        check_whole_groups(train, cfg.replay.group_size)
    train["ref_logp"] = compute_behaviour_logprobs(actor_model, train, batch_size=cfg.data.behaviour_batch_size,
                                                   packing=cfg.data.packing)
    train["filter_w"], pf_stats = pf_filter(hp.pf, train["score"], train["group_id"], cfg.trainer.seed)
    if hp.pf.filter == "dynamic_sampling":
        logger.info("pf_ppo.filter=dynamic_sampling: %d prompt groups dropped (all scores equal)",
                    pf_stats["pf_ppo/dropped_groups"])

    n_use, capacity, chunk = buffer_layout(cfg, n_rows, mesh)
    windows = group_windows(train["group_id"], n_use)
    rows, valid = window_slots(windows[0], capacity)
    p_len, r_len = train["prompt_ids"].shape[1], train["response_ids"].shape[1]
    with_critic = hp.critic is not None
    rs = make_replay(cfg, capacity, example_item(p_len, r_len, critic=with_critic), mesh)
    rs = replay_lib.add(rs, BufferItem(data=window_items(train, rows, valid),
                                       prepared=zero_prepared(capacity, r_len, critic=with_critic)))

    pol = split_policy(actor_model)
    critic_gd = critic_params = None
    if with_critic:
        critic_gd, critic_params = build_critic(cfg, actor_model, mesh=mesh, rules=rules)
    prompt_group = prompt_group_size(train, cfg.replay.group_size, chunk, batch_divisor(mesh))
    core = build_core(cfg, mesh, pol.graphdef, pol.params, critic_gd, critic_params, rs, chunk=chunk, hp=hp,
                      base=pol.base, prompt_group=prompt_group)
    trainable = _n_params((pol.params, critic_params))
    total = trainable + _n_params(pol.base)
    if spec is not None:
        logger.info("LoRA rank %d on %s: %d trainable parameters of %d (%.3f%%); frozen base shared by the "
                    "reference%s", spec.rank, ",".join(spec.targets), trainable, total, 100.0 * trainable / total,
                    " and the critic" if with_critic and not cfg.critic.share_trunk else "")
    return Run(cfg=cfg, mesh=mesh, rules=rules, tokenizer=loaded.tokenizer, model_path=loaded.model_path, parts=pol,
               critic_gd=critic_gd, state=core.state, prepare=core.prepare, step=core.step, train=train,
               heldout=heldout, n_use=n_use, capacity=capacity, report=report, windows=windows, pf_stats=pf_stats,
               params_trainable=trainable, params_total=total)


def _n_params(tree) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


__all__ = ["Core", "Run", "assemble_run", "build_core", "build_run", "check_config", "ensure_data"]
