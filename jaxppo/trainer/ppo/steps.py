"""One jitted, sharded update step ``state -> (state, metrics)`` (docs/design.md, "One update step").

1. Minibatch of ``B = actor.ppo_mini_batch_size`` sequences from the replay buffer, key
   ``fold_in(state.rng, state.step)``: prioritized with ``β = linear_beta(step, β0, beta_steps)``, or
   uniform (``replay.sampling=uniform``: stored priorities are the PF-PPO filter weights, ``β = 0`` so
   ``w_i = 1``). PF-PPO filter weights ``f_i`` under prioritized replay (``jaxppo.replay.filtered``): the
   buffer samples with ``P(i) ∝ f_i·q_i`` (``q_i = (p_i+ε)^α``) and ``w_i = (q_min/q_i)^β`` corrects only the
   priority part, so the expected gradient share ``P(i)·w_i ∝ f_i·q_i^(1−β)`` keeps ``∝ f_i`` at β = 1 (rank
   prioritization: sampled by rank, ``w_i = w_rank,i·f_i/max f``).
   With ``pf_ppo.reweight_method`` (verl's batch-level resampling with replacement, ``P(j) ∝ r_j``) the
   minibatch is NOT gathered: each sampled row carries its resample count ``c_i`` as a loss weight,
   ``c_i·Z`` with ``Z = Σ_i u_i / Σ_i c_i u_i`` (``u_i`` = valid tokens for ``token-mean``, ``[u_i>0]`` for the
   ``seq-mean-*`` modes), so each loss equals the loss of the resampled batch exactly (per micro-batch), and
   every sampled row (count 0 included) gets a fresh priority from the same forward (item 5).
   Statistics metrics (clip fractions, ``is/*``, means) are over the distinct sampled rows.
2. Fresh log-probs/entropy/values; behaviour correction ``ρ = ops.importance_weights(prox, μ)``
   (``importance.enabled=false``: ``ρ = 1``; then ``is/*`` describe the applied weights, all 1, and the
   weights that would be applied are logged as ``is_diag/*``); loss weights ``sg(w_i·c_i·ρ_t)``.
3. Losses: actor ``pg(w·ρ) − c_H·H + c_KL·agg(kl(θ, ref))`` (``c_H = 0``: ``H`` is only logged, computed without
   a backward pass over ``[B,R,V]``), critic ``c_v·vf`` with the value loss
   weighted by the PER weights ``w_i`` (separate models: two independent losses, ``c_v`` only scales
   the critic's gradient; ``critic.share_trunk``: one joint loss, the sum). Gradients are accumulated
   over ``B / ppo_micro_batch_size`` micro-batches (``lax.scan``, mean of micro-batch gradients); each
   model has ``clip_by_global_norm → adamw``. The learning rates are set in the optimizer states before the
   epochs to ``lr_schedule(state.step)`` (``state.step`` counts every step, NaN-skipped ones included), so
   all epochs of a step use the same LR and the schedule advances once per step; ``actor/lr`` (times the
   guards' ``lr_scale``) and ``critic/lr`` are exactly the LRs applied.
   **Epochs**: on the one sampled minibatch the actor takes ``actor.ppo_epochs`` and the critic
   ``critic.ppo_epochs`` consecutive optimizer updates (``lax.scan`` over a static count, so the step
   compiles once); with ``share_trunk`` the joint loss takes ``actor.ppo_epochs`` updates
   (``critic.ppo_epochs`` is unused there). Loss/statistics metrics and gradient norms are means over
   the epochs (and micro-batches); the importance weights use the fixed ``prox_logp``, so ``ρ`` is the
   same in every epoch while the PPO ratio ``π_θ/π_prox`` moves.
4. Non-finite loss or gradient norm in any epoch: the whole step is skipped in-graph (old params, optimizer and
   replay state kept), ``nan_total``/``nan_streak`` count it, metric ``train/nan_skipped`` = 1.
5. Priorities of every sampled slot get the per-sequence ``agg_t|δ_t|`` of the values the critic had at
   the start of its **last** epoch (with one epoch: the values before the update), stored with the filter
   weight as in prepare (``filtered_stored_priority``: ``f·(|δ|+ε)^α``).
6. ``algorithm/kl`` = ``masked_mean(kl(π_θ, ref))`` of the CURRENT policy on the minibatch (the actor's
   fresh log-probs, mean over its epochs; not the prox snapshot's KL, which is constant between
   refreshes); the adaptive KL controller ``β ← ops.adaptive_kl_update(β, algorithm/kl, B, target, horizon)``.

7. Adapter dropout (``model.lora.dropout = p > 0``; ``jaxppo.models.lora_dropout``): only the losses of item 3 run
   the adapters with dropout. Their keys come from the step key: ``k = fold_in(fold_in(state.rng, state.step),
   DROPOUT_STREAM)``, phase ``i`` (actor, critic / the joint loss) ``fold_in(k, i)``, epoch ``e`` ``fold_in(·, e)``,
   micro-batch ``j`` ``fold_in(·, j)`` -- a function of (rng, step) only, so a resumed run draws the masks of an
   uninterrupted one, and (JAX's partitionable threefry) the same on any mesh. ``p = 0``: no key, no random
   operation added to the step.

``replay/sample_efficiency`` = share of the minibatch whose effective weight ``w_i · mean_t ρ_t`` is
above 0.1 (non-negligible contribution to the gradient).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import ops
from jaxppo import replay as replay_lib
from jaxppo.ops.masked import masked_var
from jaxppo.models.lora_dropout import DROPOUT_STREAM
from jaxppo.parallel import batch_divisor
from jaxppo.optim import set_learning_rate
from jaxppo.replay.filtered import filtered_stored_priority, filtered_weights
from jaxppo.trainer.micro import group_micro_order, micro_grads, strided_merge
from jaxppo.trainer.ppo.buffer_types import BufferItem
from jaxppo.trainer.ppo.forward import (
    logp_entropy,
    response_logp_entropy,
    response_logp_entropy_values,
    response_values,
)
from jaxppo.trainer.ppo.hparams import StepHP
from jaxppo.trainer.ppo.prepare import td_residuals
from jaxppo.trainer.ppo.packed import TOKEN_FIELDS, HostPlanned, packed_shardings
from jaxppo.trainer.ppo.state import TrainState
from jaxppo.trainer.ppo.policy_losses import POLICY_LOSSES
from jaxppo.trainer.nan_skip import keep_if_finite, skip_counts, skipped_metric
from jaxppo.trainer.with_base import jit_step


SAMPLE_EFFICIENCY_THRESHOLD = 0.1


def _td_priority(delta, m, agg):
    """``agg_t |δ_t|`` per sequence over the float mask ``m`` -- ``ops.priority_td_error``'s value, written as
    ``Σ|δ|·m / max(Σm, 1)``: inside this fused step the ops form rounds the stored priorities differently by an
    ulp, which changes later PER samples and so every later metric of a run (measured on configs/smoke.yaml)."""
    a = jnp.abs(delta) * m
    if agg == "max":
        return jnp.max(a, axis=-1)
    return a.sum(-1) / jnp.maximum(m.sum(-1), 1.0)


def explained_variance(values, returns, mask):
    """``1 − Var_m(G − V) / Var_m(G)`` (0 when the returns have no variance)."""
    vr = masked_var(returns, mask, unbiased=False)
    return jnp.where(vr > 1e-12, 1.0 - masked_var(returns - values, mask, unbiased=False) / jnp.maximum(vr, 1e-12), 0.0)


def behaviour_weights(hp: StepHP, prox: jax.Array, behaviour: jax.Array, m: jax.Array):
    """``(ρ [B,R] detached, rejection mask [B,R], metrics)`` for ``log_ratio = prox − μ`` (π_prox vs the
    behaviour policy μ).

    ``importance.enabled``: ``ρ = ops.importance_weights`` (``is/*`` metrics; disabled: ``ρ = 1``, ``is/*`` of
    the applied weights and ``is_diag/*`` of those that would be applied). ``rollout_correction.rollout_is``:
    ``ρ = ops.rollout_correction_weights`` (exclusive with ``importance.enabled``, checked in
    ``hparams.step_hparams``); ``rollout_rs``: the keep mask of ``ops.rejection_mask`` (else ``m``). With any
    rollout-correction key set, verl's metrics (IS, rejection and ``ops.offpolicy_metrics``) are logged under
    ``rollout_corr/``.
    """
    ih, rc = hp.importance, hp.rollout_corr
    rho, ism = ops.importance_weights(prox, behaviour, m, level=ih.level, mode=ih.mode, threshold=ih.threshold,
                                      lower=ih.lower, veto=ih.veto, cap_rule=ih.cap_rule)
    rho = jax.lax.stop_gradient(rho) if ih.enabled else jnp.ones_like(m)
    metrics = _is_metrics(ih.enabled, ism)
    keep = m
    if rc.enabled:
        log_ratio = jax.lax.stop_gradient(prox - behaviour)
        corr = dict(ops.offpolicy_metrics(jax.lax.stop_gradient(prox), behaviour, m))
        if rc.is_level is not None:
            rho, isc = ops.rollout_correction_weights(log_ratio, m, level=rc.is_level, threshold=rc.is_threshold,
                                                      batch_normalize=rc.is_batch_normalize)
            rho = jax.lax.stop_gradient(rho)
            corr.update(isc)
        if rc.rs is not None:
            keep, rsm = ops.rejection_mask(log_ratio, m, criteria=rc.rs, threshold=rc.rs_threshold)
            keep = jax.lax.stop_gradient(keep.astype(m.dtype))
            corr.update(rsm)
        metrics.update({f"rollout_corr/{k}": v for k, v in corr.items()})
    return rho, keep, metrics


def _is_metrics(enabled: bool, ism) -> dict:
    """``is/*`` describe the weights applied; with ``importance.enabled=false`` those are all 1 (ESS 1, mean
    and max 1, nothing clipped) and the weights that WOULD be applied are logged as ``is_diag/*``."""
    names = ("ess", "weight_mean", "weight_max", "clipped_frac")
    if enabled:
        return {f"is/{k}": ism[k] for k in names}
    ones = {"ess": 1.0, "weight_mean": 1.0, "weight_max": 1.0, "clipped_frac": 0.0}
    return {**{f"is/{k}": jnp.float32(ones[k]) for k in names}, **{f"is_diag/{k}": ism[k] for k in names}}


def count_weights(counts: jax.Array | None, mask: jax.Array, agg: str) -> jax.Array:
    """``[B, 1]`` loss weights ``c_i·Z`` that make ``agg`` over the distinct rows equal ``agg`` over the batch in
    which row ``i`` appears ``c_i`` times: ``Z = Σ_i u_i / Σ_i c_i u_i`` with ``u_i = Σ_t m_it`` (token-mean) or
    ``[Σ_t m_it > 0]`` (seq-mean-*); ``Z = 0`` when ``Σ c_i u_i = 0``. ``counts=None``: all 1."""
    if counts is None:
        return jnp.ones((mask.shape[0], 1), jnp.float32)
    n = mask.astype(jnp.float32).sum(-1)
    u = n if agg == "token-mean" else (n > 0).astype(jnp.float32)
    c = counts.astype(jnp.float32)
    den = jnp.sum(c * u)
    z = jnp.where(den > 0, jnp.sum(u) / jnp.where(den > 0, den, 1.0), 0.0)
    return (c * z)[:, None]


def actor_terms(hp: StepHP, logits: jax.Array, batch: BufferItem, w: jax.Array, counts: jax.Array | None = None):
    """:func:`token_actor_terms` of the log-probs and entropies (``forward.logp_entropy``) of response logits
    ``[B,R,V]``."""
    d = batch.data
    logp, ent = logp_entropy(logits, d.response_ids, d.response_mask, entropy_grad=hp.actor.entropy_coeff != 0)
    return token_actor_terms(hp, logp, ent, batch, w, counts)


def token_actor_terms(hp: StepHP, logp: jax.Array, ent: jax.Array, batch: BufferItem, w: jax.Array,
                      counts: jax.Array | None = None):
    """``(pg(w·c·ρ; m·k) − c_H·H_c + c_KL·agg_c(kl(θ, ref)), metrics)`` from the response tokens' log-probs
    ``logp`` and entropies ``ent`` ``[B,R]`` (0 outside the response mask) of the minibatch ``batch``
    (``[B, ...]`` leaves) with PER weights ``w`` ``[B]``.

    ``pg`` is the policy loss ``hp.actor.policy_loss`` (``registry.POLICY_LOSSES``; "ppo": clip + dual clip)
    with the detached weights ``w_i·c_i·ρ_t`` (``c``: :func:`count_weights` of the PF-PPO resample ``counts``
    ``[B]``, all 1 when ``None``; ``ρ`` and the rejection keep-mask ``k`` from :func:`behaviour_weights`); every
    loss term is aggregated over ``m·k`` (``m`` the response mask). ``algorithm/kl`` is the current policy's
    ``masked_mean(kl(π_θ, ref))`` over ``m``. Without a critic the data metrics are ``data/score/mean`` and
    ``actor/advantages/mean`` (no ``critic/*``). ``waste/zero_grad_token_frac``: the share of the minibatch's
    response tokens (``m``) whose policy-loss term has no gradient, i.e. outside ``m·k`` or counted by the loss's
    ``pg_zero_grad_frac`` (zero advantage, clipped branch, zero weight).
    """
    a = hp.actor
    d, pr = batch.data, batch.prepared
    m = d.response_mask.astype(jnp.float32)
    prox = pr.prox_logp
    rho, keep, ism = behaviour_weights(hp, prox, d.behaviour_logprobs, m)
    ml = m * keep
    cw = count_weights(counts, ml, a.agg)
    weights = jax.lax.stop_gradient(w[:, None] * cw * rho)
    pg_loss, pgm = POLICY_LOSSES.get(a.policy_loss)(logp, prox, pr.advantages, ml, a, weights)
    entropy = ops.aggregate(ent * cw, ml, a.agg)
    kl_loss = ops.aggregate(ops.kl_penalty(logp, d.ref_logp, a.kl_loss_type) * cw, ml, a.agg)
    total = pg_loss - a.entropy_coeff * entropy if a.entropy_coeff != 0 else pg_loss  # c_H = 0: H logged only
    if a.use_kl_loss:
        total = total + a.kl_loss_coef * kl_loss
    seq_rho = (rho * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    waste = {}
    if "pg_zero_grad_frac" in pgm:   # tokens masked out of the loss (rejection, keep = 0) have no gradient either
        n_m = jnp.maximum(m.sum(), 1.0)
        waste["waste/zero_grad_token_frac"] = (pgm["pg_zero_grad_frac"] * ml.sum() + (m - ml).sum()) / n_m
    data_prefix = ("critic/advantages/mean", "critic/score/mean") if hp.critic is not None else (
        "actor/advantages/mean", "data/score/mean")
    aux = {
        "actor/pg_loss": pg_loss, "actor/pg_clipfrac": pgm["pg_clipfrac"],
        "actor/pg_clipfrac_lower": pgm["pg_clipfrac_lower"], "actor/ppo_kl": pgm["ppo_kl"],
        "actor/entropy": entropy, "actor/kl_loss": kl_loss,
        data_prefix[0]: ops.masked_mean(pr.advantages, m),
        data_prefix[1]: jnp.mean(d.score),
        "response_length/mean": jnp.mean(m.sum(-1)),
        **ism, **waste,
        "replay/sample_efficiency": jnp.mean((w * seq_rho > SAMPLE_EFFICIENCY_THRESHOLD).astype(jnp.float32)),
        "replay/per_weight_mean": jnp.mean(w),
        "algorithm/kl": ops.masked_mean(ops.kl_penalty(jax.lax.stop_gradient(logp), d.ref_logp, a.kl_penalty), m),
    }
    return total, aux


def critic_terms(hp: StepHP, values: jax.Array, batch: BufferItem, w: jax.Array, counts: jax.Array | None = None):
    """``(vf_loss (weighted by w·c, clipped), metrics, priority [B] = agg_t|δ_t| of these values)`` for the fresh
    ``values`` ``[B,R]`` of ``batch`` (``c``: :func:`count_weights` of the PF-PPO resample ``counts``, 1 if None)."""
    c = hp.critic
    pr = batch.prepared
    m = batch.data.response_mask.astype(jnp.float32)
    values = values * m
    cw = count_weights(counts, m, c.agg)
    vf_loss, vfm = ops.value_loss(values, pr.values, pr.returns, m, clip=c.cliprange_value,
                                  agg=c.agg, weights=jax.lax.stop_gradient(w[:, None] * cw))
    sv = jax.lax.stop_gradient(values)
    delta = td_residuals(pr.token_rewards, sv, m, c.gamma)
    aux = {
        "critic/vf_loss": vf_loss, "critic/vf_clipfrac": vfm["vf_clipfrac"],
        "critic/vf_explained_var": explained_variance(sv, pr.returns, m),
        "critic/values/mean": ops.masked_mean(sv, m),
        "critic/returns/mean": ops.masked_mean(pr.returns, m),
    }
    return vf_loss, aux, _td_priority(delta, m, c.priority_agg)


def _f32(aux):
    return {k: jnp.asarray(v, jnp.float32) for k, v in aux.items()}


class Phase(NamedTuple):
    """One optimised loss of the step: the ``TrainState`` fields it updates, its loss, its epoch count.

    ``loss_fn(params: tuple, batch: BufferItem, w [B], counts [B] or None, key=None) -> (loss, (aux, priority [B] or
    None))`` with ``params`` the fields' values in ``fields`` order; ``aux["_loss"]`` is the loss itself (NaN check);
    ``key``: the adapter-dropout key of this micro-batch (None: no dropout).
    """
    fields: tuple[str, ...]
    loss_fn: Callable
    epochs: int


def make_phases(hp: StepHP, actor_gd, critic_gd, base=None) -> list[Phase]:
    """Separate models: an actor phase (``actor.ppo_epochs``) and a critic phase (``critic.ppo_epochs``,
    loss ``c_v·vf``). ``share_trunk``: one joint phase ``pg − c_H·H + c_KL·kl + c_v·vf`` over (trunk+LM
    head, value head) with ``actor.ppo_epochs`` epochs (every joint update moves the policy, so the
    policy's epoch count governs; ``critic.ppo_epochs`` is not used). Critic-free (``hp.critic is None``):
    the actor phase only. ``base``: the frozen base of models with adapters (a constant of every loss: no
    gradient reaches it)."""
    c = hp.critic
    n = hp.replay.group_size      # > 1: the minibatch is whole prompt groups, each prompt through the trunk once

    entropy_grad = hp.actor.entropy_coeff != 0

    def actor_loss(params, batch, w, counts, key=None):
        logp, ent = response_logp_entropy(actor_gd, params[0], batch.data, base=base, lora_key=key, group_size=n,
                                          packed=batch.packed, entropy_grad=entropy_grad)
        la, aux = token_actor_terms(hp, logp, ent, batch, w, counts)
        return la, (_f32({**aux, "_loss": la}), None)

    if c is None:
        return [Phase(("actor",), actor_loss, hp.actor_epochs)]
    if c.share_trunk:
        def joint(params, batch, w, counts, key=None):
            (logp, ent), values = response_logp_entropy_values(
                actor_gd, params[0], critic_gd, params[1], batch.data, share_trunk=True, base=base, lora_key=key,
                group_size=n, packed=batch.packed, entropy_grad=entropy_grad)
            la, aux_a = token_actor_terms(hp, logp, ent, batch, w, counts)
            vf, aux_c, prio = critic_terms(hp, values, batch, w, counts)
            total = la + c.vf_coef * vf
            return total, (_f32({**aux_a, **aux_c, "_loss": total}), prio)
        return [Phase(("actor", "critic"), joint, hp.actor_epochs)]

    def critic_loss(params, batch, w, counts, key=None):
        vf, aux, prio = critic_terms(hp, response_values(critic_gd, params[0], batch.data, base=base, lora_key=key,
                                                         group_size=n, packed=batch.packed), batch, w, counts)
        lc = c.vf_coef * vf
        return lc, (_f32({**aux, "_loss": lc}), prio)

    return [Phase(("actor",), actor_loss, hp.actor_epochs),
            Phase(("critic",), critic_loss, hp.critic_epochs)]


def make_update(loss_fn: Callable, txs: tuple, n_micro: int, *, mesh=None):
    """One optimizer update of ``loss_fn`` on a minibatch:
    ``(params, opts, batch, w, counts, key=None) -> (params, opts, aux, priority, grad_norms)``.

    Gradients are the mean over ``n_micro`` equal micro-batches (``lax.scan``); metrics are the mean
    over micro-batches; ``grad_norms`` are the global norms of each field's accumulated gradient
    (before clipping). The guards' LR cut is in each optimizer's injected learning rate (``set_learning_rate``).
    Micro-batches are strided (``jaxppo.trainer.micro.micro_grads``: micro-batch ``j`` = rows ``j, j+n, ...``); the
    priority vector comes back in the minibatch's row order. With ``mesh`` every micro-batch is constrained to be
    split over the batch axes. ``key`` (adapter dropout): micro-batch ``j``'s loss gets ``fold_in(key, j)``.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def grads(params, batch, w, counts, key):
        def one(p, *x):
            (_, aux), g = grad_fn(p, *x)
            return g, aux

        g, (aux, prio) = micro_grads(one, params, (batch, w, counts), n_micro, mesh, key=key)
        return g, jax.tree.map(jnp.mean, aux), (None if prio is None else strided_merge(prio))

    def update(params, opts, batch, w, counts, key=None):
        g, aux, prio = grads(params, batch, w, counts, key)
        new_p, new_o, norms = [], [], []
        for p, o, gi, tx in zip(params, opts, g, txs):
            norms.append(optax.global_norm(gi))
            u, o = tx.update(gi, o, p)
            new_p.append(optax.apply_updates(p, u))
            new_o.append(o)
        return tuple(new_p), tuple(new_o), aux, prio, tuple(norms)

    return update


def run_epochs(update: Callable, epochs: int, params, opts, batch, w, counts=None, key=None):
    """``epochs`` consecutive ``update`` calls on the same minibatch (``lax.scan``, static count).

    Returns ``(params, opts, aux, priority, grad_norms, finite)``: metrics and gradient norms are
    means over the epochs, the priority is the one of the **last** epoch (the |δ| of the values
    before that epoch's update), ``finite`` is true when every epoch's loss and gradient norms were.
    ``key`` (adapter dropout): epoch ``e`` updates with ``fold_in(key, e)``.
    """
    def ok(aux, norms):
        return jnp.all(jnp.isfinite(aux["_loss"])) & functools.reduce(
            jnp.logical_and, [jnp.all(jnp.isfinite(n)) for n in norms])

    def epoch_key(e):
        return () if key is None else (jax.random.fold_in(key, e),)

    if epochs == 1:
        p, o, aux, prio, norms = update(params, opts, batch, w, counts, *epoch_key(0))
        return p, o, aux, prio, norms, ok(aux, norms)

    def body(carry, e):
        p, o, aux, prio, norms = update(*carry, batch, w, counts, *epoch_key(e))
        return (p, o), (aux, prio, norms)

    xs = None if key is None else jnp.arange(epochs)
    (p, o), (aux, prio, norms) = jax.lax.scan(body, (params, opts), xs, length=epochs)
    finite = ok(aux, norms)
    aux = jax.tree.map(jnp.mean, aux)
    return p, o, aux, (None if prio is None else prio[-1]), tuple(jnp.mean(n) for n in norms), finite


_GRAD_NORM_KEYS = {"actor": "actor/grad_norm", "critic": "critic/grad_norm"}


def make_train_step(hp: StepHP, actor_gd, critic_gd, actor_tx: optax.GradientTransformation,
                    critic_tx: optax.GradientTransformation | None, actor_lr: optax.Schedule,
                    critic_lr: optax.Schedule | None = None, *, state_shardings=None, mesh=None, base=None,
                    packed: bool = False):
    """The jitted step ``state -> (state, metrics)`` (donated state; explicit shardings with a mesh).

    ``hp``: the config's ``hparams.step_hparams``; ``actor_lr`` / ``critic_lr``: the learning-rate schedules of the
    two optimizers (``optim.lr_schedule``; the step sets each optimizer's rate to ``lr(state.step)``, the actor's
    times ``state.lr_scale``). Critic-free (``hp.critic is None``): no critic
    phase, no ``critic/*`` metrics, ``state.critic`` stays None. With adapters, ``base`` is the frozen base
    (``jaxppo.models.adapters``): the jitted function takes it as a second, non-donated argument and the
    returned callable (:class:`WithBase`) binds it, so callers still call ``step(state)``.

    ``packed``: the jitted step is ``(state, plan)`` with ``plan`` the packed layout of the minibatch it draws
    (:func:`jaxppo.trainer.ppo.packed.plan_pieces` of the token fields :func:`make_draw_tokens` returns for the
    same state), wrapped in :class:`jaxppo.trainer.ppo.packed.HostPlanned` so callers still call ``step(state)``;
    the trunk runs on the packed rows, the losses and metrics are those of the padded layout.
    """
    if hp.critic is not None and (critic_tx is None or critic_lr is None):
        raise ValueError("a step with a critic (hp.critic) needs critic_tx and critic_lr")
    rh, pf = hp.replay, hp.pf
    B, n_micro = hp.mini_batch, hp.mini_batch // hp.micro_batch
    prioritized = rh.prioritized
    td_priority = rh.priority == "td_error"
    txs = {"actor": actor_tx, "critic": critic_tx}
    opt_field = {"actor": "actor_opt", "critic": "critic_opt"}
    kc, drop_rate = hp.kl_ctrl, hp.lora_dropout

    def step_with(state: TrainState, plan, frozen):
        phases = [(ph, make_update(ph.loss_fn, tuple(txs[f] for f in ph.fields), n_micro, mesh=mesh))
                  for ph in make_phases(hp, actor_gd, critic_gd, frozen)]
        key, k_pf, beta, smp = draw_minibatch(hp, state)
        batch: BufferItem = smp.items.replace(packed=plan)
        idx = smp.indices
        if prioritized:
            w = filtered_weights(state.replay, smp, state.replay.storage.data.filter_w, beta)
        else:
            w = jnp.ones_like(smp.weights)
        if rh.group_size > 1:       # row i of a drawn group: s_i = n·m_i/m_g (replay.buffer), E[gradient] of rows
            w = w * smp.group_share
        w_stats = {"replay/per_weight_min": jnp.min(w), "replay/per_weight_max": jnp.max(w)}
        counts = None
        if pf.reweight:     # verl's resample, as per-row counts (module docstring, item 1)
            sel = replay_lib.resample_indices(k_pf, replay_lib.batch_reweight(batch.data.score, pf.reweight_method,
                                                                             pf.weight_pow))
            counts = jnp.zeros((B,), jnp.float32).at[sel].add(1.0)
        lrs = {"actor": actor_lr(state.step), "critic": None if critic_lr is None else critic_lr(state.step)}
        applied = {"actor": lrs["actor"] * state.lr_scale, "critic": lrs["critic"]}   # the guards' LR cut

        new_fields, metrics, finite, prio, loss = {}, {}, jnp.bool_(True), None, jnp.float32(0.0)
        k_drop = jax.random.fold_in(key, DROPOUT_STREAM) if drop_rate > 0 else None   # item 7
        for i, (ph, update) in enumerate(phases):
            params = tuple(getattr(state, f) for f in ph.fields)
            opts = tuple(set_learning_rate(getattr(state, opt_field[f]), applied[f]) for f in ph.fields)
            ph_key = None if k_drop is None else jax.random.fold_in(k_drop, i)
            p, o, aux, ph_prio, norms, ok = run_epochs(update, ph.epochs, params, opts, batch, w, counts, ph_key)
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
            if td_priority:    # fresh |δ| of every sampled slot; other priorities only change at a refresh
                rs = replay_lib.set_priorities(rs, idx, filtered_stored_priority(rs, prio, batch.data.filter_w),
                                               refresh=False)
            rs = replay_lib.record_sample(rs, idx)    # staleness decay (replay.decay), one count per draw
        kl_coef = state.kl_coef
        if kc.adaptive:
            kl_coef = ops.adaptive_kl_update(kl_coef, metrics["algorithm/kl"], B, target=kc.target_kl,
                                             horizon=kc.horizon)

        new = state.replace(
            **{f: keep_if_finite(finite, v, getattr(state, f)) for f, v in new_fields.items()},
            replay=keep_if_finite(finite, rs, state.replay),
            kl_coef=jnp.where(finite, kl_coef, state.kl_coef).astype(jnp.float32),
            **skip_counts(state, finite),
            step=state.step + 1,
        )
        rm = replay_lib.metrics(new.replay)
        metrics.update({
            "actor/lr": applied["actor"],
            "actor/kl_coef": jnp.float32(hp.actor.kl_loss_coef if hp.actor.use_kl_loss else 0.0),
            "algorithm/kl_coef": new.kl_coef,
            "replay/priority_mean": rm["priority_mean"], "replay/priority_max": rm["priority_max"],
            "replay/floor_fraction": rm["floor_fraction"],
            "replay/weight_clipped_fraction": rm["weight_clipped_fraction"],
            "replay/beta": beta, **w_stats,
            "train/nan_skipped": skipped_metric(finite),
            "train/nan_total": new.nan_total.astype(jnp.float32),
        })
        if hp.critic is not None:
            metrics["critic/lr"] = lrs["critic"]
        if prioritized and new.replay.decay != "none":
            sm = replay_lib.staleness_metrics(new.replay)
            metrics.update({f"replay/{k}": sm[k] for k in ("sample_count_mean", "sample_count_max", "age_mean")
                            if k in sm})
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        return new, metrics

    if not packed:
        def step(state: TrainState, frozen=None):
            return step_with(state, None, frozen)

        return jit_step(step, state_shardings, mesh, base, out_scalars=True)

    def packed_step(state: TrainState, plan, frozen=None):
        return step_with(state, plan, frozen)

    plan_shardings = packed_shardings(mesh, branches=rh.group_size > 1) if state_shardings is not None else None
    jitted = jit_step(packed_step, state_shardings, mesh, base, out_scalars=True,
                      **({} if plan_shardings is None else {"batch_shardings": plan_shardings}))
    return HostPlanned(jitted, make_draw_tokens(hp, mesh), B // n_micro, rows=B, name="packed update",
                       multiple_of=1 if mesh is None else batch_divisor(mesh), shardings=plan_shardings,
                       group_size=rh.group_size)


def draw_minibatch(hp: StepHP, state: TrainState, *, micro_order: bool = True):
    """``(key, k_pf, beta, sample)``: the step's key ``fold_in(state.rng, state.step)``, its PF-PPO key, the PER
    ``beta`` and the drawn minibatch (``replay.sample`` of ``hp.mini_batch`` rows; with ``replay.group_size > 1``
    reordered so every strided micro-batch holds whole groups, unless ``micro_order`` is False: then in group order)
    — a function of the state alone."""
    rh = hp.replay
    key = jax.random.fold_in(state.rng, state.step)
    k_sample, k_pf = jax.random.split(key)
    beta = replay_lib.linear_beta(state.step, rh.beta0, rh.beta_steps) if rh.prioritized else jnp.float32(0.0)
    smp = replay_lib.sample(state.replay, k_sample, hp.mini_batch, beta=beta, group_size=rh.group_size)
    perm = group_micro_order(hp.mini_batch, rh.group_size, hp.mini_batch // hp.micro_batch)
    if perm is not None and micro_order:   # whole groups inside every strided micro-batch (group_micro_order)
        smp = jax.tree.map(lambda x: x[perm], smp)
    return key, k_pf, beta, smp


def make_draw_tokens(hp: StepHP, mesh=None):
    """Jitted ``state -> {prompt_ids, prompt_mask, response_ids, response_mask}`` of the minibatch the step draws
    from ``state`` (:func:`draw_minibatch`; whole groups in group order, as ``plan_pieces(..., group_size)`` reads
    them), replicated so every process reads it whole."""
    def tokens(state):
        data = draw_minibatch(hp, state, micro_order=False)[3].items.data
        return {k: getattr(data, k) for k in TOKEN_FIELDS}

    if mesh is None:
        return jax.jit(tokens)
    return jax.jit(tokens, out_shardings=NamedSharding(mesh, PartitionSpec()))
