"""Fixtures of the fault tests: the trainer tests' tiny scored dataset (collected once per session) and a runner of
the command-line entry points as real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, TINY, compile_cache, scored_data  # noqa: F401 - fixtures used here
from tests.xla_flags import cli_env

__all__ = ["REPO", "TINY", "cli_env", "one_line_error", "overrides", "run_module"]


def overrides(stories_model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """The tiny trainer overrides (tests/trainer/conftest.py) for ``out``: 4 steps, a checkpoint every 2, no
    held-out split (the fault tests look at the run's plumbing, not its evaluation)."""
    return [f"model.path={stories_model}", f"data.path={data}", f"trainer.output_dir={out}", *TINY,
            "data.eval_fraction=0", "trainer.total_steps=4", "trainer.save_every=2", *extra]


def run_module(module: str, args: list[str], cache: Path, *, timeout: float = 300, max_file_bytes: int | None = None,
               **env: str) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` from the repository root; stdout and stderr captured apart. ``max_file_bytes``:
    the process's file size limit (``ulimit -f``), set by the child itself before it runs the module."""
    if max_file_bytes is None:
        cmd = [sys.executable, "-m", module, *args]
    else:
        code = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({n}, {n})); "
                "sys.argv = [{m!r}] + sys.argv[1:]; runpy.run_module({m!r}, run_name='__main__', alter_sys=True)")
        cmd = [sys.executable, "-c", code.format(n=int(max_file_bytes), m=module), *args]
    return subprocess.run(cmd, cwd=REPO, env=cli_env(cache, **env), capture_output=True, text=True, timeout=timeout)


def one_line_error(res: subprocess.CompletedProcess, prog: str, *needles: str) -> str:
    """Check that ``res`` failed with status 2 and that stderr is one line, ``prog: ...``, containing every needle
    (no log record, traceback or third-party line before it); returns the line."""
    err = res.stderr
    lines = err.strip().splitlines()
    assert res.returncode == 2, f"exit {res.returncode}\n{err[-4000:]}"
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(f"{prog}:"), err[-4000:]
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err[-4000:]}"
    for bad in ("Traceback", "Exception ignored", "ERROR:", "Task exception"):
        assert bad not in err, f"{bad!r} on stderr:\n{err[-4000:]}"
    for n in needles:
        assert n in last, f"{n!r} not in {last!r}"
    return last


@pytest.fixture(scope="session")
def tiny_model_4_layers(tmp_path_factory, stories_model) -> Path:
    """stories260K without its last layer (4 of 5 layers): another model shape from the same files."""
    import json
    import shutil

    from jaxppo.hf.safetensors_io import SafetensorsFile, save_file

    dst = tmp_path_factory.mktemp("model4") / "stories4"
    shutil.copytree(stories_model, dst)
    f = SafetensorsFile(stories_model / "model.safetensors")
    cfg = json.loads((stories_model / "config.json").read_text())
    last = cfg["num_hidden_layers"] - 1
    names = [n for n in f.names() if not n.startswith(f"model.layers.{last}.")]
    save_file([(n, f.shape(n), f.dtype(n)) for n in names], f.get, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=last)))
    return dst


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, stories_model, scored_data, compile_cache):  # noqa: F811
    """A finished 4-step run, started in a folder an earlier process left behind: a stale lock (of a process that
    has ended) and a temporary checkpoint folder of an interrupted write. Its data file (JSON lines) has a NaN, an
    inf and a -inf score and one broken line (datasets cannot parse it: the line-by-line reader takes over).
    Returns ``(run folder, completed process, pid of the stale lock)``."""
    import json

    tmp = tmp_path_factory.mktemp("finished")
    lines = scored_data.read_text().splitlines()
    rows = [json.loads(line) for line in lines[:3]]
    bad = [json.dumps(dict(r, score=v)) for r, v in zip(rows, (float("nan"), float("inf"), float("-inf")))]
    data = tmp / "data.jsonl"
    data.write_text("\n".join([*bad, '{"prompt": "broken', *lines[3:]]) + "\n")
    out = tmp / "run"
    (out / "checkpoints" / "2.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    (out / ".jaxppo.lock").write_text(json.dumps({"pid": dead_pid, "host": __import__("socket").gethostname(),
                                                  "started": "2000-01-01T00:00:00Z", "command": "an earlier run"}))
    res = run_module("jaxppo.train", overrides(stories_model, data, out), compile_cache)
    assert res.returncode == 0, res.stderr[-4000:]
    return out, res, dead_pid
