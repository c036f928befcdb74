"""What every peer driver shares (numpy and the standard library only: it is imported by jaxppo's, Tunix's and
TRL's drivers, each in its own virtual environment).

A driver is run as ``python <tool>_driver.py --task TASK --dtype DTYPE --work DIR --repeats N --out FILE``:
``DIR`` holds what ``benchmarks/peers.py`` wrote once for every tool (``model/`` = a Hugging Face folder,
``config.json`` + ``model.safetensors``; ``batch.npz`` = the fixed batch; ``spec.json`` = shapes and
hyper-parameters). The driver builds its tool's model from those weights, computes the loss of ``TASK`` on the
batch BEFORE any update (the equivalence check) with the same compiled update it then times ``N`` times (so
that first call is the compile / warm-up), and writes a :func:`record` as JSON.

Tasks: ``fwdbwd`` (mean next-token cross-entropy over all positions, gradients of every parameter),
``dpo`` (one DPO update, reference log-probs given in the batch), ``grpo`` (one critic-free clipped-ratio
update with given advantages and old log-probs), ``ppo`` (one actor update and one critic update with given
GAE advantages, returns and old values), ``lora`` (the DPO update with rank-8 adapters on the attention and
MLP projections, base weights frozen), ``dpo_hh`` (the DPO update on real HH-RLHF lengths, ``hh_*`` arrays: prompts
left padded, answers right padded, masks beside; each tool lays the ragged rows out as it does best).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

TASKS = ("fwdbwd", "dpo", "grpo", "ppo", "lora", "dpo_hh")
DTYPES = ("float32", "bfloat16")


class Unsupported(Exception):
    """The tool has no such update step (the record says why instead of a time)."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=TASKS, required=True)
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    ap.add_argument("--work", required=True, help="folder with model/, batch.npz, spec.json")
    ap.add_argument("--repeats", type=int, default=5, help="timed updates; 0: the loss only")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def ragged_rows(b: dict) -> list[tuple[list[int], list[int]]]:
    """The ``dpo_hh`` pairs as ``2n`` unpadded ``(prompt, answer)`` token lists: the chosen rows, then the rejected."""
    out = []
    for side in ("chosen", "rejected"):
        for i in range(b["hh_prompt_ids"].shape[0]):
            p = b["hh_prompt_ids"][i][b["hh_prompt_mask"][i] > 0].tolist()
            out.append((p, b[f"hh_{side}_ids"][i][b[f"hh_{side}_mask"][i] > 0].tolist()))
    return out


def load_work(work: str | Path) -> tuple[dict, dict[str, np.ndarray], Path]:
    """``(spec, batch arrays, model folder)`` of a work folder written by ``benchmarks/peers.py``."""
    work = Path(work)
    spec = json.loads((work / "spec.json").read_text())
    with np.load(work / "batch.npz") as z:
        batch = {k: z[k] for k in z.files}
    return spec, batch, work / "model"


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def minor_faults() -> int:
    """Minor page faults of this process so far (``ru_minflt``): first touches of freshly mapped memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def tokens_of(task: str, spec: dict) -> int:
    """Tokens one update processes: ``B x T`` (fwdbwd), ``2 x pairs x (P + R)`` (dpo, lora), ``B x (P + R)``
    (grpo, ppo: the critic's pass over the same tokens is not counted twice), the real tokens (dpo_hh: each pair's
    prompt once and both answers)."""
    s = spec["shapes"]
    if task == "dpo_hh":
        return s["hh_real_tokens"]
    if task == "fwdbwd":
        return s["fwd_batch"] * s["fwd_seq"]
    if task in ("dpo", "lora"):
        return 2 * s["dpo_pairs"] * (s["dpo_prompt"] + s["dpo_response"])
    return s["rl_batch"] * (s["rl_prompt"] + s["rl_response"])


def time_updates(update, repeats: int) -> list[float]:
    """``repeats`` timed calls of ``update()`` (which must block until its result is ready). The driver's loss
    call already ran (compiled / warmed up) the same update, so every call here is a steady-state one."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    return times


def record(tool: str, task: str, dtype: str, spec: dict, *, loss: float | None, parts: dict | None = None,
           setup_s: float | None = None, times: list[float] | None = None, versions: dict | None = None,
           notes: list[str] | None = None, unsupported: str | None = None, load_before=None,
           faults_per_update: float | None = None) -> dict:
    """The JSON record a driver writes (``s_per_update`` = median of ``times``; ``minor_faults_per_update``: the
    process's minor page faults during the timed updates over their number, i.e. 4 KiB pages of fresh memory
    each update touches, fewer where the kernel maps huge pages)."""
    out = {"setup_s": setup_s, "tool": tool, "task": task, "dtype": dtype, "loss": loss, "loss_parts": parts or {},
           "versions": versions or {}, "notes": notes or [], "unsupported": unsupported,
           "tokens_per_update": tokens_of(task, spec), "peak_rss_mb": peak_rss_mb(),
           "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()), "python": sys.version.split()[0]}
    if times:
        med = statistics.median(times)
        out.update(times_s=times, s_per_update=med,
                   tokens_per_s=out["tokens_per_update"] / med, minor_faults_per_update=faults_per_update)
    return out


def run_driver(tool: str, build, argv=None) -> dict:
    """Parse the arguments, call ``build(task, dtype, spec, batch, model_dir) -> (loss, parts, update, versions,
    notes)`` and time ``update`` (or record ``Unsupported``), write the record to ``--out`` and return it."""
    args = parse_args(argv)
    load_before = list(os.getloadavg())
    spec, batch, model_dir = load_work(args.work)
    t0 = time.perf_counter()
    try:
        loss, parts, update, versions, notes = build(args.task, args.dtype, spec, batch, model_dir)
    except Unsupported as e:
        rec = record(tool, args.task, args.dtype, spec, loss=None, unsupported=str(e), load_before=load_before)
    else:  # --repeats 0: the loss only (the equivalence check), nothing timed
        setup = time.perf_counter() - t0  # load + compile + the first (loss) update
        faults0 = minor_faults()
        times = time_updates(update, args.repeats) if args.repeats > 0 else None
        faults = (minor_faults() - faults0) / args.repeats if times else None
        rec = record(tool, args.task, args.dtype, spec, loss=loss, parts=parts, setup_s=setup, times=times,
                     versions=versions, notes=notes, load_before=load_before, faults_per_update=faults)
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return rec
