"""Per-sequence replay priorities ``[B]`` (before the sampler's ``+ eps`` and ``^alpha``), with or without a critic.

``mask`` is ``[B, T]``, 1 on response tokens; ``n_b = sum_t m_bt``. An empty row has priority 0.

* :func:`priority_td_error`:      ``agg_t |delta_bt|`` over the mask (``agg`` ``"mean"``: ``sum_t m|delta| /
  max(n_b, 1)``; ``"max"``: ``max_t m|delta|``).
* :func:`priority_abs_advantage`: ``agg_t |A_bt|`` (same aggregation) -- for critic-free estimators.
* :func:`priority_group_variance`: the unbiased variance of the scores of the row's prompt group,
  ``sum_g (s - mean_g)^2 / (n_g - 1)`` (0 for a group of one and for a group of equal scores: such a group
  gives every group-relative estimator zero advantage, hence no learning signal).

=============================  ==================================  =====================================
priority (``PRIORITIES``)      inputs                              suits estimators
=============================  ==================================  =====================================
``td_error``                   ``delta [B,T], mask``               ``gae`` (needs a critic)
``abs_advantage``              ``advantages [B,T], mask``          any (``grpo``, ``rloo``, ``reinforce_*``)
``group_variance``             ``scores [B], group_ids [B]``       group-relative: ``grpo``, ``rloo``,
                                                                   ``reinforce_plus_plus_baseline``
=============================  ==================================  =====================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxppo.ops._checks import check_choice, check_floating, check_ndim, check_same_shape, compute_dtype
from jaxppo.ops.group_advantages import group_stats
from jaxppo.registry import Registry

AGGS = ("mean", "max")


def _agg_abs(x: jax.Array, mask: jax.Array, agg: str, name: str) -> jax.Array:
    check_choice("agg", agg, AGGS)
    check_ndim(name, x, 2)
    check_same_shape(**{name: x, "mask": mask})
    check_floating(name, x)
    dtype = compute_dtype(x)
    valid = jnp.asarray(mask) != 0
    a = jnp.where(valid, jnp.abs(jnp.asarray(x, dtype)), 0)
    if agg == "max":
        return jnp.max(a, axis=-1, initial=0.0)
    return jnp.sum(a, axis=-1) / jnp.maximum(jnp.sum(valid, axis=-1).astype(dtype), 1)


def priority_td_error(delta: jax.Array, mask: jax.Array, agg: str = "mean") -> jax.Array:
    """``agg_t |delta_bt|`` per sequence (``mean``: ``sum m|delta| / max(n, 1)``; ``max``) -- 0 for an empty row."""
    return _agg_abs(delta, mask, agg, "delta")


def priority_abs_advantage(advantages: jax.Array, mask: jax.Array, agg: str = "mean") -> jax.Array:
    """``agg_t |A_bt|`` per sequence (``mean``: ``sum m|A| / max(n, 1)``; ``max``) -- 0 for an empty row."""
    return _agg_abs(advantages, mask, agg, "advantages")


def priority_group_variance(scores: jax.Array, group_ids: jax.Array) -> jax.Array:
    """Per row: unbiased variance of its group's scores ``sum_g (s - mean_g)^2 / (n_g - 1)`` (0 if ``n_g = 1``)."""
    check_ndim("scores", scores, 1, "[B]")
    check_floating("scores", scores)
    b = jnp.shape(scores)[0]
    if jnp.shape(group_ids) != (b,):
        raise ValueError(f"group_ids must have shape [B]={[b]}, got {list(jnp.shape(group_ids))}")
    if not jnp.issubdtype(jnp.result_type(group_ids), jnp.integer):
        raise TypeError(f"group_ids must be an integer array, got dtype {jnp.result_type(group_ids)}")
    s = jnp.asarray(scores, compute_dtype(scores))
    _, _, var = group_stats(s, jnp.asarray(group_ids))
    return var


@dataclasses.dataclass(frozen=True)
class Priority:
    """A registered priority: ``fn(*, delta, advantages, mask, score, group_id, agg) -> [B]`` (``delta`` is
    ``None`` without a critic; a priority with ``needs_critic`` cannot run then)."""

    name: str
    fn: Callable[..., jax.Array]
    needs_critic: bool = False

    def __call__(self, *, delta: jax.Array | None, advantages: jax.Array, mask: jax.Array, score: jax.Array,
                 group_id: jax.Array, agg: str = "mean") -> jax.Array:
        if self.needs_critic and delta is None:
            raise ValueError(f"replay priority {self.name!r} needs critic values (TD residuals); got delta=None")
        return self.fn(delta=delta, advantages=advantages, mask=mask, score=score, group_id=group_id, agg=agg)


#: name -> priority (the table in the module docstring); ``@PRIORITIES.register(name, needs_critic=...)`` on
#: ``fn(*, delta, advantages, mask, score, group_id, agg)`` adds one
PRIORITIES: Registry[Priority] = Registry("replay priority", wrap=Priority)


@PRIORITIES.register("td_error", needs_critic=True)
def _td_error(*, delta, advantages, mask, score, group_id, agg):
    return priority_td_error(delta, mask, agg)


@PRIORITIES.register("abs_advantage")
def _abs_advantage(*, delta, advantages, mask, score, group_id, agg):
    return priority_abs_advantage(advantages, mask, agg)


@PRIORITIES.register("group_variance")
def _group_variance(*, delta, advantages, mask, score, group_id, agg):
    return priority_group_variance(score, group_id)
