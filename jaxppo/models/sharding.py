"""Logical-axis metadata of model parameters -> PartitionSpecs / NamedShardings on a mesh.

Every ``nnx.Param`` built by ``jaxppo.models`` carries ``logical_axes`` metadata (see ``layers.make_param``);
the rules of ``jaxppo.parallel`` map logical names to mesh axes (unknown names such as ``"layers"``
are replicated). With a mesh, a dimension whose size the mesh axes do not divide (e.g. SmolLM2's 9
heads on ``tensor=2``) is replicated instead of raising (``fit_spec``).
"""

from __future__ import annotations

from typing import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxppo.parallel import logical_to_spec


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


def spec_of(var: nnx.Variable, rules: Mapping | None = None) -> PartitionSpec:
    return logical_to_spec(var_logical_axes(var), rules)
