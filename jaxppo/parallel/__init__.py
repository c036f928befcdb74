"""Meshes and shardings (``("data", "fsdp", "tensor")`` axes, logical-axis rules); host <-> global transfers."""

from jaxppo.parallel.host import (all_processes, broadcast_from_main, float_from_main, from_host, host_scalar,
                                  is_main_process, process_index, steps_from_main, to_host, tree_from_host)
from jaxppo.parallel.mesh import (BATCH_AXES, DEFAULT_RULES, MESH_AXES, batch_divisor, batch_sharding,
                                  logical_to_spec, make_mesh, merged_rules, named_sharding, replicated)

__all__ = ["BATCH_AXES", "DEFAULT_RULES", "MESH_AXES", "all_processes", "batch_divisor", "batch_sharding",
           "broadcast_from_main", "float_from_main", "from_host", "host_scalar", "is_main_process", "logical_to_spec", "make_mesh",
           "merged_rules", "named_sharding", "process_index", "replicated", "steps_from_main", "to_host", "tree_from_host"]
