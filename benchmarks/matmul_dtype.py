"""The matmul-level bound on what bfloat16 can give on this CPU: float32 vs bfloat16 GEMMs, one process each.

Each measurement runs in a fresh child process (``--child FRAMEWORK:DTYPE``), so no thread pool of one
framework steals cores from the other's. Timed per child (best of ``--repeats`` after a warm-up):

  * ``square``: an ``n x n`` by ``n x n`` matmul (``--n``, 2048 by default);
  * the GEMM shapes of one SmolLM2-135M decoder layer at 8 x 128 tokens (N = 1024 rows): the forward
    ``x [N, D] @ W [D, F]``, the input gradient ``g [N, F] @ W.T`` and the weight gradient ``x.T @ g``, for the
    MLP (D=576, F=1536) and the q/o projection (576 x 576), and the tied LM head (576 x 49152, N = 1016).

JAX: ``jnp.dot(a, b, preferred_element_type=float32)`` on operands of the dtype (float32 accumulation inside
the dot; bfloat16 in, float32 out). Transposed operands are written as ``a.T`` inside the jitted function, as the
backward pass produces them. torch: ``torch.matmul`` on float32 operands under ``torch.autocast("cpu", bf16)``
for bfloat16 (what autocast does in a model), plain float32 otherwise.

Reported: seconds and GFLOP/s per GEMM, the bfloat16 / float32 speed ratio per framework, the load average
before and after each child.

    python benchmarks/matmul_dtype.py [--n 2048] [--repeats 5] [--out benchmarks/results/matmul_dtype.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py (run from benchmarks/ or with it on sys.path)

# (name, M, K, N, transpose_lhs, transpose_rhs): C[M, N] = op(A) @ op(B), op = transpose where flagged
N_TOK, D, F, V = 1024, 576, 1536, 49152
SHAPES = [
    ("mlp_fwd x@W", N_TOK, D, F, False, False),
    ("mlp_dx g@W.T", N_TOK, F, D, False, True),
    ("mlp_dw x.T@g", D, N_TOK, F, True, False),
    ("attn_fwd x@Wq", N_TOK, D, D, False, False),
    ("attn_dx g@Wq.T", N_TOK, D, D, False, True),
    ("attn_dw x.T@g", D, N_TOK, D, True, False),
    ("head_fwd h@E.T", N_TOK - 8, D, V, False, True),
    ("head_dh g@E", N_TOK - 8, V, D, False, False),
    ("head_dE g.T@h", V, N_TOK - 8, D, True, False),
]


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cases(n: int):
    return [("square", n, n, n, False, False)] + SHAPES


def child_jax(dtype: str, n: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    out = {}
    for name, m, k, nn, ta, tb in _cases(n):
        a_shape = (k, m) if ta else (m, k)
        b_shape = (nn, k) if tb else (k, nn)
        a = jax.random.normal(jax.random.key(0), a_shape, jnp.float32).astype(dt)
        b = jax.random.normal(jax.random.key(1), b_shape, jnp.float32).astype(dt)

        def f(a, b, ta=ta, tb=tb):
            return jnp.dot(a.T if ta else a, b.T if tb else b, preferred_element_type=jnp.float32)
        fj = jax.jit(f)
        s = _best(lambda fj=fj, a=a, b=b: fj(a, b).block_until_ready(), repeats)
        out[name] = {"s": s, "gflops": 2.0 * m * k * nn / s / 1e9}
    return {"version": jax.__version__, "gemms": out}


def child_torch(dtype: str, n: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    out = {}
    for name, m, k, nn, ta, tb in _cases(n):
        a = torch.randn((k, m) if ta else (m, k))
        b = torch.randn((nn, k) if tb else (k, nn))

        def f(a=a, b=b, ta=ta, tb=tb):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                return torch.matmul(a.t() if ta else a, b.t() if tb else b)
        if dtype == "bfloat16":  # autocast converts float32 operands per call; time the GEMM on bf16 copies too
            ab, bb = a.bfloat16(), b.bfloat16()
            s_pre = _best(lambda ab=ab, bb=bb, ta=ta, tb=tb: torch.matmul(ab.t() if ta else ab, bb.t() if tb else bb),
                          repeats)
        s = _best(f, repeats)
        out[name] = {"s": s, "gflops": 2.0 * m * k * nn / s / 1e9}
        if dtype == "bfloat16":
            out[name].update(s_bf16_operands=s_pre, gflops_bf16_operands=2.0 * m * k * nn / s_pre / 1e9)
    return {"version": torch.__version__, "threads": torch.get_num_threads(), "gemms": out}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "matmul_dtype.json"))
    args = ap.parse_args(argv)
    if args.child:
        fw, dtype = args.child.split(":")
        before = list(os.getloadavg())
        res = (child_jax if fw == "jax" else child_torch)(dtype, args.n, args.repeats)
        res.update(loadavg_before=before, loadavg_after=list(os.getloadavg()))
        Path(args.child_out).write_text(json.dumps(res))
        return res
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("jax:float32", "jax:bfloat16", "torch:float32", "torch:bfloat16"):
            path = Path(tmp) / (key.replace(":", "_") + ".json")
            subprocess.run([sys.executable, __file__, "--child", key, "--child-out", str(path), "--n", str(args.n),
                            "--repeats", str(args.repeats)], check=True)
            runs[key] = json.loads(path.read_text())
            sq = runs[key]["gemms"]["square"]
            print(f"{key:<16} square {args.n}: {sq['s'] * 1e3:8.1f} ms {sq['gflops']:8.1f} GFLOP/s "
                  f"(load {runs[key]['loadavg_before'][0]:.2f})", flush=True)
    names = [c[0] for c in _cases(args.n)]
    ratio = {fw: {nm: runs[f"{fw}:float32"]["gemms"][nm]["s"] / runs[f"{fw}:bfloat16"]["gemms"][nm]["s"]
                  for nm in names} for fw in ("jax", "torch")}
    print(f"\n{'GEMM':<18}{'jax f32':>10}{'jax bf16':>10}{'x':>6}{'torch f32':>11}{'torch bf16':>11}{'x':>6}  GFLOP/s")
    for nm in names:
        g = {k: runs[k]["gemms"][nm]["gflops"] for k in runs}
        print(f"{nm:<18}{g['jax:float32']:>10.0f}{g['jax:bfloat16']:>10.0f}{ratio['jax'][nm]:>6.2f}"
              f"{g['torch:float32']:>11.0f}{g['torch:bfloat16']:>11.0f}{ratio['torch'][nm]:>6.2f}")
    res = {"n": args.n, "repeats": args.repeats, "machine": machine.describe(),
           "runs": runs, "speedup_bf16_over_f32": ratio}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
