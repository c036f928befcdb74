"""benchmarks/model.py with two dtypes: one child process per dtype, the bf16/f32 speed-up in the JSON; bad
--dtype / --frameworks values are named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_model_benchmark_reports_bf16_over_f32(tmp_path):
    out = tmp_path / "m.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "model.py"), "--layers", "1", "--batch", "1", "--seq", "8",
                    "--repeats", "1", "--rounds", "1", "--matmul", "64", "--frameworks", "jax",
                    "--dtype", "float32,bfloat16", "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    r = json.loads(out.read_text())
    by = r["by_dtype"]
    assert set(by) == {"float32", "bfloat16"} and set(by["float32"]) == {"jax"}
    want = by["float32"]["jax"]["step_s_median"] / by["bfloat16"]["jax"]["step_s_median"]
    assert r["speedup_bf16_over_f32"]["jax"] == pytest.approx(want)
    assert r["config"]["processes"] == "one per framework and dtype"


@pytest.mark.parametrize("args, msg", [(["--dtype", "float16"], "expected float32, bfloat16"),
                                       (["--frameworks", "tf"], "names neither jax nor torch")])
def test_model_benchmark_bad_arguments_are_named(args, msg):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "model.py"), *args], cwd=REPO, capture_output=True,
                       text=True)
    assert p.returncode == 2 and msg in p.stderr, p.stderr
