"""jaxppo side by side with Tunix (JAX) and TRL (PyTorch): one update step of each, each tool in its own process.

    bash benchmarks/peers/setup.sh                     # once: the peers' virtual environments
    python benchmarks/peers.py [--out results/peers.json] [--quick] [--tasks fwdbwd,dpo,...] [--dtypes ...]

Same model in every tool: SmolLM2-135M dimensions (30 layers, d=576, 9 heads / 3 KV heads, MLP 1536, vocab 49152,
tied embeddings), random weights written ONCE by jaxppo as a Hugging Face folder (``model.safetensors``) and
loaded by every tool; RoPE base 1e6 in all three (SmolLM2 uses 1e5, but Tunix 0.1.7's Llama3 calls
``apply_rope`` without the config's ``rope_theta`` and so always uses its default 1e6). Same fixed batch
(``batch.npz``: token ids in ``[0, V-2]``, no padding, ``V-1`` is Tunix's pad id) and the same
hyper-parameters (``spec.json``: AdamW lr 1e-5, betas 0.9/0.999, eps 1e-8, no weight decay, global-norm clip
1.0; DPO beta 0.1 sigmoid; clip 0.2; value clip 0.2; token-mean aggregation; no KL and no entropy term).

Rows (``benchmarks/peers/common.py`` says what each driver runs):
  fwdbwd  the model's forward + backward (mean next-token cross-entropy, 8 x 128 tokens);
  dpo     one DPO update, 8 pairs of prompt 64 + response 64, reference log-probs given (precomputed);
  grpo    one critic-free clipped-ratio update, 8 x (64 + 64) tokens (2 groups of 4 responses, the rows of a group
          sharing one prompt), advantages and old log-probs given;
  ppo     one PPO update with a critic (actor update + critic update, GAE advantages/returns/old values given), on
          the same rows (2 prompts x 4 responses);
  lora    the DPO update with rank-8 adapters (q, k, v, o, gate, up, down), where a tool has adapters;
  dpo_hh  one DPO update on real lengths: 8 HH-RLHF pairs of ``../shared`` (drawn with seed 0) tokenized with
          SmolLM2's tokenizer at caps (256, 128), reference log-probs given; each tool in its best CPU layout for
          ragged rows (jaxppo: packed rows, ``data.packing``; TRL: its collator's layout, each prompt + answer row
          right padded to the batch's longest; Tunix: prompts left padded and answers right padded to the batch's
          longest, not to the caps). Its tokens are the real ones (each pair's prompt once and both answers).

Each (row, dtype) runs jaxppo, Tunix and TRL one after the other (the order rotates from row to row), each in
a fresh process: jaxppo with this python, the peers with their venv's python. A driver loads the weights,
computes the row's loss on the initial weights and the fixed batch (the equivalence check, compared across
tools within ``LOSS_TOL``), then compiles/warms up once and times ``--repeats`` updates (median). Peak RSS is the
driver process's ``ru_maxrss``; the 1/5/15-min load average is recorded before and after each driver.
Speed-ups (``speedup_vs_tunix`` = Tunix's s/update / jaxppo's) are only given where the losses agree.

``--quick``: 2 layers, 2 repeats, float32 only (tests, smoke runs); ``--check-only``: the losses only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402  benchmarks/machine.py
DRIVERS = HERE / "peers"
TOOLS = ("jaxppo", "tunix", "trl")
TASKS = ("fwdbwd", "dpo", "grpo", "ppo", "lora", "dpo_hh")
VOCAB = 49152
#: absolute loss tolerance of the equivalence check, by compute dtype
LOSS_TOL = {"float32": 2e-3, "bfloat16": 5e-2}
HPARAMS = dict(lr=1e-5, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8, weight_decay=0.0, grad_clip=1.0, dpo_beta=0.1,
               clip_eps=0.2, value_clip=0.2, gamma=1.0, lam=0.95, lora_rank=8, lora_alpha=16.0)
#: the default (row, dtype) plan: every row in float32, the model and DPO rows in bfloat16 too (all rows in both
#: dtypes take about twice the ~12 minutes budgeted for one run; ``--dtypes float32,bfloat16`` asks for that)
DEFAULT_PLAN = tuple((t, "float32") for t in TASKS) + (("fwdbwd", "bfloat16"), ("dpo", "bfloat16"))
SHAPES = dict(fwd_batch=8, fwd_seq=128, dpo_pairs=8, dpo_prompt=64, dpo_response=64, rl_batch=8, rl_prompt=64,
              rl_response=64, group=4, hidden=576, hh_pairs=8, hh_prompt=256, hh_response=128)


def venv_python(tool: str) -> Path:
    """The peer's interpreter: ``$JAXPPO_PEERS_VENVS/<tool>`` or ``benchmarks/peers/.venv-<tool>`` (setup.sh)."""
    root = os.environ.get("JAXPPO_PEERS_VENVS")
    base = Path(root) / tool if root else DRIVERS / f".venv-{tool}"
    return base / "bin" / "python"


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """``(A, G)`` of full-length rows: ``δ_t = r_t + γ V_{t+1} − V_t`` (``V_T = 0``), ``A_t = δ_t + γλ A_{t+1}``,
    ``G = A + V``."""
    adv = np.zeros_like(values)
    nxt = np.zeros(values.shape[0], values.dtype)
    last = np.zeros(values.shape[0], values.dtype)
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
        nxt = values[:, t]
    return adv, adv + values


def make_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """The fixed batch of every row (module docstring); float arrays are float32, ids int32."""
    s, hp = SHAPES, HPARAMS
    rng = np.random.default_rng(seed)
    ids = lambda *shape: rng.integers(0, VOCAB - 1, size=shape).astype(np.int32)
    lv = math.log(VOCAB)
    out = {"fwd_ids": ids(s["fwd_batch"], s["fwd_seq"]),
           "dpo_prompt": ids(s["dpo_pairs"], s["dpo_prompt"]), "dpo_chosen": ids(s["dpo_pairs"], s["dpo_response"]),
           "dpo_rejected": ids(s["dpo_pairs"], s["dpo_response"]),
           "dpo_ref_chosen": -s["dpo_response"] * lv + rng.normal(0, 5, s["dpo_pairs"]),
           "dpo_ref_rejected": -s["dpo_response"] * lv + rng.normal(0, 5, s["dpo_pairs"]),
           # a GRPO group is n responses to ONE prompt: the rows of each group of 4 share their prompt
           "rl_prompt": np.repeat(ids(s["rl_batch"] // s["group"], s["rl_prompt"]), s["group"], axis=0),
           "rl_response": ids(s["rl_batch"], s["rl_response"]),
           "rl_old_logp": -lv + rng.normal(0, 0.3, (s["rl_batch"], s["rl_response"])),
           "rl_scores": rng.normal(0, 1, s["rl_batch"]),
           "ppo_values": rng.normal(0, 0.5, (s["rl_batch"], s["rl_response"])),
           "value_head_kernel": rng.normal(0, 0.02, (s["hidden"], 1)), "value_head_bias": np.zeros(1)}
    g = out["rl_scores"].reshape(-1, s["group"])
    out["grpo_adv"] = ((g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-6)).reshape(-1)
    rew = np.zeros((s["rl_batch"], s["rl_response"]))
    rew[:, -1] = out["rl_scores"]
    out["ppo_token_rewards"] = rew
    out["ppo_adv"], out["ppo_returns"] = gae(rew, out["ppo_values"], hp["gamma"], hp["lam"])
    return {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in out.items()}


def hh_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """The ``dpo_hh`` row's pairs: ``hh_pairs`` HH-RLHF pairs drawn with ``seed`` from all the pairs of ``../shared``,
    tokenized by ``benchmarks/packing.py`` at the caps (prompts left padded, answers right padded, masks beside),
    with reference log-probs of a uniform model plus noise (float32)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.packing import load_pairs

    s = SHAPES
    arrays = load_pairs(s["hh_prompt"], s["hh_response"], None)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(arrays["prompt_ids"].shape[0], s["hh_pairs"], replace=False))
    out = {f"hh_{k}": np.asarray(arrays[k])[pick].astype(np.int32) for k in
           ("prompt_ids", "prompt_mask", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")}
    lv = math.log(VOCAB)
    for side in ("chosen", "rejected"):
        n = out[f"hh_{side}_mask"].sum(1)
        out[f"hh_ref_{side}"] = (-n * lv + rng.normal(0, 5, n.shape[0])).astype(np.float32)
    return out


def prepare_work(work: Path, layers: int, env: dict, tasks: tuple[str, ...] = TASKS) -> None:
    """Write ``work/{model/, batch.npz, spec.json}`` (the weights by the jaxppo driver, in its own process); the
    ``dpo_hh`` pairs only when ``tasks`` has that row (they need ``../shared`` and the tokenizer)."""
    work.mkdir(parents=True, exist_ok=True)
    batch, shapes = make_batch(), dict(SHAPES)
    if "dpo_hh" in tasks:
        batch.update(hh_batch())
        shapes["hh_real_tokens"] = int(sum(batch[f"hh_{k}_mask"].sum() for k in ("prompt", "chosen", "rejected")))
    np.savez(work / "batch.npz", **batch)
    spec = {"layers": layers, "rope_theta": 1e6, "vocab": VOCAB, "pad_id": VOCAB - 1, "shapes": shapes,
            "hparams": HPARAMS}
    (work / "spec.json").write_text(json.dumps(spec, indent=2))
    subprocess.run([sys.executable, str(DRIVERS / "jaxppo_driver.py"), "--export", str(work), "--layers",
                    str(layers), "--rope-theta", "1e6"], check=True, env=env, capture_output=True, text=True)


def run_one(tool: str, task: str, dtype: str, work: Path, repeats: int, env: dict, timeout: int) -> dict:
    """One driver process; a record with ``error`` when the tool is missing or the driver failed."""
    py = Path(sys.executable) if tool == "jaxppo" else venv_python(tool)
    base = {"tool": tool, "task": task, "dtype": dtype}
    if not py.exists():
        return {**base, "error": f"no virtual environment for {tool} ({py}); run benchmarks/peers/setup.sh"}
    out = work / f"{tool}-{task}-{dtype}.json"
    out.unlink(missing_ok=True)
    cmd = [str(py), str(DRIVERS / f"{tool}_driver.py"), "--task", task, "--dtype", dtype, "--work", str(work),
           "--repeats", str(repeats), "--out", str(out)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - t0
    if p.returncode != 0 or not out.exists():
        return {**base, "error": f"driver exited {p.returncode}: {p.stderr.strip()[-1500:]}", "wall_s": wall}
    rec = json.loads(out.read_text())
    rec["wall_s"] = wall
    return rec


def compare(recs: dict[str, dict], dtype: str) -> dict:
    """The row's equivalence check: every loss against the first tool's (jaxppo's where it has one)."""
    losses = {t: r.get("loss") for t, r in recs.items() if r.get("loss") is not None}
    if len(losses) < 2:
        return {"checked": False, "reason": "fewer than two tools computed this row", "losses": losses}
    ref_tool = "jaxppo" if "jaxppo" in losses else next(iter(losses))
    tol = LOSS_TOL[dtype]
    diffs = {t: abs(v - losses[ref_tool]) for t, v in losses.items() if t != ref_tool}
    return {"checked": True, "reference": ref_tool, "tolerance_abs": tol, "losses": losses, "abs_diff": diffs,
            "agree": {t: d <= tol for t, d in diffs.items()}}


def speedups(recs: dict[str, dict], check: dict) -> dict:
    """``speedup_vs_<peer>`` = peer s/update / jaxppo s/update, for peers whose loss agreed with jaxppo's."""
    out = {}
    j = recs.get("jaxppo", {}).get("s_per_update")
    for peer in ("tunix", "trl"):
        p = recs.get(peer, {}).get("s_per_update")
        agreed = check.get("checked") and check.get("reference") == "jaxppo" and check["agree"].get(peer)
        out[f"speedup_vs_{peer}"] = (p / j) if (j and p and agreed) else None
    return out


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'row':<8}{'dtype':<10}{'tool':<8}{'s/update':>10}{'tokens/s':>10}{'peak RSS MiB':>13}{'loss':>11}"
          f"{'vs tunix':>10}{'vs trl':>8}  note")
    for row in rows:
        for tool in TOOLS:
            r = row["tools"].get(tool, {})
            note = r.get("unsupported") or r.get("error", "")
            sp = row["speedups"] if tool == "jaxppo" else {}
            print(f"{row['task']:<8}{row['dtype']:<10}{tool:<8}{fmt(r.get('s_per_update'), '.3f'):>10}"
                  f"{fmt(r.get('tokens_per_s'), '.0f'):>10}{fmt(r.get('peak_rss_mb'), '.0f'):>13}"
                  f"{fmt(r.get('loss'), '.5f'):>11}{fmt(sp.get('speedup_vs_tunix')):>10}"
                  f"{fmt(sp.get('speedup_vs_trl')):>8}  {note[:70]}")
        c = row["check"]
        if c.get("checked"):
            bad = [t for t, ok in c["agree"].items() if not ok]
            print(f"{'':<8}loss check vs {c['reference']} (|diff| <= {c['tolerance_abs']}): "
                  + ("all agree" if not bad else f"DIFFER: {bad} " + str({t: round(d, 5) for t, d in c['abs_diff'].items()})))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "results" / "peers.json"))
    ap.add_argument("--quick", action="store_true", help="2 layers, 2 repeats, float32 only")
    ap.add_argument("--check-only", action="store_true", help="the loss check only (drivers time nothing)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--dtypes", default=None, help="comma list of float32,bfloat16: every row in each (default: "
                    "DEFAULT_PLAN; --quick: float32)")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per driver process")
    ap.add_argument("--work", default=None, help="folder for weights/batch/driver records (default: a temp dir)")
    args = ap.parse_args(argv)
    layers = args.layers or (2 if args.quick else 30)
    repeats = 0 if args.check_only else (args.repeats or (2 if args.quick else 5))
    tasks, tools = args.tasks.split(","), args.tools.split(",")
    dtypes = (args.dtypes or ("float32" if args.quick else None))
    for d in (dtypes or "float32").split(","):
        if d not in LOSS_TOL:
            raise SystemExit(f"--dtypes: unknown dtype {d!r}; known: {', '.join(LOSS_TOL)}")
    for t in tasks:
        if t not in TASKS:
            raise SystemExit(f"--tasks: unknown row {t!r}; known: {', '.join(TASKS)}")
    for t in tools:
        if t not in TOOLS:
            raise SystemExit(f"--tools: unknown tool {t!r}; known: {', '.join(TOOLS)}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    t_start = time.perf_counter()
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="peers-")
    work = Path(args.work or tmp.name)
    prepare_work(work, layers, env, tuple(tasks))
    rows = []
    plan = ([(t, d) for t in tasks for d in dtypes.split(",")] if dtypes else
            [(t, d) for t, d in DEFAULT_PLAN if t in tasks])
    for i, (task, dtype) in enumerate(plan):
        order = tools[i % len(tools):] + tools[:i % len(tools)]
        recs = {}
        for tool in order:
            recs[tool] = run_one(tool, task, dtype, work, repeats, env, args.timeout)
            r = recs[tool]
            print(f"[{time.perf_counter() - t_start:6.0f}s] {task:<7}{dtype:<9}{tool:<7}"
                  f"{fmt(r.get('s_per_update'), '.3f')} s/update  loss {fmt(r.get('loss'), '.5f')}  "
                  f"{r.get('error') or r.get('unsupported') or ''}"[:200], flush=True)
        check = compare(recs, dtype)
        rows.append({"task": task, "dtype": dtype, "order": order, "tools": recs, "check": check,
                     "speedups": speedups(recs, check)})
    total = time.perf_counter() - t_start
    res = {"date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "machine": machine.describe(), "commit": machine.git_commit(),
           "layers": layers, "repeats": repeats, "rope_theta": 1e6, "shapes": SHAPES, "hparams": HPARAMS,
           "loss_tolerance_abs": LOSS_TOL, "total_wall_s": total, "rows": rows}
    print_table(rows)
    print(f"\ntotal {total:.0f} s, {layers} layers, median of {repeats}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    if tmp is not None:
        tmp.cleanup()
    return res


if __name__ == "__main__":
    main()
