"""The replay buffer's state: a device-resident pytree, and ``init``.

What is stored
--------------
``storage``        any pytree of arrays (dict, tuple, ``flax.struct`` dataclass, nested), each leaf
                   ``[capacity, ...]`` (one row per trajectory): the structure of ``init``'s ``example_item``
                   with a leading slot axis; every operation maps over its leaves (``jax.tree.map``).
``priorities``     float32 ``[layout.sizes[0]]`` (padded past ``capacity`` with zeros): the leaves of the
                   sum tree, i.e. what sampling uses: the stored priority of item ``i`` times its staleness
                   decay factor (``staleness.py``; the factor is 1 with ``decay="none"``). The *stored
                   priority* of item ``i`` is:

                   - ``prioritization="proportional"``: ``p_i = (|δ_i| + ε)^α`` — already raised to α, so
                     sampling uses it directly: ``P(i) = p_i / Σ_k p_k``.
                   - ``prioritization="rank"``: the raw ``|δ_i| + ε`` (no exponent); ``P(i)`` is computed at
                     sample time from ranks: ``P(i) ∝ (1 / rank(i))^α``.

                   A stored value of 0 means "never sample" (empty slots, and items switched off with
                   :func:`jaxppo.replay.set_priorities`). A *valid* item is a filled slot with a stored
                   priority > 0.
``tree``           float32 ``[2, M]``: a wide sum tree over ``priorities`` (``tree.py``): per node the sum
                   of its leaves and their smallest positive value (``+inf`` if none; the top's minimum is
                   the least likely valid item, for the PER weights). Nodes are recomputed exactly from
                   their children whenever a leaf below changes, so the tree cannot drift.
``base_priorities`` float32, shaped and sharded like ``priorities``: the stored priorities before the
                   staleness decay (equal to ``priorities`` when ``decay="none"``).
``sample_count``   int32, like ``priorities``: ``n_i``, times item ``i`` was drawn (``record_sample``) since
                   its last refresh (``add`` / ``set_priorities``).
``refresh_step``   int32, like ``priorities``: the ``clock`` value at item ``i``'s last refresh.
``clock``          int32 scalar: the number of ``record_sample`` calls so far (one per training step);
                   ``age_i = clock - refresh_step_i``.
``decay_ref``      int32 scalar: the clock value the ``"age"`` leaves are expressed at (``staleness.py``).
``max_priority``   float32 scalar: running maximum of every stored priority ever written (starts at 1.0);
                   new items get it.
``insert_pos``     int32 scalar: the ring position the next item is written to.
``size``           int32 scalar: number of filled slots (``min(items added, capacity)``); slots
                   ``0..size-1`` are filled.

Static (not pytree leaves): ``capacity``, ``alpha``, ``eps``, ``prioritization``, ``decay``, ``decay_rate``,
``weight_floor`` (``κ`` of the PER weights, ``weights.py``),
the tree ``layout`` and the optional ``mesh``. With a mesh, ``storage`` and the per-slot arrays
(``priorities``, ``base_priorities``, ``sample_count``, ``refresh_step``) are sharded over the batch axes
``("data", "fsdp")``; the small ``tree`` and the scalars are replicated.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxppo.parallel.mesh import BATCH_AXES, batch_divisor
from jaxppo.replay.tree import TreeLayout, auto_layout
from jaxppo.replay.weights import DEFAULT_WEIGHT_FLOOR, check_weight_floor

PRIORITIZATIONS = ("proportional", "rank")
DECAYS = ("none", "sampled", "age")


@struct.dataclass
class ReplayState:
    """Prioritized replay buffer state (see the module docstring for what each field holds)."""

    storage: Any                   # pytree of [capacity, ...] arrays (module docstring)
    priorities: jax.Array
    tree: jax.Array
    max_priority: jax.Array
    insert_pos: jax.Array
    size: jax.Array
    base_priorities: jax.Array
    sample_count: jax.Array
    refresh_step: jax.Array
    clock: jax.Array
    decay_ref: jax.Array
    capacity: int = struct.field(pytree_node=False)
    alpha: float = struct.field(pytree_node=False)
    eps: float = struct.field(pytree_node=False)
    prioritization: str = struct.field(pytree_node=False)
    layout: TreeLayout = struct.field(pytree_node=False)
    mesh: Mesh | None = struct.field(pytree_node=False, default=None)
    decay: str = struct.field(pytree_node=False, default="none")
    decay_rate: float = struct.field(pytree_node=False, default=1.0)
    weight_floor: float = struct.field(pytree_node=False, default=DEFAULT_WEIGHT_FLOOR)


@struct.dataclass
class Sample:
    """One sampled minibatch.

    ``indices`` int32 ``[B]`` buffer slots; ``items`` the stored rows (the storage pytree, every leaf
    ``[B, ...]``); ``probs`` float32 ``[B]`` the exact sampling probability ``P(i)`` of each slot; ``weights``
    float32 ``[B]`` the PER importance weights ``w_i = min(1, (m_ref / m_i)^β)`` (``weights.py``).
    ``group_share`` float32 ``[B]``: 1 for item sampling; for whole groups of ``n`` slots
    (``sample(group_size=n)``, ``buffer.py``) ``n·m_i / m_g``, the factor that gives each row the expected loss
    weight it has under item sampling (``probs`` is then the group's ``P(g) = m_g / Σ m``).
    """

    indices: jax.Array
    items: Any
    probs: jax.Array
    weights: jax.Array
    group_share: jax.Array


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def is_concrete(*xs: Any) -> bool:
    """True when none of ``xs`` is being traced (so values can be checked eagerly)."""
    return not any(_is_tracer(leaf) for x in xs for leaf in jax.tree_util.tree_leaves(x))


def replicated_sharding(mesh: Mesh | None) -> NamedSharding | None:
    return None if mesh is None else NamedSharding(mesh, PartitionSpec())


def leading_sharding(mesh: Mesh | None, ndim: int) -> NamedSharding | None:
    """Shard the leading axis over the mesh's batch axes; ``None`` without a mesh."""
    if mesh is None:
        return None
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def constrain(x: jax.Array, sharding: NamedSharding | None) -> jax.Array:
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _check_scalar(name: str, value: Any, *, low: float, strict: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"replay.{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < low or (strict and v == low):
        op = ">" if strict else ">="
        raise ValueError(f"replay.{name} must be finite and {op} {low}, got {value!r}")
    return v


def leaf_name(path: tuple) -> str:
    """A pytree path as ``a.b.0`` (dict keys, attribute names and sequence indices joined by dots)."""
    return jax.tree_util.keystr(tuple(path), simple=True, separator=".") or "<root>"


def example_leaves(example_item: Any) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """``[(path, per-item shape, dtype)]`` of every leaf of ``example_item`` (arrays, ``ShapeDtypeStruct``,
    Python/NumPy scalars); ``ValueError`` for an empty pytree or a leaf that is not an array."""
    flat = jax.tree_util.tree_flatten_with_path(example_item)[0]
    if not flat:
        raise ValueError("replay example_item must be a non-empty pytree of arrays (one item, no batch axis), "
                         f"got {example_item!r:.200} with no array leaves")
    out = []
    for path, leaf in flat:
        name = leaf_name(path)
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            if not isinstance(leaf, (bool, int, float, np.generic)):
                raise ValueError(f"replay example_item leaf {name!r} must be an array or jax.ShapeDtypeStruct "
                                 f"(something with a shape and dtype), got {type(leaf).__name__}")
            leaf = np.asarray(leaf)
        dtype = jnp.dtype(leaf.dtype)
        if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
            raise ValueError(f"replay example_item leaf {name!r} has dtype {dtype}, which JAX cannot store")
        out.append((name, tuple(leaf.shape), dtype))
    return out


def init(capacity: int, example_item: Any, *, alpha: float = 0.6, eps: float = 1e-6,
         prioritization: str = "proportional", mesh: Mesh | None = None,
         leaf_fanout: int | None = None, decay: str = "none", decay_rate: float = 1.0,
         weight_floor: float = DEFAULT_WEIGHT_FLOOR) -> ReplayState:
    """An empty buffer of ``capacity`` items shaped like ``example_item``.

    ``example_item``: any pytree (dict, tuple, ``flax.struct`` dataclass, nested; ``None`` nodes hold nothing)
    whose leaves are arrays (or ``jax.ShapeDtypeStruct``) for ONE item, without a batch axis, e.g.
    ``{"response_ids": jnp.zeros((R,), jnp.int32), "score": jnp.zeros((), jnp.float32)}``; ``storage`` gets
    the same structure with a leading ``[capacity]`` axis on every leaf.
    ``alpha`` (≥ 0) the priority exponent, ``eps`` (≥ 0) added to ``|δ|``, ``prioritization``
    ``"proportional"`` or ``"rank"``. ``decay`` (``"none"``, ``"sampled"``, ``"age"``) and ``decay_rate``
    (in ``(0, 1]``) the staleness decay of ``staleness.py``. With ``mesh`` (``jaxppo.parallel.make_mesh``)
    storage and priorities are sharded over ``("data", "fsdp")``; ``capacity`` must then be a multiple of the
    number of batch shards. ``leaf_fanout`` (a power of two ≤ 1024) is a speed knob for the tree's leaf rows;
    the default comes from :func:`jaxppo.replay.tree.auto_layout`. ``weight_floor`` (``κ`` in ``[0, 1]``) bounds
    the PER weights below by ``κ^β`` (``weights.py``; 0 gives the classic ``(m_min / m_i)^β``).
    """
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"replay capacity must be a positive integer, got {capacity!r}")
    capacity = int(capacity)
    if capacity >= 2 ** 31 - 1:
        raise ValueError(f"replay capacity {capacity} does not fit int32 indices")
    alpha = _check_scalar("alpha", alpha, low=0.0)
    eps = _check_scalar("eps", eps, low=0.0)
    if prioritization not in PRIORITIZATIONS:
        raise ValueError(f"replay prioritization must be one of {PRIORITIZATIONS}, got {prioritization!r}")
    if decay not in DECAYS:
        raise ValueError(f"replay decay.kind must be one of {DECAYS}, got {decay!r}")
    decay_rate = _check_scalar("decay.rate", decay_rate, low=0.0, strict=True)
    weight_floor = check_weight_floor(weight_floor)
    if decay_rate > 1.0:
        raise ValueError(f"replay.decay.rate must be in (0, 1], got {decay_rate!r}")
    example_leaves(example_item)     # validates: non-empty, array leaves
    if leaf_fanout is not None and (isinstance(leaf_fanout, bool) or not isinstance(leaf_fanout, (int, np.integer))
                                    or not 1 <= leaf_fanout <= 1024 or leaf_fanout & (leaf_fanout - 1)):
        raise ValueError(f"replay leaf_fanout must be a power of two in [1, 1024], got {leaf_fanout!r}")

    shards = 1 if mesh is None else batch_divisor(mesh)
    if capacity % shards:
        raise ValueError(f"replay capacity={capacity} must be a multiple of the mesh's batch shards "
                         f"(data x fsdp = {shards}) to shard the storage")
    layout = auto_layout(capacity, shards, None if leaf_fanout is None else int(leaf_fanout))

    def slots(leaf):
        leaf = leaf if hasattr(leaf, "shape") and hasattr(leaf, "dtype") else np.asarray(leaf)
        shape = tuple(leaf.shape)
        return jax.device_put(jnp.zeros((capacity, *shape), jnp.dtype(leaf.dtype)),
                              leading_sharding(mesh, 1 + len(shape)))

    storage = jax.tree.map(slots, example_item)
    per_slot = leading_sharding(mesh, 1)
    priorities = jax.device_put(jnp.zeros((layout.sizes[0],), jnp.float32), per_slot)
    rep = replicated_sharding(mesh)
    tree = jnp.stack([jnp.zeros((layout.num_nodes,), jnp.float32), jnp.full((layout.num_nodes,), jnp.inf)])
    return ReplayState(
        storage=storage,
        priorities=priorities,
        tree=jax.device_put(tree, rep),
        max_priority=jax.device_put(jnp.ones((), jnp.float32), rep),
        insert_pos=jax.device_put(jnp.zeros((), jnp.int32), rep),
        size=jax.device_put(jnp.zeros((), jnp.int32), rep),
        base_priorities=jax.device_put(jnp.zeros((layout.sizes[0],), jnp.float32), per_slot),
        sample_count=jax.device_put(jnp.zeros((layout.sizes[0],), jnp.int32), per_slot),
        refresh_step=jax.device_put(jnp.zeros((layout.sizes[0],), jnp.int32), per_slot),
        clock=jax.device_put(jnp.zeros((), jnp.int32), rep),
        decay_ref=jax.device_put(jnp.zeros((), jnp.int32), rep),
        capacity=capacity, alpha=alpha, eps=eps, prioritization=prioritization,
        layout=layout, mesh=mesh, decay=decay, decay_rate=decay_rate, weight_floor=weight_floor,
    )


def stored_priority(state: ReplayState, td_abs: jax.Array) -> jax.Array:
    """Stored value for ``|δ|``: ``(|δ| + ε)^α`` (proportional) or ``|δ| + ε`` (rank).

    Non-finite ``|δ|`` (NaN/inf; only reachable under ``jit``, eager calls raise) is stored as the running
    maximum, so such an item is revisited rather than poisoning the sums.
    """
    td = jnp.abs(jnp.asarray(td_abs, jnp.float32))
    raw = td + jnp.float32(state.eps)
    p = raw ** jnp.float32(state.alpha) if state.prioritization == "proportional" else raw
    return jnp.where(jnp.isfinite(p), p, state.max_priority)
