"""The ``XLA_FLAGS`` of the JAX processes the tests run: the pytest process and the subprocesses it starts.

``FAST_COMPILE`` runs XLA:CPU's LLVM code generation at -O0. The tests' programs are tiny, so compiling them takes
most of a test's time, and -O0 compiles them in about half the time. XLA's own HLO passes (fusion, layout, sharding)
run as at the default level, so a program computes the same values up to float rounding. The processes that stand
for a user's shell (the installed ``jaxppo`` console script, ``jaxppo.plan`` on the shipped examples) run without
these flags, at the default level. The benchmark scripts' tests check their records' fields, never a time, so
their children compile with ``FAST_COMPILE`` too.
"""

from __future__ import annotations

import os
from pathlib import Path

FAST_COMPILE = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` for a process with ``devices`` simulated CPU devices, compiled with ``FAST_COMPILE``."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"


def cli_env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command-line subprocess: one CPU device, ``FAST_COMPILE``, and with ``cache`` (the
    session's compilation cache) every program cached there; ``extra`` adds or replaces variables."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
    if cache is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return {**env, **extra}


__all__ = ["FAST_COMPILE", "cli_env", "xla_flags"]
