"""The PPO trainer's own update step on an accelerator, at real model sizes: seconds, tokens/s, MFU and memory.

``python benchmarks/device_step.py --config FILE --shape NAME [--rows N] [--steps N] [--hbm-gb G] [--json OUT]
[overrides...]``; ``python benchmarks/device_step.py --table FILE.json...`` prints the records as the markdown table
of ``benchmarks/README.md``; ``benchmarks/device_suite.sh`` runs the GPU set.

Everything after the data I/O is the training code path: random weights of the named Hugging Face shape
(``SHAPES``: the ``config.json`` fields of each model, no download) and synthetic token rows go through
``trainer.ppo.build.assemble_run`` — the second half of ``build_run``: reference log-probs (the behaviour pass),
PF-PPO weights, the filled replay buffer, critic or adapters (LoRA, quantized base), the jitted prepare and update
step — and then ``run.prepare`` and ``run.step`` as ``jaxppo.train`` calls them. Rows are ``data.max_prompt_length``
+ ``data.max_response_length`` tokens with every mask 1 (the longest a run pads to).

Reported (printed as a table and written as JSON):

- ``s_per_step``: median wall time of ``--steps`` update steps after one warm-up step (which compiles);
  ``tokens_per_s`` = ``actor.ppo_mini_batch_size x (P + R)`` / ``s_per_step``;
- ``model_flops_per_step`` (:func:`step_model_flops`, stated below) and ``mfu`` = that / ``s_per_step`` / peak,
  against the datasheet's dense bf16 peak (``--peak-tflops``, 989.4 for an H100/H200 SXM) and against the bf16
  matmul rate measured in the same process (an 8192^3 product, ``matmul_tflops``);
- memory (accelerators with ``memory_stats``): ``bytes_in_use`` / ``peak_bytes_in_use`` / ``bytes_limit`` after
  the weights, after the adapters (a quantized base replaces the loaded one), after setup and after the steps;
  beside them the plan of ``jaxppo.plan`` for the same config on the same device: persistent state + the largest
  temporaries of its three programs (step, prepare pass, behaviour pass; ``--no-plan-compile``: the persistent
  state only). ``--hbm-gb G`` caps the allocator at G x 10^9 bytes (``XLA_PYTHON_CLIENT_MEM_FRACTION`` from the
  device's total memory, read with ``nvidia-smi`` before JAX starts): the run then shows whether the config fits a
  smaller card (e.g. 80 GB or 24 GB) for real; an out-of-memory error is recorded with the phase it hit.

Model FLOPs (the convention of MFU: the useful arithmetic, no rematerialisation counted): per sequence of ``T = P + R``
tokens, a forward pass costs ``2 N_body T`` (every decoder matmul; ``N_body`` = q, k, v, o, gate, up, down weights of
all layers) + ``2 L d_q T^2`` (causal attention: ``QK^T`` and ``AV``, half of the ``T x T`` scores) + the read-out
(``2 d V R``: the LM head on the ``R`` response positions for the actor; the value head's ``2 d T`` for a critic).
A training pass costs 3 forwards with full weights (forward, input gradients, weight gradients) and 2 with LoRA (the
frozen base gets no weight gradients; the adapters' own ``2 r (in + out)`` per token and projection are added,
times 3). The step trains the actor on ``actor.ppo_epochs x ppo_mini_batch_size`` sequences and, with GAE, the critic on
``critic.ppo_epochs x ppo_mini_batch_size``; ``tokens_per_s`` counts the minibatch's tokens once.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax   # importing jax does not start a backend: _cap_memory still applies

REPO = Path(__file__).resolve().parents[1]
H100_BF16_DENSE_TFLOPS = 989.4   # NVIDIA H100/H200 SXM datasheet, dense bf16 tensor-core peak

# config.json fields of the Hugging Face checkpoints (shapes only; weights are random)
_QWEN = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", max_position_embeddings=32768,
             rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu")
_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu")
SHAPES = {
    "qwen2.5-0.5b": dict(_QWEN, vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "smollm2-135m": dict(_LLAMA, vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    # a toy shape for the CPU test of this script
    "tiny": dict(_LLAMA, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                 max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5),
}


def forward_flops(hf: dict, prompt_len: int, response_len: int, *, head: str) -> dict[str, float]:
    """Forward FLOPs of one sequence, by part: ``body`` = ``2 N_body T``, ``attention`` = ``2 L d_q T^2``,
    ``head`` = ``2 d V R`` (``head="lm"``) or ``2 d T`` (``head="value"``); ``T = P + R``."""
    d, f, L = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    hd = hf.get("head_dim") or d // hf["num_attention_heads"]
    dq, dkv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    T = prompt_len + response_len
    n_body = L * (d * dq + 2 * d * dkv + dq * d + 3 * d * f)
    out = {"body": 2.0 * n_body * T, "attention": 2.0 * L * dq * T * T}
    out["head"] = 2.0 * d * hf["vocab_size"] * response_len if head == "lm" else 2.0 * d * T
    return out


def adapter_flops(hf: dict, rank: int, targets: tuple[str, ...], seq_len: int) -> float:
    """Forward FLOPs of the LoRA adapters on one sequence: ``2 r (in + out)`` per token, target and layer."""
    d, f, L = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    hd = hf.get("head_dim") or d // hf["num_attention_heads"]
    dq, dkv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    dims = {"q": (d, dq), "k": (d, dkv), "v": (d, dkv), "o": (dq, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    return float(L * seq_len * sum(2 * rank * sum(dims[t]) for t in targets))


def step_model_flops(hf: dict, *, prompt_len: int, response_len: int, actor_sequences: int,
                     critic_sequences: int = 0, lora_rank: int = 0, lora_targets: tuple[str, ...] = ()) -> float:
    """Model FLOPs of one update step (module doc): the actor (LM head) trained on ``actor_sequences`` sequences and
    the critic (value head) on ``critic_sequences`` (0: critic-free), each pass ``3x`` its forward with full
    weights, ``2x`` (+ ``3x`` the adapters') with LoRA."""
    T = prompt_len + response_len

    def train(head):
        fwd = sum(forward_flops(hf, prompt_len, response_len, head=head).values())
        if lora_rank > 0:
            return 2.0 * fwd + 3.0 * adapter_flops(hf, lora_rank, lora_targets, T)
        return 3.0 * fwd

    return actor_sequences * train("lm") + (critic_sequences * train("value") if critic_sequences else 0.0)


def synthetic_rows(n: int, prompt_len: int, response_len: int, vocab: int, group: int, seed: int) -> dict:
    """``n`` token rows in the data layer's layout (``split_data``'s dict): uniform random tokens, full masks,
    behaviour log-probs near a uniform model's ``-log V``, scores ~ N(0, 1), prompt groups of ``group`` rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {
        "prompt_ids": rng.integers(0, vocab, (n, prompt_len), dtype=np.int32),
        "prompt_mask": np.ones((n, prompt_len), np.int32),
        "response_ids": rng.integers(0, vocab, (n, response_len), dtype=np.int32),
        "response_mask": np.ones((n, response_len), np.int32),
        "behaviour_logprobs": (-np.log(vocab) + 0.1 * rng.standard_normal((n, response_len))).astype(np.float32),
        "score": rng.standard_normal(n).astype(np.float32),
        "group_id": (np.arange(n) // max(group, 1)).astype(np.int32),
    }


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_leaf(key, shape, dtype, kind):
    import jax
    import jax.numpy as jnp

    if kind == "ones":
        return jnp.ones(shape, dtype)
    if kind == "zeros":
        return jnp.zeros(shape, dtype)
    return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def random_model(lm_cfg, mesh, rules, seed: int = 0):
    """A ``CausalLM`` of ``lm_cfg`` with random weights made leaf by leaf in the parameter dtype under ``jit`` (no
    float32 copy of a bfloat16 model: what fits a card loaded from safetensors fits here too), then sharded as
    ``load_pretrained`` shards: N(0, 0.02) matrices, norm scales 1, biases 0."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxppo.models import CausalLM, shard_model

    abstract = nnx.eval_shape(lambda: CausalLM(lm_cfg, rngs=nnx.Rngs(seed)))
    gd, state = nnx.split(abstract)
    leaves, treedef = jax.tree.flatten_with_path(state)
    out = []
    for i, (path, x) in enumerate(leaves):
        name = "/".join(str(getattr(k, "key", k)) for k in path).lower()
        kind = "ones" if "norm" in name else "zeros" if ("bias" in name or len(x.shape) < 2) else "normal"
        out.append(jax.block_until_ready(_init_leaf(jax.random.PRNGKey(seed * 100003 + i), x.shape,
                                                    jnp.dtype(x.dtype), kind)))
    model = nnx.merge(gd, jax.tree.unflatten(treedef, out))
    shard_model(model, mesh, rules)
    return model


def matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """bf16 ``n x n x n`` matmul rate of the default device (TFLOP/s, mean of ``repeats`` after 3 warm-ups)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)
    for _ in range(3):
        jax.block_until_ready(mm(a, b))
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(mm(a, b))
    return 2.0 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def _memory() -> dict | None:
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def _memory_safe() -> dict | None:
    try:
        return _memory()
    except Exception:
        return None


def _cap_memory(hbm_gb: float) -> dict:
    """Set ``XLA_PYTHON_CLIENT_MEM_FRACTION`` so the allocator holds ``hbm_gb`` x 10^9 bytes (before JAX starts)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    total = int(out.split()[0]) * 2 ** 20
    frac = hbm_gb * 1e9 / total
    if not 0 < frac <= 1:
        raise SystemExit(f"--hbm-gb {hbm_gb}: the device has {total / 1e9:.1f} GB")
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{frac:.4f}"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    return {"device_total_bytes": total, "mem_fraction": round(frac, 4), "cap_bytes": int(hbm_gb * 1e9)}


def run(args, rec: dict) -> dict:
    """Fill ``rec`` (kept by the caller when a phase fails: ``rec["phase"]`` names it) and return it."""
    import jax
    import numpy as np

    from jaxppo.config import load_config
    from jaxppo.models.adapters import with_adapters
    from jaxppo.trainer.mesh import mesh_from_config
    from jaxppo.cli.plan import plan
    from jaxppo.hf.from_config import lm_config
    from jaxppo.trainer.ppo.build import assemble_run, check_config
    from jaxppo.trainer.ppo.packed import HostPlanned
    from jaxppo.trainer.policy import LoadedPolicy

    hf = SHAPES[args.shape]
    rec.update({"shape": args.shape, "config": args.config, "overrides": args.overrides, "phase": "setup",
                "device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform,
                "jax": jax.__version__})
    cfg = load_config(args.config, [f"model.path={args.model_dir}", *args.overrides])
    devices = jax.devices()[:1]
    hp = check_config(cfg, len(devices))
    mesh, rules = mesh_from_config(cfg.mesh, devices)
    P, R = cfg.data.max_prompt_length, cfg.data.max_response_length
    mini, epochs = cfg.actor.ppo_mini_batch_size, cfg.actor.ppo_epochs
    critic = hp.critic is not None
    lora = cfg.model.lora
    rec.update(prompt_len=P, response_len=R, mini_batch=mini,
               micro_batch=cfg.actor.ppo_micro_batch_size or mini, critic=critic, lora_rank=lora.rank,
               quantize_base=lora.quantize_base, param_dtype=cfg.model.param_dtype,
               compute_dtype=cfg.model.compute_dtype, remat=cfg.model.remat)
    rec["phase"] = "plan"
    try:
        p = plan(cfg, devices=devices, compile_step=args.plan_compile)
        rec["plan_total_bytes"] = p["per_device"]["total_bytes"]
        rec["plan_parts"] = {k: v for k, v in p["per_device"].items() if v is not None}
        rec["plan_temp_by_phase"] = p.get("temp_by_phase")
        if p.get("load"):   # a quantized base: the plan's load-and-quantize peak
            rec["plan_load_bytes"] = p["load"]["bytes"]
    except Exception as e:  # the measurement still runs
        rec["plan_error"] = f"{type(e).__name__}: {e}"
    if args.matmul:
        rec["matmul_tflops"] = matmul_tflops()

    t0 = time.perf_counter()
    model = random_model(lm_config(hf, cfg.model), mesh, rules, seed=cfg.trainer.seed)
    rec["memory_after_weights"] = _memory()
    model = with_adapters(model, cfg.model.lora, seed=cfg.trainer.seed, mesh=mesh, rules=rules)   # as build_run
    rows = args.rows or 2 * mini
    train = synthetic_rows(rows, P, R, hf["vocab_size"], cfg.rollout.n, seed=1)
    heldout = synthetic_rows(max(1, cfg.rollout.n), P, R, hf["vocab_size"], cfg.rollout.n, seed=2)
    rec["memory_after_adapters"] = _memory()
    rec["phase"] = "assemble (behaviour pass, buffer, jits)"
    loaded = LoadedPolicy(mesh=mesh, rules=rules, model_path="random:" + args.shape, tokenizer=None, model=model)
    del model
    run_ = assemble_run(cfg, loaded, train, heldout, None, hp=hp)
    del loaded
    rec["phase"] = "prepare"
    state = jax.block_until_ready(run_.prepare(run_.state))
    rec["setup_s"] = time.perf_counter() - t0
    rec["memory_after_setup"] = _memory()
    rec["phase"] = "compile step"
    t0 = time.perf_counter()
    compiled = run_.step.lower(state).compile()
    extra = (run_.step.base,) if hasattr(run_.step, "base") else ()   # WithBase: the frozen base of adapters
    rec["compile_s"] = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    if ma is not None:
        rec["step_temp_bytes"] = int(ma.temp_size_in_bytes)
    if isinstance(run_.step, HostPlanned):   # data.packing: each step's plan is made on the host, then compiled
        call = run_.step                     # for its shape (at most its row budgets)
    else:
        def call(s):
            return compiled(s, *extra)
    rec["phase"] = "steps"
    times, metrics = [], None
    for i in range(args.steps + 1):
        t0 = time.perf_counter()
        state, metrics = call(state)
        jax.block_until_ready(metrics)
        if i > 0:   # the first call also runs autotuning / first-touch allocations
            times.append(time.perf_counter() - t0)
    rec["phase"] = "done"
    rec["memory_after_steps"] = _memory()
    m = {k: float(np.asarray(v)) for k, v in metrics.items() if np.asarray(v).ndim == 0}
    rec["finite_losses"] = all(np.isfinite(m[k]) for k in m if "loss" in k)
    rec["metrics"] = {k: m[k] for k in sorted(m) if k.startswith(("actor/", "critic/"))}
    s = statistics.median(times)
    seqs = mini * epochs
    flops = step_model_flops(hf, prompt_len=P, response_len=R, actor_sequences=seqs,
                             critic_sequences=mini * cfg.critic.ppo_epochs if critic else 0,
                             lora_rank=lora.rank, lora_targets=tuple(lora.targets))
    rec.update(times_s=times, s_per_step=s, tokens_per_s=mini * (P + R) / s, model_flops_per_step=flops,
               achieved_tflops=flops / s / 1e12, mfu_datasheet=flops / s / (args.peak_tflops * 1e12),
               peak_tflops=args.peak_tflops)
    if rec.get("matmul_tflops"):
        rec["mfu_vs_matmul"] = flops / s / (rec["matmul_tflops"] * 1e12)
    return rec


def fmt(rec: dict) -> str:
    gib = lambda b: "-" if b is None else f"{b / 2 ** 30:.2f} GiB"  # noqa: E731
    peak = (rec.get("memory_after_steps") or rec.get("memory_after_setup") or {}).get("peak_bytes_in_use")
    lines = [f"{rec['shape']} {rec.get('compute_dtype')} lora={rec.get('lora_rank')} "
             f"quant={rec.get('quantize_base')} critic={rec.get('critic')} P+R={rec.get('prompt_len')}+"
             f"{rec.get('response_len')} mini={rec.get('mini_batch')} micro={rec.get('micro_batch')}: "
             f"phase={rec['phase']}"]
    if "s_per_step" in rec:
        lines.append(f"  {rec['s_per_step']:.3f} s/step, {rec['tokens_per_s']:.0f} tokens/s, "
                     f"{rec['achieved_tflops']:.1f} TFLOP/s model, MFU {100 * rec['mfu_datasheet']:.1f}% of "
                     f"{rec['peak_tflops']} (matmul measured {rec.get('matmul_tflops') or 0:.0f} TFLOP/s)")
    temps = rec.get("plan_temp_by_phase") or {}
    lines.append(f"  plan {gib(rec.get('plan_total_bytes'))} (temporaries: "
                 + ", ".join(f"{k} {gib(v)}" for k, v in temps.items()) + ")"
                 + (f"; load {gib(rec['plan_load_bytes'])}" if rec.get("plan_load_bytes") else "")
                 + f"; measured peak {gib(peak)}"
                 + (f"; error: {rec['error']}" if rec.get("error") else ""))
    return "\n".join(lines)


def table(records: list[dict]) -> str:
    """The markdown table of ``benchmarks/README.md`` ("On a GPU") from device_step JSON records, one row each."""
    gib = lambda b: "-" if b is None else f"{b / 2 ** 30:.2f}"  # noqa: E731
    rows = ["| run | model, step | P+R, mini / micro | compute | s/step | tokens/s | model TFLOP/s | MFU (989.4) "
            "| plan GiB (largest temp) | measured peak GiB | cap | result |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in records:
        kind = (f"LoRA r{r['lora_rank']}" + (f" {r['quantize_base']} base" if r.get("quantize_base") else "")
                if r.get("lora_rank") else "full weights") + (", GAE critic" if r.get("critic") else ", GRPO")
        temps = r.get("plan_temp_by_phase") or {}
        big = max(temps, key=temps.get) if temps else None
        # records of the first GPU run (before the plan compiled its three programs): persistent + the step's temp
        plan_s = gib(r.get("plan_total_bytes")) + (f" ({big})" if big else " (step only)" if r.get(
            "plan_total_bytes") else " (persistent only)" if r.get("plan_persistent_bytes") else "")
        if r.get("plan_load_bytes"):   # a quantized base (since run 6): the plan's load-and-quantize peak
            plan_s += f"; load {gib(r['plan_load_bytes'])}"
        peak = (r.get("memory_after_steps") or {}).get("peak_bytes_in_use")
        cap = r.get("memory_cap") or {}
        done = "s_per_step" in r
        result = "ran" if done else f"OOM in {r.get('phase', '?').split(' (')[0]}" if "RESOURCE_EXHAUSTED" in \
            r.get("error", "") else f"failed in {r.get('phase')}"
        rows.append("| " + " | ".join([
            name, f"{r['shape']}, {kind}", f"{r.get('prompt_len')}+{r.get('response_len')}, "
            f"{r.get('mini_batch')} / {r.get('micro_batch')}", r.get("compute_dtype", "?"),
            f"{r['s_per_step']:.3f}" if done else "-", f"{r['tokens_per_s']:.0f}" if done else "-",
            f"{r['achieved_tflops']:.1f}" if done else "-", f"{100 * r['mfu_datasheet']:.1f}%" if done else "-",
            plan_s, gib(peak), f"{cap['cap_bytes'] / 1e9:.0f} GB" if cap else "-", result]) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--table"]:   # python benchmarks/device_step.py --table results/device/*.json
        print(table([(Path(f).stem, json.loads(Path(f).read_text())) for f in argv[1:]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--rows", type=int, default=None, help="training rows (default 2 x actor.ppo_mini_batch_size)")
    ap.add_argument("--steps", type=int, default=3, help="timed update steps (after one warm-up step)")
    ap.add_argument("--hbm-gb", type=float, default=None, help="cap the GPU allocator at this many 10^9 bytes")
    ap.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    ap.add_argument("--matmul", action="store_true", help="also measure the bf16 8192^3 matmul rate")
    ap.add_argument("--no-plan-compile", dest="plan_compile", action="store_false",
                    help="plan the persistent state only (no compile of the plan's three programs)")
    ap.add_argument("--model-dir", default=None, help="where config.json is written (default: a temp folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cap = _cap_memory(args.hbm_gb) if args.hbm_gb else None
    import tempfile
    tmp = tempfile.TemporaryDirectory()
    args.model_dir = args.model_dir or tmp.name
    (Path(args.model_dir) / "config.json").write_text(json.dumps(SHAPES[args.shape]))
    rec: dict = {"phase": "start"}
    try:
        run(args, rec)
        ok = True
    except Exception as e:   # recorded with the phase it hit (an out-of-memory error is a result here)
        import traceback
        rec["memory_at_error"] = _memory_safe()
        rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        rec["traceback"] = traceback.format_exc()[-4000:]
        ok = False
    rec["memory_cap"] = cap
    rec["argv"] = argv
    rec.setdefault("shape", args.shape)
    rec.setdefault("phase", "start")
    print(fmt(rec), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
