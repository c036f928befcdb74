"""What machine a benchmark ran on, for its JSON: enough to tell two hosts apart when their times differ.

``describe()`` -> cpus, platform, the CPU's model name / vendor / family / model / stepping (``/proc/cpuinfo``) and
which of the SIMD features that decide the GEMM kernels it has (AVX-512, its bf16/VNNI extensions, AMX). Two
"AMD EPYC" hosts with the same flags can still differ in generation (family 25 = Zen 3/4, 26 = Zen 5), which is why
family and model are recorded, not just the name.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

#: the cpuinfo flags recorded (the ones XLA:CPU's and torch's GEMM kernels dispatch on)
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
              "amx_bf16", "amx_int8")
_FIELDS = {"model name": "cpu_model_name", "vendor_id": "cpu_vendor", "cpu family": "cpu_family", "model": "cpu_model",
           "stepping": "cpu_stepping"}


def parse_cpuinfo(text: str) -> dict:
    """The first processor block of a ``/proc/cpuinfo`` text: the ``_FIELDS`` (family/model/stepping as ints) and
    ``simd``, the ``SIMD_FLAGS`` it lists (in that order). Missing fields are left out."""
    out: dict = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if key in _FIELDS:
            name = _FIELDS[key]
            out[name] = int(value) if name in ("cpu_family", "cpu_model", "cpu_stepping") and value.isdigit() else value
        elif key == "flags":
            have = set(value.split())
            out["simd"] = [f for f in SIMD_FLAGS if f in have]
    return out


def describe(cpuinfo: str | Path = "/proc/cpuinfo") -> dict:
    """cpus, platform and (on Linux) ``parse_cpuinfo`` of this machine, the ``XLA_FLAGS`` in effect (None when
    unset: XLA's defaults; the scheduler flag changes a step's memory by a fifth, benchmarks/README.md) and the
    ``GLIBC_TUNABLES`` (None when unset; ``glibc.malloc.hugetlb=1`` changes a CPU step's time through its page
    faults, benchmarks/README.md), plus the 1/5/15-min load average now."""
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "xla_flags": os.environ.get("XLA_FLAGS"),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}
    try:
        info.update(parse_cpuinfo(Path(cpuinfo).read_text()))
    except OSError:
        pass
    if hasattr(os, "getloadavg"):
        info["loadavg"] = list(os.getloadavg())
    return info


def git_commit(repo: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of ``repo`` (default: this checkout), or None outside a git checkout."""
    cwd = Path(repo) if repo is not None else Path(__file__).resolve().parents[1]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
