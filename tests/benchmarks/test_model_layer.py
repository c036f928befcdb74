"""benchmarks/model_layer.py: the GEMM parts it times keep every product (forward, input and weight gradient) in the
compiled program. With the forward output dropped, XLA deletes the forward product and the 'GEMMs alone' time
misses a third of the GEMMs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"

# run in benchmarks/ (model_layer imports its sibling scripts as top-level modules), never via sys.path edits
CHECK = """
import jax, jax.numpy as jnp
import model_layer
from jaxppo.models.layers import dense
x = jnp.ones((2, 4, 8)); w = jnp.ones((8, 6))
def dropped(x, w):
    y, pull = jax.vjp(dense, x, w)
    return pull(jnp.ones_like(y))
print(model_layer.dot_count(jax.jit(dropped), x, w))
model_layer._vjp_call(dense, x, w)()
print("ok")
"""


def test_the_forward_product_is_kept_and_a_dropped_one_is_counted():
    p = subprocess.run([sys.executable, "-c", CHECK], cwd=BENCH, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    dropped, ok = p.stdout.split()
    assert dropped == "2" and ok == "ok"   # the old formulation compiles to 2 products; _vjp_call checks for 3


@pytest.mark.slow
def test_a_tiny_run_records_both_dtypes(tmp_path):
    out = tmp_path / "layer.json"
    subprocess.run([sys.executable, str(BENCH / "model_layer.py"), "--batch", "1", "--seq", "8", "--rounds", "1",
                    "--dtypes", "float32,bfloat16", "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    r = json.loads(out.read_text())
    for dt in ("float32", "bfloat16"):
        assert r["medians"][f"{dt}/layer_s"] > 0 and r[f"{dt}/ratio_median"] > 0
    assert set(r["speedup"]) == {"layer", "gemms", "attention", "head", "head_gemms"}


def test_layer_record_is_gemm_bound():
    """What benchmarks/README.md reads from results/model_layer_dtypes.json (its table is generated from it): the
    float32 layer's GEMMs and attention are most of its time, and bfloat16 speeds the layer, its GEMMs and the head."""
    d = json.loads((REPO / "results" / "model_layer_dtypes.json").read_text())
    assert 0.8 <= d["float32/ratio_median"] <= 1.0
    assert all(d["speedup"][k] > 1 for k in ("layer", "gemms", "head"))


def test_gemm_rates_of_both_frameworks_are_alike_in_float32():
    """benchmarks/README.md: the model's float32 GEMMs run as fast in JAX as in torch on this CPU (within 35%)."""
    d = json.loads((REPO / "results" / "matmul_dtype_zen4.json").read_text())
    jx, tc = d["runs"]["jax:float32"]["gemms"], d["runs"]["torch:float32"]["gemms"]
    assert all(0.75 <= jx[n]["gflops"] / tc[n]["gflops"] <= 1.35 for n in jx)
    assert d["machine"]["xla_flags"] is None and d["machine"]["cpu_family"] == 25
