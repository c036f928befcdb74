"""Critic-free advantage estimators over prompt groups (verl ``core_algos`` numerics) and their registry.

Inputs are ``token_rewards`` and ``mask`` ``[B, T]`` (``mask`` 1 on response tokens) and, for the group
estimators, ``group_ids`` ``[B]``: integers of any value, not necessarily contiguous or sorted; rows with the
same id answer the same prompt. Each estimator returns ``(advantages, returns)`` ``[B, T]``. With the sequence
score ``s_b = sum_t m_bt r_bt`` and, per group ``g`` of size ``n_g``, ``mean_g`` and the unbiased ``std_g``:

* :func:`grpo_advantages`:  ``A_b = (s_b - mean_g) / (std_g + eps)`` (``norm_by_std=False``, Dr.GRPO:
  ``s_b - mean_g``); a group of one has ``mean = 0, std = 1`` (so ``A_b = s_b / (1 + eps)``).
* :func:`rloo_advantages`:  ``A_b = s_b n/(n-1) - mean_g n/(n-1) = s_b - mean(other members' scores)``;
  a group of one keeps ``A_b = s_b``.
* :func:`reinforce_pp_advantages`: return-to-go ``G_t = r_t + gamma * c_{t+1}``, ``c_t = m_t G_t``
  (``c_T = 0``: the running return resets at every masked position), ``A = masked_whiten(G, m) * m``.
* :func:`reinforce_pp_baseline_advantages`: ``A = masked_whiten((s_b - mean_g) m_bt, m) * m`` (a group of one
  has ``mean = 0``).

The group estimators broadcast the per-sequence advantage over the response: ``A_bt = A_b m_bt``, and return
the advantages as the returns too (as verl; there is no critic to regress). ``reinforce_pp_advantages`` returns
the raw ``G`` (not masked, as verl). verl sums *all* token rewards for ``s_b``; we sum over the mask, which is
the same whenever padding carries zero reward (our token rewards always do).

**Grouping.** Group statistics use ``jnp.unique(group_ids, size=B, return_inverse=True)`` (static shape, any
ids, ``O(B log B)``) and ``segment_sum`` over the dense group index, so ``B`` may be large; the variance is the
two-pass ``sum (s - mean)^2 / (n - 1)``. A fully masked row has ``s_b = 0``, still counts as a member of its
group (as in verl) and gets advantage 0 (``x m``).

**Registry.** :data:`ADVANTAGE_ESTIMATORS` (a :class:`jaxppo.registry.Registry`) maps a config name to an :class:`AdvantageEstimator`: a callable with
one signature ``est(token_rewards, values, mask, group_ids, hp) -> (advantages, returns)`` (``hp`` an
:class:`AdvantageHParams`; ``values``/``group_ids`` may be ``None`` when the estimator does not use them) and
the flags ``needs_critic`` / ``needs_groups``. Only ``gae`` needs a critic. To add an estimator, write one pure
function and register an adapter::

    @ADVANTAGE_ESTIMATORS.register("my_estimator", needs_groups=True)
    def _my_estimator(token_rewards, values, mask, group_ids, hp):
        return my_estimator(token_rewards, mask, group_ids, eps=hp.eps)

=================================  ============  ============
name                               needs_critic  needs_groups
=================================  ============  ============
``gae``                            yes           no
``grpo``                           no            yes
``rloo``                           no            yes
``reinforce_plus_plus``            no            no
``reinforce_plus_plus_baseline``   no            yes
=================================  ============  ============
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_floating, check_ndim, check_same_shape, check_scalar_range, compute_dtype
from jaxppo.ops.advantages import gae
from jaxppo.ops.masked import masked_whiten
from jaxppo.registry import Registry


def _prepare(token_rewards: Any, mask: Any) -> tuple[jax.Array, jax.Array]:
    check_ndim("token_rewards", token_rewards, 2)
    check_ndim("mask", mask, 2)
    check_same_shape(token_rewards=token_rewards, mask=mask)
    check_floating("token_rewards", token_rewards)
    dtype = compute_dtype(token_rewards)
    m = (jnp.asarray(mask) != 0).astype(dtype)
    r = jnp.where(m != 0, jnp.asarray(token_rewards, dtype), 0)
    return r, m


def _check_groups(group_ids: Any, b: int) -> jax.Array:
    if group_ids is None:
        raise ValueError("group_ids is required by this estimator (an int array [B] of prompt ids)")
    if jnp.shape(group_ids) != (b,):
        raise ValueError(f"group_ids must have shape [B]={[b]}, got {list(jnp.shape(group_ids))}")
    if not jnp.issubdtype(jnp.result_type(group_ids), jnp.integer):
        raise TypeError(f"group_ids must be an integer array, got dtype {jnp.result_type(group_ids)}")
    return jnp.asarray(group_ids)


def group_stats(scores: jax.Array, group_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per row: ``(n_g, mean_g, unbiased var_g)`` of the scores of its group (``var = 0`` for ``n_g = 1``).

    ``mean_g = sum_g s / n_g``; ``var_g = sum_g (s - mean_g)^2 / (n_g - 1)``. Groups are found with
    ``jnp.unique(size=B)`` so any integer ids work under ``jit``.
    """
    b = scores.shape[0]
    if b == 0:
        z = jnp.zeros((0,), scores.dtype)
        return z, z, z
    _, inv = jnp.unique(group_ids, size=b, fill_value=None, return_inverse=True)
    inv = inv.reshape(b)
    count = jax.ops.segment_sum(jnp.ones_like(scores), inv, num_segments=b)[inv]
    mean = jax.ops.segment_sum(scores, inv, num_segments=b)[inv] / count
    sq = jax.ops.segment_sum(jnp.square(scores - mean), inv, num_segments=b)[inv]
    var = jnp.where(count > 1, sq / jnp.where(count > 1, count - 1, 1), 0)
    return count, mean, var


def _sequence_scores(token_rewards: Any, mask: Any, group_ids: Any):
    r, m = _prepare(token_rewards, mask)
    g = _check_groups(group_ids, r.shape[0])
    return jnp.sum(r, axis=-1), m, g


def grpo_advantages(token_rewards: jax.Array, mask: jax.Array, group_ids: jax.Array, *, norm_by_std: bool = True,
                    eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """GRPO outcome advantages (verl ``compute_grpo_outcome_advantage``); returns ``(A, A)``.

    ``A_bt = m_bt (s_b - mean_g) / (std_g + eps)`` with the unbiased ``std_g``; ``norm_by_std=False`` (Dr.GRPO)
    gives ``m_bt (s_b - mean_g)``. A group of one uses ``mean = 0``, ``std = 1``.
    """
    if not isinstance(norm_by_std, bool):
        raise TypeError(f"norm_by_std must be a bool, got {type(norm_by_std).__name__}")
    check_scalar_range("eps", eps, ge=0.0)
    s, m, g = _sequence_scores(token_rewards, mask, group_ids)
    n, mean, var = group_stats(s, g)
    single = n == 1
    mean = jnp.where(single, 0, mean)
    adv = s - mean
    if norm_by_std:
        std = jnp.where(single, 1, jnp.sqrt(var))
        adv = adv / (std + eps)
    adv = adv[:, None] * m
    return adv, adv


def rloo_advantages(token_rewards: jax.Array, mask: jax.Array,
                    group_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """RLOO advantages (verl ``compute_rloo_outcome_advantage``); returns ``(A, A)``.

    For a group of ``n > 1``: ``A_b = s_b n/(n-1) - mean_g n/(n-1) = (n s_b - sum_g s) / (n - 1)``, which is
    ``s_b`` minus the mean of the other ``n - 1`` scores. A group of one keeps ``A_b = s_b``. ``A_bt = A_b m_bt``.
    """
    s, m, g = _sequence_scores(token_rewards, mask, group_ids)
    n, mean, _ = group_stats(s, g)
    scale = n / jnp.where(n > 1, n - 1, 1)
    adv = jnp.where(n > 1, s * scale - mean * scale, s)
    adv = adv[:, None] * m
    return adv, adv


def reinforce_pp_advantages(token_rewards: jax.Array, mask: jax.Array,
                            gamma: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++ (verl ``compute_reinforce_plus_plus_outcome_advantage``); returns ``(A, G)``.

    Backwards over ``t = T-1 .. 0`` with ``c = 0``: ``G_t = r_t + gamma c``; ``c = m_t G_t`` (the running return
    resets at every masked position; ``r_t`` counts as 0 there). ``A = masked_whiten(G, m) * m``; ``G`` is
    returned unmasked (as verl).
    Whitening needs at least two valid tokens (see :func:`jaxppo.ops.masked_var`).
    """
    check_scalar_range("gamma", gamma, ge=0.0, le=1.0)
    r, m = _prepare(token_rewards, mask)
    gm = jnp.asarray(gamma, r.dtype)

    def step(carry, x):
        rt, mt = x
        g_t = rt + gm * carry
        return g_t * mt, g_t

    _, ret = jax.lax.scan(step, jnp.zeros(r.shape[:1], r.dtype), (r.T, m.T), reverse=True)
    ret = ret.T
    adv = masked_whiten(ret, m) * m
    return adv, ret


def reinforce_pp_baseline_advantages(token_rewards: jax.Array, mask: jax.Array, group_ids: jax.Array, *,
                                     eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++ with a group-mean baseline (verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``).

    ``x_bt = (s_b - mean_g) m_bt`` (a group of one has ``mean = 0``), ``A = masked_whiten(x, m) * m``; returns
    ``(A, A)``. ``eps`` is accepted for a uniform signature and, as in verl, unused (whitening uses its own
    ``1e-8``).
    """
    check_scalar_range("eps", eps, ge=0.0)
    s, m, g = _sequence_scores(token_rewards, mask, group_ids)
    n, mean, _ = group_stats(s, g)
    x = (s - jnp.where(n == 1, 0, mean))[:, None] * m
    adv = masked_whiten(x, m) * m
    return adv, adv


# ---------------------------------------------------------------------------------------------------------------
# registry


@dataclasses.dataclass(frozen=True)
class AdvantageHParams:
    """Static hyper-parameters shared by all estimators (hashable: usable as a ``jit`` static argument)."""

    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    eps: float = 1e-6


EstimatorFn = Callable[[jax.Array, "jax.Array | None", jax.Array, "jax.Array | None", AdvantageHParams],
                       tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: ``est(token_rewards, values, mask, group_ids, hp) -> (advantages, returns)``."""

    name: str
    fn: EstimatorFn
    needs_critic: bool
    needs_groups: bool

    def __call__(self, token_rewards: jax.Array, values: jax.Array | None, mask: jax.Array,
                 group_ids: jax.Array | None, hp: AdvantageHParams) -> tuple[jax.Array, jax.Array]:
        """Run the estimator after checking that the inputs it needs are present."""
        if self.needs_critic and values is None:
            raise ValueError(f"advantage estimator {self.name!r} needs critic values; got values=None")
        if self.needs_groups and group_ids is None:
            raise ValueError(f"advantage estimator {self.name!r} needs group_ids; got group_ids=None")
        if not isinstance(hp, AdvantageHParams):
            raise TypeError(f"hp must be an AdvantageHParams, got {type(hp).__name__}")
        return self.fn(token_rewards, values, mask, group_ids, hp)


def _estimator(name: str, fn: EstimatorFn, *, needs_critic: bool = False,
               needs_groups: bool = False) -> AdvantageEstimator:
    return AdvantageEstimator(name, fn, needs_critic, needs_groups)


#: name -> estimator; ``@ADVANTAGE_ESTIMATORS.register(name, needs_critic=..., needs_groups=...)`` adds one
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", wrap=_estimator)


@ADVANTAGE_ESTIMATORS.register("gae", needs_critic=True)
def _gae(token_rewards, values, mask, group_ids, hp):
    return gae(token_rewards, values, mask, hp.gamma, hp.lam)


@ADVANTAGE_ESTIMATORS.register("grpo", needs_groups=True)
def _grpo(token_rewards, values, mask, group_ids, hp):
    return grpo_advantages(token_rewards, mask, group_ids, norm_by_std=hp.norm_by_std, eps=hp.eps)


@ADVANTAGE_ESTIMATORS.register("rloo", needs_groups=True)
def _rloo(token_rewards, values, mask, group_ids, hp):
    return rloo_advantages(token_rewards, mask, group_ids)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def _reinforce_pp(token_rewards, values, mask, group_ids, hp):
    return reinforce_pp_advantages(token_rewards, mask, hp.gamma)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", needs_groups=True)
def _reinforce_pp_baseline(token_rewards, values, mask, group_ids, hp):
    return reinforce_pp_baseline_advantages(token_rewards, mask, group_ids, eps=hp.eps)

