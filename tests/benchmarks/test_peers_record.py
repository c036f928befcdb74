"""The peer comparisons quoted in README.md and benchmarks/README.md are the committed results/peers*.json."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "peers.json"


def _rows(record=RECORD):
    d = json.loads(record.read_text())
    return {(r["task"], r["dtype"]): r["tools"] for r in d["rows"]}


# each idle run printed in benchmarks/README.md, with how many timed tool rows it holds at least
RUNS = [(RECORD, 12), (ROOT / "results" / "peers_grpo_ppo_lora.json", 8), (ROOT / "results" / "peers_bf16.json", 6),
        (ROOT / "results" / "peers_fwdbwd_fourth.json", 6),
        *((p, 1) for p in sorted((ROOT / "results" / "peers_bf16_ab").glob("*.json")))]


@pytest.mark.parametrize("record,least", RUNS, ids=[r.name for r, _ in RUNS])
def test_benchmarks_readme_table_is_the_record(record, least):
    text = (ROOT / "benchmarks" / "README.md").read_text()
    rows = _rows(record)
    assert rows, f"{record.name} has no rows"
    n = 0
    for (task, dtype), tools in rows.items():
        for tool, rec in tools.items():
            if rec.get("s_per_update") is None:
                continue
            pat = rf"^{task}\s+{dtype}\s+{tool}\s+{rec['s_per_update']:.3f}\s+{rec['tokens_per_s']:.0f}\s+" \
                  rf"{rec['peak_rss_mb']:.0f}\s"
            assert re.search(pat, text, re.M), f"benchmarks/README.md lacks the record's row {task} {dtype} {tool}"
            n += 1
    assert n >= least


@pytest.mark.parametrize("task,peer,quoted", [("fwdbwd", "tunix", "1.12x"), ("fwdbwd", "trl", "1.47x"),
                                              ("dpo", "tunix", "1.38x"), ("dpo", "trl", "2.38x"),
                                              ("grpo", "tunix", "1.36x"), ("grpo", "trl", "1.71x"),
                                              ("ppo", "tunix", "1.20x")])
def test_readme_speedups_are_the_record(task, peer, quoted):
    tools = _rows()[(task, "float32")]
    ratio = tools[peer]["s_per_update"] / tools["jaxppo"]["s_per_update"]
    assert f"{ratio:.2f}x" == quoted
    assert quoted in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("dtype,quoted", [("bfloat16", "1.10x Tunix / 0.66x TRL in bfloat16"),
                                          ("float32", "1.10x Tunix / 0.85x TRL in float32")])
def test_readme_fourth_run_speedups_are_the_record(dtype, quoted):
    tools = _rows(ROOT / "results" / "peers_fwdbwd_fourth.json")[("fwdbwd", dtype)]
    ratios = [tools[p]["s_per_update"] / tools["jaxppo"]["s_per_update"] for p in ("tunix", "trl")]
    assert f"{ratios[0]:.2f}x Tunix / {ratios[1]:.2f}x TRL in {dtype}" == quoted
    assert quoted in (ROOT / "README.md").read_text()


def test_ab_runs_are_one_row_of_each_commit():
    """The A/B files are the jaxppo-only bfloat16 fwd+bwd of three commits, two rounds each, same loss."""
    files = sorted((ROOT / "results" / "peers_bf16_ab").glob("*.json"))
    assert sorted(f.stem for f in files) == [f"{c}_round{k}" for c in ("000fc0c", "09ad7cd", "ef016b2") for k in (1, 2)]
    losses = {round(_rows(f)[("fwdbwd", "bfloat16")]["jaxppo"]["loss"], 6) for f in files}
    assert len(losses) == 1


def test_readme_bf16_over_float32_is_the_fourth_run():
    rows = _rows(ROOT / "results" / "peers_fwdbwd_fourth.json")
    ratio = rows[("fwdbwd", "float32")]["jaxppo"]["s_per_update"] / rows[("fwdbwd", "bfloat16")]["jaxppo"]["s_per_update"]
    assert f"model fwd+bwd {ratio:.2f}x float32 in the fourth peers run" in (ROOT / "README.md").read_text()
