"""Run a sweep's runs as subprocesses, resumably.

- A run is **done** when its ``summary.json`` exists (a committed run folder under ``results/sweeps`` included:
  checkpoints are not needed); done runs are skipped. The others run seed by seed (every variant of seed 0, then
  of seed 1, ...: :func:`seed_major`), so a sweep stopped part-way leaves complete pairs. Any other run is started as
  ``python -m jaxppo.<command> --config BASE ... trainer.output_dir=<dir> trainer.resume=auto``, so a run
  that was killed (with the sweep, by SIGKILL of its process group) continues from its newest checkpoint.
- Runs stay in the sweep's process group: killing the group stops everything, and the next invocation
  finishes the same table.
- Each run's stdout/stderr are appended to ``<run>/sweep_stdout.log`` / ``sweep_stderr.log``. A run that
  exits non-zero does not stop the sweep: it is recorded in ``<sweep>/failures.json`` (return code, the
  tail of its stderr, the command, ``status``) and retried on the next invocation; a success removes its entry.
  A run that exits with ``PREEMPTED_EXIT`` (75: stopped by a signal after saving its checkpoint,
  :mod:`jaxppo.trainer.preemption`) is recorded with ``status: "preempted"`` (any other non-zero exit:
  ``"failed"``); the next invocation continues it from that checkpoint (``trainer.resume=auto``).
- SIGTERM / SIGINT to the sweep process: no new run starts; the running runs are waited for (a signal sent to
  the process group, as Ctrl-C, ``kill -TERM -PGID`` and SLURM do, reaches them too: they save and exit 75), each
  is recorded, and :func:`run_sweep` raises :class:`SweepStopped`. A second signal passes SIGTERM on to the running
  runs (which abort at once if they were signalled already).
- ``JAX_COMPILATION_CACHE_DIR`` is set to ``<sweep>/xla_cache`` unless the environment already sets one,
  so runs of the same shapes compile once; for a sweep under the committed ``results/`` folder that cache is the
  same path under the git-ignored ``runs/`` instead (:func:`scratch_path`: ``results/`` holds records only).
- One sweep per run at a time: a sweep claims a run (an exclusive lock, ``<run>/.sweep-claim.lock``,
  :class:`jaxppo.trainer.run_folder.RunLock`) before it starts it and holds the claim until the run's process ends. A run
  claimed by another live sweep (the same sweep file started twice, or two array tasks) is put aside; once this
  sweep has nothing else to run it waits for each such claim, then skips the run when the other sweep finished it
  and runs it otherwise (the other sweep died or the run failed). So concurrent sweeps of one file run every run
  exactly once and each ends with the whole table. ``failures.json`` is updated under its own lock.
- Before a run starts, a ``config.json`` that an earlier attempt left in its folder must match the run's
  config, and so must the finished runs' when any run is still to run; otherwise the sweep stops with an error
  naming the keys (a changed sweep file must not silently mix runs). A sweep whose runs are all finished only
  logs the differences (:func:`check_not_stale`).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jaxppo.sweeps.spec import RunSpec, SweepError, SweepSpec
from jaxppo.trainer.preemption import PREEMPTED_EXIT
from jaxppo.trainer.run_folder import RunFolderBusy, RunLock

FAILURES_FILE = "failures.json"
CLAIM_FILE = ".sweep-claim.lock"
STDOUT_LOG = "sweep_stdout.log"
STDERR_LOG = "sweep_stderr.log"
TAIL_CHARS = 4000


class SweepStopped(Exception):
    """The sweep stopped on a signal (``signame``) before every run was done; ``preempted``: the keys of the runs
    that were stopped with their checkpoint saved (exit 75), ``not_started``: the keys of the runs it did not
    start."""

    def __init__(self, signame: str, preempted: Sequence[str], not_started: Sequence[str]):
        self.signame, self.preempted, self.not_started = signame, list(preempted), list(not_started)
        super().__init__(f"stopped by {signame}: {len(self.preempted)} run(s) preempted with their checkpoint saved, "
                         f"{len(self.not_started)} not started; rerun the same command to continue")


def is_done(run: RunSpec) -> bool:
    return (run.out_dir / "summary.json").is_file()


def seed_major(runs: Sequence[RunSpec], seeds: Sequence[int]) -> list[RunSpec]:
    """``runs`` in execution order: by the sweep's seed order (``seeds``) first, then in their given (variant)
    order, so that a sweep stopped part-way leaves complete seed pairs for the paired statistics."""
    rank = {s: i for i, s in enumerate(seeds)}
    return sorted(runs, key=lambda r: rank.get(r.seed, len(rank)))   # stable: variants keep their order


def scratch_path(path: str | Path, roots: tuple[Path, ...] | None = None) -> Path:
    """Where scratch output meant for ``path`` goes: a path inside a ``results/`` folder of the repository (or of the
    working directory) becomes the same path under ``runs/`` beside it (git-ignored: ``results/`` holds committed
    records only); any other path is returned resolved and unchanged. ``roots`` (default: the repository of this
    package and the working directory) are the folders whose ``results/`` is meant."""
    p = Path(path).resolve()
    for root in roots if roots is not None else (Path(__file__).resolve().parents[2], Path.cwd()):
        try:
            rel = p.relative_to(root.resolve() / "results")
        except ValueError:
            continue
        return root.resolve() / "runs" / rel
    return p


def cache_dir(spec: SweepSpec) -> Path:
    """The sweep's shared XLA compilation cache: ``<sweep>/xla_cache``, moved out of ``results/``
    (:func:`scratch_path`)."""
    return scratch_path(Path(spec.output_dir) / "xla_cache")


def run_env(spec: SweepSpec, base_env: dict | None = None) -> dict:
    """The environment of a run: ``base_env`` (default ``os.environ``) with a shared XLA compilation cache
    (:func:`cache_dir`)."""
    env = dict(os.environ if base_env is None else base_env)
    if not env.get("JAX_COMPILATION_CACHE_DIR"):
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir(spec))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    return env


def command_line(spec: SweepSpec, run: RunSpec) -> str:
    """One shell line for ``run`` (for a cluster job array): the cache variable, then the command."""
    cache = str(cache_dir(spec))
    return f"JAX_COMPILATION_CACHE_DIR={shlex.quote(cache)} " + shlex.join(run.argv("python"))


def _jsonable(x):
    return json.loads(json.dumps(x))


def config_changes(run: RunSpec) -> dict[str, str]:
    """``{key: "old -> new"}`` for each dotted config key where the ``config.json`` in ``run``'s folder (written by
    the trainer when that run started) differs from the config the sweep file plans for it today; empty when there
    is no such file (or it is half-written: the trainer rewrites it) or nothing differs. ``old`` is ``(absent)``
    for a key the run's code did not have yet; such a key is no change when today's value is its schema default
    (a key joins the schema with a default that keeps the old behaviour)."""
    f = run.out_dir / "config.json"
    if not f.is_file() or not run.config:
        return {}
    try:
        old = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    new = _jsonable(run.config)
    defaults = _schema_defaults()
    return {k: f"{_show(_get(old, k))} -> {_show(_get(new, k))}" for k in sorted(_diff_keys(old, new))
            if not (_get(old, k) is _ABSENT and _get(new, k) == _get(defaults, k))}


@functools.cache
def _schema_defaults() -> dict:
    """The config schema's defaults as JSON (``Config()``)."""
    from jaxppo.config import Config, to_dict

    return _jsonable(to_dict(Config()))


def _listed(changes: dict[str, str], most: int) -> str:
    return "; ".join(f"{k}: {v}" for k, v in list(changes.items())[:most])


def check_not_stale(runs: Sequence[RunSpec], log: Callable[[str], None] = print) -> None:
    """Stop (SweepError) before anything runs when the sweep file no longer gives the config its run folders were
    made with (:func:`config_changes`), because a table must not mix configs:

    - an unfinished run (its ``config.json`` left by a killed or failed attempt) with another config: always;
    - finished runs (``summary.json``) with another config, when other runs are still to run.

    When every run is finished nothing new would join the table: the differences are logged and the tables are
    rewritten from those runs. That is the case of a committed sweep (``results/sweeps/<name>``) invoked after the
    config schema grew or a default changed: its runs stay as they were made; their ``config.json`` files say how.
    """
    pending = [r for r in runs if not is_done(r)]
    for run in pending:
        changes = config_changes(run)
        if changes:
            raise SweepError(f"run {run.key}: {run.out_dir / 'config.json'} was written with a different config "
                             f"({_listed(changes, 8)}); the sweep file changed since: delete that run folder or "
                             "use another output_dir")
    changed = {r.key: config_changes(r) for r in runs if is_done(r)}
    changed = {k: v for k, v in changed.items() if v}
    if not changed:
        return
    keys = sorted({k for v in changed.values() for k in v})
    example = next(iter(changed))
    what = (f"{len(changed)} finished runs were made with another config than the sweep file gives today "
            f"(keys {', '.join(keys[:8])}; e.g. {example}: {_listed(changed[example], 4)})")
    if pending:
        raise SweepError(f"{what}: running the {len(pending)} other runs would mix configs in one table; use "
                         "--output-dir for a new sweep, or set the old values in the sweep file's overrides")
    log(f"note: {what}; nothing to run, the tables are rewritten from those runs")


def _get(d, dotted: str):
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return _ABSENT
        d = d[k]
    return d


_ABSENT = object()


def _diff_keys(a, b, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def _show(v, width: int = 40) -> str:
    t = "(absent)" if v is _ABSENT else json.dumps(v)
    return t if len(t) <= width else t[:width - 3] + "..."


def read_failures(out_dir: str | Path) -> dict[str, dict]:
    f = Path(out_dir) / FAILURES_FILE
    if not f.is_file():
        return {}
    return json.loads(f.read_text(encoding="utf-8"))


def _write_failures(out_dir: Path, failures: dict[str, dict]) -> None:
    tmp = out_dir / f"{FAILURES_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(failures, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out_dir / FAILURES_FILE)


def _update_failures(out_dir: Path, key: str, record: dict | None) -> dict[str, dict]:
    """Set (``record``) or clear (None) the failure of run ``key`` in ``failures.json``, read and written under the
    file's lock (another sweep of the same folder may update it at the same time); returns the new contents."""
    from jaxppo.trainer.run_folder import RunLock

    lock = RunLock(out_dir, key="sweep output_dir", name=f".{FAILURES_FILE}.lock")
    lock.acquire(wait=True)
    try:
        failures = read_failures(out_dir)
        if record is None:
            failures.pop(key, None)
        else:
            failures[key] = record
        _write_failures(out_dir, failures)
    finally:
        lock.release()
    return failures


def _tail(path: Path, n: int = TAIL_CHARS) -> str:
    if not path.is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - n))
        return fh.read().decode("utf-8", errors="replace")


def run_sweep(spec: SweepSpec, runs: Sequence[RunSpec], *, jobs: int = 1, python: str = sys.executable,
              env: dict | None = None, cwd: str | Path | None = None,
              argv_for: Callable[[RunSpec], list[str]] | None = None,
              log: Callable[[str], None] = print) -> dict[str, dict]:
    """Run every run that is not done, at most ``jobs`` at a time; returns the failures of this invocation (each
    record's ``status``: ``"failed"`` or ``"preempted"``). Raises :class:`SweepStopped` after a SIGTERM / SIGINT
    (module doc), once the runs it started have ended and are recorded.

    ``argv_for(run)`` (default ``run.argv(python)``) builds each command. With ``jobs > 1`` the CPU cores are split
    between the run slots (:func:`core_slots`). With ``jobs > 1``, a first run
    whose config collects its dataset (``data.collect_if_missing`` and ``data.path`` missing) runs alone
    first, so parallel runs do not collect the same file at once.
    """
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    argv_for = argv_for or (lambda r: r.argv(python))
    env = run_env(spec, env)
    check_not_stale(runs, log)
    pending = seed_major([r for r in runs if not is_done(r)], spec.seeds)
    done = len(runs) - len(pending)
    log(f"sweep {spec.name}: {len(runs)} runs, {done} done, {len(pending)} to run ({out})")
    new_failures: dict[str, dict] = {}
    commands: dict[str, list[str]] = {}
    claims: dict[str, RunLock] = {}

    def claim(run: RunSpec, *, wait: bool = False) -> bool:
        """Claim ``run`` for this sweep; False when another live sweep holds it (``wait``: block until it ends) or
        when the run is done by now (another sweep finished it)."""
        run.out_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock(run.out_dir, key=f"sweep run {run.key}", name=CLAIM_FILE)
        try:
            lock.acquire(wait=wait)
        except RunFolderBusy as e:
            log(f"  busy  {run.key}: {e}; it is run by another sweep, checked again at the end")
            return False
        if is_done(run):
            lock.release()
            log(f"  skip  {run.key}: finished by another sweep")
            return False
        claims[run.key] = lock
        return True

    slots = core_slots(jobs)
    slot_of: dict[str, int] = {}

    def start(run: RunSpec) -> tuple[RunSpec, subprocess.Popen, float]:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        run_env_i, pin = env, None
        if slots:
            free = next(i for i in range(len(slots)) if i not in slot_of.values())
            slot_of[run.key] = free
            pin = slots[free]
            run_env_i = dict(env, OMP_NUM_THREADS=str(len(pin)), MKL_NUM_THREADS=str(len(pin)))
        fo = open(run.out_dir / STDOUT_LOG, "ab")
        fe = open(run.out_dir / STDERR_LOG, "ab")
        stamp = f"\n=== sweep attempt {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode()
        fo.write(stamp)
        fe.write(stamp)
        fo.flush()
        fe.flush()
        try:
            commands[run.key] = argv_for(run)
            proc = subprocess.Popen(commands[run.key], cwd=cwd, env=run_env_i, stdout=fo, stderr=fe,
                                    stdin=subprocess.DEVNULL,
                                    preexec_fn=None if pin is None else (lambda cores=pin: os.sched_setaffinity(0, cores)))
        finally:
            fo.close()
            fe.close()
        log(f"  start {run.key}")
        return run, proc, time.monotonic()

    def finish(run: RunSpec, rc: int, t0: float) -> None:
        dt = time.monotonic() - t0
        try:
            if rc == 0 and is_done(run):
                _update_failures(out, run.key, None)
                log(f"  done  {run.key} ({dt:.0f} s)")
            else:
                preempted = rc == PREEMPTED_EXIT
                why = (f"preempted (exit status {rc}): its checkpoint is saved, the next invocation resumes it"
                       if preempted else f"exit status {rc}" if rc != 0 else "exited 0 without writing summary.json")
                rec = {"variant": run.variant, "seed": run.seed, "returncode": rc,
                       "status": "preempted" if preempted else "failed", "error": why,
                       "stderr_tail": _tail(run.out_dir / STDERR_LOG), "command": shlex.join(commands[run.key]),
                       "time": time.strftime("%Y-%m-%d %H:%M:%S")}
                new_failures[run.key] = rec
                _update_failures(out, run.key, rec)
                log(f"  {'PREEMPTED' if preempted else 'FAILED'} {run.key}: {why} (see {run.out_dir / STDERR_LOG})")
        finally:
            slot_of.pop(run.key, None)
            claims.pop(run.key).release()

    queue = list(pending)
    deferred: list[RunSpec] = []       # claimed by another sweep when their turn came
    active: list[tuple[RunSpec, subprocess.Popen, float]] = []

    def next_claimed() -> RunSpec | None:
        """The next queued run this sweep could claim; once nothing is queued or running, the runs of other sweeps
        in turn (waiting for each claim). None once a signal arrived."""
        while queue and not stop.signum:
            run = queue.pop(0)
            if claim(run):
                return run
            if not is_done(run):
                deferred.append(run)
        while deferred and not active and not stop.signum:
            run = deferred.pop(0)
            log(f"  wait  {run.key}: for the other sweep's run to end")
            if claim(run, wait=True):
                return run
        return None

    stop = _SweepSignals(lambda: [p for _, p, _ in active]).__enter__()
    try:
        if jobs > 1 and queue and _collects(queue[0]):
            first = next_claimed()
            if first is not None:
                active.append(start(first))
                r, p, t0 = active[0]
                rc = p.wait()
                active.pop()
                finish(r, rc, t0)
        while active or ((queue or deferred) and not stop.signum):
            while len(active) < jobs:
                run = next_claimed()
                if run is None:
                    break
                active.append(start(run))
            if not active:
                continue
            if jobs == 1:
                r, p, t0 = active[0]
                rc = p.wait()
                active.pop()
                finish(r, rc, t0)
                continue
            time.sleep(0.2)
            still = []
            for r, p, t0 in active:
                rc = p.poll()
                if rc is None:
                    still.append((r, p, t0))
                else:
                    finish(r, rc, t0)
            active = still
    finally:
        stop.__exit__()
        for _, p, _ in active:  # interrupted (KeyboardInterrupt/SIGTERM): stop the children, they resume later
            if p.poll() is None:
                p.terminate()
        for _, p, _ in active:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for lock in claims.values():
            lock.release()
    if stop.signum:
        left = [r.key for r in [*queue, *deferred] if not is_done(r)]
        preempted = [k for k, v in new_failures.items() if v["status"] == "preempted"]
        raise SweepStopped(signal.Signals(stop.signum).name, preempted, left)
    return new_failures


class _SweepSignals:
    """SIGTERM / SIGINT of a sweep (module doc): the first only sets ``signum``; a second sends SIGTERM to the
    running runs (``procs()``). Installs nothing outside the main thread."""

    def __init__(self, procs: Callable[[], list[subprocess.Popen]]):
        self.procs, self.signum, self._previous = procs, None, {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        for p in self.procs():
            if p.poll() is None:
                p.terminate()

    def __enter__(self) -> "_SweepSignals":
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous = {}


def core_slots(jobs: int) -> list[list[int]] | None:
    """The CPU cores of this process split into ``jobs`` disjoint sets (round robin), one per run slot of a
    ``--jobs`` sweep: each run is pinned to its set (``sched_setaffinity``) with ``OMP_NUM_THREADS`` its size. None
    for one job, or when there are fewer cores than jobs or no affinity support (the runs then share every core)."""
    if jobs <= 1 or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < jobs:
        return None
    return [cores[i::jobs] for i in range(jobs)]


def _collects(run: RunSpec) -> bool:
    data = run.config.get("data", {}) if run.config else {}
    return bool(data.get("collect_if_missing")) and bool(data.get("path")) and not Path(data["path"]).exists()
