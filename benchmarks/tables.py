"""The measurement tables of benchmarks/README.md, benchmarks/cpu.md and launch/README.md, generated from the committed JSON records.

    python -m benchmarks.tables           # rewrite every table between its marker comments
    python -m benchmarks.tables --check   # exit 1 (and name them) when a committed table is not the records'

A table sits between ``<!-- table NAME: begin -->`` and ``<!-- table NAME: end -->``; ``TABLES`` maps NAME to the
function that renders it from the records, ``DOCS`` says which file holds which tables. The records keep the date,
machine, load and commit of each measurement; the docs keep the method and the current tables.
``tests/test_benchmark_tables.py`` checks that the committed tables are what this module generates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
BENCH_RESULTS = ROOT / "benchmarks" / "results"

#: the current peer comparison: for each (task, dtype) the record that measured the current code
PEERS_CURRENT: dict[tuple[str, str], str] = {
    **{(t, "float32"): "peers_float32.json" for t in ("fwdbwd", "dpo", "grpo", "ppo", "lora")},
    ("fwdbwd", "bfloat16"): "peers_all.json", ("dpo", "bfloat16"): "peers_all.json",
    ("lora", "bfloat16"): "peers_lora_bfloat16.json",
    ("grpo", "bfloat16"): "peers_grpo_ppo.json", ("ppo", "bfloat16"): "peers_grpo_ppo.json",
    ("dpo_hh", "float32"): "peers_dpo_hh.json",
}
#: the repeated float32 forward+backward runs (tool order rotated between them)
PEERS_ROUNDS = [f"peers_fwdbwd_rounds/round{k}.json" for k in range(1, 6)]
#: A/B experiments, jaxppo's code or settings varied one at a time: (name, folder or file pair, A, B, rows, tools)
PEERS_AB: list[tuple[str, list[str], list[str], tuple[tuple[str, str], ...], tuple[str, ...]]] = [
    ("DPO: two rows per pair (A) vs each pair's prompt once (B)",
     [f"peers_dpo_prefix_ab/d23054b_round{k}.json" for k in (1, 2)],
     [f"peers_dpo_prefix_ab/shared_round{k}.json" for k in (1, 2)], (("dpo", "float32"),), ("jaxppo",)),
    ("GRPO/PPO: row layout (A) vs each group's prompt once (B)",
     [f"peers_group_prompt_ab/rows_{k}.json" for k in (1, 2)],
     [f"peers_group_prompt_ab/shared_{k}.json" for k in (1, 2)], (("grpo", "float32"), ("ppo", "float32")),
     ("jaxppo",)),
    ("model.remat: False (A) vs \"auto\" (B)", [f"peers_remat_ab/false_{k}.json" for k in (1, 2)],
     [f"peers_remat_ab/auto_{k}.json" for k in (1, 2)], (("fwdbwd", "float32"),), ("jaxppo",)),
    ("glibc malloc: default (A) vs GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (B)", ["peers_fwdbwd_malloc/default.json"],
     ["peers_fwdbwd_malloc/hugetlb.json"], (("fwdbwd", "float32"),), ("jaxppo", "tunix", "trl")),
    ("XLA:CPU scheduler: default (A) vs --xla_cpu_enable_concurrency_optimized_scheduler=false (B)",
     ["peers_ppo_scheduler_default.json"], ["peers_ppo_scheduler_dfs.json"],
     (("ppo", "float32"), ("ppo", "bfloat16")), ("jaxppo", "tunix")),
    ("XLA:CPU scheduler, jaxppo's other rows: default (A) vs the flag (B)", ["peers_jaxppo_scheduler_default.json"],
     ["peers_jaxppo_scheduler_dfs.json"],
     tuple((t, d) for t in ("fwdbwd", "dpo", "grpo") for d in ("float32", "bfloat16")), ("jaxppo",)),
]
#: the GPU records of the current code (results/device/); earlier attempts are in results/archive/device/
DEVICE_CURRENT = ["run1_qwen1p5b_grpo_bf16_micro8", "run1_qwen1p5b_grpo_f32_micro8", "run2_qwen1p5b_grpo_bf16",
                  "run2_qwen1p5b_grpo_f32", "run3_qwen7b_lora_80gb", "run6_qwen7b_qlora_24gb_behaviour8",
                  "run7_qwen1p5b_grpo_bf16params", "run8_qwen7b_qlora_24gb_behaviour32_compact"]
#: the GAE variants the ops table shows (the record has the unroll and chunk sizes too)
OPS_VARIANTS = ("loop_torch", "scan", "gae", "blocked32", "stream_floor")


def load(rel: str, base: Path = RESULTS) -> dict:
    return json.loads((base / rel).read_text(encoding="utf-8"))


def peer_rows(rel: str) -> dict[tuple[str, str], dict]:
    """``{(task, dtype): {tool: its measurement}}`` of one peers record."""
    return {(r["task"], r["dtype"]): r["tools"] for r in load(rel)["rows"]}


def _md(header: list[str], align: str, rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def peers_table() -> str:
    """The current peer comparison, one line per (row, dtype): each tool's s/update and peak RSS, jaxppo's speed-up
    (the peer's s/update / jaxppo's), and the record. A tool without the row: "-"."""
    rows = []
    for (task, dtype), rel in PEERS_CURRENT.items():
        tools = peer_rows(rel)[(task, dtype)]
        s = {k: (tools.get(k) or {}).get("s_per_update") for k in ("jaxppo", "tunix", "trl")}
        rss = {k: tools[k]["peak_rss_mb"] for k in s if s[k] is not None}
        fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
        rows.append([task, dtype, *(fmt(s[k], ".3f") for k in s),
                     *("-" if s[k] is None else _x(s[k], s["jaxppo"]) for k in ("tunix", "trl")),
                     *(fmt(rss.get(k), ".0f") for k in s), rel])
    return _md(["row", "dtype", "jaxppo s/update", "Tunix s/update", "TRL s/update", "jaxppo vs Tunix",
                "jaxppo vs TRL", "jaxppo peak RSS MiB", "Tunix peak RSS MiB", "TRL peak RSS MiB", "record"],
               "llrrrrrrrrl", rows)


def peers_rounds_table() -> str:
    """The float32 forward+backward measured five times back to back, the tools' order rotated."""
    rows, vt, vr = [], [], []
    for rel in PEERS_ROUNDS:
        (row,) = load(rel)["rows"]
        t = row["tools"]
        s = {k: t[k]["s_per_update"] for k in ("jaxppo", "tunix", "trl")}
        vt.append(s["tunix"] / s["jaxppo"])
        vr.append(s["trl"] / s["jaxppo"])
        rows.append([rel, " > ".join(row["order"]), *(f"{s[k]:.3f}" for k in ("jaxppo", "tunix", "trl")),
                     f"{vt[-1]:.2f}x", f"{vr[-1]:.2f}x", f"{t['jaxppo']['peak_rss_mb']:.0f}",
                     f"{t['tunix']['peak_rss_mb']:.0f}"])
    rows.append(["median", "", "", "", "", f"{statistics.median(vt):.2f}x", f"{statistics.median(vr):.2f}x", "", ""])
    return _md(["record", "order", "jaxppo s", "Tunix s", "TRL s", "jaxppo vs Tunix", "jaxppo vs TRL",
                "jaxppo peak RSS MiB", "Tunix peak RSS MiB"], "llrrrrrrr", rows)


def peers_ab_table() -> str:
    """Each A/B experiment: s/update of A and B per round, B's speed-up, peak RSS and fresh memory per update
    (minor page faults x 4 KiB, where recorded) of the first round, and whether the losses are equal."""
    rows = []
    for name, a_files, b_files, keys, tools in PEERS_AB:
        a_recs, b_recs = [peer_rows(f) for f in a_files], [peer_rows(f) for f in b_files]
        for key in keys:
            for tool in tools:
                a = [r[key][tool] for r in a_recs]
                b = [r[key][tool] for r in b_recs]
                fresh = ("-" if a[0].get("minor_faults_per_update") is None else
                         f"{a[0]['minor_faults_per_update'] * 4096 / 2 ** 30:.2f} -> "
                         f"{b[0]['minor_faults_per_update'] * 4096 / 2 ** 30:.2f}")
                same = len({round(x["loss"], 6) for x in a + b}) == 1
                rows.append([name, f"{key[0]} {key[1]}", tool, " / ".join(f"{x['s_per_update']:.3f}" for x in a),
                             " / ".join(f"{x['s_per_update']:.3f}" for x in b),
                             " / ".join(_x(x["s_per_update"], y["s_per_update"]) for x, y in zip(a, b)),
                             f"{a[0]['peak_rss_mb']:.0f} -> {b[0]['peak_rss_mb']:.0f}", fresh,
                             "yes" if same else "no"])
    return _md(["experiment", "row", "tool", "A s/update", "B s/update", "B speed-up", "peak RSS MiB A -> B",
                "fresh GiB/update A -> B", "same loss"], "llllllllr", rows)


def layouts_table() -> str:
    """30-layer model forward+backward, float32 vs bfloat16 compute, layers scanned or unrolled (one process)."""
    d = load("model_dtype_pair_layouts.json")
    first = d["float32:scan"]["median"]
    rows = [[k.replace(":", ", ").replace("scan", "scanned").replace("unroll", "unrolled"),
             f"{d[k]['compile_and_first_s']:.1f}", f"{d[k]['median']:.2f}", _x(first, d[k]["median"])]
            for k in ("float32:scan", "float32:unroll", "bfloat16:scan", "bfloat16:unroll")]
    return _md(["variant", "compile + first call s", "step s (median)", "vs float32 scanned"], "lrrr", rows)


def layer_table() -> str:
    """One decoder layer and the LM head, each part timed alone, float32 vs bfloat16 (model_layer.py)."""
    d = load("model_layer_dtypes.json")
    m, sp = d["medians"], d["speedup"]
    names = {"layer": "one layer fwd+bwd", "gemms": "its 21 GEMMs alone", "attention": "its attention alone",
             "head": "LM head + cross-entropy", "head_gemms": "the head's GEMMs alone"}
    rows = [[label, f"{m[f'float32/{k}_s'] * 1e3:.1f}", f"{m[f'bfloat16/{k}_s'] * 1e3:.1f}", f"{sp[k]:.2f}x"]
            for k, label in names.items()]
    rows.append(["(GEMMs + attention) / layer", f"{d['float32/ratio_median']:.2f}", f"{d['bfloat16/ratio_median']:.2f}",
                 ""])
    rows.append(["GEMM rate GFLOP/s", f"{d['float32/gemm_gflops_per_s_median']:.0f}",
                 f"{d['bfloat16/gemm_gflops_per_s_median']:.0f}", ""])
    return _md(["part (median)", "float32 ms", "bfloat16 ms", "bf16 speed-up"], "lrrr", rows)


def matmul_table() -> str:
    """The model's GEMM shapes alone, JAX vs torch, float32 and bfloat16 (matmul_dtype.py, a process each)."""
    runs = load("matmul_dtype_zen4.json")["runs"]
    cols = [k for k in ("jax:float32", "torch:float32", "jax:bfloat16", "torch:bfloat16") if k in runs]
    names = list(runs[cols[0]]["gemms"])
    rows = [[n, *(f"{runs[c]['gemms'][n]['gflops']:.0f}" if n in runs[c]["gemms"] else "-" for c in cols)]
            for n in names]
    return _md(["GEMM", *(c.replace(":", " ") + " GFLOP/s" for c in cols)], "l" + "r" * len(cols), rows)


def ops_table() -> str:
    """GAE, B=256, float32: each variant's time against verl's loops and the memory-traffic floor."""
    d = load("ops.json", BENCH_RESULTS)
    rows = [[str(r["T"]), r["mask"] or "-", f"`{r['variant']}`", f"{r['ms_median']:.2f}", f"{r['ms_min']:.2f}",
             f"{r['speedup_vs_loop_numpy']:.1f}", f"{r['speedup_vs_loop_torch']:.1f}", f"{r['effective_GBps']:.1f}",
             f"{r['x_stream_floor']:.2f}"] for r in d["rows"] if r["variant"] in OPS_VARIANTS]
    return _md(["T", "mask", "variant", "ms median", "ms min", "x numpy loop", "x torch loop", "GB/s", "x floor"],
               "rllrrrrrr", rows)


def replay_table() -> str:
    """Prioritized replay, sample(256) + update_priorities(256): jaxppo vs flashbax, in a jitted scan and per call."""
    rows = []
    for r in load("replay.json", BENCH_RESULTS)["rows"]:
        for mode, k in (("in graph", "_graph"), ("per call", "")):
            rows.append([f"{r['N']:,}", r["tree"], mode,
                         f"{r[f'jaxppo{k}_us']:.1f} / {r[f'jaxppo{k}_us_min']:.1f}",
                         f"{r[f'flashbax{k}_us']:.1f} / {r[f'flashbax{k}_us_min']:.1f}",
                         f"{r[f'speedup{k}']:.2f} / {r[f'speedup{k}_min']:.2f} / {r[f'speedup{k}_paired_median']:.2f}"])
    return _md(["N", "jaxppo tree", "mode", "jaxppo us/step (med / min)", "flashbax us/step (med / min)",
                "speed-up (med / min / paired)"], "rlllrr", rows)


def train_table() -> str:
    """One offline-PPO update step of the smoke and quickstart shapes (train.py)."""
    rows = [[r["case"], f"{r['params'] / 1e6:.2f}M", f"{r['minibatch']} ({r['minibatch'] // r['micro_batch']}x"
             f"{r['micro_batch']})", f"{r['prompt_len']}+{r['response_len']}", f"{r['step_compile_s']:.1f}",
             f"{r['prepare_compile_s']:.1f}", f"{r['prepare_s']:.2f} ({r['buffer']} rows)", f"{r['step_s_median']:.3f}",
             f"{r['step_s_min']:.3f}", f"{r['tokens_per_s_median']:.0f}", f"{r['peak_rss_mb'] / 1024:.1f}"]
            for r in load("train.json", BENCH_RESULTS)["results"]]
    return _md(["shape", "params", "minibatch", "tokens/row", "step compile s", "prepare compile s", "prepare s",
                "step s median", "step s min", "tokens/s", "peak RSS GiB"], "lrrrrrrrrrr", rows)


def estimators_table() -> str:
    """The same step per ``algorithm.adv_estimator`` (train.py --estimators)."""
    res = load("train_estimators.json", BENCH_RESULTS)["results"]
    gae = {r["case"]: r["step_s_median"] for r in res if r["estimator"] == "gae"}
    rows = [[r["case"], r["estimator"], f"{r['step_s_median']:.4g}", f"{r['prepare_s']:.3g}",
             f"{r['step_compile_s']:.2f}", f"{r['tokens_per_s_median']:,.0f}", f"{r['step_s_median'] / gae[r['case']]:.2f}"]
            for r in res]
    return _md(["case", "estimator", "step s (median)", "prepare s (whole buffer)", "step compile s", "tokens/s",
                "step time vs gae"], "llrrrrr", rows)


def device_table() -> str:
    """The GPU records of the current code (device_step.py's table)."""
    from benchmarks.device_step import table

    return table([(name, load(f"device/{name}.json")) for name in DEVICE_CURRENT])


def device_plans_table() -> str:
    """The LoRA examples planned and run on the GPU (launch/README.md)."""
    gib = lambda b: f"{b / 2 ** 30:.2f}"  # noqa: E731
    rows = []
    for name, example in (("run3_qwen7b_lora_80gb", "`qwen2_5_7b_lora_80gb.yaml`"),
                          ("run6_qwen7b_qlora_24gb_behaviour8", "`qwen2_5_7b_qlora_24gb.yaml`"),
                          ("run8_qwen7b_qlora_24gb_behaviour32_compact", "`qwen2_5_7b_qlora_24gb.yaml` "
                                                                          "`data.behaviour_batch_size=32`")):
        r = load(f"device/{name}.json")
        t = r["plan_temp_by_phase"]
        total = gib(r["plan_total_bytes"]) + (f"; load {gib(r['plan_load_bytes'])}" if r.get("plan_load_bytes") else "")
        peak = r["memory_after_steps"]["peak_bytes_in_use"]
        rows.append([example, f"{r.get('micro_batch')}", " / ".join(gib(t[k]) for k in ("step", "prepare", "behaviour")),
                     total, gib(peak), f"{r['memory_cap']['cap_bytes'] / 1e9:.0f} GB", f"{r['s_per_step']:.2f}", name])
    return _md(["example", "micro-batch", "temp GiB: step / prepare / behaviour", "plan GiB per device",
                "measured peak GiB", "cap", "s/step", "record"], "lrlrrrrl", rows)


def packing_table(rec: dict | None = None) -> str:
    """Real tokens per second of each pass, padded vs packed rows (packing.py; HH-RLHF pairs, SmolLM2-135M shape):
    one row per (caps, pass), the packed / padded ratio (DPO: against the trainer's shared-prefix layout) or why
    there is none (an arm that failed, with its error)."""
    rec = load("packing.json") if rec is None else rec
    by = {(tuple(r["caps"]), r["pass"], r["arm"]): r for r in rec["records"]}
    seen = list(dict.fromkeys((tuple(r["caps"]), r["pass"]) for r in rec["records"]))
    caps_order = list(dict.fromkeys(c for c, _ in seen))
    pass_order = ["behaviour", "dpo", "reward", "ppo", "grpo", "grpo_groups"]
    # grouped by caps (in the order first measured), passes in the benchmark's order (a --merge appends rows)
    order = sorted(seen, key=lambda k: (caps_order.index(k[0]),
                                        pass_order.index(k[1]) if k[1] in pass_order else len(pass_order)))

    def rate(r: dict | None) -> str:
        if r is None:
            return "not run"
        if "error" in r:
            return "failed: " + r["error"].split(":")[-1].strip()[:48]
        return f"{r['real_tokens_per_s']:,.0f} ({r['peak_rss_mib']:,.0f} MiB)"

    rows = []
    for caps, pas in order:
        padded = by.get((caps, pas, "padded_shared_prefix" if pas == "dpo" else "padded"))
        packed = by.get((caps, pas, "packed"))
        ok = padded is not None and packed is not None and "error" not in padded and "error" not in packed
        ratio = f"{packed['real_tokens_per_s'] / padded['real_tokens_per_s']:.2f}x" if ok else "n/a"
        stack = rate(by.get((caps, pas, "padded"))) if pas == "dpo" else ""
        rows.append([f"{caps[0]}+{caps[1]}", pas, rate(padded), stack, rate(packed), ratio])
    return _md(["caps P+R", "pass", "padded: real tokens/s (peak RSS)", "DPO padded [2B] stack",
                "packed: real tokens/s (peak RSS)", "packed / padded"], "llrrrr", rows)


def packing_train_table(rec: dict | None = None) -> str:
    """A whole training run, packed vs padded (``train_time.py --compare packing``): the config, the ABBA pairs,
    each arm's median update-step time, and the paired packed / padded ratios of update-step and wall time."""
    rec = load("train_time_packing.json") if rec is None else rec
    med = {a: statistics.median(r["train_s"] for r in rec["runs"] if r["arm"] == a) for a in ("packed", "padded")}
    ci = lambda r: f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"  # noqa: E731
    return _md(["config", "pairs", "padded update steps s (median)", "packed update steps s (median)",
                "packed / padded, update steps [95% CI]", "packed / padded, wall [95% CI]"], "lrrrll",
               [[f"`{rec['config']}`", str(rec["train_ratio"]["pairs"]), f"{med['padded']:.1f}", f"{med['packed']:.1f}",
                 ci(rec["train_ratio"]), ci(rec["wall_ratio"])]])


def attention_table() -> str:
    """Forward + backward of each attention implementation this CPU runs (attention.py), against the reference."""
    rec = load("attention_cpu.json")
    rows = []
    for key, med in rec["median_s"].items():
        dtype, seq, impl = key.split("/")
        rows.append([dtype, seq, impl, f"{med * 1e3:.2f}", f"{rec['ratio_to_reference_median'][key]:.2f}"])
    return _md(["dtype", "T", "implementation", "median ms", "time / reference (median of rounds)"],
               "lrlrr", rows)


def quickstart_table() -> str:
    """The main job from nothing (quickstart.py): wall time, its phases and its held-out result (the final
    before/after evaluation reuses the last step's evaluation, so the loop's evaluations hold it)."""
    r = load("quickstart.json")
    lo, hi = r["eval/reward_gain_ci95"]
    return _md(["wall s", "setup s (incl. collection)", "loop s", "updates s (incl. buffer refreshes)",
                "evaluations s", "perplexity checks s", "checkpoints s", "held-out gain [95% CI]",
                "load before / after"], "rrrrrrrll",
               [[f"{r['wall_s']:.0f}", f"{r['time/setup_s']:.0f}", f"{r['time/train_s']:.0f}",
                 f"{r['update_steps_s']:.0f}", f"{r['time/evaluations_s']:.0f}", f"{r['time/perplexity_s']:.0f}",
                 f"{r['time/checkpoints_s']:.0f}",
                 f"{r['eval/reward_gain']:+.3f} [{lo:+.3f}, {hi:+.3f}]",
                 f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f}"]])


TABLES: dict[str, Callable[[], str]] = {
    "ops": ops_table, "replay": replay_table, "layouts": layouts_table, "layer": layer_table, "matmul": matmul_table,
    "peers": peers_table, "peers-rounds": peers_rounds_table, "peers-ab": peers_ab_table, "train": train_table,
    "estimators": estimators_table, "device": device_table, "device-plans": device_plans_table,
    "packing": packing_table, "packing-train": packing_train_table, "attention": attention_table,
    "quickstart": quickstart_table,
}
DOCS: dict[str, tuple[str, ...]] = {
    "benchmarks/README.md": ("ops", "replay", "peers", "train", "attention", "packing", "packing-train", "quickstart",
                             "device"),
    "benchmarks/cpu.md": ("layouts", "layer", "matmul", "estimators", "peers-rounds", "peers-ab"),
    "launch/README.md": ("device-plans",),
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- table {name}: begin -->", f"<!-- table {name}: end -->"


def rewrite(text: str, name: str, table: str) -> str:
    """``text`` with the table ``name`` (between its markers) replaced by ``table``."""
    begin, end = markers(name)
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + "\n" + table + "\n" + text[j:]


def generate(doc: str, text: str) -> str:
    """``text`` (the file ``doc``) with every table of ``DOCS[doc]`` regenerated."""
    for name in DOCS[doc]:
        text = rewrite(text, name, TABLES[name]())
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = ap.parse_args(argv)
    stale = []
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        new = generate(doc, text)
        if new != text:
            stale.append(doc)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "differ from the records" if args.check else "rewritten"
    print(f"{', '.join(stale)}: {verb}" if stale else "every table is the records'")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
