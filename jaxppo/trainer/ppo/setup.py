"""Building a run from a config: mesh, models, data, replay buffer, optimizers and the jitted functions.

``build_run(cfg)`` returns a :class:`Run` whose ``state`` is the initial ``TrainState`` (placed on the
mesh) and whose ``prepare`` / ``step`` are the jitted prepare and update functions. The loop
(``jaxppo.trainer.ppo.loop``) drives it; tests use it directly.
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
from flax import nnx

from jaxppo import replay as replay_lib
from jaxppo.config import ConfigError
from jaxppo.optim import (
    init_optimizer,
    make_optimizer,
    replicate_leaves,
    shardings_of,
    split_params,
)
from jaxppo.models.adapters import (
    TRAINABLE,
    lora_critic,
    merge_with_base,
    reference_adapters,
    split_frozen,
)
from jaxppo.models.heads import ValueModel
from jaxppo.models.lora import spec_from_config
from jaxppo.trainer.harness import check_rows
from jaxppo.trainer.micro import check_mesh
from jaxppo.trainer.policy_eval import split_data
from jaxppo.trainer.ppo.batch import (
    TRAJECTORY_DTYPES,
    BufferItem,
    Trajectories,
    example_item,
    trajectories_from_arrays,
    zero_prepared,
)
from jaxppo.trainer.ppo.hparams import step_hparams
from jaxppo.trainer.ppo.prepare import make_prepare_fn, pf_filter
from jaxppo.trainer.ppo.state import TrainState, make_critic
from jaxppo.trainer.ppo.steps import make_train_step

logger = logging.getLogger("jaxppo.trainer")


@dataclasses.dataclass
class Run:
    cfg: Any
    mesh: Any
    rules: dict
    tokenizer: Any
    model_path: str
    actor_gd: Any
    critic_gd: Any               # None without a critic (critic-free advantage estimator)
    ref_params: Any              # frozen initial policy (reference), for evaluation; adapters: all-zero factors
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
    base: Any = None             # adapters (model.lora.rank > 0): the frozen base every role shares
    params_trainable: int = 0    # parameters that get gradients (actor + critic)
    params_total: int = 0        # all parameters (the base counted once)

    @property
    def tokens_per_step(self) -> int:
        return int(self.cfg.actor.ppo_mini_batch_size * (self.train["prompt_ids"].shape[1]
                                                         + self.train["response_ids"].shape[1]))

    def policy(self, params=None) -> nnx.Module:
        return merge_with_base(self.actor_gd, self.state.actor if params is None else params, self.base)

    def reference(self) -> nnx.Module:
        """The frozen initial policy: with adapters the base with its adapters off (no copy of its weights)."""
        return merge_with_base(self.actor_gd, self.ref_params, self.base)

    def param_summary(self) -> dict[str, int]:
        return {"model/params_trainable": int(self.params_trainable), "model/params_total": int(self.params_total)}


def check_config(cfg: Any, n_devices: int) -> None:
    """Cross-section checks that need the device count; ConfigError naming the key."""
    a = cfg.actor
    check_mesh(cfg.mesh, n_devices, a.ppo_micro_batch_size or a.ppo_mini_batch_size,
               "actor.ppo_micro_batch_size (or ppo_mini_batch_size)")
    if cfg.pf_ppo.enabled and cfg.pf_ppo.filter == "none" and cfg.pf_ppo.reweight_method == "none":
        raise ConfigError("pf_ppo.enabled=true needs pf_ppo.filter or pf_ppo.reweight_method other than 'none'")
    if cfg.importance.lower is not None and cfg.importance.mode != "mask":
        raise ConfigError("importance.lower is only used with importance.mode=mask")
    step_hparams(cfg)    # estimator / priority / importance vs rollout_correction rules
    n, shards = cfg.replay.group_size, cfg.mesh.data * cfg.mesh.fsdp
    micro = a.ppo_micro_batch_size or a.ppo_mini_batch_size
    if n > 1 and (micro // shards) % n:
        raise ConfigError(f"replay.group_size={n}: each of the mesh's {shards} batch shards holds "
                          f"{micro // shards} rows of a micro-batch (actor.ppo_micro_batch_size / (mesh.data x "
                          f"mesh.fsdp)), which must be a multiple of the group size so no group is split")


def check_whole_groups(train: dict[str, np.ndarray], group_size: int) -> None:
    """``replay.group_size = n > 1``: every prompt group of the (group-ordered) training rows has exactly ``n`` rows
    and one prompt (the same ``prompt_ids`` and ``prompt_mask`` in each row); ``ValueError`` naming the first group
    that does not, and how many do not."""
    gid = np.asarray(train["group_id"])
    starts, sizes = group_runs(gid)
    bad = np.flatnonzero(sizes != group_size)
    if bad.size:
        g = int(gid[starts[bad[0]]])
        raise ValueError(f"replay.group_size={group_size}: {bad.size} of {len(starts)} prompt groups do not have "
                         f"{group_size} training rows (group_id {g} has {int(sizes[bad[0]])}); every group needs "
                         "exactly replay.group_size responses (or set replay.group_size=1)")
    for key in ("prompt_ids", "prompt_mask"):
        x = np.asarray(train[key]).reshape(len(starts), group_size, -1)
        differs = np.flatnonzero((x != x[:, :1]).any(axis=(1, 2)))
        if differs.size:
            g = int(gid[starts[differs[0]]])
            raise ValueError(f"replay.group_size={group_size}: the rows of {differs.size} prompt groups do not share "
                             f"one prompt ({key} differs within group_id {g}); a group must be n responses to the "
                             "same prompt")


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


def _round_up(x: int, m: int) -> int:
    return int(math.ceil(x / m) * m)


def group_order(group_id: np.ndarray) -> np.ndarray:
    """Row order that makes every prompt group contiguous: groups in order of first appearance, rows within a
    group in their original order (the identity when the groups are already contiguous)."""
    gid = np.asarray(group_id)
    _, first, inv = np.unique(gid, return_index=True, return_inverse=True)
    return np.lexsort((np.arange(len(gid)), first[inv.reshape(-1)])).astype(np.int64)


def group_runs(group_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, sizes)`` of the runs of equal consecutive ``group_id`` values (one run per group when the groups are
    contiguous, :func:`group_order`)."""
    gid = np.asarray(group_id)
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    return starts, np.diff(np.r_[starts, len(gid)])


def group_windows(group_id: np.ndarray, n_use: int) -> list[np.ndarray]:
    """Consecutive buffer windows of WHOLE prompt groups, each of at most ``n_use`` rows (greedy packing).

    ``group_id`` must have contiguous groups (:func:`group_order`). A dataset of ``<= n_use`` rows is one
    window. A group larger than ``n_use`` is a ``ConfigError`` (``replay.capacity`` must hold a whole group)."""
    gid = np.asarray(group_id)
    n = len(gid)
    if n <= n_use:
        return [np.arange(n, dtype=np.int64)]
    starts, sizes = group_runs(gid)
    if len(np.unique(gid)) != len(starts):
        raise ValueError("group_windows: prompt groups are not contiguous (order the rows with group_order)")
    if sizes.max() > n_use:
        raise ConfigError(f"replay.capacity: a prompt group has {int(sizes.max())} rows but a buffer window holds "
                          f"{n_use}; raise replay.capacity so whole groups fit")
    windows, begin, rows = [], 0, 0
    for st, sz in zip(starts, sizes):
        if rows + sz > n_use:
            windows.append(np.arange(begin, st, dtype=np.int64))
            begin, rows = st, 0
        rows += sz
    windows.append(np.arange(begin, n, dtype=np.int64))
    return windows


def window_slots(rows: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Dataset rows of the ``capacity`` buffer slots for a window and the slot-valid mask (slots past the window
    repeat its last row and are invalid: filter weight 0, never sampled)."""
    j = np.arange(capacity)
    n = len(rows)
    return np.asarray(rows)[np.minimum(j, n - 1)].astype(np.int64), j < n


def window_items(train: dict[str, np.ndarray], rows: np.ndarray, valid: np.ndarray) -> Trajectories:
    """The buffer's data fields (numpy ``Trajectories``) for slots ``rows`` of the data layer's dict ``train``;
    invalid slots get filter weight 0 and a group id of their own (below every real one), so no group estimator
    counts them in a real group."""
    data = trajectories_from_arrays(train, rows)
    low = min(int(np.min(train["group_id"], initial=0)), 0)
    pad_gid = low - 1 - np.arange(len(rows))
    return data.replace(filter_w=np.where(valid, data.filter_w, 0.0).astype(TRAJECTORY_DTYPES["filter_w"]),
                        group_id=np.where(valid, data.group_id, pad_gid).astype(TRAJECTORY_DTYPES["group_id"]))


def buffer_layout(cfg: Any, n_rows: int, mesh) -> tuple[int, int, int]:
    """``(n_use, capacity, chunk)``: dataset rows in the buffer window (``min(n_rows, replay.capacity)``), the
    buffer slots (``n_use`` rounded up to a multiple of ``lcm(chunk, batch shards)``) and the micro-batch /
    prepare chunk size (``actor.ppo_micro_batch_size`` or ``ppo_mini_batch_size``)."""
    from jaxppo.parallel import batch_divisor

    a = cfg.actor
    chunk = a.ppo_micro_batch_size or a.ppo_mini_batch_size
    n_use = min(n_rows, cfg.replay.capacity)
    return n_use, _round_up(n_use, math.lcm(chunk, batch_divisor(mesh))), chunk


@dataclasses.dataclass
class Core:
    """The train state and the jitted functions built from (concrete or abstract) sharded parameters."""
    state: TrainState
    actor_tx: Any
    critic_tx: Any   # None without a critic
    prepare: Any   # jitted state -> state
    step: Any      # jitted state -> (state, metrics)


def build_core(cfg: Any, mesh, actor_gd, actor_params, critic_gd, critic_params, replay_state, *,
               chunk: int, base=None) -> Core:
    """Optimizers, the initial ``TrainState`` and the jitted prepare/step: ONE code path for ``build_run``
    (concrete arrays on ``mesh``) and ``jaxppo.plan`` (``ShapeDtypeStruct`` leaves carrying their shardings,
    nothing allocated). Optimizer states are sharded like their parameters (``init_optimizer``); the scalar
    fields are replicated. ``critic_params=None`` (critic-free estimator): no critic optimizer, ``critic`` and
    ``critic_opt`` None. ``base``: the frozen base of models with adapters (``actor_params`` / ``critic_params``
    are then only their trainable parts), an argument of the jitted functions (``jaxppo.trainer.with_base``)."""
    from jax.sharding import NamedSharding, PartitionSpec

    hp = step_hparams(cfg)
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
    prepare = make_prepare_fn(cfg, actor_gd, critic_gd, chunk=min(chunk, capacity), state_shardings=shardings, hp=hp,
                              base=base)
    step = make_train_step(cfg, actor_gd, critic_gd, actor_tx, critic_tx, state_shardings=shardings, mesh=mesh,
                           hp=hp, base=base)
    return Core(state=state, actor_tx=actor_tx, critic_tx=critic_tx, prepare=prepare, step=step)


def lm_config(hf_config: dict, model_cfg: Any):
    """The ``LMConfig`` that ``load_pretrained`` builds for ``config.json`` contents and ``cfg.model``."""
    from jaxppo.models import LMConfig
    from jaxppo.models.config import default_scan_layers

    return LMConfig.from_hf(hf_config, param_dtype=model_cfg.param_dtype, compute_dtype=model_cfg.compute_dtype,
                            remat=model_cfg.remat, scan_layers=default_scan_layers(model_cfg.compute_dtype))


def check_critic_vocab(critic_vocab: int, policy_vocab: int) -> None:
    """ConfigError when the critic checkpoint (``critic.model_path``) has a smaller vocabulary than the policy: the
    critic reads the policy's token ids, and an id past its embedding table would be clamped silently under jit.
    (A larger one is allowed: checkpoints pad their embedding tables; the tokenizer itself is not compared.)"""
    if critic_vocab < policy_vocab:
        raise ConfigError(f"critic.model_path: its vocabulary has {critic_vocab} tokens, fewer than model.path's "
                          f"{policy_vocab}; the critic reads the policy's token ids, so it needs the same tokenizer")


def _with_shardings(params, mesh, rules):
    from jaxppo.models import named_shardings

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                        named_shardings(params, mesh, rules))


def make_replay(cfg: Any, capacity: int, example: Any, mesh):
    """``replay_lib.init`` with the config's sampling and staleness-decay settings."""
    return replay_lib.init(capacity, example, alpha=cfg.replay.alpha, eps=cfg.replay.eps,
                           prioritization=cfg.replay.prioritization, mesh=mesh, decay=cfg.replay.decay.kind,
                           decay_rate=cfg.replay.decay.rate, weight_floor=cfg.replay.weight_floor)


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
                  n_rows: int | None = None, critic_hf_config: dict | None = None):
    """``(core, actor_gd, critic_gd, ref_params)`` of the run ``build_run(cfg)`` would make, built abstractly:
    models from ``config.json`` contents (no weights) with the same logical-axis shardings, a buffer of
    ``buffer_layout(cfg, n_rows or replay.capacity)`` slots with the same storage shardings, and the same
    ``build_core`` (optimizer states, jitted prepare/step). Every leaf is a ``ShapeDtypeStruct`` with a sharding."""
    from jaxppo.models import CausalLM, ValueModel

    with_critic = step_hparams(cfg).critic is not None
    lm_cfg = lm_config(hf_config, cfg.model)
    spec = spec_from_config(cfg.model.lora)
    if spec is not None:
        return _abstract_lora_core(cfg, mesh, rules, lm_cfg.replace(lora=spec), with_critic, prompt_len=prompt_len,
                                   response_len=response_len, n_rows=n_rows)
    critic_lm_cfg = None
    if with_critic and cfg.critic.model_path and not cfg.critic.share_trunk:
        if critic_hf_config is None:
            raise ConfigError("critic.model_path is set: the plan needs that model's config.json too")
        critic_lm_cfg = lm_config(critic_hf_config, cfg.model)
        check_critic_vocab(critic_lm_cfg.vocab_size, lm_cfg.vocab_size)

    def build():
        actor = CausalLM(lm_cfg, rngs=nnx.Rngs(0))
        if not with_critic:
            return actor, None
        if critic_lm_cfg is not None:
            critic = ValueModel.from_lm(CausalLM(critic_lm_cfg, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(cfg.trainer.seed))
        else:
            critic = make_critic(actor, share_trunk=cfg.critic.share_trunk, seed=cfg.trainer.seed)
        return actor, critic

    actor, critic = nnx.eval_shape(build)
    actor_gd, actor_params = split_params(actor)
    actor_params = _with_shardings(actor_params, mesh, rules)
    critic_gd = critic_params = None
    if critic is not None:
        critic_gd, critic_params = split_params(critic)
        critic_params = _with_shardings(critic_params, mesh, rules)

    _, capacity, chunk = buffer_layout(cfg, cfg.replay.capacity if n_rows is None else n_rows, mesh)
    rs = abstract_replay(cfg, mesh, capacity, example_item(prompt_len, response_len, critic=with_critic))
    core = build_core(cfg, mesh, actor_gd, actor_params, critic_gd, critic_params, rs, chunk=chunk)
    return core, actor_gd, critic_gd, actor_params


def _abstract_lora_core(cfg, mesh, rules, lm_cfg, with_critic: bool, *, prompt_len: int, response_len: int,
                        n_rows: int | None):
    """``abstract_core`` with adapters: the 4th result is the frozen base (the reference is the base itself)."""
    _check_lora_critic(cfg, with_critic)
    actor_gd, actor_params, base = split_frozen(nnx.eval_shape(lambda: _new_lm(lm_cfg)))
    actor_params, base = _with_shardings(actor_params, mesh, rules), _with_shardings(base, mesh, rules)
    critic_gd = critic_params = None
    if with_critic:
        critic_gd, critic_params = _lora_critic(cfg, lm_cfg, abstract=True)
        critic_params = _with_shardings(critic_params, mesh, rules)
    _, capacity, chunk = buffer_layout(cfg, cfg.replay.capacity if n_rows is None else n_rows, mesh)
    rs = abstract_replay(cfg, mesh, capacity, example_item(prompt_len, response_len, critic=with_critic))
    core = build_core(cfg, mesh, actor_gd, actor_params, critic_gd, critic_params, rs, chunk=chunk, base=base)
    return core, actor_gd, critic_gd, base


def _new_lm(lm_cfg):
    from jaxppo.models import CausalLM
    return CausalLM(lm_cfg, rngs=nnx.Rngs(0))


def _check_lora_critic(cfg, with_critic: bool) -> None:
    if with_critic and cfg.critic.model_path and not cfg.critic.share_trunk:
        raise ConfigError("model.lora.rank > 0 with critic.model_path: the critic shares the policy's frozen base "
                          "(its own adapters and value head); set critic.model_path=null")


def _lora_critic(cfg, lm_cfg, *, abstract: bool):
    """``(critic_gd, trainable)``: a bare value head (``critic.share_trunk``) or a ``ValueModel`` on the shared base
    with its own adapters (``adapters.lora_critic``)."""
    from jaxppo.models import ScalarHead
    if cfg.critic.share_trunk:
        make = lambda: ScalarHead(lm_cfg.hidden_size, rngs=nnx.Rngs(cfg.trainer.seed),  # noqa: E731
                                  std=lm_cfg.initializer_range, dtype=lm_cfg.param_dtype)
        return split_params(nnx.eval_shape(make) if abstract else make())
    if abstract:
        gd, trainable, _ = nnx.split(nnx.eval_shape(lambda: ValueModel(lm_cfg, rngs=nnx.Rngs(cfg.trainer.seed))),
                                     TRAINABLE, ...)
        return gd, trainable
    return lora_critic(lm_cfg, seed=cfg.trainer.seed)


def build_run(cfg: Any, *, devices=None) -> Run:
    """Everything a run needs, from ``cfg`` (models loaded, data tokenized, buffer filled, jits built).

    The training rows are ordered so each prompt group is contiguous (:func:`group_order`) and cut into buffer
    windows of whole groups (:func:`group_windows`); with a critic-free estimator no critic is built."""
    from jaxppo.hf import load_pretrained, load_tokenizer
    from jaxppo.hf.paths import resolve_model_path, tokenizer_path
    from jaxppo.models.adapters import with_adapters
    from jaxppo.models.dtypes import dtype_of
    from jaxppo.trainer.mesh import mesh_from_config

    devices = list(jax.devices() if devices is None else devices)
    check_config(cfg, len(devices))
    mesh, rules = mesh_from_config(cfg.mesh, devices)
    ensure_data(cfg)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(tokenizer_path(cfg.model))
    param_dtype, compute_dtype = dtype_of(cfg.model.param_dtype), dtype_of(cfg.model.compute_dtype)
    actor_model = load_pretrained(model_path, dtype=param_dtype, compute_dtype=compute_dtype, mesh=mesh, rules=rules,
                                  remat=cfg.model.remat)
    actor_model = with_adapters(actor_model, cfg.model.lora, seed=cfg.trainer.seed, mesh=mesh, rules=rules)
    train, heldout, report = split_data(cfg, tokenizer, reference_path=model_path, reference=actor_model)
    return assemble_run(cfg, mesh, rules, tokenizer, model_path, actor_model, train, heldout, report)


def assemble_run(cfg: Any, mesh, rules: dict, tokenizer, model_path, actor_model, train: dict[str, np.ndarray],
                 heldout: dict[str, np.ndarray], report) -> Run:
    """:func:`build_run` after its I/O: from the loaded (sharded) policy — with its adapters attached
    (``models.adapters.with_adapters``) when ``model.lora`` asks for them — and the tokenized training / held-out rows to the
    run (reference log-probs, PF-PPO weights, the filled buffer, critic or adapters, jitted prepare and step).
    ``benchmarks/device_step.py`` calls it with random weights and synthetic rows: the same path as training."""
    from jaxppo.data import compute_behaviour_logprobs
    from jaxppo.models import shard_model

    if spec_from_config(cfg.model.lora) is not None and actor_model.config.lora is None:
        raise ValueError("assemble_run: model.lora.rank > 0 but the policy has no adapters; attach them first "
                         "(with_adapters), before any reference pass")
    hp = step_hparams(cfg)
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
    train["ref_logp"] = compute_behaviour_logprobs(actor_model, train, batch_size=cfg.data.behaviour_batch_size)
    train["filter_w"], pf_stats = pf_filter(cfg, train["score"], train["group_id"], cfg.trainer.seed)
    if cfg.pf_ppo.enabled and cfg.pf_ppo.filter == "dynamic_sampling":
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

    spec = spec_from_config(cfg.model.lora)
    if spec is not None:
        return _finish_lora_run(cfg, mesh, rules, tokenizer, model_path, actor_model, spec, rs, train, heldout,
                                n_use, capacity, chunk, report, windows, pf_stats)
    actor_gd, actor_params = split_params(actor_model)
    critic_gd = critic_params = None
    if hp.critic is not None:
        critic_model = make_critic(actor_model, share_trunk=cfg.critic.share_trunk, seed=cfg.trainer.seed)
        if cfg.critic.model_path and not cfg.critic.share_trunk:
            from jaxppo.hf import load_pretrained
            from jaxppo.hf.paths import resolve_model_path
            from jaxppo.models import ValueModel
            from jaxppo.models.dtypes import dtype_of

            param_dtype, compute_dtype = dtype_of(cfg.model.param_dtype), dtype_of(cfg.model.compute_dtype)
            critic_lm = load_pretrained(resolve_model_path(cfg.critic.model_path), dtype=param_dtype,
                                        compute_dtype=compute_dtype, mesh=mesh, rules=rules, remat=cfg.model.remat)
            check_critic_vocab(critic_lm.config.vocab_size, actor_model.config.vocab_size)
            critic_model = ValueModel.from_lm(critic_lm, rngs=nnx.Rngs(cfg.trainer.seed))
        shard_model(critic_model, mesh, rules)
        critic_gd, critic_params = split_params(critic_model)
    ref_params = jax.tree.map(lambda x: jnp.array(x, copy=True), actor_params)
    core = build_core(cfg, mesh, actor_gd, actor_params, critic_gd, critic_params, rs, chunk=chunk)
    n = _n_params((actor_params, critic_params))
    return Run(cfg=cfg, mesh=mesh, rules=rules, tokenizer=tokenizer, model_path=model_path, actor_gd=actor_gd,
               critic_gd=critic_gd, ref_params=ref_params, state=core.state, prepare=core.prepare, step=core.step,
               train=train, heldout=heldout, n_use=n_use, capacity=capacity, report=report, windows=windows,
               pf_stats=pf_stats, params_trainable=n, params_total=n)


def _n_params(tree) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def _finish_lora_run(cfg, mesh, rules, tokenizer, model_path, actor_model, spec, rs, train, heldout, n_use,
                     capacity, chunk, report, windows, pf_stats) -> Run:
    """``build_run``'s models with adapters: the actor's adapters, a critic on the same base (or a bare value head
    with ``critic.share_trunk``; none when critic-free), the base outside the train state, no reference copy."""
    from jaxppo.models import named_shardings

    with_critic = step_hparams(cfg).critic is not None
    _check_lora_critic(cfg, with_critic)
    actor_gd, actor_params, base = split_frozen(actor_model)
    critic_gd = critic_params = None
    if with_critic:
        critic_gd, critic_params = _lora_critic(cfg, actor_model.config, abstract=False)
        critic_params = jax.device_put(critic_params, named_shardings(critic_params, mesh, rules))
    core = build_core(cfg, mesh, actor_gd, actor_params, critic_gd, critic_params, rs, chunk=chunk, base=base)
    trainable = _n_params((actor_params, critic_params))
    total = trainable + _n_params(base)
    logger.info("LoRA rank %d on %s: %d trainable parameters of %d (%.3f%%); frozen base shared by the reference%s",
                spec.rank, ",".join(spec.targets), trainable, total, 100.0 * trainable / total,
                " and the critic" if with_critic and not cfg.critic.share_trunk else "")
    return Run(cfg=cfg, mesh=mesh, rules=rules, tokenizer=tokenizer, model_path=model_path, actor_gd=actor_gd,
               critic_gd=critic_gd, ref_params=reference_adapters(actor_params), state=core.state, prepare=core.prepare, step=core.step,
               train=train, heldout=heldout, n_use=n_use, capacity=capacity, report=report, windows=windows,
               pf_stats=pf_stats, base=base, params_trainable=trainable,
               params_total=total)


def load_window(run: Run, state: TrainState, refresh_index: int) -> TrainState:
    """For datasets larger than the buffer: the rows of window ``refresh_index mod len(run.windows)`` (whole prompt
    groups, :func:`group_windows`) written into the buffer's ``BufferItem.data`` (no-op with a single window)."""
    if len(run.windows) <= 1:
        return state
    window = run.windows[refresh_index % len(run.windows)]
    rows, valid = window_slots(window, run.capacity)
    old: BufferItem = state.replay.storage
    data = jax.tree.map(lambda v, o: jax.device_put(v.astype(o.dtype), o.sharding),
                        window_items(run.train, rows, valid), old.data)
    return state.replace(replay=state.replay.replace(storage=old.replace(data=data)),
                         data_cursor=jax.device_put(jnp.int32(window[0]), state.data_cursor.sharding))
