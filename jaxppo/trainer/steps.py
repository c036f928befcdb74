"""One jitted, sharded update step ``state -> (state, metrics)`` (DESIGN.md §3 "Each update step").

1. Minibatch of ``B = actor.ppo_mini_batch_size`` sequences from the replay buffer, key
   ``fold_in(state.rng, state.step)``: prioritized with ``β = linear_beta(step, β0, beta_steps)``, or
   uniform (``replay.sampling=uniform``: stored priorities are the PF-PPO filter weights, ``β = 0`` so
   ``w_i = 1``). With ``pf_ppo.reweight_method`` the minibatch is resampled with verl's batch weights.
2. Fresh log-probs/entropy/values; behaviour correction ``ρ = ops.importance_weights(prox, μ)``
   (``importance.enabled=false``: ``ρ = 1``); loss weights ``sg(w_i·ρ_t)``.
3. Losses: actor ``pg(w·ρ) − c_H·H + c_KL·agg(kl(θ, ref))``, critic ``c_v·vf`` with the value loss
   weighted by the PER weights ``w_i`` (separate models: two independent losses, ``c_v`` only scales
   the critic's gradient; ``critic.share_trunk``: one joint loss, the sum). Gradients are accumulated
   over ``B / ppo_micro_batch_size`` micro-batches (``lax.scan``, mean of micro-batch gradients); each
   model has ``clip_by_global_norm → adamw``.
   **Epochs**: on the one sampled minibatch the actor takes ``actor.ppo_epochs`` and the critic
   ``critic.ppo_epochs`` consecutive optimizer updates (``lax.scan`` over a static count, so the step
   compiles once); with ``share_trunk`` the joint loss takes ``actor.ppo_epochs`` updates
   (``critic.ppo_epochs`` is unused there). Loss/statistics metrics and gradient norms are means over
   the epochs (and micro-batches); the importance weights use the fixed ``prox_logp``, so ``ρ`` is the
   same in every epoch while the PPO ratio ``π_θ/π_prox`` moves.
4. Non-finite loss or gradient norm in any epoch: the whole step is skipped in-graph (old params, optimizer and
   replay state kept), ``nan_total``/``nan_streak`` count it, metric ``train/nan_skipped`` = 1.
5. Priorities of the sampled slots get the per-sequence ``agg_t|δ_t|`` (times the filter weight) of the
   values the critic had at the start of its **last** epoch (with one epoch: the values before the update).
6. Adaptive KL controller: ``β ← ops.adaptive_kl_update(β, kl(prox, ref), B, target, horizon)``.

``replay/sample_efficiency`` = share of the minibatch whose effective weight ``w_i · mean_t ρ_t`` is
above 0.1 (non-negligible contribution to the gradient).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import ops
from jaxppo import replay as replay_lib
from jaxppo.trainer.forward import logp_entropy, response_logits, response_logits_values, response_values
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


def actor_terms(cfg: Any, logits: jax.Array, items, w: jax.Array):
    """``(pg(w·ρ) − c_H·H + c_KL·agg(kl(θ, ref)), metrics)`` from response logits ``[B,R,V]``."""
    a, alg = cfg.actor, cfg.algorithm
    m = items["response_mask"].astype(jnp.float32)
    logp, ent = logp_entropy(logits, items["response_ids"], items["response_mask"])
    prox = items["prox_logp"]
    rho, ism = _importance(cfg, prox, items["behaviour_logprobs"], m)
    weights = jax.lax.stop_gradient(w[:, None] * rho)
    pg_loss, pgm = ops.policy_loss(logp, prox, items["advantages"], m, clip_low=a.clip_low,
                                   clip_high=a.clip_high, clip_c=a.clip_ratio_c, agg=a.loss_agg_mode,
                                   weights=weights)
    entropy = ops.aggregate(ent, m, a.loss_agg_mode)
    kl_loss = ops.aggregate(ops.kl_penalty(logp, items["ref_logp"], a.kl_loss_type), m, a.loss_agg_mode)
    total = pg_loss - a.entropy_coeff * entropy
    if a.use_kl_loss:
        total = total + a.kl_loss_coef * kl_loss
    seq_rho = (rho * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    aux = {
        "actor/pg_loss": pg_loss, "actor/pg_clipfrac": pgm["pg_clipfrac"],
        "actor/pg_clipfrac_lower": pgm["pg_clipfrac_lower"], "actor/ppo_kl": pgm["ppo_kl"],
        "actor/entropy": entropy, "actor/kl_loss": kl_loss,
        "critic/advantages/mean": ops.masked_mean(items["advantages"], m),
        "critic/score/mean": jnp.mean(items["score"]),
        "response_length/mean": jnp.mean(m.sum(-1)),
        "is/ess": ism["ess"], "is/weight_mean": ism["weight_mean"], "is/weight_max": ism["weight_max"],
        "is/clipped_frac": ism["clipped_frac"],
        "replay/sample_efficiency": jnp.mean((w * seq_rho > SAMPLE_EFFICIENCY_THRESHOLD).astype(jnp.float32)),
        "replay/per_weight_mean": jnp.mean(w),
        "algorithm/kl": ops.masked_mean(ops.kl_penalty(prox, items["ref_logp"], alg.kl_penalty), m),
    }
    return total, aux


def critic_terms(cfg: Any, values: jax.Array, items, w: jax.Array):
    """``(vf_loss (PER-weighted, clipped), metrics, priority [B] = agg_t|δ_t| of these values)``."""
    c, alg = cfg.critic, cfg.algorithm
    m = items["response_mask"].astype(jnp.float32)
    values = values * m
    vf_loss, vfm = ops.value_loss(values, items["values"], items["returns"], m, clip=c.cliprange_value,
                                  agg=c.loss_agg_mode, weights=jax.lax.stop_gradient(w[:, None]))
    sv = jax.lax.stop_gradient(values)
    delta = td_residuals(items["token_rewards"], sv, m, alg.gamma)
    aux = {
        "critic/vf_loss": vf_loss, "critic/vf_clipfrac": vfm["vf_clipfrac"],
        "critic/vf_explained_var": explained_variance(sv, items["returns"], m),
        "critic/values/mean": ops.masked_mean(sv, m),
        "critic/returns/mean": ops.masked_mean(items["returns"], m),
    }
    return vf_loss, aux, sequence_priority(delta, m, alg.priority_agg)


def _f32(aux):
    return {k: jnp.asarray(v, jnp.float32) for k, v in aux.items()}


class Phase(NamedTuple):
    """One optimised loss of the step: the ``TrainState`` fields it updates, its loss, its epoch count.

    ``loss_fn(params: tuple, items, w) -> (loss, (aux, priority [B] or None))`` with ``params`` the
    fields' values in ``fields`` order; ``aux["_loss"]`` is the loss itself (for the NaN check).
    """
    fields: tuple[str, ...]
    loss_fn: Callable
    epochs: int


def make_phases(cfg: Any, actor_gd, critic_gd) -> list[Phase]:
    """Separate models: an actor phase (``actor.ppo_epochs``) and a critic phase (``critic.ppo_epochs``,
    loss ``c_v·vf``). ``share_trunk``: one joint phase ``pg − c_H·H + c_KL·kl + c_v·vf`` over (trunk+LM
    head, value head) with ``actor.ppo_epochs`` epochs (every joint update moves the policy, so the
    policy's epoch count governs; ``critic.ppo_epochs`` is not used)."""
    c = cfg.critic
    if c.share_trunk:
        def joint(params, items, w):
            logits, values = response_logits_values(actor_gd, params[0], critic_gd, params[1], items,
                                                    share_trunk=True)
            la, aux_a = actor_terms(cfg, logits, items, w)
            vf, aux_c, prio = critic_terms(cfg, values, items, w)
            total = la + c.vf_coef * vf
            return total, (_f32({**aux_a, **aux_c, "_loss": total}), prio)
        return [Phase(("actor", "critic"), joint, cfg.actor.ppo_epochs)]

    def actor_loss(params, items, w):
        la, aux = actor_terms(cfg, response_logits(actor_gd, params[0], items), items, w)
        return la, (_f32({**aux, "_loss": la}), None)

    def critic_loss(params, items, w):
        vf, aux, prio = critic_terms(cfg, response_values(critic_gd, params[0], items), items, w)
        lc = c.vf_coef * vf
        return lc, (_f32({**aux, "_loss": lc}), prio)

    return [Phase(("actor",), actor_loss, cfg.actor.ppo_epochs),
            Phase(("critic",), critic_loss, c.ppo_epochs)]


def make_update(loss_fn: Callable, txs: tuple, n_micro: int):
    """One optimizer update of ``loss_fn`` on a minibatch:
    ``(params, opts, scales, items, w) -> (params, opts, aux, priority, grad_norms)``.

    Gradients are the mean over ``n_micro`` equal micro-batches (``lax.scan``); metrics are the mean
    over micro-batches; ``grad_norms`` are the global norms of each field's accumulated gradient
    (before clipping); ``scales[i]`` (or None) multiplies field ``i``'s optimizer update (the LR cut).
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def grads(params, items, w):
        if n_micro == 1:
            (_, (aux, prio)), g = grad_fn(params, items, w)
            return g, aux, prio
        b = w.shape[0]
        split = lambda x: x.reshape(n_micro, b // n_micro, *x.shape[1:])  # noqa: E731

        def body(acc, x):
            (_, (aux, prio)), g = grad_fn(params, x[0], x[1])
            return jax.tree.map(jnp.add, acc, g), (aux, prio)

        gsum, (aux, prio) = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params),
                                         (jax.tree.map(split, items), split(w)))
        aux = jax.tree.map(jnp.mean, aux)
        return jax.tree.map(lambda g: g / n_micro, gsum), aux, (None if prio is None else prio.reshape(b))

    def update(params, opts, scales, items, w):
        g, aux, prio = grads(params, items, w)
        new_p, new_o, norms = [], [], []
        for p, o, gi, tx, sc in zip(params, opts, g, txs, scales):
            norms.append(optax.global_norm(gi))
            u, o = tx.update(gi, o, p)
            if sc is not None:
                u = jax.tree.map(lambda x: x * sc.astype(x.dtype), u)
            new_p.append(optax.apply_updates(p, u))
            new_o.append(o)
        return tuple(new_p), tuple(new_o), aux, prio, tuple(norms)

    return update


def run_epochs(update: Callable, epochs: int, params, opts, scales, items, w):
    """``epochs`` consecutive ``update`` calls on the same minibatch (``lax.scan``, static count).

    Returns ``(params, opts, aux, priority, grad_norms, finite)``: metrics and gradient norms are
    means over the epochs, the priority is the one of the **last** epoch (the |δ| of the values
    before that epoch's update), ``finite`` is true when every epoch's loss and gradient norms were.
    """
    def ok(aux, norms):
        return jnp.all(jnp.isfinite(aux["_loss"])) & functools.reduce(
            jnp.logical_and, [jnp.all(jnp.isfinite(n)) for n in norms])

    if epochs == 1:
        p, o, aux, prio, norms = update(params, opts, scales, items, w)
        return p, o, aux, prio, norms, ok(aux, norms)

    def body(carry, _):
        p, o, aux, prio, norms = update(*carry, scales, items, w)
        return (p, o), (aux, prio, norms)

    (p, o), (aux, prio, norms) = jax.lax.scan(body, (params, opts), None, length=epochs)
    finite = ok(aux, norms)
    aux = jax.tree.map(jnp.mean, aux)
    return p, o, aux, (None if prio is None else prio[-1]), tuple(jnp.mean(n) for n in norms), finite


def _where_tree(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


_GRAD_NORM_KEYS = {"actor": "actor/grad_norm", "critic": "critic/grad_norm"}


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
    txs = {"actor": actor_tx, "critic": critic_tx}
    opt_field = {"actor": "actor_opt", "critic": "critic_opt"}
    phases = [(ph, make_update(ph.loss_fn, tuple(txs[f] for f in ph.fields), n_micro))
              for ph in make_phases(cfg, actor_gd, critic_gd)]
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

        new_fields, metrics, finite, prio, loss = {}, {}, jnp.bool_(True), None, jnp.float32(0.0)
        for ph, update in phases:
            params = tuple(getattr(state, f) for f in ph.fields)
            opts = tuple(getattr(state, opt_field[f]) for f in ph.fields)
            scales = tuple(state.lr_scale if f == "actor" else None for f in ph.fields)
            p, o, aux, ph_prio, norms, ok = run_epochs(update, ph.epochs, params, opts, scales, items, w)
            for f, pi, oi, n in zip(ph.fields, p, o, norms):
                new_fields[f], new_fields[opt_field[f]] = pi, oi
                metrics[_GRAD_NORM_KEYS[f]] = n
            loss = loss + aux.pop("_loss")
            metrics.update(aux)
            finite = finite & ok
            if ph_prio is not None:
                prio = ph_prio
        metrics["train/loss"] = loss

        rs = state.replay
        if prioritized:
            rs = replay_lib.update_priorities(rs, idx, prio * items["filter_w"])
        kl_coef = state.kl_coef
        if kc.type == "adaptive":
            kl_coef = ops.adaptive_kl_update(kl_coef, metrics["algorithm/kl"], B, target=kc.target_kl,
                                             horizon=kc.horizon)

        new = state.replace(
            **{f: _where_tree(finite, v, getattr(state, f)) for f, v in new_fields.items()},
            replay=_where_tree(finite, rs, state.replay),
            kl_coef=jnp.where(finite, kl_coef, state.kl_coef).astype(jnp.float32),
            nan_total=state.nan_total + (~finite).astype(jnp.int32),
            nan_streak=jnp.where(finite, 0, state.nan_streak + 1).astype(jnp.int32),
            step=state.step + 1,
        )
        rm = replay_lib.metrics(new.replay)
        metrics.update({
            "actor/lr": actor_lr(state.step) * state.lr_scale, "critic/lr": critic_lr(state.step),
            "actor/kl_coef": jnp.float32(a.kl_loss_coef if a.use_kl_loss else 0.0),
            "algorithm/kl_coef": new.kl_coef,
            "replay/priority_mean": rm["priority_mean"], "replay/priority_max": rm["priority_max"],
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
