"""A sweep as a SLURM array job: ``python -m jaxppo.sweep --config F --slurm OUT.sbatch``.

:func:`slurm_script` writes one bash script whose array task ``i`` (``SLURM_ARRAY_TASK_ID``) runs the ``i``-th
pending run of the sweep (the runs without ``summary.json`` when the script is written, in the sweep's seed-major
order), with the same command line as ``--print-commands`` (:func:`jaxppo.sweeps.runner.command_line`), from the
directory the script was written in. Each run writes its usual folder under the sweep's ``output_dir``, so
``python -m jaxppo.sweep --config F --results-only`` (or ``report``) reads the results unchanged; a task that runs
a run another task or sweep holds fails with status 2 naming the holder (the run folder's lock). The ``#SBATCH``
resources come from the sweep file's ``slurm:`` mapping (:class:`jaxppo.sweeps.spec.SlurmSection`: ``partition``,
``time``, ``gpus``, ``cpus``, ``mem``, ``max_parallel``), each overridden by its ``--slurm-*`` flag
(:func:`resources`). SLURM's preemption signal (SIGTERM) makes a run save and exit 75; ``--requeue`` in the script
puts such a task back in the queue, and the rerun resumes (``trainer.resume=auto``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from jaxppo.sweeps.runner import command_line, is_done, seed_major
from jaxppo.sweeps.spec import RunSpec, SweepError, SweepSpec, slurm_value_problem


@dataclass(frozen=True)
class SlurmResources:
    """``#SBATCH`` resources of every array task (None: the cluster's default); :func:`resources` merges the sweep
    file's ``slurm:`` mapping with the ``--slurm-*`` flags."""

    time: str | None = None            # --time, e.g. 02:00:00
    cpus: int | None = None            # --cpus-per-task
    mem: str | None = None             # --mem, e.g. 16G
    gpus: int | None = None            # --gpus-per-task
    partition: str | None = None       # --partition
    max_parallel: int | None = None    # the array's %N: at most N tasks at once


def resources(spec: SweepSpec, **flags: object) -> SlurmResources:
    """The ``#SBATCH`` resources of ``spec``'s array job: its sweep file's ``slurm:`` mapping
    (:class:`jaxppo.sweeps.spec.SlurmSection`, checked when the file was read), each key overridden by the flag of
    the same name in ``flags`` (``time=``, ``cpus=``, ...; None: not given). Raises ``SweepError`` naming the flag
    (``--slurm-time``, ...) for an invalid flag value."""
    merged = dataclasses.asdict(spec.slurm)
    for name, value in flags.items():
        if name not in merged:
            raise TypeError(f"resources: unknown SLURM resource {name!r}")
        if value is None:
            continue
        problem = slurm_value_problem(name, value)
        if problem is not None:
            raise SweepError(f"--slurm-{name.replace('_', '-')}: {problem}")
        merged[name] = value
    return SlurmResources(**merged)


def pending_runs(spec: SweepSpec, runs: Sequence[RunSpec]) -> list[RunSpec]:
    """The runs without ``summary.json``, in execution order (the array's task order)."""
    return seed_major([r for r in runs if not is_done(r)], spec.seeds)


def slurm_script(spec: SweepSpec, runs: Sequence[RunSpec], res: SlurmResources = SlurmResources(), *,
                 cwd: str | None = None) -> str:
    """The array job script of ``runs``' pending runs (module doc); ``cwd`` (default the current directory) is where
    each task runs its command. Raises ``ValueError`` when no run is pending."""
    todo = pending_runs(spec, runs)
    if not todo:
        raise ValueError(f"sweep {spec.name}: every run is finished; nothing to submit")
    log_dir = os.path.abspath(os.path.join(str(spec.output_dir), "slurm"))
    array = f"0-{len(todo) - 1}" + (f"%{res.max_parallel}" if res.max_parallel else "")
    head = [f"#SBATCH --job-name={shlex.quote('jaxppo-' + spec.name)}", f"#SBATCH --array={array}",
            f"#SBATCH --output={shlex.quote(log_dir)}/%A_%a.out", "#SBATCH --requeue"]
    for flag, value in (("time", res.time), ("cpus-per-task", res.cpus), ("mem", res.mem),
                        ("gpus-per-task", res.gpus), ("partition", res.partition)):
        if value is not None:
            head.append(f"#SBATCH --{flag}={shlex.quote(str(value))}")
    lines = ["#!/bin/bash", *head, "",
             f"# sweep {spec.name}: {len(todo)} pending runs of {len(runs)}; task i runs the i-th line of RUNS.",
             "# Submit with: sbatch THIS_FILE (written by python -m jaxppo.sweep --slurm).",
             "set -euo pipefail", f"mkdir -p {shlex.quote(log_dir)}",
             f"cd {shlex.quote(os.path.abspath(cwd or os.getcwd()))}", "RUNS=("]
    lines += [f"  {shlex.quote(command_line(spec, r))}  # {r.key}" for r in todo]
    lines += [")", 'if [ -z "${SLURM_ARRAY_TASK_ID:-}" ] || [ "$SLURM_ARRAY_TASK_ID" -ge "${#RUNS[@]}" ]; then',
              '  echo "SLURM_ARRAY_TASK_ID must be 0..$(( ${#RUNS[@]} - 1 ))" >&2; exit 2', "fi",
              'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export OMP_NUM_THREADS="$SLURM_CPUS_PER_TASK"; fi',
              'eval "${RUNS[$SLURM_ARRAY_TASK_ID]}"', ""]
    return "\n".join(lines)


__all__ = ["SlurmResources", "pending_runs", "resources", "slurm_script"]
