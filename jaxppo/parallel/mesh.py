"""Device meshes and logical-axis shardings.

One mesh with axes ``("data", "fsdp", "tensor")``. Parameters and activations are annotated with
*logical* axis names (``"batch"``, ``"embed"``, ``"mlp"``, ...); a rule table maps each logical
name to a mesh axis, a tuple of mesh axes, or ``None`` (replicated). Batch-major arrays are split
over ``("data", "fsdp")`` so FSDP ranks also see distinct data.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical name -> mesh axes. Kept small and explicit; config `mesh.rules` entries override these.
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
}


def simulated_devices_flags(xla_flags: str, n: int) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with ``--xla_force_host_platform_device_count=n`` in place of any
    such flag: ``n`` simulated CPU devices, every other flag kept. Takes effect in a process whose JAX backend has not
    started yet."""
    kept = [f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={n}"])


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` of shape ``(data, fsdp, tensor)`` over ``devices`` (default: all devices).

    Raises ValueError naming the shape and the device count when they do not match.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = (data, fsdp, tensor)
    if any((not isinstance(s, int)) or s < 1 for s in shape):
        raise ValueError(f"mesh shape must be positive integers, got data={data} fsdp={fsdp} tensor={tensor}")
    n = int(np.prod(shape))
    if n != len(devices):
        raise ValueError(f"mesh data={data} x fsdp={fsdp} x tensor={tensor} = {n} devices, "
                         f"but {len(devices)} are available ({devices[0].platform}); "
                         f"the product of mesh.data, mesh.fsdp and mesh.tensor must equal the device count")
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def merged_rules(overrides: Mapping[str, str | Sequence[str] | None] | None = None) -> dict:
    rules = dict(DEFAULT_RULES)
    for k, v in (overrides or {}).items():
        if v is not None and not isinstance(v, str):
            v = tuple(v)
        rules[k] = v
    for k, v in rules.items():
        for ax in ((v,) if isinstance(v, str) else (v or ())):
            if ax not in MESH_AXES:
                raise ValueError(f"mesh.rules.{k}: unknown mesh axis {ax!r}; mesh axes are {MESH_AXES}")
    return rules


def logical_to_spec(names: Sequence[str | None], rules: Mapping | None = None) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions carry logical ``names`` (None = replicated).

    A mesh axis is used at most once per array: a later dimension that maps to an already-used
    axis is replicated instead.
    """
    rules = merged_rules(rules) if rules is None or any(k not in DEFAULT_RULES for k in rules) else rules
    used: set[str] = set()
    spec = []
    for name in names:
        target = None if name is None else rules.get(name)
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def named_sharding(mesh: Mesh, names: Sequence[str | None], rules: Mapping | None = None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(names, rules))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Shard the leading (batch) axis over ``("data", "fsdp")``; other axes replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_divisor(mesh: Mesh) -> int:
    """How many shards the batch axis is split into (a batch size must be a multiple of it)."""
    return int(mesh.shape["data"] * mesh.shape["fsdp"])
