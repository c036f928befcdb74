"""Replay metrics for the logs (the trainer logs them with a ``replay/`` prefix, e.g. ``replay/priority_mean``).

- ``priority_mean`` / ``priority_max``: mean / largest stored priority over valid items (filled,
  stored priority > 0), i.e. what the buffer holds now;
- ``priority_running_max``: the running maximum of every priority ever stored (what new items get);
- ``size``: filled slots; ``valid``: valid items;
- ``floor_fraction``: share of the valid items at the priority floor, ``|δ_i| <= ε`` (stored priority before
  staleness decay ``<= (2ε)^α``, rank: ``<= 2ε``): zero-advantage / zero-TD items, e.g. GRPO groups whose
  responses all got the same reward;
- ``weight_clipped_fraction``: share of the valid items whose sampling mass is below ``κ·m_max`` (``weights.py``):
  they take no part in the PER weights' normalization and their weight is truncated to 1;
- with a :class:`Sample`: ``weight_mean``, ``weight_min`` and ``sample_efficiency`` = share of the
  sampled items whose PER weight is at least ``efficiency_threshold`` (default 0.1, i.e. not down-weighted by
  more than 10x), and ``beta`` when given.

All values are float32 ``jnp`` scalars (jittable; ``O(capacity)`` for the priority statistics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxppo.replay.state import ReplayState, Sample


def metrics(state: ReplayState, sample: Sample | None = None, *, beta: float | jax.Array | None = None,
            efficiency_threshold: float = 0.1) -> dict[str, jax.Array]:
    """The metrics of the module docstring."""
    p = state.priorities
    valid = (p > 0) & (jnp.arange(p.shape[0]) < state.size)
    n_valid = jnp.sum(valid)
    nf = jnp.maximum(n_valid, 1).astype(jnp.float32)
    floor_value = 2.0 * jnp.float32(state.eps)
    if state.prioritization == "proportional":
        floor_value = floor_value ** jnp.float32(state.alpha)
        clipped = jnp.sum(valid & (p < jnp.float32(state.weight_floor) * jnp.max(jnp.where(valid, p, 0.0))))
    else:       # rank masses r^(-α), the largest 1 (rank 1)
        ranks = jnp.arange(1, p.shape[0] + 1, dtype=jnp.float32)
        clipped = jnp.sum((ranks <= n_valid) & (ranks ** (-jnp.float32(state.alpha)) < state.weight_floor))
    at_floor = valid & (state.base_priorities <= floor_value * (1.0 + 1e-5))
    out = {
        "priority_mean": jnp.sum(jnp.where(valid, p, 0.0)) / jnp.maximum(n_valid, 1).astype(jnp.float32),
        "priority_max": jnp.max(jnp.where(valid, p, 0.0)).astype(jnp.float32),
        "priority_running_max": state.max_priority.astype(jnp.float32),
        "size": state.size.astype(jnp.float32),
        "valid": n_valid.astype(jnp.float32),
        "floor_fraction": jnp.sum(at_floor).astype(jnp.float32) / nf,
        "weight_clipped_fraction": clipped.astype(jnp.float32) / nf,
    }
    if sample is not None:
        w = sample.weights.astype(jnp.float32)
        out["weight_mean"] = jnp.mean(w)
        out["weight_min"] = jnp.min(w)
        out["sample_efficiency"] = jnp.mean((w >= efficiency_threshold).astype(jnp.float32))
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
