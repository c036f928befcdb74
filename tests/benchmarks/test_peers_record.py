"""The committed peer records (results/peers*.json) are what benchmarks/README.md's generated tables say they are:
every current row measured, its losses agreeing across tools, the claims the docs make of them true of them, and
each A/B experiment a clean one-variable comparison. (That the tables are the records': tests/test_benchmark_tables.py.)
"""

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.tables import PEERS_AB, PEERS_CURRENT, PEERS_ROUNDS, peer_rows

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _record(rel):
    return json.loads((RESULTS / rel).read_text())


def test_current_records_cover_every_row_and_dtype():
    both = [(t, d) for t in ("fwdbwd", "dpo", "grpo", "ppo", "lora") for d in ("float32", "bfloat16")]
    assert sorted(PEERS_CURRENT) == sorted(both + [("dpo_hh", "float32")])   # real-length DPO: float32 only
    for (task, dtype), rel in PEERS_CURRENT.items():
        tools = peer_rows(rel)[(task, dtype)]
        assert tools["jaxppo"]["s_per_update"] > 0 and tools["tunix"]["s_per_update"] > 0, (task, dtype)
        rec = _record(rel)
        assert rec["machine"]["xla_flags"] is None and rec["machine"].get("glibc_tunables") is None, rel   # defaults


@pytest.mark.parametrize("rel", sorted(set(PEERS_CURRENT.values()) | set(PEERS_ROUNDS)))
def test_every_current_row_agrees_on_the_loss(rel):
    for row in _record(rel)["rows"]:
        if row["tools"].get("jaxppo", {}).get("s_per_update") is not None:
            assert all(row["check"]["agree"].values()), (rel, row["task"], row["dtype"])


def test_every_update_step_meets_the_targets():
    """benchmarks/README.md: every update step is >= 1.5x Tunix and >= 1.3x TRL in both dtypes, with a lower peak RSS
    than Tunix's."""
    for (task, dtype), rel in PEERS_CURRENT.items():
        if task == "fwdbwd":
            continue
        tools = peer_rows(rel)[(task, dtype)]
        j = tools["jaxppo"]["s_per_update"]
        assert tools["tunix"]["s_per_update"] / j >= 1.5, (task, dtype)
        if tools["trl"].get("s_per_update") is not None:
            assert tools["trl"]["s_per_update"] / j >= 1.3, (task, dtype)
        assert tools["jaxppo"]["peak_rss_mb"] < tools["tunix"]["peak_rss_mb"], (task, dtype)


def test_fwdbwd_rounds_are_five_rotated_runs_at_the_target():
    """The float32 forward+backward measured five times, the order rotated (jaxppo first in 1-3, Tunix in 4, TRL in
    5), every tool timed and agreeing; at or above 1.2x Tunix in each."""
    recs = [_record(f) for f in PEERS_ROUNDS]
    assert [r["rows"][0]["order"][0] for r in recs] == ["jaxppo", "jaxppo", "jaxppo", "tunix", "trl"]
    ratios = []
    for r in recs:
        (row,) = r["rows"]
        assert (row["task"], row["dtype"]) == ("fwdbwd", "float32") and all(row["check"]["agree"].values())
        assert r["machine"]["glibc_tunables"] is None
        ratios.append(row["tools"]["tunix"]["s_per_update"] / row["tools"]["jaxppo"]["s_per_update"])
    assert min(ratios) >= 1.2 and statistics.median(ratios) >= 1.2


@pytest.mark.parametrize("exp", PEERS_AB, ids=[e[0] for e in PEERS_AB])
def test_ab_experiments_change_one_thing(exp):
    """Each A/B pair: the same rows and tools timed on both sides, the same losses."""
    name, a_files, b_files, keys, tools = exp
    assert len(a_files) == len(b_files)
    for fa, fb in zip(a_files, b_files):
        ra, rb = peer_rows(fa), peer_rows(fb)
        for key in keys:
            for tool in tools:
                a, b = ra[key][tool], rb[key][tool]
                assert a["s_per_update"] > 0 and b["s_per_update"] > 0
                assert round(a["loss"], 6) == round(b["loss"], 6), (name, key, tool)


def test_ab_settings_are_recorded():
    """The environment an A/B varies is in its records' ``machine``."""
    for k, flags in (("default", None), ("dfs", FLAG)):
        for f in (f"peers_ppo_scheduler_{k}.json", f"peers_jaxppo_scheduler_{k}.json"):
            assert _record(f)["machine"]["xla_flags"] == flags
    assert _record("peers_fwdbwd_malloc/default.json")["machine"]["glibc_tunables"] is None
    assert _record("peers_fwdbwd_malloc/hugetlb.json")["machine"]["glibc_tunables"] == "glibc.malloc.hugetlb=1"


def test_what_the_ab_experiments_show():
    """The readings benchmarks/README.md and docs/usage.md give of the A/B records."""
    def pair(a, b, key, tool="jaxppo"):
        return peer_rows(a)[key][tool], peer_rows(b)[key][tool]

    # shared prompts and remat="auto": faster and less memory in every round
    for a_files, b_files, keys in [(e[1], e[2], e[3]) for e in PEERS_AB[:3]]:
        for fa, fb in zip(a_files, b_files):
            for key in keys:
                a, b = pair(fa, fb, key)
                assert b["s_per_update"] < a["s_per_update"] and b["peak_rss_mb"] < a["peak_rss_mb"], (fa, key)
    # huge pages: the JAX tools' faults drop over 20x and both get faster
    for tool in ("jaxppo", "tunix"):
        a, b = pair("peers_fwdbwd_malloc/default.json", "peers_fwdbwd_malloc/hugetlb.json", ("fwdbwd", "float32"), tool)
        assert a["minor_faults_per_update"] > 20 * b["minor_faults_per_update"] and b["s_per_update"] < a["s_per_update"]
    # the scheduler flag: less memory for the PPO update in both dtypes, slower GRPO and forward+backward
    for dt in ("float32", "bfloat16"):
        a, b = pair("peers_ppo_scheduler_default.json", "peers_ppo_scheduler_dfs.json", ("ppo", dt))
        assert b["peak_rss_mb"] < a["peak_rss_mb"] and b["s_per_update"] <= a["s_per_update"]
    for task in ("fwdbwd", "grpo"):
        a, b = pair("peers_jaxppo_scheduler_default.json", "peers_jaxppo_scheduler_dfs.json", (task, "float32"))
        assert b["s_per_update"] > a["s_per_update"]


def test_usage_quotes_the_ab_records():
    """docs/usage.md's summaries of the remat and huge-page A/B records."""
    usage = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    rec = {f.stem: peer_rows(f"peers_remat_ab/{f.name}")[("fwdbwd", "float32")]["jaxppo"]
           for f in sorted((RESULTS / "peers_remat_ab").glob("*.json"))}
    up = [rec[f"false_{k}"]["s_per_update"] / rec[f"auto_{k}"]["s_per_update"] for k in (1, 2)]
    rss = 1 - rec["auto_1"]["peak_rss_mb"] / rec["false_1"]["peak_rss_mb"]
    assert f"took about {round(1 - 1 / (sum(up) / 2), 1):.0%} less time and {rss:.0%} less peak memory" in usage
    m = {k: peer_rows(f"peers_fwdbwd_malloc/{k}.json")[("fwdbwd", "float32")]["jaxppo"] for k in ("default", "hugetlb")}
    less = 1 - m["hugetlb"]["s_per_update"] / m["default"]["s_per_update"]
    assert f"It made the forward+backward of jaxppo and of Tunix about {round(less, 1):.0%} faster" in usage
