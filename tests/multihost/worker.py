"""A process of a multi-process test: joins ``jax.distributed`` from the JAXPPO_* variables, runs a scenario.

    python tests/multihost/worker.py SCENARIO OUT_DIR

Writes ``OUT_DIR/SCENARIO.<process>.npz`` with what it read back, and prints one line per fact.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def init() -> None:
    jax.distributed.initialize(coordinator_address=os.environ["JAXPPO_COORDINATOR"],
                               num_processes=int(os.environ["JAXPPO_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAXPPO_PROCESS_ID"]), initialization_timeout=120)


def global_array(out_dir: str) -> None:
    """A (data=2, fsdp=4) mesh over all devices; arrays built from host data and read back in several specs."""
    from jaxppo.parallel import from_host, make_mesh, to_host

    mesh = make_mesh(2, 4, 1)
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12) / 7.0
    got = {}
    for name, spec in {"batch": P(("data", "fsdp")), "grid": P("data", "fsdp"), "rep": P()}.items():
        g = from_host(x, NamedSharding(mesh, spec))
        print(f"{name}: fully_addressable={g.is_fully_addressable}", flush=True)
        got[name] = to_host(g)
        got[name + "_sum"] = to_host(jax.jit(lambda v: (v * v).sum())(g))
    np.savez(os.path.join(out_dir, f"global_array.{jax.process_index()}.npz"), **got)
    print(f"process {jax.process_index()}/{jax.process_count()} local={jax.local_device_count()} "
          f"global={jax.device_count()} ok", flush=True)


SCENARIOS = {"global_array": global_array}

if __name__ == "__main__":
    if os.environ.get("JAXPPO_NUM_PROCESSES", "1") != "1" or "JAXPPO_COORDINATOR" in os.environ:
        init()
    SCENARIOS[sys.argv[1]](sys.argv[2])
