"""The prepare pass (docs/design.md, "Prepare"): proximal log-probs, values, token rewards, GAE, priorities (batched, jitted).

For every buffer slot (``[N, R]`` arrays, ``m`` the response mask):

- ``prox_logp_t`` = log-probs of the current policy (the PPO "old" policy snapshot); ``ref_logp`` is
  stored once at setup (reference = initial policy);
- ``V_t`` from the critic, masked: ``V_t·m_t`` (only with an estimator that needs a critic);
- token rewards ``r_t = -β·kl(prox, ref)_t·m_t`` (if ``algorithm.use_kl_in_reward``) ``+ s_i·[t = last_i]``;
- ``(A, G)`` from ``algorithm.adv_estimator`` (``ops.ADVANTAGE_ESTIMATORS``): ``gae`` is
  ``ops.gae(r, V, m, γ, λ)``, with ``algorithm.norm_adv`` whitened over the valid tokens of the whole buffer
  (``ops.masked_whiten``) and re-masked; the critic-free ones (grpo, rloo, reinforce_plus_plus[_baseline]) get
  ``group_ids`` = the rows' ``group_id`` and no values;
- the per-sequence priority ``p_i`` of ``replay.priority`` (:func:`buffer_priority`): ``td_error``
  ``agg_t |δ_t|`` with ``δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t`` (mean or max over the mask; default with a
  critic), ``abs_advantage`` ``agg_t |A_t|`` (default without), ``group_variance``. With ``f_i`` the PF-PPO
  filter weight, the buffer
  stores ``f_i·(p_i + ε)^α`` (proportional: sampling ``P(i) ∝ f_i·(p_i+ε)^α``) or ``(p_i + ε)·[f_i > 0]``
  (rank); slots with ``f_i = 0`` get 0 (never sampled). The step's PER weights then correct only the
  priority part, so the expected gradient share of item ``i`` is ``∝ f_i·P_prio(i)^(1−β)`` at every β
  (the filter preference survives at β = 1; ``jaxppo.replay.filtered``).
  Uniform sampling stores ``f_i`` itself (``P(i) ∝ f_i``, weights 1: share ``∝ f_i``) and never writes
  priorities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import ops
from jaxppo import replay as replay_lib
from jaxppo.replay.filtered import filtered_stored_priority
from jaxppo.parallel import batch_divisor
from jaxppo.trainer.micro import chunked_map
from jaxppo.trainer.ppo.packed import TOKEN_FIELDS, HostPlanned, packed_shardings
from jaxppo.trainer.ppo.buffer_types import BufferItem, Prepared, Tokens
from jaxppo.trainer.ppo.forward import response_logp_entropy, response_logp_entropy_values
from jaxppo.trainer.with_base import jit_step
from jaxppo.trainer.ppo.hparams import PFHP, StepHP


def last_token_onehot(response_mask: jax.Array) -> jax.Array:
    """``[B,R]`` float32: 1 at the last position where ``response_mask`` is 1 (all 0 for an empty row)."""
    m = response_mask.astype(jnp.int32)
    n = m.sum(-1)
    idx = jnp.maximum(n - 1, 0)
    return jax.nn.one_hot(idx, m.shape[1], dtype=jnp.float32) * (n > 0)[:, None]


def token_rewards(score: jax.Array, response_mask: jax.Array, prox_logp: jax.Array, ref_logp: jax.Array, *,
                  kl_coef: jax.Array | float, use_kl_in_reward: bool, kl_kind: str) -> jax.Array:
    """``r_t = -β·kl(prox, ref)_t·m_t (optional) + s·[t = last]``."""
    m = response_mask.astype(jnp.float32)
    r = score.astype(jnp.float32)[:, None] * last_token_onehot(response_mask)
    if use_kl_in_reward:
        r = r - jnp.asarray(kl_coef, jnp.float32) * ops.kl_penalty(prox_logp, ref_logp, kl_kind) * m
    return r


def td_residuals(rewards: jax.Array, values: jax.Array, response_mask: jax.Array, gamma: float) -> jax.Array:
    """``δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t`` on the mask (0 elsewhere; no bootstrap past the last token)."""
    m = response_mask.astype(jnp.float32)
    v = values * m
    nxt = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
    return (rewards + gamma * nxt - v) * m


def buffer_priority(hp: StepHP, *, delta: jax.Array | None, advantages: jax.Array, mask: jax.Array,
                    score: jax.Array, group_id: jax.Array) -> jax.Array:
    """Per-slot priority ``p_i`` of ``replay.priority`` (``ops.PRIORITIES``; table in ``jaxppo.ops.priorities``):
    ``td_error`` ``agg_t|δ_t|`` (needs a critic), ``abs_advantage`` ``agg_t|A_t|``, ``group_variance`` the
    unbiased variance of the row's group scores (over the whole buffer, so groups are whole)."""
    return ops.PRIORITIES.get(hp.replay.priority)(delta=delta, advantages=advantages, mask=mask, score=score,
                                                  group_id=group_id, agg=hp.replay.priority_agg)


def make_prepare_fn(actor_gd, critic_gd, *, chunk: int, hp: StepHP, state_shardings=None, base=None,
                    packed: bool = False, group_size: int | None = None):
    """Jitted ``state -> state`` that recomputes every prepared array and priority of the buffer: the buffer's
    ``BufferItem.prepared`` (``batch.Prepared``) is replaced, its ``data`` kept.

    With the estimator ``algorithm.adv_estimator`` (``hp.advantage``): ``(A, G) = est(r, V, m, group_id, hp)``;
    a critic-free estimator gets ``V = None`` (no critic forward, no ``values`` in the buffer) and the rows'
    ``group_id`` (the buffer holds whole groups: ``windows.group_windows``). ``algorithm.norm_adv`` whitens the
    advantages of critic estimators only (the critic-free ones normalise per group / batch themselves).
    ``base``: the frozen base of models with adapters (``jaxppo.trainer.with_base``).

    ``group_size = n > 1`` (default ``replay.group_size``; the build passes ``windows.prompt_group_size``, which is
    also ``n`` when every prompt group of the data has ``n`` rows with one prompt): the buffer holds whole prompt
    groups in order (``windows.group_windows``; its padding slots make whole blocks of ``n`` too, the capacity being a
    multiple of the chunk, itself a multiple of ``n``), so every strided chunk holds whole groups
    (``micro.chunked_map(group_size=n)``), each group's prompt goes through the trunk once
    (``forward.response_hidden``), and the outputs come back in buffer order: the row layout's values up to float
    summation order.

    ``packed``: the forward passes run on packed rows, one plan per chunk (:func:`jaxppo.trainer.packed.plan_pieces`
    of the buffer's token fields, made on the host when a window is loaded and reused until the next:
    :class:`jaxppo.trainer.ppo.packed.HostPlanned`; with ``n > 1`` each group packed with its prompt once); the
    outputs are the padded layout's.
    """
    ah = hp.advantage
    estimator = ops.ADVANTAGE_ESTIMATORS.get(ah.estimator)
    critic = hp.critic
    share = critic is not None and critic.share_trunk
    prioritized = hp.replay.prioritized
    mesh = None if state_shardings is None else state_shardings.rng.mesh

    n = hp.replay.group_size if group_size is None else int(group_size)

    def prepare_with(state, plan, base):
        item: BufferItem = state.replay.storage
        d = item.data

        def one(piece):
            batch, pl = piece
            if critic is None:
                (logp, _), values = response_logp_entropy(actor_gd, state.actor, batch, base=base, group_size=n,
                                                          packed=pl), None
            else:
                (logp, _), values = response_logp_entropy_values(actor_gd, state.actor, critic_gd, state.critic,
                                                                 batch, share_trunk=share, base=base, group_size=n,
                                                                 packed=pl)
            return logp, values

        # whole groups per chunk; the plan is laid out for the strided split already
        fn = one if plan is not None else (lambda t: one((t, None)))
        prox_logp, values = chunked_map(fn, Tokens.of(d), chunk, mesh=mesh, group_size=n, aligned=plan)
        prox_logp = jax.lax.stop_gradient(prox_logp)
        m = d.response_mask.astype(jnp.float32)
        rewards = token_rewards(d.score, d.response_mask, prox_logp, d.ref_logp, kl_coef=state.kl_coef,
                                use_kl_in_reward=ah.use_kl_in_reward, kl_kind=ah.kl_penalty)
        fw = d.filter_w
        delta = None
        if values is not None:
            values = values * m
            adv, ret = estimator(rewards, values, m, d.group_id, ah.params)
            if ah.norm_adv:
                valid = m * (fw > 0).astype(jnp.float32)[:, None]
                adv = ops.masked_whiten(adv, valid) * m
            delta = td_residuals(rewards, values, m, critic.gamma)
        else:
            adv, ret = estimator(rewards, None, m, d.group_id, ah.params)
        prio = buffer_priority(hp, delta=delta, advantages=adv * m, mask=m, score=d.score, group_id=d.group_id)
        prepared = Prepared(prox_logp=prox_logp, token_rewards=rewards, advantages=adv * m, returns=ret * m,
                            values=values)
        rs = state.replay.replace(storage=item.replace(prepared=prepared))
        stored = filtered_stored_priority(rs, prio, fw) if prioritized else fw
        idx = jnp.arange(fw.shape[0], dtype=jnp.int32)
        rs = replay_lib.set_priorities(rs, idx, stored)
        return state.replace(replay=rs)

    if not packed:
        def prepare(state, base=None):
            return prepare_with(state, None, base)

        return jit_step(prepare, state_shardings, mesh, base, out_scalars=False)
    def prepare_packed(state, plan, base=None):
        return prepare_with(state, plan, base)

    shardings = packed_shardings(mesh, branches=n > 1) if state_shardings is not None else None
    jitted = jit_step(prepare_packed, state_shardings, mesh, base, out_scalars=False,
                      **({} if shardings is None else {"batch_shardings": shardings}))

    def tokens(state):
        return {k: getattr(state.replay.storage.data, k) for k in TOKEN_FIELDS}

    rep = {} if mesh is None else {"out_shardings": NamedSharding(mesh, PartitionSpec())}
    return HostPlanned(jitted, jax.jit(tokens, **rep), chunk, name="packed prepare",
                       multiple_of=1 if mesh is None else batch_divisor(mesh), shardings=shardings,
                       cache_key=lambda state: int(jax.device_get(state.data_cursor)), group_size=n)


def pf_filter(pf: PFHP, score: np.ndarray, group_id: np.ndarray, seed: int) -> tuple[np.ndarray, dict[str, int]]:
    """PF-PPO dataset filter weights ``f_i`` (``pf.filter``, the step's ``hparams.PFHP``: ``pf_ppo.filter``, "none"
    when PF-PPO is off, which gives all 1) and the filter's counts.

    The filter is ``replay.pf_ppo.PF_FILTERS[pf.filter]``; the counts hold ``pf_ppo/dropped_groups``, the
    groups whose every row got weight 0 (``dynamic_sampling``, DAPO: the groups whose scores are all equal)."""
    if pf.filter == "none":
        return np.ones(score.shape, np.float32), {"pf_ppo/dropped_groups": 0}
    groups, gid = np.unique(group_id, return_inverse=True)
    s, g = jnp.asarray(score, jnp.float32), jnp.asarray(gid, jnp.int32)
    w = replay_lib.filter_weights(pf.filter, s, g, int(len(groups)), key=jax.random.PRNGKey(seed),
                                  weight_pow=pf.weight_pow)
    dropped = int(replay_lib.pf_ppo.dropped_groups(w, g, int(len(groups))))
    w = np.asarray(w, np.float32)
    if not (w > 0).any():
        raise ValueError(f"pf_ppo.filter={pf.filter!r} gives every trajectory weight 0; nothing to train on")
    return w, {"pf_ppo/dropped_groups": dropped}
