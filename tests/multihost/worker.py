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
                               process_id=int(os.environ["JAXPPO_PROCESS_ID"]), initialization_timeout=120,
                               heartbeat_timeout_seconds=int(os.environ.get("JAXPPO_HEARTBEAT_TIMEOUT_S", 30)))


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


def one_dies(out_dir: str) -> None:
    """Both processes all-reduce once; then process 1 is SIGKILLed and process 0 enters a second collective
    that can never complete: the coordination service must end process 0 (non-zero exit) instead of a hang."""
    import signal
    import time

    from jaxppo.parallel import from_host, make_mesh, to_host

    mesh = make_mesh(2, 4, 1)
    g = from_host(np.arange(8, dtype=np.float32), NamedSharding(mesh, P(("data", "fsdp"))))
    total = float(to_host(jax.jit(lambda v: v.sum())(g)))
    print(f"first collective ok: {total}", flush=True)
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(2.0)
    print(f"entering the second collective at {time.time():.1f}", flush=True)
    print(to_host(jax.jit(lambda v: v * 2.0, out_shardings=NamedSharding(mesh, P()))(g)), flush=True)
    print("second collective returned (should not happen)", flush=True)


SCENARIOS = {"global_array": global_array, "one_dies": one_dies}

if __name__ == "__main__":
    if os.environ.get("JAXPPO_NUM_PROCESSES", "1") != "1" or "JAXPPO_COORDINATOR" in os.environ:
        init()
    SCENARIOS[sys.argv[1]](sys.argv[2])
