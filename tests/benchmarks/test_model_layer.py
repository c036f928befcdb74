"""benchmarks/model_layer.py: the GEMM parts it times keep every product (forward, input and weight gradient) in the
compiled program. Until 5 Dec 2026 the forward output was dropped, XLA deleted the forward product, and the
'GEMMs alone' time missed a third of the GEMMs (a layer looked only 0.69 GEMMs + attention)."""

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


def test_benchmarks_readme_quotes_the_layer_record():
    """The numbers benchmarks/README.md quotes from results/model_layer_dtypes.json (the run after the fix)."""
    d = json.loads((REPO / "results" / "model_layer_dtypes.json").read_text())
    m, sp = d["medians"], d["speedup"]
    text = " ".join((REPO / "benchmarks" / "README.md").read_text().split())
    ms = lambda k: f"{m[k] * 1e3:.1f}"  # noqa: E731
    assert (f"one layer's fwd+bwd {sp['layer']:.2f}x, its GEMMs {sp['gemms']:.2f}x, the LM head with its "
            f"cross-entropy {sp['head']:.2f}x") in text
    predicted = 30 * m["bfloat16/layer_s"] + m["bfloat16/head_s"]
    assert (f"30 x {m['bfloat16/layer_s'] * 1e3:.0f} ms + {m['bfloat16/head_s']:.2f} s ≈ {predicted:.1f} s") in text
    assert f"(GEMMs + attention) / layer = {d['float32/ratio_median']:.2f} in float32**, " \
           f"{d['bfloat16/ratio_median']:.2f} in bf16" in text
    assert (f"its 21 GEMMs alone take {ms('float32/gemms_s')} of its {ms('float32/layer_s')} ms, at "
            f"{d['float32/gemm_gflops_per_s_median']:.0f} GFLOP/s") in text
    assert (f"can cut the {100 * (1 - d['float32/ratio_median']):.0f}% of a layer outside its GEMMs and attention, "
            f"and some of attention's own {ms('float32/attention_s')} ms") in text
    assert f"The head is GEMMs too ({ms('float32/head_gemms_s')} of {ms('float32/head_s')} ms)" in text
    # the whole-step cut PPO's 1.5x-Tunix target would need, from the fifth peers run
    rows = {(r["task"], r["dtype"]): r["tools"] for r in
            json.loads((REPO / "results" / "peers_fifth.json").read_text())["rows"]}
    ppo = rows[("ppo", "float32")]
    need = 1 - ppo["tunix"]["s_per_update"] / 1.5 / ppo["jaxppo"]["s_per_update"]
    assert f"the whole step would have to be {100 * need:.0f}% faster for PPO's 1.5x" in text


def test_benchmarks_readme_quotes_the_gemm_rates_of_both_frameworks():
    d = json.loads((REPO / "results" / "matmul_dtype_zen4.json").read_text())
    text = " ".join((REPO / "benchmarks" / "README.md").read_text().split())
    rate = lambda fw, names: " / ".join(f"{d['runs'][fw + ':float32']['gemms'][n]['gflops']:.0f}"  # noqa: E731
                                        for n in names)
    mlp = ("mlp_fwd x@W", "mlp_dx g@W.T", "mlp_dw x.T@g")
    head = ("head_fwd h@E.T", "head_dh g@E", "head_dE g.T@h")
    assert f"at {rate('jax', mlp)} GFLOP/s in JAX and {rate('torch', mlp)} in torch" in text
    assert f"the LM head's three at {rate('jax', head)} against {rate('torch', head)}" in text
    assert d["machine"]["xla_flags"] is None and d["machine"]["cpu_family"] == 25

