"""Multi-process entry point: ``jax.distributed.initialize()``, then ``python -m jaxppo.train``.

    python launch/multihost.py --config FILE [dotted.key=value ...]

Run the same command in every process (one per host on TPU pods and multi-node GPU clusters).
``jax.distributed.initialize()`` finds the coordinator by itself on Cloud TPU, under SLURM and Open MPI;
elsewhere set all three of

    JAXPPO_COORDINATOR=host:port   JAXPPO_NUM_PROCESSES=N   JAXPPO_PROCESS_ID=i

(``JAXPPO_LOCAL_DEVICE_IDS=0,1,...`` optionally restricts the GPUs a process uses).
``JAXPPO_DISTRIBUTED=0`` skips the initialisation (plain single-process run, for debugging).
Nothing else differs from ``python -m jaxppo.train``: after initialisation ``jax.devices()`` lists the
devices of all processes and the trainer builds its mesh from them.
"""

from __future__ import annotations

import os
import sys


def distributed_kwargs(env=os.environ) -> dict:
    """Keyword arguments of ``jax.distributed.initialize`` from the JAXPPO_* environment variables."""
    names = ("JAXPPO_COORDINATOR", "JAXPPO_NUM_PROCESSES", "JAXPPO_PROCESS_ID")
    given = [n for n in names if env.get(n)]
    if given and len(given) != len(names):
        missing = sorted(set(names) - set(given))
        raise SystemExit(f"launch/multihost.py: set all of {', '.join(names)} or none of them; missing {missing}")
    kw: dict = {}
    if given:
        kw = dict(coordinator_address=env["JAXPPO_COORDINATOR"], num_processes=int(env["JAXPPO_NUM_PROCESSES"]),
                  process_id=int(env["JAXPPO_PROCESS_ID"]))
    if env.get("JAXPPO_LOCAL_DEVICE_IDS"):
        kw["local_device_ids"] = [int(i) for i in env["JAXPPO_LOCAL_DEVICE_IDS"].split(",")]
    return kw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("JAXPPO_DISTRIBUTED", "1") != "0" and not any(a in ("-h", "--help") for a in argv):
        import jax

        jax.distributed.initialize(**distributed_kwargs())
        print(f"jax.distributed: process {jax.process_index()}/{jax.process_count()}, "
              f"{jax.local_device_count()} local / {jax.device_count()} global devices", file=sys.stderr)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from jaxppo.train import main as train_main

    return train_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
