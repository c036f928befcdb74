"""KTO (Kahneman-Tversky optimisation) on unpaired feedback: TRL's ``KTOTrainer`` loss and metric names.

Each row is one answer with a boolean label (desirable or not). Inputs are ``[B]`` per row: the summed response
log-probs of the policy (``pi``) and of the frozen reference (``ref``); ``u = pi − ref`` is the row's log-ratio.

**Reference point.** ``z0`` estimates ``KL(π ‖ π_ref)`` from *mismatched* pairs: each prompt of the batch with the
answer of another row (TRL pairs row ``i``'s prompt with row ``i − 1``'s answer, :func:`kto_mismatched_order`), so
that the estimate is not the log-ratio of the answers being judged::

    z0 = max(mean_k(pi_kl,k − ref_kl,k), 0)          (held fixed: no gradient flows through z0)

**Loss** (``beta`` > 0; ``lambda_D``/``lambda_U`` = ``desirable_weight``/``undesirable_weight``)::

    desirable:    lambda_D · (1 − σ(beta · (u − z0)))
    undesirable:  lambda_U · (1 − σ(beta · (z0 − u)))
    loss = Σ_i w_i · loss_i / Σ_i w_i                  (TRL: the mean over the batch's rows)

``w`` (default 1) marks real rows (0 for padding). TRL advises weights with
``lambda_D · n_D / (lambda_U · n_U)`` in ``[1, 4/3]``.

Metrics (detached, TRL's names): ``rewards/chosen`` = mean of ``beta·u`` over desirable rows, ``rewards/rejected``
over undesirable rows (NaN without such rows, as TRL), ``rewards/margins`` = their difference (an absent side
counts 0), ``kl`` = ``z0``, ``logps/chosen`` / ``logps/rejected`` = mean ``pi`` of each side, ``count/chosen`` /
``count/rejected``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.ops._checks import check_floating, check_ndim, check_same_shape, check_scalar_range, compute_dtype


def kto_mismatched_order(n: int) -> np.ndarray:
    """``order [n]`` int: the KL estimate of row ``i`` pairs row ``i``'s prompt with the answer of row
    ``order[i] = (i − 1) mod n`` (TRL shifts the batch's answers by one). One row pairs with itself."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return (np.arange(n) - 1) % n


def kto_reference_point(policy_kl_logp: jax.Array, ref_kl_logp: jax.Array,
                        weights: jax.Array | None = None) -> jax.Array:
    """``z0 = max(Σ w·(pi_kl − ref_kl) / Σ w, 0)`` (0-d, gradient stopped) over the mismatched pairs ``[K]``."""
    check_ndim("policy_kl_logp", policy_kl_logp, 1, "[K]")
    check_same_shape(policy_kl_logp=policy_kl_logp, ref_kl_logp=ref_kl_logp)
    check_floating("policy_kl_logp", policy_kl_logp)
    dtype = compute_dtype(policy_kl_logp, ref_kl_logp)
    d = jnp.asarray(policy_kl_logp, dtype) - jnp.asarray(ref_kl_logp, dtype)
    w = jnp.ones_like(d) if weights is None else jnp.asarray(weights, dtype)
    z0 = jnp.sum(w * d) / jnp.maximum(jnp.sum(w), 1e-12)
    return jax.lax.stop_gradient(jnp.maximum(z0, 0))


def kto_loss(logp: jax.Array, ref_logp: jax.Array, desirable: jax.Array, z0: jax.Array | float, *, beta: float,
             desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
             weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The batch's KTO loss (0-d) and TRL's metrics (formulas in the module docstring).

    ``logp``, ``ref_logp`` [B] summed response log-probs, ``desirable`` [B] bool labels, ``z0`` the reference point
    of :func:`kto_reference_point`, ``weights`` [B] (0 for padding rows). Gradients flow into ``logp``.
    """
    check_scalar_range("beta", beta, gt=0.0)
    check_scalar_range("desirable_weight", desirable_weight, ge=0.0)
    check_scalar_range("undesirable_weight", undesirable_weight, ge=0.0)
    check_ndim("logp", logp, 1, "[B]")
    check_same_shape(logp=logp, ref_logp=ref_logp, desirable=desirable)
    check_floating("logp", logp)
    dtype = compute_dtype(logp, ref_logp)
    pi, rf = jnp.asarray(logp, dtype), jnp.asarray(ref_logp, dtype)
    good = jnp.asarray(desirable, bool)
    w = jnp.ones_like(pi) if weights is None else jnp.asarray(weights, dtype)
    beta_ = jnp.asarray(beta, dtype)
    z0 = jax.lax.stop_gradient(jnp.asarray(z0, dtype))
    u = pi - rf
    per_row = jnp.where(good, desirable_weight * (1 - jax.nn.sigmoid(beta_ * (u - z0))),
                        undesirable_weight * (1 - jax.nn.sigmoid(beta_ * (z0 - u))))
    loss = jnp.sum(w * per_row) / jnp.maximum(jnp.sum(w), 1e-12)

    reward = jax.lax.stop_gradient(beta_ * u)
    wd, wu = w * good, w * (~good)
    nd, nu = jnp.sum(wd), jnp.sum(wu)
    chosen = jnp.where(nd > 0, jnp.sum(wd * reward) / jnp.maximum(nd, 1e-12), jnp.nan)
    rejected = jnp.where(nu > 0, jnp.sum(wu * reward) / jnp.maximum(nu, 1e-12), jnp.nan)
    pi_ = jax.lax.stop_gradient(pi)
    metrics = {
        "rewards/chosen": chosen, "rewards/rejected": rejected,
        "rewards/margins": jnp.nan_to_num(chosen) - jnp.nan_to_num(rejected),
        "kl": z0,
        "logps/chosen": jnp.where(nd > 0, jnp.sum(wd * pi_) / jnp.maximum(nd, 1e-12), jnp.nan),
        "logps/rejected": jnp.where(nu > 0, jnp.sum(wu * pi_) / jnp.maximum(nu, 1e-12), jnp.nan),
        "count/chosen": nd, "count/rejected": nu,
    }
    return loss, metrics


def kto_pair_loss(logp: jax.Array, kl_logp: jax.Array, ref_logp: jax.Array, ref_kl_logp: jax.Array,
                  desirable: jax.Array, *, beta: float, desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
                  weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """KTO in the two-answer layout of the preference trainers: row ``i`` holds its judged answer (``logp``,
    ``ref_logp`` [B]) and, in the second slot, the mismatched answer of its KL estimate (``kl_logp``,
    ``ref_kl_logp`` [B], e.g. :func:`jaxppo.data.unpaired.kto_layout`): ``z0 = kto_reference_point(kl_logp,
    ref_kl_logp, weights)``, then :func:`kto_loss`. One forward of the pair layout gives both log-probs."""
    z0 = kto_reference_point(kl_logp, ref_kl_logp, weights)
    return kto_loss(logp, ref_logp, desirable, z0, beta=beta, desirable_weight=desirable_weight,
                    undesirable_weight=undesirable_weight, weights=weights)


__all__ = ["kto_loss", "kto_mismatched_order", "kto_pair_loss", "kto_reference_point"]
