"""``results/sweeps/whole_groups/README.md``: its tables are the report of the two committed whole-group sweeps, and
its reading matches their verdicts."""

from pathlib import Path

from jaxppo.sweeps import report as RP

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "results" / "sweeps" / "whole_groups" / "README.md"
SWEEPS = ["configs/sweeps/whole_groups.yaml", "configs/sweeps/whole_groups_per.yaml"]


def test_tables_are_the_regenerated_report(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert RP.main([*SWEEPS, "--print"]) == 0
    block = capsys.readouterr().out
    text = DOC.read_text(encoding="utf-8")
    assert f"{RP.BEGIN}\n{block}{RP.END}" in text


def test_reading_matches_the_verdicts():
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    uniform, per = text.split("#### whole_groups_per")
    assert ": lower (primary, final value: final difference -0.026 [-0.052, -0.000]" in uniform
    assert ": no difference measured (primary, final value: final difference" in per
    assert "under uniform replay the whole-group runs ended lower" in text
    assert "under prioritized replay no difference was measured" in text


def test_quoted_speedup_range_is_the_ab_record():
    """The per-update speed-up range quoted is the min-max of the GRPO/PPO row-layout vs shared-prompt A/B rounds."""
    import json

    files = {f.stem: json.loads(f.read_text()) for f in (ROOT / "results" / "peers_group_prompt_ab").glob("*.json")}
    t = {k: {r["task"]: r["tools"]["jaxppo"]["s_per_update"] for r in d["rows"]} for k, d in files.items()}
    ups = [t[f"rows_{k}"][task] / t[f"shared_{k}"][task] for k in (1, 2) for task in ("grpo", "ppo")]
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"made GRPO and PPO {min(ups):.2f}-{max(ups):.2f}x faster" in text
    results_md = " ".join((ROOT / "docs" / "results.md").read_text(encoding="utf-8").split())
    assert f"buys {min(ups):.2f}-{max(ups):.2f}x per update" in results_md


def test_docs_quote_the_uniform_difference():
    """docs/results.md quotes the uniform sweep's paired difference as the report prints it."""
    assert "-0.026 [-0.052, -0.000]" in " ".join((ROOT / "docs" / "results.md").read_text(encoding="utf-8").split())
    assert "+0.009 [-0.025, 0.044]" in " ".join((ROOT / "docs" / "results.md").read_text(encoding="utf-8").split())
    assert "0.009 [-0.025, 0.044], p 0.566" in DOC.read_text(encoding="utf-8")
