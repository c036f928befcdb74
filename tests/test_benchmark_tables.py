"""The measurement tables of benchmarks/README.md, benchmarks/cpu.md and launch/README.md are what ``python -m benchmarks.tables``
generates from the committed records, and the prose around them carries no dates or run ordinals."""

import re
from pathlib import Path

import pytest

from benchmarks import tables

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", sorted(tables.DOCS))
def test_generated_tables_are_committed(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert tables.generate(doc, text) == text, f"{doc}'s tables differ from the records: run python -m benchmarks.tables"


@pytest.mark.parametrize("doc", sorted(tables.DOCS))
def test_every_table_has_its_markers_once(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    for name in tables.DOCS[doc]:
        begin, end = tables.markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), name


def test_rewrite_replaces_only_between_the_markers():
    begin, end = tables.markers("x")
    text = f"before\n{begin}\nold\n{end}\nafter\n"
    assert tables.rewrite(text, "x", "new") == f"before\n{begin}\nnew\n{end}\nafter\n"


@pytest.mark.parametrize("doc", ["benchmarks/README.md", "benchmarks/cpu.md", "launch/README.md"])
def test_prose_has_no_dates_or_run_ordinals(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (Dec|Nov|Jan) 20\d\d\b", text)
    assert not re.search(r"\b(second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) (idle )?run\b", text, re.I)
    assert not re.search(r"\bissue \d+", text)


def test_records_the_docs_name_exist():
    for rel in {*tables.PEERS_CURRENT.values(), *tables.PEERS_ROUNDS,
                *(f for e in tables.PEERS_AB for f in e[1] + e[2])}:
        assert (tables.RESULTS / rel).is_file(), rel
    for name in tables.DEVICE_CURRENT:
        assert (tables.RESULTS / "device" / f"{name}.json").is_file(), name


def test_packing_table_by_hand():
    def arm(caps, pas, name, rate=None, error=None):
        r = {"caps": list(caps), "pass": pas, "arm": name}
        return dict(r, error=error) if error else dict(r, real_tokens_per_s=rate, peak_rss_mib=1024.0)

    rec = {"records": [arm((512, 256), "dpo", "padded_shared_prefix", 50.0),
                       arm((512, 256), "dpo", "padded", error="JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory"),
                       arm((512, 256), "dpo", "packed", 150.0),
                       arm((512, 256), "reward", "padded", error="JaxRuntimeError: INTERNAL: Out of memory"),
                       arm((512, 256), "reward", "packed", 300.0),
                       arm((256, 128), "ppo", "padded", 100.0)]}
    rows = tables.packing_table(rec).splitlines()[2:]
    assert rows == [
        "| 512+256 | dpo | 50 (1,024 MiB) | failed: Out of memory | 150 (1,024 MiB) | 3.00x |",
        "| 512+256 | reward | failed: Out of memory |  | 300 (1,024 MiB) | n/a |",
        "| 256+128 | ppo | 100 (1,024 MiB) |  | not run | n/a |",
    ]


def test_packing_table_groups_merged_rows_by_caps_in_the_pass_order():
    def arm(caps, pas):
        return {"caps": list(caps), "pass": pas, "arm": "padded", "real_tokens_per_s": 1.0, "peak_rss_mib": 1.0}

    # a --merge run appends its rows after the kept ones
    rec = {"records": [arm((512, 256), "behaviour"), arm((256, 128), "dpo"), arm((256, 128), "grpo"),
                       arm((512, 256), "ppo"), arm((256, 128), "behaviour")]}
    rows = [r.split(" | ")[:2] for r in tables.packing_table(rec).splitlines()[2:]]
    assert rows == [["| 512+256", "behaviour"], ["| 512+256", "ppo"], ["| 256+128", "behaviour"],
                    ["| 256+128", "dpo"], ["| 256+128", "grpo"]]


def test_packing_train_table_by_hand():
    runs = [{"arm": "packed", "train_s": t} for t in (1.0, 3.0, 2.0)] + [{"arm": "padded", "train_s": t}
                                                                          for t in (4.0, 6.0, 5.0)]
    r = {"ratio": 0.4, "lo": 0.35, "hi": 0.45, "pairs": 3}
    table = tables.packing_train_table({"config": "configs/smoke.yaml", "runs": runs, "train_ratio": r,
                                        "wall_ratio": dict(r, ratio=0.5, lo=0.45, hi=0.55)})
    assert table.splitlines()[-1] == ("| `configs/smoke.yaml` | 3 | 5.0 | 2.0 | 0.400 [0.350, 0.450] | "
                                      "0.500 [0.450, 0.550] |")
