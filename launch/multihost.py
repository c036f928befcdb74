"""Multi-process entry point: ``jax.distributed.initialize()``, then a jaxppo command (``train`` by default).

    python launch/multihost.py [train|dpo|evaluate|reward|collect] --config FILE [dotted.key=value ...]

Run the same command in every process (one per host on TPU pods and multi-node GPU clusters).
``jax.distributed.initialize()`` finds the coordinator by itself on Cloud TPU, under SLURM and Open MPI;
elsewhere set all three of

    JAXPPO_COORDINATOR=host:port   JAXPPO_NUM_PROCESSES=N   JAXPPO_PROCESS_ID=i

(``JAXPPO_LOCAL_DEVICE_IDS=0,1,...`` optionally restricts the GPUs a process uses;
``JAXPPO_HEARTBEAT_TIMEOUT_S`` (default 30) bounds how long the others wait for a process that died).
``JAXPPO_DISTRIBUTED=0`` skips the initialisation (plain single-process run, for debugging).

Each process runs the command in a child process and watches it (``JAXPPO_SUPERVISE=0``: not): when a peer
process dies, the distributed runtime ends the others with a native report; this process then prints one line
instead (which process died, the last complete checkpoint, resume with ``trainer.resume=auto``), keeps the report
in ``<output_dir>/crash-process<i>.log`` and exits with status 76. SIGTERM / SIGINT are passed to the child
(preemption: it saves and exits with 75).
After initialisation ``jax.devices()`` lists the devices of all processes and the command builds its mesh
from them; only process 0 writes files. Log lines carry ``[process i/N]``; ``kill -USR1 PID`` prints
the Python stacks of a process (to see which collective it waits in).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import re
import signal
import sys
from pathlib import Path

COMMANDS = {name: f"jaxppo.cli.{name}" for name in ("train", "dpo", "evaluate", "reward", "collect")}


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


#: exit status of a process whose peer process died (the run stops everywhere; restart all with trainer.resume=auto)
PEER_DIED_EXIT = 76

# how the JAX coordination service and gloo report a peer that died: the task ids are in group "ids"
_DEAD_PEER = (
    re.compile(r"following tasks are unhealthy \(stopped sending heartbeats\):\s*(?P<ids>\d+(?:[\s,]+\d+)*)"),
    re.compile(r"[Tt]ask (?P<ids>\d+) heartbeat timeout"),
    re.compile(r"gloo/transport/tcp/pair\.cc.*(?:Connection closed by peer|Received data size doesn't match)"),
)


def dead_peers(text: str) -> list[int] | None:
    """The process ids that the coordination service reports dead in ``text`` ([] for a lost gloo connection,
    which names no process); None when ``text`` reports no dead peer."""
    for pat in _DEAD_PEER:
        m = pat.search(text)
        if m:
            ids = m.groupdict().get("ids")
            return sorted({int(i) for i in re.findall(r"\d+", ids)}) if ids else []
    return None


def last_checkpoint(rest: list[str]) -> tuple[int | None, Path | None]:
    """The newest complete checkpoint step of the run that ``rest`` (``--config FILE key=value ...``) describes, and
    its ``checkpoints`` folder; (None, folder or None) when there is none or the config cannot be read."""
    try:
        from jaxppo.cli.util import parse_args_and_config

        _, cfg = parse_args_and_config("launch/multihost.py", "", rest)
        folder = Path(cfg.trainer.output_dir) / "checkpoints"
    except BaseException:  # noqa: BLE001 - the report is best effort: the run has failed already
        return None, None
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir()] if folder.is_dir() else []
    return (max(steps) if steps else None), folder


def supervise(argv: list[str], rest: list[str]) -> int:
    """Run this command again as a child process (``JAXPPO_SUPERVISED=1``) and watch its stderr: when the child is
    ended by the distributed runtime because a peer process died (:func:`dead_peers`), print one line naming that
    process and the last complete checkpoint, keep the runtime's native report in ``<output_dir>/crash-process<i>.log``
    and return :data:`PEER_DIED_EXIT`. Everything else is passed through: stdout untouched, stderr line by line,
    SIGTERM / SIGINT forwarded to the child (preemption), the child's exit status returned. The child dies with
    this process (``PR_SET_PDEATHSIG``)."""
    import ctypes
    import subprocess

    def die_with_parent() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001,S110 - not Linux: the child may outlive a killed supervisor
            pass

    env = dict(os.environ, JAXPPO_SUPERVISED="1")
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env, stderr=subprocess.PIPE,
                             preexec_fn=die_with_parent)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda signum, _f: child.send_signal(signum))
    held: list[str] = []      # the runtime's report, from its first line on
    assert child.stderr is not None
    for raw in child.stderr:
        line = raw.decode("utf-8", errors="replace")
        # held from the first line of a Python traceback or of the runtime's report: a collective that fails for a
        # dead peer raises in Python first, then the runtime aborts the process
        if held or line.startswith("Traceback (most recent call last)") or dead_peers(line) is not None \
                or "coordination_service" in line:
            held.append(line)
        else:
            sys.stderr.write(line)
            sys.stderr.flush()
    rc = child.wait()
    peers = dead_peers("".join(held)) if held else None
    if rc == 0 or peers is None:
        if held:
            sys.stderr.write("".join(held))
        return rc if rc >= 0 else 128 - rc
    me, n = os.environ.get("JAXPPO_PROCESS_ID", "?"), os.environ.get("JAXPPO_NUM_PROCESSES", "?")
    step, folder = last_checkpoint(rest)
    log = None
    if folder is not None:
        try:
            log = folder.parent / f"crash-process{me}.log"
            log.write_text("".join(held), encoding="utf-8")
        except OSError:
            log = None
    who = (f"process {', '.join(map(str, peers))} of {n} died (it stopped sending heartbeats)" if peers
           else f"a peer process of {n} died (its connection to process {me} was lost)")
    where = (f"last complete checkpoint: step {step} in {folder}" if step is not None
             else "no complete checkpoint")
    print(f"launch/multihost.py: process {me}: {who}; the run stopped; {where}; restart every process with "
          f"trainer.resume=auto{f' (runtime report in {log})' if log else ''}", file=sys.stderr)
    return PEER_DIED_EXIT


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    module, rest = split_command(argv)
    if (os.environ.get("JAXPPO_DISTRIBUTED", "1") != "0" and os.environ.get("JAXPPO_SUPERVISED") != "1"
            and os.environ.get("JAXPPO_SUPERVISE", "1") != "0" and not any(a in ("-h", "--help") for a in rest)):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return supervise(argv, rest)
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
