"""Multi-process entry point: ``jax.distributed.initialize()``, then a jaxppo command (``train`` by default).

    python launch/multihost.py [train|dpo|evaluate|reward|collect] --config FILE [dotted.key=value ...]

Run the same command in every process (one per host on TPU pods and multi-node GPU clusters).
``jax.distributed.initialize()`` finds the coordinator by itself on Cloud TPU, under SLURM and Open MPI;
elsewhere set all three of

    JAXPPO_COORDINATOR=host:port   JAXPPO_NUM_PROCESSES=N   JAXPPO_PROCESS_ID=i

(``JAXPPO_LOCAL_DEVICE_IDS=0,1,...`` optionally restricts the GPUs a process uses;
``JAXPPO_HEARTBEAT_TIMEOUT_S`` (default 30) bounds how long the others wait for a process that died).
``JAXPPO_DISTRIBUTED=0`` skips the initialisation (plain single-process run, for debugging).
After initialisation ``jax.devices()`` lists the devices of all processes and the command builds its mesh
from them; only process 0 writes files. Log lines carry ``[process i/N]``; ``kill -USR1 PID`` prints
the Python stacks of a process (to see which collective it waits in).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import signal
import sys

COMMANDS = {"train": "jaxppo.train", "dpo": "jaxppo.dpo", "evaluate": "jaxppo.evaluate",
            "reward": "jaxppo.reward", "collect": "jaxppo.collect"}


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
    if env.get("JAXPPO_HEARTBEAT_TIMEOUT_S"):
        kw["heartbeat_timeout_seconds"] = int(env["JAXPPO_HEARTBEAT_TIMEOUT_S"])
    return kw


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """``(module, rest)``: the first argument names a command of :data:`COMMANDS`, else ``train``."""
    if argv and not argv[0].startswith("-"):
        if argv[0] not in COMMANDS:
            raise SystemExit(f"launch/multihost.py: unknown command {argv[0]!r}; one of {', '.join(COMMANDS)} "
                             "(or none: train)")
        return COMMANDS[argv[0]], argv[1:]
    return COMMANDS["train"], argv


def _tag_logs(index: int, count: int) -> None:
    """Every log record (and warnings) of this process starts with ``[process i/N]``."""
    old = logging.getLogRecordFactory()
    tag = f"[process {index}/{count}] "

    def factory(*a, **k):
        rec = old(*a, **k)
        rec.msg = tag + str(rec.msg)
        return rec
    logging.setLogRecordFactory(factory)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    module, rest = split_command(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.environ.get("JAXPPO_DISTRIBUTED", "1") != "0" and not any(a in ("-h", "--help") for a in rest):
        import jax

        kw = distributed_kwargs()
        kw.setdefault("heartbeat_timeout_seconds", 30)
        # CPU collectives (gloo): every process must run its programs in order; with asynchronous dispatch
        # a process can enqueue the next program (e.g. Orbax's barrier) behind one that waits for a peer, and
        # both wait forever. Set before the CPU client exists; no effect on GPU/TPU.
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        jax.distributed.initialize(**kw)
        from jaxppo.parallel.host import use_distributed_barriers

        use_distributed_barriers()
        _tag_logs(jax.process_index(), jax.process_count())
        print(f"jax.distributed: process {jax.process_index()}/{jax.process_count()}, "
              f"{jax.local_device_count()} local / {jax.device_count()} global devices", file=sys.stderr)
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
