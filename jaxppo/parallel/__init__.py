"""Meshes and shardings (``("data", "fsdp", "tensor")`` axes, logical-axis rules)."""

from jaxppo.parallel.mesh import (BATCH_AXES, DEFAULT_RULES, MESH_AXES, batch_divisor, batch_sharding,
                                  logical_to_spec, make_mesh, merged_rules, named_sharding, replicated)

__all__ = ["BATCH_AXES", "DEFAULT_RULES", "MESH_AXES", "batch_divisor", "batch_sharding", "logical_to_spec",
           "make_mesh", "merged_rules", "named_sharding", "replicated"]
