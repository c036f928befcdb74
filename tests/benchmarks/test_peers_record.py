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
RUNS = [(RECORD, 12), (ROOT / "results" / "peers_grpo_ppo_lora.json", 8), (ROOT / "results" / "peers_bf16.json", 6)]


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


@pytest.mark.parametrize("peer,quoted", [("tunix", "0.86x Tunix"), ("trl", "0.55x TRL")])
def test_readme_bf16_speedups_are_the_record(peer, quoted):
    tools = _rows(ROOT / "results" / "peers_bf16.json")[("fwdbwd", "bfloat16")]
    ratio = tools[peer]["s_per_update"] / tools["jaxppo"]["s_per_update"]
    assert f"{ratio:.2f}x" == quoted.split()[0]
    assert quoted in (ROOT / "README.md").read_text()
