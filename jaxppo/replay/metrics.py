"""Replay metrics for the logs (the trainer logs them with a ``replay/`` prefix, e.g. ``replay/priority_mean``).

- ``priority_mean`` / ``priority_max``: mean / largest stored priority over valid items (filled,
  stored priority > 0), i.e. what the buffer holds now;
- ``priority_running_max``: the running maximum of every priority ever stored (what new items get);
- ``size``: filled slots; ``valid``: valid items;
- with a :class:`Sample`: ``weight_mean``, ``weight_min`` and ``sample_efficiency`` = share of the
  sampled items whose PER weight is at least ``weight_floor`` (default 0.1, i.e. not down-weighted by
  more than 10x), and ``beta`` when given.

All values are float32 ``jnp`` scalars (jittable; ``O(capacity)`` for the priority statistics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.replay.state import ReplayState, Sample


def metrics(state: ReplayState, sample: Sample | None = None, *, beta: float | jax.Array | None = None,
            weight_floor: float = 0.1) -> dict[str, jax.Array]:
    """The metrics of the module docstring."""
    p = state.priorities
    valid = (p > 0) & (jnp.arange(p.shape[0]) < state.size)
    n_valid = jnp.sum(valid)
    out = {
        "priority_mean": jnp.sum(jnp.where(valid, p, 0.0)) / jnp.maximum(n_valid, 1).astype(jnp.float32),
        "priority_max": jnp.max(jnp.where(valid, p, 0.0)).astype(jnp.float32),
        "priority_running_max": state.max_priority.astype(jnp.float32),
        "size": state.size.astype(jnp.float32),
        "valid": n_valid.astype(jnp.float32),
    }
    if sample is not None:
        w = sample.weights.astype(jnp.float32)
        out["weight_mean"] = jnp.mean(w)
        out["weight_min"] = jnp.min(w)
        out["sample_efficiency"] = jnp.mean((w >= weight_floor).astype(jnp.float32))
    if beta is not None:
        out["beta"] = jnp.asarray(beta, jnp.float32)
    return out


def staleness_metrics(state: ReplayState) -> dict[str, jax.Array]:
    """Staleness of the valid items (``staleness.py``), float32 scalars, ``O(capacity)``:
    ``sample_count_mean`` / ``sample_count_max`` (``n_i``: draws since the item's refresh) and ``age_mean``
    (``clock - refresh_step_i``: steps since its refresh). Logged as ``replay/<name>``."""
    valid = (state.base_priorities > 0) & (jnp.arange(state.priorities.shape[0]) < state.size)
    k = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
    cnt = jnp.where(valid, state.sample_count, 0).astype(jnp.float32)
    age = jnp.where(valid, state.clock - state.refresh_step, 0).astype(jnp.float32)
    return {"sample_count_mean": jnp.sum(cnt) / k, "sample_count_max": jnp.max(cnt, initial=0.0),
            "age_mean": jnp.sum(age) / k}
