"""DPO train state, minibatch order and the jitted update step (pure functions over explicit pytrees).

Layout of a batch of ``B`` pairs: ``prompt_ids``/``prompt_mask`` [B, P] (left padded), ``chosen_ids``/
``chosen_mask`` and ``rejected_ids``/``rejected_mask`` [B, R] (right padded), ``ref_chosen``/``ref_rejected`` [B]
(the frozen reference's summed response log-probs, computed once and cached). The policy's summed log-probs come
from ONE forward in which each pair's prompt runs through the trunk once and its chosen and rejected answers both
attend to it (``CausalLM.shared_prefix_logprobs``: ``[B, P+2R]`` instead of the ``[2B, P+R]`` stack
``concat(prompt, chosen)``, ``concat(prompt, rejected)``, which gives the same log-probs; with adapter dropout the
stack is kept, since its masks are drawn per row)::

    logp_seq(y | x) = sum_t m_t · log π(y_t | x, y_<t)          (m = the answer's mask)

and the loss is ``mean_pairs dpo_loss(...)`` (``jaxppo.ops.dpo_loss``, TRL's formulas). With
``micro_batch_size`` the batch is cut into ``B / mb`` equal strided micro-batches (micro-batch ``j`` = pairs
``j, j + B/mb, ...``: ``jaxppo.trainer.micro``, the split of the PPO step) whose gradients (and metrics) are
averaged, which equals the full-batch mean because the micro-batches have equal size.

Packed rows (``data.packing``): the batch carries ``"packed"``, its pairs packed on the host by :func:`plan_pairs`
with each prompt once (``jaxppo.models.packing.pack_shared``: prompt, chosen, rejected in consecutive slots, the
rejected answer attending to the prompt and not to the chosen one, its positions continuing the prompt's), planned
per micro-batch (``jaxppo.trainer.packed.plan_pieces``: the strided split of the ``[2B]`` stack hands micro-batch
``j`` the chosen rows of its pairs, then their rejected rows, and its own plan). The policy's forward then runs on
the packed rows (``CausalLM.packed_logprobs``) and its log-probs come back as ``[B]`` chosen / rejected, so the
losses and metrics are the padded step's up to float32 summation order. Adapter dropout draws its masks over the
packed rows' shape, so with ``lora_dropout > 0`` the packed and padded steps draw different (equally distributed)
masks; without dropout they agree.

Order of pairs: shuffled epochs. Pair ``c`` of the stream (``c = 0, 1, ...``; the state's ``data_cursor`` is the
next one) is ``perm_e[c mod N]`` with ``e = c div N`` and ``perm_e = jax.random.permutation(fold_in(PRNGKey(seed),
e), N)``: a function of (seed, cursor) only, so a resumed run draws the same batches.

Step: the learning rate is ``lr_scale × lr_schedule(state.step)`` (as the PPO trainer; ``lr_scale`` = the guards' cut);
a non-finite loss or gradient skips the update in-graph (parameters and optimizer state kept) and counts it in
``nan_total``/``nan_streak`` (metric ``train/nan_skipped``).

Adapter dropout (``lora_dropout = p > 0``, ``jaxppo.models.lora_dropout``): only the update's loss runs the adapters
with dropout, micro-batch ``j`` of step ``s`` with the key ``fold_in(fold_in(fold_in(PRNGKey(seed), s),
DROPOUT_STREAM), j)`` (the PPO step's derivation; a function of (seed, step), so a resumed run draws the same
masks). The reference log-probs and every evaluation pass run without it. ``p = 0``: no random operation.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxppo.models.lora_dropout import DROPOUT_STREAM
from jaxppo.ops import dpo_loss
from jaxppo.optim import all_finite, learning_rate_of, set_learning_rate
from jaxppo.parallel.host import to_host
from jaxppo.trainer.micro import micro_grads
from jaxppo.trainer.nan_skip import keep_if_finite, skip_counts, skipped_metric
from jaxppo.trainer.packed import packed_shardings, plan_pieces
from jaxppo.trainer.with_base import jit_step

PAIR_KEYS = ("prompt_ids", "prompt_mask", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask",
             "ref_chosen", "ref_rejected")
KTO_KEYS = PAIR_KEYS + ("desirable",)   # loss_type=kto: + the rows' labels (jaxppo.data.unpaired.kto_layout)


@struct.dataclass
class DPOState:
    step: jax.Array          # int32: update steps done (NaN-skipped ones included)
    actor: Any               # nnx.State of the policy CausalLM
    actor_opt: Any           # optax state of make_optimizer(actor.optim)
    lr_scale: jax.Array      # guard LR multiplier (1 = as configured)
    nan_total: jax.Array     # int32: skipped updates
    nan_streak: jax.Array    # int32: consecutive skipped updates
    data_cursor: jax.Array   # int32: index of the next pair in the shuffled-epoch stream


@struct.dataclass
class DPOHParams:
    """Frozen hyper-parameters of the step (static under jit)."""

    beta: float = struct.field(pytree_node=False)
    loss_type: str = struct.field(pytree_node=False)
    label_smoothing: float = struct.field(pytree_node=False)
    rpo_alpha: float = struct.field(pytree_node=False)
    micro_batch_size: int = struct.field(pytree_node=False)
    desirable_weight: float = struct.field(pytree_node=False, default=1.0)     # KTO only
    undesirable_weight: float = struct.field(pytree_node=False, default=1.0)   # KTO only

    @classmethod
    def from_config(cls, dpo_cfg: Any) -> "DPOHParams":
        return cls(beta=float(dpo_cfg.beta), loss_type=str(dpo_cfg.loss_type),
                   label_smoothing=float(dpo_cfg.label_smoothing), rpo_alpha=float(dpo_cfg.rpo_alpha),
                   micro_batch_size=int(dpo_cfg.micro_batch_size or dpo_cfg.batch_size),
                   desirable_weight=float(dpo_cfg.desirable_weight),
                   undesirable_weight=float(dpo_cfg.undesirable_weight))


@functools.lru_cache(maxsize=4)
def _epoch_perm(seed: int, epoch: int, n: int) -> np.ndarray:
    return to_host(jax.random.permutation(jax.random.fold_in(jax.random.PRNGKey(seed), epoch), n))


def batch_indices(seed: int, cursor: int, batch_size: int, n: int) -> np.ndarray:
    """Pair indices ``[batch_size]`` of the stream positions ``cursor .. cursor+batch_size-1`` (module doc)."""
    if n < 1:
        raise ValueError(f"batch_indices: no pairs (n={n})")
    if cursor < 0 or batch_size < 1:
        raise ValueError(f"batch_indices: need cursor >= 0 and batch_size >= 1, got {cursor}, {batch_size}")
    c = np.arange(cursor, cursor + batch_size, dtype=np.int64)
    return np.array([_epoch_perm(int(seed), int(e), int(n))[p] for e, p in zip(c // n, c % n)], dtype=np.int64)


def pair_stack(batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(prompt_ids, prompt_mask, response_ids, response_mask)`` of the ``[2B]`` stack: chosen rows, then rejected."""
    p_ids = jnp.concatenate([batch["prompt_ids"], batch["prompt_ids"]], 0)
    p_mask = jnp.concatenate([batch["prompt_mask"], batch["prompt_mask"]], 0)
    r_ids = jnp.concatenate([batch["chosen_ids"], batch["rejected_ids"]], 0)
    r_mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], 0)
    return p_ids, p_mask, r_ids, r_mask


def plan_pairs(batch: dict[str, Any], micro_batch_size: int, *, multiple_of: int = 1, buckets: int = 8):
    """The packed layout (``jaxppo.models.packing.Packed``, with ``branch_ids``) of a host batch of ``B`` pairs for
    the step's ``B / micro_batch_size`` strided micro-batches (module doc): ``plan_pieces`` of the pairs, each prompt
    packed once before its chosen and rejected answers; the sequence arrays describe the ``[2B]`` stack (chosen rows,
    then rejected), whose strided piece ``j`` is micro-batch ``j``'s chosen rows then its rejected rows. Row arrays
    ``[n·N, L]`` (``L = P + 2R``), sequence arrays ``[2B, ...]``; ``N`` a multiple of ``multiple_of`` (the
    data-parallel size), one of at most ``buckets`` values."""
    b = np.asarray(batch["prompt_ids"]).shape[0]
    if micro_batch_size < 1 or b % micro_batch_size:
        raise ValueError(f"plan_pairs: batch of {b} pairs is not a multiple of micro_batch_size={micro_batch_size}")
    fields = {"prompt_ids": np.asarray(batch["prompt_ids"]), "prompt_mask": np.asarray(batch["prompt_mask"]),
              "response_ids": np.stack([np.asarray(batch["chosen_ids"]), np.asarray(batch["rejected_ids"])], 1),
              "response_mask": np.stack([np.asarray(batch["chosen_mask"]), np.asarray(batch["rejected_mask"])], 1)}
    return plan_pieces(fields, b // micro_batch_size, multiple_of=multiple_of, buckets=buckets)


def plan_shardings(mesh: Any):
    """The shardings of a :func:`plan_pairs` plan on ``mesh`` (every array's rows over the batch axes)."""
    return packed_shardings(mesh, branches=True)


def policy_pair_logps(graphdef: Any, params: Any, batch: dict[str, jax.Array], lora_key: jax.Array | None = None
                      ) -> tuple[jax.Array, jax.Array]:
    """``(logp_chosen [B], logp_rejected [B])``: summed response log-probs, one forward over ``[2B, P+R]``
    (the shared-prefix layout, or the packed rows of ``batch["packed"]`` when it is there: module doc).
    ``params``: the model's state, or with adapters the pair ``(trainable, base)`` (``jaxppo.models.adapters``);
    ``lora_key``: adapter dropout (the update's loss only)."""
    model = nnx.merge(graphdef, *params) if isinstance(params, tuple) else nnx.merge(graphdef, params)
    b = batch["prompt_ids"].shape[0]
    if batch.get("packed") is not None:    # the pairs' packed rows; log-probs of the [2B] stack, chosen then rejected
        _, _, r_ids, r_mask = pair_stack(batch)
        lp = model.packed_logprobs(batch["packed"], r_ids, r_mask, lora_key=lora_key).sum(axis=1)
        return lp[:b], lp[b:]
    if lora_key is not None:   # adapter dropout draws its masks per row of the [2B, P+R] stack
        lp = model.continuation_logprobs(*pair_stack(batch), lora_key=lora_key).sum(axis=1)
        return lp[:b], lp[b:]
    responses = jnp.stack([batch["chosen_ids"], batch["rejected_ids"]], axis=1)       # [B, 2, R]
    masks = jnp.stack([batch["chosen_mask"], batch["rejected_mask"]], axis=1)
    lp = model.shared_prefix_logprobs(batch["prompt_ids"], batch["prompt_mask"], responses, masks).sum(axis=2)
    return lp[:, 0], lp[:, 1]


def pair_loss(graphdef: Any, params: Any, batch: dict[str, jax.Array], hp: DPOHParams,
              rpo_tokens_per_pair: jax.Array | None = None, lora_key: jax.Array | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``mean_pairs dpo_loss`` of ``batch`` under ``params`` and TRL's metrics (``loss`` included);
    ``rpo_tokens_per_pair``: the whole batch's chosen tokens per pair when ``batch`` is one micro-batch of it;
    ``lora_key``: adapter dropout of the policy's forward (module doc)."""
    pc, pr = policy_pair_logps(graphdef, params, batch, lora_key)
    if hp.loss_type == "kto":   # the KTO layout (jaxppo.data.unpaired): judged answer, mismatched answer
        from jaxppo.ops.kto import kto_pair_loss

        loss, metrics = kto_pair_loss(pc, pr, batch["ref_chosen"], batch["ref_rejected"], batch["desirable"],
                                      beta=hp.beta, desirable_weight=hp.desirable_weight,
                                      undesirable_weight=hp.undesirable_weight)
        return loss, {**metrics, "loss": loss}
    lengths = {}
    if hp.loss_type in ("ipo", "sigmoid_norm") or hp.rpo_alpha > 0:
        lengths = dict(chosen_length=batch["chosen_mask"].sum(1), rejected_length=batch["rejected_mask"].sum(1))
    loss, metrics = dpo_loss(pc, pr, batch["ref_chosen"], batch["ref_rejected"], beta=hp.beta,
                             loss_type=hp.loss_type, label_smoothing=hp.label_smoothing, rpo_alpha=hp.rpo_alpha,
                             rpo_tokens_per_pair=rpo_tokens_per_pair, **lengths)
    loss = loss.mean()
    return loss, {**metrics, "loss": loss}


def make_dpo_step(graphdef: Any, tx: optax.GradientTransformation, schedule: optax.Schedule, hp: DPOHParams, *,
                  state_shardings: Any = None, batch_shardings: Any = None, mesh: Any = None, base: Any = None,
                  lora_dropout: float = 0.0, seed: int = 0):
    """Jitted ``(state, batch) -> (state, metrics)`` with the state donated (module doc). Micro-batches are the
    strided ones of every trainer (``jaxppo.trainer.micro.micro_grads``); with ``mesh`` they are constrained to
    stay split over the batch axes. With adapters ``state.actor`` is the trainable part and ``base`` the frozen
    one, a third, non-donated argument of the jitted function that the returned callable binds. ``lora_dropout``
    (the adapters' ``LoraSpec.dropout``) and ``seed`` (``trainer.seed``): the adapter dropout of the loss. A batch
    with ``"packed"`` (:func:`plan_pairs` for ``hp.micro_batch_size``; with ``batch_shardings``, its shardings under
    ``"packed"``: :func:`plan_shardings`) runs its forward on the packed rows (module doc)."""
    if not 0.0 <= lora_dropout < 1.0:
        raise ValueError(f"make_dpo_step: lora_dropout must be in [0, 1), got {lora_dropout!r}")

    def grads_of(params, batch, frozen=None, key=None):
        b = batch["prompt_ids"].shape[0]
        mb = hp.micro_batch_size
        if b % mb:
            raise ValueError(f"batch of {b} pairs is not a multiple of micro_batch_size={mb}")
        tpp = jnp.maximum(batch["chosen_mask"].sum(), 1) / b    # RPO's NLL: a token mean over the whole batch

        def one(p, x, *k):
            kw = {} if not k else {"lora_key": k[0]}
            (_, metrics), g = jax.value_and_grad(
                lambda q: pair_loss(graphdef, q if frozen is None else (q, frozen), x, hp, tpp, **kw), has_aux=True)(p)
            return g, metrics

        grads, metrics = micro_grads(one, params, (batch,), b // mb, mesh, key=key)
        return grads, jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)

    def step(state: DPOState, batch: dict[str, jax.Array], frozen=None):
        lr = schedule(state.step)
        opt = set_learning_rate(state.actor_opt, lr * state.lr_scale)   # the guards' LR cut
        key = None
        if lora_dropout > 0:
            key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), state.step), DROPOUT_STREAM)
        grads, metrics = grads_of(state.actor, batch, frozen, key)
        finite = jnp.isfinite(metrics["loss"]) & all_finite(grads)
        safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
        updates, new_opt = tx.update(safe_grads, opt, state.actor)
        new_params = optax.apply_updates(state.actor, updates)
        new_state = state.replace(
            step=state.step + 1, actor=keep_if_finite(finite, new_params, state.actor),
            actor_opt=keep_if_finite(finite, new_opt, opt), **skip_counts(state, finite),
            data_cursor=state.data_cursor + batch["prompt_ids"].shape[0])
        metrics = dict(metrics, grad_norm=optax.global_norm(grads), learning_rate=learning_rate_of(opt) *
                       state.lr_scale, **{"train/nan_skipped": skipped_metric(finite)})
        return new_state, metrics

    return jit_step(step, state_shardings, mesh, base, out_scalars=True, batch_shardings=batch_shardings)


@functools.partial(jax.jit, static_argnums=0)
def _pair_logps_jit(graphdef, params, batch):
    return policy_pair_logps(graphdef, params, batch)


def pair_logps(graphdef: Any, params: Any, arrays: dict[str, np.ndarray], batch_size: int, packing: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """Summed policy log-probs ``(chosen [N], rejected [N])`` of all pairs of ``arrays`` (batched, one compiled
    shape: the last batch is padded with copies of its first row and cut). ``packing``: each batch's pairs run as
    packed rows, each prompt once (:func:`plan_pairs`, one piece; at most 8 programs, logged via
    ``packing.ProgramLog``)."""
    from jaxppo.models.sharding import batch_multiple
    from jaxppo.models.packing import ProgramLog

    n = arrays["prompt_ids"].shape[0]
    if n == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    bs = min(batch_size, n)
    keys = PAIR_KEYS[:6]
    programs = ProgramLog() if packing else None
    multiple = batch_multiple(params) if packing else 1
    out_c, out_r = [], []
    for s in range(0, n, bs):
        chunk = {k: np.asarray(arrays[k][s:s + bs]) for k in keys}
        m = chunk["prompt_ids"].shape[0]
        if m < bs:
            chunk = {k: np.concatenate([v, np.repeat(v[:1], bs - m, axis=0)]) for k, v in chunk.items()}
        if programs is not None:
            chunk["packed"] = plan_pairs(chunk, bs, multiple_of=multiple)
            programs.add(chunk["packed"])
        c, r = _pair_logps_jit(graphdef, params, chunk)
        out_c.append(to_host(c)[:m])
        out_r.append(to_host(r)[:m])
    if programs is not None:
        programs.log("DPO pair log-prob pass")
    return np.concatenate(out_c).astype(np.float32), np.concatenate(out_r).astype(np.float32)


__all__ = ["DPOHParams", "DPOState", "KTO_KEYS", "PAIR_KEYS", "batch_indices", "make_dpo_step", "pair_logps", "pair_loss",
           "pair_stack", "plan_pairs", "plan_shardings", "policy_pair_logps"]
