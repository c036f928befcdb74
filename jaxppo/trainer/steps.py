"""One jitted, sharded update step ``state -> (state, metrics)`` (DESIGN.md §3 "Each update step").

1. Minibatch of ``B = actor.ppo_mini_batch_size`` sequences from the replay buffer, key
   ``fold_in(state.rng, state.step)``: prioritized with ``β = linear_beta(step, β0, beta_steps)``, or
   uniform (``replay.sampling=uniform``: stored priorities are the PF-PPO filter weights, ``β = 0`` so
   ``w_i = 1``). With ``pf_ppo.reweight_method`` the minibatch is resampled with verl's batch weights.
2. Fresh log-probs/entropy/values; behaviour correction ``ρ = ops.importance_weights(prox, μ)``
   (``importance.enabled=false``: ``ρ = 1``); loss weights ``sg(w_i·ρ_t)``.
3. ``L = pg(w·ρ) − c_H·H + c_KL·agg(kl(θ, ref)) + c_v·vf``  where the value loss is weighted by
   the PER weights ``w_i``. Separate critic: ``c_v`` only scales
   its gradient. Gradients are accumulated over ``B / ppo_micro_batch_size`` micro-batches
   (``lax.scan``, mean of micro-batch gradients); each model has ``clip_by_global_norm → adamw``.
4. Non-finite loss or gradient norm: the update is skipped in-graph (old params, optimizer and
   replay state kept), ``nan_total``/``nan_streak`` count it, metric ``train/nan_skipped`` = 1.
5. Priorities of the sampled slots get the fresh per-sequence ``agg_t|δ_t|`` (times the filter weight).
6. Adaptive KL controller: ``β ← ops.adaptive_kl_update(β, kl(prox, ref), B, target, horizon)``.

``replay/sample_efficiency`` = share of the minibatch whose effective weight ``w_i · mean_t ρ_t`` is
above 0.1 (non-negligible contribution to the gradient).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import ops
from jaxppo import replay as replay_lib
from jaxppo.trainer.forward import logp_entropy, response_logits_values
from jaxppo.trainer.prepare import sequence_priority, td_residuals
from jaxppo.trainer.state import TrainState, lr_schedule

SAMPLE_EFFICIENCY_THRESHOLD = 0.1


def _masked_var(x, m):
    mean = ops.masked_mean(x, m)
    return ops.masked_mean(jnp.square(x - mean), m)


def explained_variance(values, returns, mask):
    """``1 − Var_m(G − V) / Var_m(G)`` (0 when the returns have no variance)."""
    vr = _masked_var(returns, mask)
    return jnp.where(vr > 1e-12, 1.0 - _masked_var(returns - values, mask) / jnp.maximum(vr, 1e-12), 0.0)


def _importance(cfg, prox, behaviour, m):
    ic = cfg.importance
    rho, met = ops.importance_weights(prox, behaviour, m, level=ic.level, mode=ic.mode, threshold=ic.threshold,
                                      lower=ic.lower if ic.mode == "mask" else None, veto=ic.veto_threshold, cap_rule=ic.cap_rule)
    rho = jax.lax.stop_gradient(rho)
    if not ic.enabled:
        rho = jnp.ones_like(m)
    return rho, met


def make_loss_fn(cfg: Any, actor_gd, critic_gd):
    a, c, alg = cfg.actor, cfg.critic, cfg.algorithm

    def loss_fn(params, items, w):
        actor_p, critic_p = params
        logits, values = response_logits_values(actor_gd, actor_p, critic_gd, critic_p, items,
                                                share_trunk=c.share_trunk)
        m = items["response_mask"].astype(jnp.float32)
        logp, ent = logp_entropy(logits, items["response_ids"], items["response_mask"])
        values = values * m
        prox = items["prox_logp"]
        rho, ism = _importance(cfg, prox, items["behaviour_logprobs"], m)
        weights = jax.lax.stop_gradient(w[:, None] * rho)
        pg_loss, pgm = ops.policy_loss(logp, prox, items["advantages"], m, clip_low=a.clip_low,
                                       clip_high=a.clip_high, clip_c=a.clip_ratio_c, agg=a.loss_agg_mode,
                                       weights=weights)
        vf_loss, vfm = ops.value_loss(values, items["values"], items["returns"], m, clip=c.cliprange_value,
                                      agg=c.loss_agg_mode, weights=jax.lax.stop_gradient(w[:, None]))
        entropy = ops.aggregate(ent, m, a.loss_agg_mode)
        kl_loss = ops.aggregate(ops.kl_penalty(logp, items["ref_logp"], a.kl_loss_type), m, a.loss_agg_mode)
        total = pg_loss - a.entropy_coeff * entropy + c.vf_coef * vf_loss
        if a.use_kl_loss:
            total = total + a.kl_loss_coef * kl_loss
        sv = jax.lax.stop_gradient(values)
        delta = td_residuals(items["token_rewards"], sv, m, alg.gamma)
        seq_rho = (rho * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)
        aux = {
            "train/loss": total,
            "actor/pg_loss": pg_loss, "actor/pg_clipfrac": pgm["pg_clipfrac"],
            "actor/pg_clipfrac_lower": pgm["pg_clipfrac_lower"], "actor/ppo_kl": pgm["ppo_kl"],
            "actor/entropy": entropy, "actor/kl_loss": kl_loss,
            "critic/vf_loss": vf_loss, "critic/vf_clipfrac": vfm["vf_clipfrac"],
            "critic/vf_explained_var": explained_variance(sv, items["returns"], m),
            "critic/values/mean": ops.masked_mean(sv, m),
            "critic/returns/mean": ops.masked_mean(items["returns"], m),
            "critic/advantages/mean": ops.masked_mean(items["advantages"], m),
            "critic/score/mean": jnp.mean(items["score"]),
            "response_length/mean": jnp.mean(m.sum(-1)),
            "is/ess": ism["ess"], "is/weight_mean": ism["weight_mean"], "is/weight_max": ism["weight_max"],
            "is/clipped_frac": ism["clipped_frac"],
            "replay/sample_efficiency": jnp.mean((w * seq_rho > SAMPLE_EFFICIENCY_THRESHOLD).astype(jnp.float32)),
            "replay/per_weight_mean": jnp.mean(w),
            "algorithm/kl": ops.masked_mean(ops.kl_penalty(prox, items["ref_logp"], alg.kl_penalty), m),
        }
        aux = {k: jnp.asarray(v, jnp.float32) for k, v in aux.items()}
        return total, (aux, sequence_priority(delta, m, alg.priority_agg))

    return loss_fn


def _where_tree(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def make_train_step(cfg: Any, actor_gd, critic_gd, actor_tx: optax.GradientTransformation,
                    critic_tx: optax.GradientTransformation, *, state_shardings=None, mesh=None):
    """The jitted step ``state -> (state, metrics)`` (donated state; explicit shardings with a mesh)."""
    a, rc, alg = cfg.actor, cfg.replay, cfg.algorithm
    B = a.ppo_mini_batch_size
    mb = a.ppo_micro_batch_size or B
    n_micro = B // mb
    prioritized = rc.sampling == "prioritized"
    beta_steps = rc.beta_steps or cfg.trainer.total_steps
    actor_lr = lr_schedule(a.optim, cfg.trainer.total_steps)
    critic_lr = lr_schedule(cfg.critic.optim, cfg.trainer.total_steps)
    loss_fn = make_loss_fn(cfg, actor_gd, critic_gd)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    pf = cfg.pf_ppo
    reweight = pf.enabled and pf.reweight_method != "none"
    kc = alg.kl_ctrl

    def step(state: TrainState):
        key = jax.random.fold_in(state.rng, state.step)
        k_sample, k_pf = jax.random.split(key)
        beta = replay_lib.linear_beta(state.step, rc.beta0, beta_steps) if prioritized else jnp.float32(0.0)
        smp = replay_lib.sample(state.replay, k_sample, B, beta=beta)
        items, w, idx = smp.items, smp.weights, smp.indices
        if not prioritized:
            w = jnp.ones_like(w)
        if reweight:
            sel = replay_lib.resample_indices(k_pf, replay_lib.batch_reweight(items["score"], pf.reweight_method,
                                                                             pf.weight_pow))
            items = jax.tree.map(lambda x: x[sel], items)
            w, idx = w[sel], idx[sel]

        params = (state.actor, state.critic)
        split = lambda x: x.reshape(n_micro, mb, *x.shape[1:])  # noqa: E731
        xs = (jax.tree.map(split, items), split(w))
        zero = jax.tree.map(jnp.zeros_like, params)

        def body(acc, x):
            (loss, (aux, prio)), g = grad_fn(params, x[0], x[1])
            return jax.tree.map(jnp.add, acc, g), (aux, prio)

        if n_micro == 1:
            (_, (aux, prio)), grads = grad_fn(params, items, w)
            aux = jax.tree.map(lambda x: x[None], aux)
        else:
            gsum, (aux, prio) = jax.lax.scan(body, zero, xs)
            grads = jax.tree.map(lambda g: g / n_micro, gsum)
        metrics = jax.tree.map(jnp.mean, aux)
        prio = prio.reshape(B)

        ga, gc = grads
        gn_a, gn_c = optax.global_norm(ga), optax.global_norm(gc)
        finite = jnp.isfinite(metrics["train/loss"]) & jnp.isfinite(gn_a) & jnp.isfinite(gn_c)

        ua, actor_opt = actor_tx.update(ga, state.actor_opt, state.actor)
        uc, critic_opt = critic_tx.update(gc, state.critic_opt, state.critic)
        ua = jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), ua)
        actor = optax.apply_updates(state.actor, ua)
        critic = optax.apply_updates(state.critic, uc)

        rs = state.replay
        if prioritized:
            rs = replay_lib.update_priorities(rs, idx, prio * items["filter_w"])
        kl_coef = state.kl_coef
        if kc.type == "adaptive":
            kl_coef = ops.adaptive_kl_update(kl_coef, metrics["algorithm/kl"], B, target=kc.target_kl,
                                             horizon=kc.horizon)

        new = state.replace(
            actor=_where_tree(finite, actor, state.actor), actor_opt=_where_tree(finite, actor_opt, state.actor_opt),
            critic=_where_tree(finite, critic, state.critic),
            critic_opt=_where_tree(finite, critic_opt, state.critic_opt),
            replay=_where_tree(finite, rs, state.replay),
            kl_coef=jnp.where(finite, kl_coef, state.kl_coef).astype(jnp.float32),
            nan_total=state.nan_total + (~finite).astype(jnp.int32),
            nan_streak=jnp.where(finite, 0, state.nan_streak + 1).astype(jnp.int32),
            step=state.step + 1,
        )
        filled = (jnp.arange(rs.priorities.shape[0]) < rs.size) & (rs.priorities > 0)
        pr = jnp.where(filled, new.replay.priorities, 0.0)
        metrics.update({
            "actor/grad_norm": gn_a, "critic/grad_norm": gn_c,
            "actor/lr": actor_lr(state.step) * state.lr_scale, "critic/lr": critic_lr(state.step),
            "actor/kl_coef": jnp.float32(a.kl_loss_coef if a.use_kl_loss else 0.0),
            "algorithm/kl_coef": new.kl_coef,
            "replay/priority_mean": pr.sum() / jnp.maximum(filled.sum(), 1),
            "replay/priority_max": pr.max(),
            "replay/beta": beta,
            "train/nan_skipped": (~finite).astype(jnp.float32),
            "train/nan_total": new.nan_total.astype(jnp.float32),
        })
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        return new, metrics

    if state_shardings is None:
        return jax.jit(step, donate_argnums=0)
    rep = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step, donate_argnums=0, in_shardings=(state_shardings,), out_shardings=(state_shardings, rep))
