"""Logical-axis metadata of model parameters -> PartitionSpecs / NamedShardings on a mesh.

Every ``nnx.Param`` built by ``jaxppo.models`` carries ``logical_axes`` metadata (see ``layers.make_param``);
the rules of ``jaxppo.parallel`` map logical names to mesh axes (unknown names such as ``"layers"``
are replicated). With a mesh, a dimension whose size the mesh axes do not divide (e.g. SmolLM2's 9
heads on ``tensor=2``) is replicated instead of raising (``fit_spec``).

Activations: ``constrain_batch(x, mesh_of(w))`` keeps ``x``'s leading (batch) axis split over the mesh's batch
axes inside the model, so a matmul with an FSDP-sharded weight gathers the weight's shards (one layer at a
time) instead of re-splitting the activations over the contracted dimension (which leaves every device with
full-size partial sums [all rows, out] to all-reduce). The LM head is vocab-parallel (``vocab_parallel_axes``).
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxppo.parallel import BATCH_AXES, logical_to_spec


def var_logical_axes(var: nnx.Variable) -> tuple:
    """The ``logical_axes`` of a Variable (all-None, i.e. replicated, when it has none)."""
    meta = var.get_metadata()
    axes = meta.get("logical_axes")
    if axes is None:
        return (None,) * len(getattr(var.get_value(), "shape", ()))
    return tuple(axes)


def _map_vars(fn, tree):
    return jax.tree.map(lambda v: v.replace(fn(v)) if isinstance(v, nnx.Variable) else v, tree,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


def fit_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """``spec`` with every dimension whose size is not divisible by its mesh-axes product replicated."""
    out = []
    for i, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        size = 1
        for a in axes:
            size *= mesh.shape[a]
        out.append(entry if size == 1 or shape[i] % size == 0 else None)
    return PartitionSpec(*out)


def mesh_spec(var: nnx.Variable, mesh: Mesh, rules: Mapping | None = None) -> PartitionSpec:
    """The PartitionSpec of ``var`` on ``mesh``: its logical axes through ``rules``, then ``fit_spec``."""
    shape = tuple(getattr(var.get_value(), "shape", ()))
    return fit_spec(logical_to_spec(var_logical_axes(var), rules), shape, mesh)


def partition_specs(tree, rules: Mapping | None = None):
    """For a module or ``nnx.State``: the same structure with each Variable's value a ``PartitionSpec``.

    Use as ``in_shardings``/``out_shardings`` of a jitted step over ``nnx.state(model)`` (after
    wrapping in NamedSharding, see ``named_shardings``).
    """
    state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
    return _map_vars(lambda v: logical_to_spec(var_logical_axes(v), rules), state)


def named_shardings(tree, mesh: Mesh, rules: Mapping | None = None):
    """Like ``partition_specs`` but each value is a ``NamedSharding`` on ``mesh`` (indivisible dims replicated)."""
    state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
    return _map_vars(lambda v: NamedSharding(mesh, mesh_spec(v, mesh, rules)), state)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Mapping | None = None) -> nnx.Module:
    """Place every parameter of ``model`` (in place) on ``mesh`` following its logical axes; returns ``model``."""
    state = nnx.state(model)
    shardings = named_shardings(state, mesh, rules)
    placed = jax.tree.map(lambda x, s: jax.device_put(x, s), state, shardings)
    nnx.update(model, placed)
    return model


def mesh_of(x: jax.Array):
    """The (abstract, inside ``jit``) mesh of ``x``'s ``NamedSharding``; ``None`` when ``x`` is on no mesh
    (a single-device or uncommitted array)."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    return None if mesh is None or mesh.empty else mesh


def batch_multiple(state) -> int:
    """The size of the batch axes (``data × fsdp``) of the mesh the model's parameters ``state`` live on (1 off a
    mesh): packed row counts are rounded up to a multiple of it, and shared-prompt passes use it, so the rows split
    evenly over the devices."""
    for leaf in jax.tree.leaves(state):
        mesh = mesh_of(leaf) if isinstance(leaf, jax.Array) else None
        if mesh is not None:
            return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.shape)
    return 1


def constrain_batch(x: jax.Array, mesh) -> jax.Array:
    """``x`` with its leading axis split over ``BATCH_AXES`` (``data × fsdp``) of ``mesh``, other axes replicated
    (``jax.lax.with_sharding_constraint``; values unchanged). A no-op when ``mesh`` is None, lacks those axes,
    their product is 1, or does not divide ``x.shape[0]``."""
    if mesh is None or x.ndim == 0 or any(a not in mesh.shape for a in BATCH_AXES):
        return x
    n = 1
    for a in BATCH_AXES:
        n *= mesh.shape[a]
    if n == 1 or x.shape[0] % n:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1)))))


def vocab_parallel_axes(mesh, rows: int, vocab: int) -> tuple[str | None, tuple[str, ...]] | None:
    """``(row axis, vocab axes)`` of a vocab-parallel LM head on ``mesh``, or ``None`` when it does not apply.

    The vocab axes are those of ``("fsdp", "tensor")`` with size > 1 (``None`` when there are none or their
    product does not divide ``vocab``); rows are split over ``"data"`` when it has size > 1 and divides ``rows``
    (else the row axis is ``None``, replicated). ``logits[rows, vocab]`` is then computed as
    ``h[rows, D] @ W[D, vocab]`` with ``h`` whole along D on every device of a data group and ``W`` split by
    vocab columns: no device holds the gathered ``[D, V]`` weight or its ``[D, V]`` gradient.
    """
    if mesh is None or any(a not in mesh.shape for a in ("data", "fsdp", "tensor")):
        return None
    axes = tuple(a for a in ("fsdp", "tensor") if mesh.shape[a] > 1)
    n = 1
    for a in axes:
        n *= mesh.shape[a]
    if not axes or vocab % n:
        return None
    row = "data" if mesh.shape["data"] > 1 and rows % mesh.shape["data"] == 0 else None
    return row, axes

