"""DESIGN.md §3 "Prepare": proximal log-probs, values, token rewards, GAE, priorities (batched, jitted).

For every buffer slot (``[N, R]`` arrays, ``m`` the response mask):

- ``prox_logp_t`` = log-probs of the current policy (the PPO "old" policy snapshot); ``ref_logp`` is
  stored once at setup (reference = initial policy);
- ``V_t`` from the critic, masked: ``V_t·m_t``;
- token rewards ``r_t = -β·kl(prox, ref)_t·m_t`` (if ``algorithm.use_kl_in_reward``) ``+ s_i·[t = last_i]``;
- ``(A, G) = ops.gae(r, V, m, γ, λ)``; with ``algorithm.norm_adv`` ``A`` is whitened over the valid
  tokens of the whole buffer (``ops.masked_whiten``) and re-masked;
- TD residuals ``δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t`` and the per-sequence priority
  ``p_i = agg_t |δ_t|`` (mean or max over the mask). With ``f_i`` the PF-PPO filter weight, the buffer
  stores ``f_i·(p_i + ε)^α`` (proportional: sampling ``P(i) ∝ f_i·(p_i+ε)^α``) or ``(p_i + ε)·[f_i > 0]``
  (rank); slots with ``f_i = 0`` get 0 (never sampled). The step's PER weights then correct only the
  priority part, so the expected gradient share of item ``i`` is ``∝ f_i·P_prio(i)^(1−β)`` at every β
  (the filter preference survives at β = 1; ``jaxppo.replay.filtered``).
  Uniform sampling stores ``f_i`` itself (``P(i) ∝ f_i``, weights 1: share ``∝ f_i``) and never writes
  priorities.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo import ops
from jaxppo import replay as replay_lib
from jaxppo.replay.filtered import filtered_stored_priority
from jaxppo.trainer.forward import logp_entropy, response_logits_values


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


def sequence_priority(delta: jax.Array, response_mask: jax.Array, agg: str) -> jax.Array:
    """``agg_t |δ_t|`` per sequence: masked mean or masked max (0 for an empty row)."""
    m = response_mask.astype(jnp.float32)
    a = jnp.abs(delta) * m
    if agg == "max":
        return jnp.max(a, axis=-1)
    return a.sum(-1) / jnp.maximum(m.sum(-1), 1.0)


def _chunked(fn, storage: Mapping[str, jax.Array], keys: tuple[str, ...], chunk: int, mesh=None):
    """Apply ``fn(items) -> tree of [chunk, ...]`` over the buffer in chunks with ``lax.map``.

    Chunks are strided: chunk ``j`` holds rows ``j, j+c, j+2c, ...`` with ``c = N / chunk`` chunks, so with the
    buffer split in contiguous blocks over the devices every chunk takes the same share of every device's
    rows (``chunk`` a multiple of the batch shards) and the per-row outputs come back in row order. With
    ``mesh`` each chunk is constrained to stay split over the batch axes (``jaxppo.parallel.BATCH_AXES``).
    """
    n = storage[keys[0]].shape[0]
    if n % chunk:
        raise ValueError(f"buffer size {n} is not a multiple of the prepare chunk {chunk}")
    c = n // chunk

    def constrain(x, axis):
        if mesh is None:
            return x
        from jax.sharding import NamedSharding, PartitionSpec

        from jaxppo.parallel import BATCH_AXES
        spec = [None] * x.ndim
        spec[axis] = BATCH_AXES
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    xs = {k: constrain(jnp.swapaxes(storage[k].reshape(chunk, c, *storage[k].shape[1:]), 0, 1), 1) for k in keys}
    out = jax.lax.map(lambda items: fn({k: constrain(v, 0) for k, v in items.items()}), xs)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1).reshape(n, *y.shape[2:]), out)


_TOKEN_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def make_ref_logp_fn(actor_gd, chunk: int):
    """Jitted ``(actor_params, storage) -> logp [N,R]`` (used once with the initial policy)."""

    def run(actor_params, storage):
        def one(items):
            from jaxppo.trainer.forward import policy_logp
            return policy_logp(actor_gd, actor_params, items)
        return _chunked(one, storage, _TOKEN_KEYS, chunk)
    return jax.jit(run)


def make_prepare_fn(cfg: Any, actor_gd, critic_gd, *, chunk: int, state_shardings=None):
    """Jitted ``state -> state`` that recomputes every prepared array and priority of the buffer."""
    alg, share = cfg.algorithm, cfg.critic.share_trunk
    prioritized = cfg.replay.sampling == "prioritized"
    mesh = None if state_shardings is None else state_shardings.rng.mesh

    def prepare(state):
        st = state.replay.storage

        def one(items):
            logits, values = response_logits_values(actor_gd, state.actor, critic_gd, state.critic, items,
                                                    share_trunk=share)
            logp, _ = logp_entropy(logits, items["response_ids"], items["response_mask"])
            return logp, values

        prox_logp, values = _chunked(one, st, _TOKEN_KEYS, chunk, mesh=mesh)
        prox_logp = jax.lax.stop_gradient(prox_logp)
        m = st["response_mask"].astype(jnp.float32)
        values = values * m
        rewards = token_rewards(st["score"], st["response_mask"], prox_logp, st["ref_logp"], kl_coef=state.kl_coef,
                                use_kl_in_reward=alg.use_kl_in_reward, kl_kind=alg.kl_penalty)
        adv, ret = ops.gae(rewards, values, m, alg.gamma, alg.lam)
        fw = st["filter_w"]
        if alg.norm_adv:
            valid = m * (fw > 0).astype(jnp.float32)[:, None]
            adv = ops.masked_whiten(adv, valid) * m
        delta = td_residuals(rewards, values, m, alg.gamma)
        prio = sequence_priority(delta, m, alg.priority_agg)
        storage = dict(st, prox_logp=prox_logp, values=values, token_rewards=rewards, advantages=adv * m,
                       returns=ret * m)
        rs = state.replay.replace(storage=storage)
        if prioritized:
            stored = filtered_stored_priority(rs, prio, fw)
        else:
            stored = fw
        idx = jnp.arange(fw.shape[0], dtype=jnp.int32)
        rs = replay_lib.set_priorities(rs, idx, stored)
        return state.replace(replay=rs)

    if state_shardings is None:
        return jax.jit(prepare, donate_argnums=0)
    return jax.jit(prepare, donate_argnums=0, in_shardings=(state_shardings,), out_shardings=state_shardings)


def pf_filter_weights(cfg: Any, score: np.ndarray, group_id: np.ndarray, seed: int) -> np.ndarray:
    """PF-PPO dataset filter weights ``f_i`` (``pf_ppo.filter``; all 1 when PF-PPO is off)."""
    pf = cfg.pf_ppo
    if not pf.enabled or pf.filter == "none":
        return np.ones(score.shape, np.float32)
    groups, gid = np.unique(group_id, return_inverse=True)
    w = replay_lib.filter_weights(pf.filter, jnp.asarray(score, jnp.float32), jnp.asarray(gid, jnp.int32),
                                  int(len(groups)), key=jax.random.PRNGKey(seed), weight_pow=pf.weight_pow)
    w = np.asarray(w, np.float32)
    if not (w > 0).any():
        raise ValueError(f"pf_ppo.filter={pf.filter!r} gives every trajectory weight 0; nothing to train on")
    return w
