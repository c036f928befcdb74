"""PF-PPO policy filtration (Zhang et al., arXiv 2409.06957) as pure, jittable weight functions.

Per prompt group (responses sharing a ``group_id``; ``num_groups`` is static for ``jit``), each function
returns a float32 weight per response, ``[B]``; filters return a 0/1 keep mask:

- ``best_of_n``:    1 on the best-scored response of each group.
- ``best_random``:  1 on the best and on one other response of the group drawn uniformly at random.
- ``best_worst``:   1 on the best and on the worst response of the group.
- ``pow``:          ``|s|^k``.
- ``dynamic_sampling``: DAPO's filter, 0 on every row of a group whose scores are all equal, else 1.
- ``none``:         1 on every real response.

Ties are broken deterministically: the lowest batch index counts as the best; the worst is the lowest
index among the minimal scores once the best is removed (so a group of equal scores keeps its first
two responses). A group of one keeps just that response. ``mask`` (optional, ``[B]``, 1 = real
response) excludes padding rows: they get weight 0 and never count as best/worst/random.

Batch level, verl's ``algorithm.pf_ppo`` semantics (whole batch, no groups), see
:func:`batch_reweight`: ``pow`` → ``|s|^k``; ``max_min`` → 1 where ``s`` equals the batch max or min,
else 0; ``max_random`` → 0.4 where ``s`` equals the batch max, else 0.1; then ``w ← max(w + 1e-8, 1e-8)``.
verl then resamples the batch with replacement in proportion to ``w`` (:func:`resample_indices`).
Scores are sequence scores ``[B]`` (verl sums the token-level scores of each response).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.registry import Registry
from jaxppo.replay.state import is_concrete

#: ``pf_ppo.filter``: name -> ``fn(scores, group_ids, num_groups, *, key, weight_pow, mask) -> weights [B]``
#: (dataset level, per prompt group); ``@PF_FILTERS.register(name)`` adds one
PF_FILTERS: Registry[Callable[..., jax.Array]] = Registry("pf_ppo filter")
#: ``pf_ppo.reweight_method`` (besides ``"none"``, off): name -> ``fn(scores [B], weight_pow) -> w [B]`` before the
#: ``1e-8`` floor (batch level, verl's semantics); ``@PF_REWEIGHTS.register(name)`` adds one
PF_REWEIGHTS: Registry[Callable[..., jax.Array]] = Registry("pf_ppo reweight method")


def _check(scores, group_ids, num_groups, mask) -> None:
    if np.ndim(scores) != 1:
        raise ValueError(f"pf_ppo: scores must be 1-D [B] sequence scores, got shape {np.shape(scores)}")
    b = np.shape(scores)[0]
    if group_ids is not None:
        if np.shape(group_ids) != (b,):
            raise ValueError(f"pf_ppo: group_ids shape {np.shape(group_ids)} does not match scores ({b},)")
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
            raise ValueError(f"pf_ppo: num_groups must be a positive int (static), got {num_groups!r}")
        if is_concrete(group_ids):
            g = np.asarray(group_ids)
            if not np.issubdtype(g.dtype, np.integer):
                raise ValueError(f"pf_ppo: group_ids must be integers, got dtype {g.dtype}")
            if g.size and (g.min() < 0 or g.max() >= num_groups):
                raise ValueError(f"pf_ppo: group_ids must lie in [0, num_groups={num_groups}), "
                                 f"got range [{g.min()}, {g.max()}]")
    if mask is not None and np.shape(mask) != (b,):
        raise ValueError(f"pf_ppo: mask shape {np.shape(mask)} does not match scores ({b},)")
    if is_concrete(scores) and not bool(np.all(np.isfinite(np.asarray(scores)))):
        raise ValueError("pf_ppo: scores contain NaN or inf")


def _valid(scores, mask):
    return jnp.ones(scores.shape, bool) if mask is None else jnp.asarray(mask) > 0


def _first_where(cond, group_ids, num_groups):
    """Per item: True iff it is the lowest-index item with ``cond`` in its group."""
    b = cond.shape[0]
    idx = jnp.arange(b, dtype=jnp.int32)
    first = jax.ops.segment_min(jnp.where(cond, idx, b), group_ids, num_segments=num_groups)
    return cond & (idx == first[group_ids])


def _best(scores, group_ids, num_groups, valid):
    top = jax.ops.segment_max(jnp.where(valid, scores, -jnp.inf), group_ids, num_segments=num_groups)
    return _first_where(valid & (scores == top[group_ids]), group_ids, num_groups)


def best_of_n(scores, group_ids, num_groups: int, *, mask=None) -> jax.Array:
    """Keep mask: 1 on the best response of each group (lowest index on ties)."""
    _check(scores, group_ids, num_groups, mask)
    scores, group_ids = jnp.asarray(scores, jnp.float32), jnp.asarray(group_ids, jnp.int32)
    return _best(scores, group_ids, num_groups, _valid(scores, mask)).astype(jnp.float32)


def best_worst(scores, group_ids, num_groups: int, *, mask=None) -> jax.Array:
    """Keep mask: 1 on the best and the worst response of each group."""
    _check(scores, group_ids, num_groups, mask)
    scores, group_ids = jnp.asarray(scores, jnp.float32), jnp.asarray(group_ids, jnp.int32)
    valid = _valid(scores, mask)
    best = _best(scores, group_ids, num_groups, valid)
    rest = valid & ~best
    low = jax.ops.segment_min(jnp.where(rest, scores, jnp.inf), group_ids, num_segments=num_groups)
    worst = _first_where(rest & (scores == low[group_ids]), group_ids, num_groups)
    return (best | worst).astype(jnp.float32)


def best_random(scores, group_ids, num_groups: int, key: jax.Array, *, mask=None) -> jax.Array:
    """Keep mask: 1 on the best response and on one other response of the group chosen uniformly."""
    _check(scores, group_ids, num_groups, mask)
    scores, group_ids = jnp.asarray(scores, jnp.float32), jnp.asarray(group_ids, jnp.int32)
    valid = _valid(scores, mask)
    best = _best(scores, group_ids, num_groups, valid)
    rest = valid & ~best
    u = jax.random.uniform(key, scores.shape)
    top_u = jax.ops.segment_max(jnp.where(rest, u, -1.0), group_ids, num_segments=num_groups)
    pick = _first_where(rest & (u == top_u[group_ids]), group_ids, num_groups)
    return (best | pick).astype(jnp.float32)


def pow_weights(scores, k: float, *, mask=None) -> jax.Array:
    """``|s|^k`` (0 on masked rows)."""
    _check(scores, None, None, mask)
    scores = jnp.asarray(scores, jnp.float32)
    return jnp.where(_valid(scores, mask), jnp.abs(scores) ** jnp.float32(k), 0.0)


def filter_weights(method: str, scores, group_ids=None, num_groups: int | None = None, *,
                   key: jax.Array | None = None, weight_pow: float = 1.0, mask=None) -> jax.Array:
    """The weights ``[B]`` of the filter ``method`` of :data:`PF_FILTERS` (``"none"``: 1 on every real response)."""
    return PF_FILTERS.get(method)(scores, group_ids, num_groups, key=key, weight_pow=weight_pow, mask=mask)


def _needs_groups(name: str, group_ids, num_groups) -> None:
    if group_ids is None or num_groups is None:
        raise ValueError(f"pf_ppo filter {name!r} needs group_ids and num_groups")


@PF_FILTERS.register("none")
def _none(scores, group_ids, num_groups, *, key, weight_pow, mask):
    _check(scores, None, None, mask)
    return _valid(jnp.asarray(scores), mask).astype(jnp.float32)


@PF_FILTERS.register("pow")
def _pow(scores, group_ids, num_groups, *, key, weight_pow, mask):
    return pow_weights(scores, weight_pow, mask=mask)


@PF_FILTERS.register("best_of_n")
def _best_of_n(scores, group_ids, num_groups, *, key, weight_pow, mask):
    _needs_groups("best_of_n", group_ids, num_groups)
    return best_of_n(scores, group_ids, num_groups, mask=mask)


@PF_FILTERS.register("best_worst")
def _best_worst(scores, group_ids, num_groups, *, key, weight_pow, mask):
    _needs_groups("best_worst", group_ids, num_groups)
    return best_worst(scores, group_ids, num_groups, mask=mask)


@PF_FILTERS.register("best_random")
def _best_random(scores, group_ids, num_groups, *, key, weight_pow, mask):
    _needs_groups("best_random", group_ids, num_groups)
    if key is None:
        raise ValueError("pf_ppo filter 'best_random' needs a PRNG key")
    return best_random(scores, group_ids, num_groups, key, mask=mask)


def batch_reweight(scores, method: str, weight_pow: float = 2.0) -> jax.Array:
    """verl's batch-level PF-PPO weights (module docstring) of ``method`` in :data:`PF_REWEIGHTS`, with the
    ``1e-8`` floor ``max(w + 1e-8, 1e-8)``."""
    fn = PF_REWEIGHTS.get(method)
    _check(scores, None, None, None)
    w = fn(jnp.asarray(scores, jnp.float32), weight_pow)
    return jnp.maximum(w + 1e-8, 1e-8)


@PF_REWEIGHTS.register("pow")
def _reweight_pow(s, weight_pow):
    return jnp.abs(s) ** jnp.float32(weight_pow)


@PF_REWEIGHTS.register("max_min")
def _reweight_max_min(s, weight_pow):
    return jnp.where((s == jnp.max(s)) | (s == jnp.min(s)), 1.0, 0.0)


@PF_REWEIGHTS.register("max_random")
def _reweight_max_random(s, weight_pow):
    return jnp.where(s == jnp.max(s), 0.4, 0.1)


def resample_indices(key: jax.Array, weights, num_samples: int | None = None) -> jax.Array:
    """``num_samples`` (default ``B``) indices drawn with replacement, ``P(i) = w_i / Σ w``."""
    if np.ndim(weights) != 1:
        raise ValueError(f"pf_ppo: weights must be 1-D, got shape {np.shape(weights)}")
    if is_concrete(weights):
        w = np.asarray(weights)
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
            raise ValueError("pf_ppo: resampling weights must be finite, >= 0 and not all 0")
    w = jnp.asarray(weights, jnp.float32)
    n = w.shape[0] if num_samples is None else int(num_samples)
    return jax.random.categorical(key, jnp.log(w), shape=(n,)).astype(jnp.int32)


def dynamic_sampling_weights(scores, group_ids, num_groups: int, *, mask=None,
                             atol: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """DAPO dynamic sampling as a keep mask: ``(weights [B] float32 in {0, 1}, n_dropped_groups int32)``.

    A group whose real responses all have (nearly) the same score carries no signal for group-relative
    estimators (std 0, every advantage 0): all its rows get 0; every other real response gets 1. "Equal"
    means ``max_g s - min_g s <= atol``. As verl's DAPO recipe (``std > 0 or len == 1``), a group with a single
    real response is kept. ``n_dropped_groups`` counts the dropped groups.
    """
    _check(scores, group_ids, num_groups, mask)
    if is_concrete(atol) and not float(atol) >= 0:
        raise ValueError(f"pf_ppo: atol must be >= 0, got {atol!r}")
    scores, group_ids = jnp.asarray(scores, jnp.float32), jnp.asarray(group_ids, jnp.int32)
    valid = _valid(scores, mask)
    hi = jax.ops.segment_max(jnp.where(valid, scores, -jnp.inf), group_ids, num_segments=num_groups)
    lo = jax.ops.segment_min(jnp.where(valid, scores, jnp.inf), group_ids, num_segments=num_groups)
    count = jax.ops.segment_sum(valid.astype(jnp.int32), group_ids, num_segments=num_groups)
    dropped = (count > 1) & (hi - lo <= atol)
    weights = (valid & ~dropped[group_ids]).astype(jnp.float32)
    return weights, jnp.sum(dropped).astype(jnp.int32)


@PF_FILTERS.register("dynamic_sampling")
def _dynamic_sampling(scores, group_ids, num_groups, *, key, weight_pow, mask):
    _needs_groups("dynamic_sampling", group_ids, num_groups)
    return dynamic_sampling_weights(scores, group_ids, num_groups, mask=mask)[0]


def dropped_groups(weights, group_ids, num_groups: int) -> jax.Array:
    """Number of groups whose every row has weight 0 (int32): the groups a filter dropped entirely (for
    ``dynamic_sampling``, its ``n_dropped_groups``)."""
    w, g = jnp.asarray(weights, jnp.float32), jnp.asarray(group_ids, jnp.int32)
    kept = jax.ops.segment_sum((w > 0).astype(jnp.int32), g, num_segments=num_groups)
    present = jax.ops.segment_sum(jnp.ones(w.shape, jnp.int32), g, num_segments=num_groups) > 0
    return jnp.sum(present & (kept <= 0)).astype(jnp.int32)
