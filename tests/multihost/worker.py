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


def decisions(out_dir: str) -> None:
    """Decisions taken once: the helpers get DIFFERENT local inputs on the two processes and must return process
    0's value (or the agreement of all) everywhere; then a checkpoint whose shards only process 1 reads is damaged
    (the data files of ``ocdbt.process_1`` overwritten) and ``restore_newest`` must restore the same older step on both."""
    import json

    from jaxppo.parallel import all_processes, float_from_main, from_host, make_mesh, steps_from_main, to_host
    from jaxppo.trainer.checkpoint import Checkpointer, CheckpointError

    me = jax.process_index()
    got = {"steps": np.asarray(steps_from_main([1, 2, 30] if me == 0 else [7])),
           "float": np.asarray(float_from_main(1.0 / 3.0 if me == 0 else 2.0)),
           "all_true": np.asarray(all_processes(True)), "all_mixed": np.asarray(all_processes(me == 0))}
    mesh = make_mesh(2, 4, 1)
    sh = NamedSharding(mesh, P(("data", "fsdp")))   # every row on one device: each process writes its own rows
    base = np.arange(8 * 8192, dtype=np.float32).reshape(8, 8192)   # big enough not to be inlined in the manifest
    from flax import struct

    @struct.dataclass
    class State:   # what Checkpointer.save checks: the parameters are `actor`
        actor: dict

    like = State(actor={"w": from_host(base, sh)})
    ckdir = os.path.join(out_dir, "ckpt")
    ckpt = Checkpointer(ckdir, keep_last=5, async_save=False)
    for step in (1, 2):
        assert ckpt.save(step, State(actor={"w": from_host(base * step, sh)}), {"note": "decisions"})
    ckpt.wait()
    all_processes(True)   # both saves are complete everywhere
    damaged = []
    if me == 0:
        for root, _, files in os.walk(os.path.join(ckdir, "2")):
            if "ocdbt.process_1" in root and os.path.basename(root) == "d":   # its data files, not its manifest
                for f in files:
                    with open(os.path.join(root, f), "r+b") as fh:
                        fh.write(b"\0" * max(os.path.getsize(os.path.join(root, f)), 16))
                    damaged.append(os.path.relpath(os.path.join(root, f), ckdir))
        print(f"damaged {len(damaged)} files of process 1: {damaged}", flush=True)
    all_processes(True)   # the damage is on disk before anyone reads
    try:   # each process's own view, undecided: process 0 reads step 2, process 1 cannot (files only, no program)
        ckpt.read(2, like)
        got["local_ok"] = np.asarray(True)
    except CheckpointError as e:
        got["local_ok"] = np.asarray(False)
        print(f"process {me}: step 2 unreadable here: {str(e)[:200]}", flush=True)
    res = ckpt.restore_newest(like)
    got["restored_step"] = np.asarray(res.step)
    got["restored"] = to_host(res.state.actor["w"])
    got["damaged_steps"] = np.asarray([d[0] for d in res.damaged])
    ckpt.close()
    np.savez(os.path.join(out_dir, f"decisions.{me}.npz"), **got)
    if me == 0:
        with open(os.path.join(out_dir, "damaged_files.json"), "w") as fh:
            json.dump(damaged, fh)
    print(f"process {me}: restored step {res.step}", flush=True)


SCENARIOS = {"global_array": global_array, "one_dies": one_dies, "decisions": decisions}

if __name__ == "__main__":
    if os.environ.get("JAXPPO_NUM_PROCESSES", "1") != "1" or "JAXPPO_COORDINATOR" in os.environ:
        if sys.argv[1] == "decisions":   # Orbax under several processes: as launch/multihost.py sets it up
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        init()
        if sys.argv[1] == "decisions":
            from jaxppo.parallel.host import use_distributed_barriers

            use_distributed_barriers()
    SCENARIOS[sys.argv[1]](sys.argv[2])
