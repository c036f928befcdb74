"""DPO-family preference losses on sequence log-probabilities (TRL ``DPOTrainer`` formulas and metric names).

Inputs are ``[P]`` per pair: the summed response log-probs of the policy (``pi_c``, ``pi_r``) and of the frozen
reference (``ref_c``, ``ref_r``); ``n_c``, ``n_r`` are the response lengths (tokens), used as ``max(n, 1)``.
With ``u_c = pi_c - ref_c``, ``u_r = pi_r - ref_r``, ``D = u_c - u_r`` and the length-normalised
``D_norm = u_c / n_c - u_r / n_r``, the per-pair loss for ``loss_type``:

* ``sigmoid``:      ``-(1 - eps) log sig(beta D) - eps log sig(-beta D)``  (``eps = label_smoothing``, cDPO)
* ``hinge``:        ``relu(1 - beta D)``
* ``ipo``:          ``(D_norm - 1 / (2 beta))^2``                          (needs the lengths)
* ``robust``:       ``(-(1 - eps) log sig(beta D) + eps log sig(-beta D)) / (1 - 2 eps)``
* ``sigmoid_norm``: ``-log sig(beta D_norm)``                              (needs the lengths)

``rpo_alpha > 0`` adds ``rpo_alpha * nll`` to every pair's loss (needs ``chosen_length``), with ``nll`` the
negative log-likelihood of the chosen responses averaged over all chosen tokens of the batch, as TRL's
``DPOTrainer`` (its ``nll_loss`` is one ``cross_entropy`` over the flattened chosen tokens of the batch):
``nll = -sum_i pi_c,i / max(sum_i n_c,i, 1)``, computed as ``mean_i(-pi_c,i) / L`` with ``L = max(sum_i n_c,i,
1) / P`` the chosen tokens per pair (``rpo_tokens_per_pair``: pass the whole batch's value when the batch is
split into micro-batches, so that the micro-batches' average is the batch's NLL). A mean of per-pair means
``-pi_c,i / n_c,i`` would weigh each token of a 1-token answer 20 times as much as one of a 20-token answer.
``label_smoothing`` must be 0 for the loss types that do not use it (``hinge``, ``ipo``, ``sigmoid_norm``).

Metrics (means over pairs, detached), TRL's names: ``rewards/chosen = E[beta u_c]``, ``rewards/rejected =
E[beta u_r]``, ``rewards/accuracies = E[beta u_c > beta u_r]``, ``rewards/margins = E[beta (u_c - u_r)]``,
``logps/chosen = E[pi_c]``, ``logps/rejected = E[pi_r]`` and, with RPO, ``nll_loss = nll``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_choice, check_floating, check_ndim, check_same_shape, check_scalar_range, \
    compute_dtype

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "robust", "sigmoid_norm")
_NEEDS_LENGTHS = ("ipo", "sigmoid_norm")
_USES_SMOOTHING = ("sigmoid", "robust")


def _length(name: str, length: Any, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    if jnp.shape(length) != shape:
        raise ValueError(f"{name} must have shape [P]={list(shape)}, got {list(jnp.shape(length))}")
    return jnp.maximum(jnp.asarray(length, dtype), 1)


def rpo_nll(chosen_logp: jax.Array, chosen_length: jax.Array,
            tokens_per_pair: jax.Array | float | None = None) -> jax.Array:
    """RPO's NLL (0-d): ``mean(-chosen_logp) / L``, with ``L = tokens_per_pair`` by default
    ``max(sum chosen_length, 1) / P``, i.e. ``-sum chosen_logp / max(sum chosen_length, 1)``: the token mean over
    all chosen tokens of the batch (TRL)."""
    check_ndim("chosen_logp", chosen_logp, 1, "[P]")
    check_floating("chosen_logp", chosen_logp)
    dtype = compute_dtype(chosen_logp)
    shape = jnp.shape(chosen_logp)
    if jnp.shape(chosen_length) != shape:
        raise ValueError(f"chosen_length must have shape [P]={list(shape)}, got {list(jnp.shape(chosen_length))}")
    if tokens_per_pair is None:
        tokens_per_pair = jnp.maximum(jnp.sum(jnp.asarray(chosen_length, dtype)), 1) / max(shape[0], 1)
    return -jnp.mean(jnp.asarray(chosen_logp, dtype)) / jnp.asarray(tokens_per_pair, dtype)


def dpo_loss(chosen_logp: jax.Array, rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
             ref_rejected_logp: jax.Array, *, beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             chosen_length: jax.Array | None = None, rejected_length: jax.Array | None = None,
             rpo_alpha: float = 0.0,
             rpo_tokens_per_pair: jax.Array | float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-pair DPO-family loss ``[P]`` and TRL's reward metrics (formulas in the module docstring).

    Reduce the loss with ``loss.mean()`` (TRL). Gradients flow into ``chosen_logp`` and ``rejected_logp`` (and,
    formally, into the reference log-probs, which callers hold fixed).
    """
    check_choice("loss_type", loss_type, DPO_LOSS_TYPES)
    check_scalar_range("beta", beta, gt=0.0)
    check_scalar_range("rpo_alpha", rpo_alpha, ge=0.0)
    if loss_type == "robust":
        check_scalar_range("label_smoothing", label_smoothing, ge=0.0, lt=0.5)
    else:
        check_scalar_range("label_smoothing", label_smoothing, ge=0.0, le=0.5)
    if loss_type not in _USES_SMOOTHING and not isinstance(label_smoothing, jax.core.Tracer) \
            and float(label_smoothing) != 0.0:
        raise ValueError(f"label_smoothing={label_smoothing} is only used by {_USES_SMOOTHING}; "
                         f"loss_type={loss_type!r} needs label_smoothing=0")
    check_ndim("chosen_logp", chosen_logp, 1, "[P]")
    shape = check_same_shape(chosen_logp=chosen_logp, rejected_logp=rejected_logp,
                             ref_chosen_logp=ref_chosen_logp, ref_rejected_logp=ref_rejected_logp)
    for name, x in (("chosen_logp", chosen_logp), ("rejected_logp", rejected_logp),
                    ("ref_chosen_logp", ref_chosen_logp), ("ref_rejected_logp", ref_rejected_logp)):
        check_floating(name, x)
    dtype = compute_dtype(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)
    pc, pr, rc, rr = (jnp.asarray(x, dtype) for x in (chosen_logp, rejected_logp, ref_chosen_logp,
                                                      ref_rejected_logp))
    if loss_type in _NEEDS_LENGTHS and (chosen_length is None or rejected_length is None):
        raise ValueError(f"loss_type={loss_type!r} normalises by response length: pass chosen_length and "
                         "rejected_length (token counts [P])")
    if not isinstance(rpo_alpha, jax.core.Tracer) and float(rpo_alpha) > 0 \
            and chosen_length is None:
        raise ValueError("rpo_alpha > 0 needs chosen_length (the RPO NLL is per token of the chosen response)")

    beta = jnp.asarray(beta, dtype)
    eps = jnp.asarray(label_smoothing, dtype)
    u_c, u_r = pc - rc, pr - rr
    delta = u_c - u_r
    if loss_type in _NEEDS_LENGTHS:
        n_c = _length("chosen_length", chosen_length, shape, dtype)
        n_r = _length("rejected_length", rejected_length, shape, dtype)
        delta_norm = u_c / n_c - u_r / n_r
    if loss_type == "sigmoid":
        loss = -(1 - eps) * jax.nn.log_sigmoid(beta * delta) - eps * jax.nn.log_sigmoid(-beta * delta)
    elif loss_type == "hinge":
        loss = jax.nn.relu(1 - beta * delta)
    elif loss_type == "ipo":
        loss = jnp.square(delta_norm - 1 / (2 * beta))
    elif loss_type == "robust":
        loss = (-(1 - eps) * jax.nn.log_sigmoid(beta * delta)
                + eps * jax.nn.log_sigmoid(-beta * delta)) / (1 - 2 * eps)
    else:
        loss = -jax.nn.log_sigmoid(beta * delta_norm)

    chosen_rewards = jax.lax.stop_gradient(beta * u_c)
    rejected_rewards = jax.lax.stop_gradient(beta * u_r)
    metrics = {
        "rewards/chosen": jnp.mean(chosen_rewards),
        "rewards/rejected": jnp.mean(rejected_rewards),
        "rewards/accuracies": jnp.mean((chosen_rewards > rejected_rewards).astype(dtype)),
        "rewards/margins": jnp.mean(chosen_rewards - rejected_rewards),
        "logps/chosen": jnp.mean(jax.lax.stop_gradient(pc)),
        "logps/rejected": jnp.mean(jax.lax.stop_gradient(pr)),
    }
    if chosen_length is not None and (isinstance(rpo_alpha, jax.core.Tracer) or float(rpo_alpha) > 0):
        nll = rpo_nll(pc, chosen_length, rpo_tokens_per_pair)
        loss = loss + jnp.asarray(rpo_alpha, dtype) * nll
        metrics["nll_loss"] = jax.lax.stop_gradient(nll)
    return loss, metrics
