"""Pick a PF-PPO filter: R² between rewards and actual scores on the samples each filter keeps.

PF-PPO (arXiv 2409.06957) chooses the filtration whose kept samples have rewards that best predict the
actual quality of the responses. Given per response a ``reward`` (from the reward model, the signal
PPO trains on) and a reference ``actual`` score (ground truth, e.g. unit-test pass rate or a held-out
judge), :func:`filter_r2` reports, for each filter, the following binned, weighted R²:

1. Bin edges: ``num_bins`` equal-width bins over ``[min reward, max reward]`` of ALL responses (the
   same edges for every filter, so the numbers are comparable); the top edge is inclusive.
2. With the filter's weights ``w_i`` (0/1 keep mask, or ``|s|^k`` for ``pow``), per bin ``b``:
   ``W_b = Σ_{i∈b} w_i``, ``x_b = Σ w_i r_i / W_b`` (mean reward), ``y_b = Σ w_i a_i / W_b`` (mean actual
   score). Bins with ``W_b = 0`` are dropped.
3. ``R²`` of the ``W_b``-weighted least-squares line ``y ≈ c0 + c1·x`` over the bins:
   ``R² = 1 - Σ W_b (y_b - ŷ_b)² / Σ W_b (y_b - ȳ)²`` with ``ȳ = Σ W_b y_b / Σ W_b``; equivalently the
   squared ``W_b``-weighted Pearson correlation of ``(x_b, y_b)``.

R² is NaN when it is undefined: fewer than two non-empty bins, or no spread in ``x_b`` or ``y_b``.
A higher R² means the kept rewards are a more faithful signal of real performance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.replay import pf_ppo
from jaxppo.replay.state import is_concrete


def bin_edges(rewards, num_bins: int) -> jax.Array:
    """``num_bins + 1`` equal-width edges over ``[min(rewards), max(rewards)]``."""
    r = jnp.asarray(rewards, jnp.float32)
    return jnp.linspace(jnp.min(r), jnp.max(r), num_bins + 1)


def binned_r2(rewards, actual, weights, edges) -> jax.Array:
    """The weighted binned R² of the module docstring for given ``weights`` ``[B]`` and ``edges``."""
    r = jnp.asarray(rewards, jnp.float32)
    a = jnp.asarray(actual, jnp.float32)
    w = jnp.asarray(weights, jnp.float32)
    num_bins = edges.shape[0] - 1
    b = jnp.clip(jnp.searchsorted(edges, r, side="right") - 1, 0, num_bins - 1)
    big_w = jax.ops.segment_sum(w, b, num_segments=num_bins)
    safe = jnp.where(big_w > 0, big_w, 1.0)
    x = jax.ops.segment_sum(w * r, b, num_segments=num_bins) / safe
    y = jax.ops.segment_sum(w * a, b, num_segments=num_bins) / safe
    tot = jnp.sum(big_w)
    x_mean = jnp.sum(big_w * x) / tot
    y_mean = jnp.sum(big_w * y) / tot
    cov = jnp.sum(big_w * (x - x_mean) * (y - y_mean))
    var_x = jnp.sum(big_w * (x - x_mean) ** 2)
    var_y = jnp.sum(big_w * (y - y_mean) ** 2)
    enough = (jnp.sum(big_w > 0) >= 2) & (var_x > 0) & (var_y > 0)
    return jnp.where(enough, cov ** 2 / jnp.where(enough, var_x * var_y, 1.0), jnp.nan)


def filter_r2(rewards, actual, group_ids, num_groups: int, *, key: jax.Array, num_bins: int = 10,
              weight_pow: float = 1.0, filters=None) -> dict[str, float]:
    """``{filter name: R²}`` for each filter in ``filters`` (see the module docstring).

    ``rewards``, ``actual``: ``[B]`` float; ``group_ids``: ``[B]`` int prompt group of each response;
    ``key`` drives ``best_random``; ``weight_pow`` is ``k`` of the ``pow`` filter; ``filters`` defaults to every
    name of ``pf_ppo.PF_FILTERS``.
    """
    if np.ndim(rewards) != 1 or np.shape(actual) != np.shape(rewards):
        raise ValueError(f"filter_r2: rewards {np.shape(rewards)} and actual {np.shape(actual)} must be "
                         "1-D of the same length")
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 2:
        raise ValueError(f"filter_r2: num_bins must be an int >= 2, got {num_bins!r}")
    if is_concrete(actual) and not bool(np.all(np.isfinite(np.asarray(actual)))):
        raise ValueError("filter_r2: actual scores contain NaN or inf")
    filters = pf_ppo.PF_FILTERS.names() if filters is None else tuple(filters)
    for name in filters:
        pf_ppo.PF_FILTERS.get(name)  # an unknown name: an error listing the known ones, before any work
    edges = bin_edges(rewards, int(num_bins))
    out = {}
    for name in filters:
        w = pf_ppo.filter_weights(name, rewards, group_ids, num_groups, key=key, weight_pow=weight_pow)
        out[name] = float(binned_r2(rewards, actual, w, edges))
    return out
