"""Every shipped example (``configs/examples/``) and launch layout that launch/README.md documents
(``jaxppo.plan.LAYOUTS``) fits the budget its config states (``mesh.hbm_gib``) when planned as an accelerator runs
it, and launch/README.md's memory table is what ``python -m jaxppo.plan --examples`` generates from the committed
records (``results/plans/``).

Compiling one 7B layout's three programs takes 30-130 s on a 2-core machine, about the same at any depth (the
accelerator's stack is scanned, so fewer layers compile no faster), and all five together take several minutes. So
one layout is compiled here, the cheapest (``qwen2_5_7b_fsdp8``, 8 devices), and checked against the budget and its
record; every layout's config, layer layout, budget and persistent state are planned live without compiling (all of
them in one process of ~15 s) and must equal its committed record, whose compiled temporaries complete the budget
check. A change to the model's temporaries shows in the compiled layout; the other records are regenerated with the
command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxppo.cli import plan as planmod
from jaxppo.cli.plan import (CATEGORIES, GiB, LAYOUTS, TABLE_BEGIN, TABLE_END, examples_table, layout_config,
                         plan_layout, read_records, rewrite_table)

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "results" / "plans"
STATE = [k for k in CATEGORIES if k != "temp_bytes"]


def test_layouts_cover_every_shipped_example_and_state_a_budget():
    shipped = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs/examples").glob("*.yaml"))
    assert sorted({lo.config for lo in LAYOUTS}) == shipped
    assert len({lo.name for lo in LAYOUTS}) == len(LAYOUTS)
    for lo in LAYOUTS:
        assert layout_config(lo).mesh.hbm_gib, f"{lo.config}: no mesh.hbm_gib (its budget)"


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict:
    """Every layout planned now without compiling (one process: the 32-device layouts need 32 simulated devices)."""
    out = tmp_path_factory.mktemp("plans")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-m", "jaxppo.plan", "--examples", "--no-compile", "--records-only",
                        "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    return {rec["name"]: rec for rec in read_records(out)}


@pytest.mark.parametrize("name", [lo.name for lo in LAYOUTS])
def test_layout_fits_its_budget_and_its_record_is_current(live, name):
    """The committed record plans the config as it is now (same config, layer layout, budget and persistent bytes
    as a live plan), for an accelerator (scanned stack), and its per-device total fits the stated budget, as does a
    quantized base's load peak."""
    lo = next(lo for lo in LAYOUTS if lo.name == name)
    full = json.loads((RECORDS / f"{name}.json").read_text())
    assert (full["name"], full["config"], full["overrides"], full["how"]) == (lo.name, lo.config, list(lo.overrides),
                                                                             lo.how)
    assert full["git_commit"] and full["date"] and full["machine"] and full["load"]
    rec, now, cfg = full["plan"], live[name]["plan"], layout_config(lo)
    assert rec["config"] == now["config"]
    assert now["config"]["layers"]["target"] == "accelerator" and now["config"]["layers"]["stack"] == "scanned"
    assert rec["hbm_gib"] == now["hbm_gib"] == cfg.mesh.hbm_gib
    for block in ("per_device", "total"):
        assert {k: rec[block][k] for k in STATE} == {k: now[block][k] for k in STATE}
    assert rec["load"] == now["load"]
    phases = rec["temp_by_phase"]
    assert sorted(phases) == ["behaviour", "prepare", "step"] and rec["per_device"]["temp_bytes"] == max(phases.values())
    total = sum(now["per_device"][k] for k in STATE) + max(phases.values())
    assert total == rec["per_device"]["total_bytes"]
    budget = cfg.mesh.hbm_gib * GiB
    assert total <= budget, f"{name}: {total / GiB:.2f} GiB per device > its budget {cfg.mesh.hbm_gib} GiB"
    assert (rec["load"] or {"bytes": 0})["bytes"] <= budget
    assert rec["fits"] is True


def test_fsdp8_example_compiled_as_the_accelerator_runs_it_fits_and_matches_its_record():
    """The full plan, compiled here: the GPUs' scanned bf16 stack, within the example's 74.5 GiB, its temporaries
    within 1% of the committed record's."""
    lo = next(lo for lo in LAYOUTS if lo.name == "qwen2_5_7b_fsdp8")
    p = plan_layout(lo, jax.devices()[:8])
    assert p["config"]["layers"] == {"target": "accelerator", "stack": "scanned", "remat_policy": "full"}
    assert p["hbm_gib"] == 74.5 and p["fits"] is True
    assert p["per_device"]["total_bytes"] <= 74.5 * GiB
    rec = json.loads((RECORDS / f"{lo.name}.json").read_text())["plan"]
    for k, v in rec["temp_by_phase"].items():
        assert abs(p["temp_by_phase"][k] - v) <= 0.01 * v, (k, p["temp_by_phase"][k], v)


def test_readme_table_is_generated_from_the_committed_records():
    text = (REPO / planmod.README).read_text(encoding="utf-8")
    want = examples_table(read_records(RECORDS))
    assert rewrite_table(text, want) == text, ("launch/README.md's plan table differs from the records: run "
                                              "python -m jaxppo.plan --examples --table-only")
    assert text.count(TABLE_BEGIN) == text.count(TABLE_END) == 1


def test_rewrite_table_replaces_only_between_the_markers():
    text = f"a\n{TABLE_BEGIN}\nold\n{TABLE_END}\nb\n"
    assert rewrite_table(text, "new") == f"a\n{TABLE_BEGIN}\nnew\n{TABLE_END}\nb\n"
    assert rewrite_table(rewrite_table(text, "new"), "new") == rewrite_table(text, "new")
