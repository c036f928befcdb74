"""The peer comparison quoted in README.md and benchmarks/README.md is the committed results/peers.json."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "peers.json"


def _rows():
    d = json.loads(RECORD.read_text())
    return {(r["task"], r["dtype"]): r["tools"] for r in d["rows"]}


def test_benchmarks_readme_table_is_the_record():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    rows = _rows()
    assert rows, "results/peers.json has no rows"
    n = 0
    for (task, dtype), tools in rows.items():
        for tool, rec in tools.items():
            if rec.get("s_per_update") is None:
                continue
            pat = rf"^{task}\s+{dtype}\s+{tool}\s+{rec['s_per_update']:.3f}\s+{rec['tokens_per_s']:.0f}\s+" \
                  rf"{rec['peak_rss_mb']:.0f}\s"
            assert re.search(pat, text, re.M), f"benchmarks/README.md lacks the record's row {task} {dtype} {tool}"
            n += 1
    assert n >= 12


@pytest.mark.parametrize("task,peer,quoted", [("fwdbwd", "tunix", "1.12x"), ("fwdbwd", "trl", "1.47x"),
                                              ("dpo", "tunix", "1.38x"), ("dpo", "trl", "2.38x"),
                                              ("grpo", "tunix", "1.36x"), ("grpo", "trl", "1.71x"),
                                              ("ppo", "tunix", "1.20x")])
def test_readme_speedups_are_the_record(task, peer, quoted):
    tools = _rows()[(task, "float32")]
    ratio = tools[peer]["s_per_update"] / tools["jaxppo"]["s_per_update"]
    assert f"{ratio:.2f}x" == quoted
    assert quoted in (ROOT / "README.md").read_text()
