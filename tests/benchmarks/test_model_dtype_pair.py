"""benchmarks/model_dtype_pair.py: variants DTYPE:LAYOUT parsed and timed in one process, the layout reaching
LMConfig.scan_layers (the 16-bit unroll rule of jaxppo.models.config is what it measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "model_dtype_pair.py"


@pytest.mark.parametrize("variants, msg", [("float32:loop", "unknown layout 'loop'"),
                                           ("float16:scan", "unknown dtype 'float16'"),
                                           ("bfloat16,bfloat16:auto", "given twice")])
def test_bad_variants_are_named(variants, msg):
    p = subprocess.run([sys.executable, str(SCRIPT), "--variants", variants], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 2 and msg in p.stderr


@pytest.mark.slow
def test_one_layer_run_records_each_variant(tmp_path):
    out = tmp_path / "pair.json"
    subprocess.run([sys.executable, str(SCRIPT), "--layers", "1", "--batch", "1",
                    "--seq", "8", "--repeats", "1", "--variants", "float32:scan,bfloat16:unroll,bfloat16:auto",
                    "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    r = json.loads(out.read_text())
    assert r["float32:scan"]["unrolled"] is False and r["bfloat16:unroll"]["unrolled"] is True
    assert r["bfloat16:auto"]["unrolled"] is True  # 16-bit compute unrolls on the CPU
    assert r["speedup_over_first"]["float32:scan"] == {"median": 1.0, "min": 1.0}
    want = r["float32:scan"]["median"] / r["bfloat16:unroll"]["median"]
    assert r["speedup_over_first"]["bfloat16:unroll"]["median"] == pytest.approx(want)
    assert abs(r["float32:scan"]["loss"] - r["bfloat16:unroll"]["loss"]) < 0.05
    assert "speedup_bf16_over_f32_median" not in r and r["machine"]["cpus"] >= 1
