"""The ablation notebooks execute end to end at toy size (``PROFILE="ci"``), and every sweep file they use plans.

Each notebook is executed with papermill into ``tmp_path`` with its sweep outputs redirected there
(``OUTPUT_ROOT``); its ``conclusion``-tagged cell must print a ``CONCLUSION`` block with one comparison line per
non-baseline variant, each quoting a final reward with a 95% interval and a verdict chosen by the stated rule.
The sweeps run in subprocesses with one simulated CPU device (``jaxppo.sweeps.notebook.run_sweep`` sets ``XLA_FLAGS``).
Each notebook is executed by a test file of its own (``test_notebook_<name>.py``, through
:func:`tests.notebooks.ci_run.execute_ci_profile`), so ``pytest -n 2 --dist loadfile`` can give the four to both
workers instead of one ~400 s file running alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxppo.sweeps import notebook as sr

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = ("importance_sampling", "prioritized_replay", "pf_ppo_filters", "ppo_vs_dpo_critic_free")
SWEEPS = ("is_onpolicy", "is_offpolicy_t1.5", "is_offpolicy_t0.7", "per_decay", "stale_reuse", "pf_filters",
          "critic_free")


def test_every_notebook_is_here_and_old_one_is_gone():
    for name in NOTEBOOKS:
        assert (REPO / "notebooks" / f"{name}.ipynb").is_file(), name
    assert not (REPO / "notebooks" / "ablations.ipynb").exists()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_parameters_cell(name):
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    assert 'PROFILE = "full"' in params[0].source and "OUTPUT_ROOT = " in params[0].source
    assert "JOBS = 1" in params[0].source
    assert any("conclusion" in c.metadata.get("tags", []) for c in nb.cells)
    assert "ci profile" in nb.cells[0].source and 'PROFILE = "full"' in nb.cells[0].source


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("profile", ["ci", "extended", None])
def test_sweep_files_plan(sweep, profile, monkeypatch):
    """Every run of every profile loads its config (unknown key or bad value -> SweepError); the ci profiles
    stay toy-sized: <= 5 variants, 2 seeds, <= 4 update steps."""
    from jaxppo.sweeps.spec import load_sweep, plan_runs

    monkeypatch.chdir(REPO)
    with pytest.warns(UserWarning, match="seeds") if profile == "ci" else _nullcontext():
        spec = load_sweep(REPO / "configs" / "sweeps" / f"{sweep}.yaml", profile=profile)
    runs = plan_runs(spec)
    assert runs and {r.variant for r in runs} == set(spec.variants)
    if profile == "ci":
        assert len(spec.variants) <= 5 and len(spec.seeds) == 2
        assert all(r.total_steps <= 4 for r in runs)
    else:
        assert len(spec.seeds) >= 5 and all(r.total_steps == 40 for r in runs)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _fake_summary(rows):
    import pandas as pd

    cols = ("final_reward_mean", "final_reward_ci95_lo", "final_reward_ci95_hi", "n_pairs", "final_diff",
            "final_diff_lo", "final_diff_hi", "final_diff_t_p")
    return pd.DataFrame([{"variant": v, **dict(zip(cols, vals))} for v, vals in rows])


@pytest.mark.parametrize("diff,word", [
    ((0.10, 0.02, 0.18, 0.03), "higher"),                    # paired t-test p < 0.05, the interval above 0
    ((-0.10, -0.18, -0.01, 0.04), "lower"),                  # below 0
    ((0.02, -0.05, 0.09, 0.5), "no difference measured"),    # contains 0 (the arms' own intervals may not overlap)
    ((0.02, 0.0, 0.04, 0.05), "no difference measured"),     # touching 0: p = 0.05 is not below 0.05
])
def test_verdict_rule(diff, word):
    summ = _fake_summary([("base", (0.50, 0.45, 0.55, 0, *(float("nan"),) * 4)),
                          ("v", (0.52, 0.41, 0.63, 5, *diff))])
    text = sr.verdict(summ, "v", "base")
    assert text.startswith("v vs base: final held-out reward 0.520 [0.410, 0.630] vs 0.500 [0.450, 0.550]: ")
    assert f": {word} (primary, final value: final difference " in text
    assert f"(t p {diff[3]:.3f}, Holm p {diff[3]:.3f}); Holm one variant: no adjustment)" in text
    one = _fake_summary([("base", (0.50, 0.45, 0.55, 0, *(float("nan"),) * 4)), ("v", (0.9, *(float("nan"),) * 2, 1,
                                                                                   0.4, *(float("nan"),) * 3))])
    assert ": not measurable (fewer than 2 seeds finished in both arms)." in sr.verdict(one, "v", "base")


def _write_results(path, rows):
    import csv

    cols = ("variant", "seed", "step", "samples", "tokens", "reward", "kl", "wall_time_s", "status", "error")
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


def test_load_extended_reads_only_finished_extended_variants(tmp_path, monkeypatch):
    """load() keeps the default variants only; load_extended() returns the baseline plus the --profile extended
    variants that have finished rows (here per_a1.0 only), and None when none has run."""
    from jaxppo.sweeps.spec import load_sweep

    monkeypatch.chdir(REPO)
    f = "configs/sweeps/per_decay.yaml"
    spec = load_sweep(REPO / f)
    budget = spec.budget_samples
    default = list(spec.variants)
    rows = []
    for v, level in [(default[0], 0.5), (default[1], 0.4), (default[2], 0.45)]:
        for s in spec.seeds:
            rows += [dict(variant=v, seed=s, step=0, samples=0, tokens=0, reward=0.1, kl=0.0, wall_time_s=1,
                          status="ok"),
                     dict(variant=v, seed=s, step=40, samples=budget, tokens=10, reward=level + 0.01 * s, kl=0.3,
                          wall_time_s=2, status="ok")]
    _write_results(tmp_path / "results.csv", rows)
    assert sr.load_extended(tmp_path, f) is None

    for s in spec.seeds:   # per_a1.0 ends far above the baseline; per_a0.4 only failed
        rows += [dict(variant="per_a1.0", seed=s, step=0, samples=0, tokens=0, reward=0.1, kl=0.0, wall_time_s=1,
                      status="ok"),
                 dict(variant="per_a1.0", seed=s, step=40, samples=budget, tokens=10, reward=0.9 + 0.01 * s, kl=0.3,
                      wall_time_s=2, status="ok")]
    rows.append(dict(variant="per_a0.4", seed=0, status="failed", error="boom"))
    _write_results(tmp_path / "results.csv", rows)
    res, summary, curves, spec_x = sr.load_extended(tmp_path, f)
    assert list(summary["variant"]) == [spec.baseline, "per_a1.0"]
    assert set(res["variant"]) == {spec.baseline, "per_a1.0"}
    assert "per_a1.0 vs " + spec.baseline + ": final held-out reward 0.920" in sr.verdict(summary, "per_a1.0",
                                                                                          spec.baseline)
    assert ": higher" in sr.verdict(summary, "per_a1.0", spec.baseline)
    _, summary_d, curves_d, _ = sr.load(tmp_path, f, "full")
    assert list(summary_d["variant"]) == default
    assert {c.variant for c in curves_d} == set(default)


def test_load_extended_without_extended_profile(tmp_path):
    """quickstart_replay.yaml has no extended profile: nothing to read, no error."""
    _write_results(tmp_path / "results.csv", [dict(variant="uniform_no_is", seed=0, step=0, samples=0, tokens=0,
                                                   reward=0.1, kl=0.0, wall_time_s=1, status="ok")])
    assert sr.load_extended(tmp_path, "configs/sweeps/quickstart_replay.yaml") is None


def test_the_helper_is_a_package_module_and_no_test_edits_sys_path():
    """notebooks/sweep_report.py moved into the package; neither the tests nor the notebooks put a folder
    on sys.path to import it."""
    assert not (REPO / "notebooks" / "sweep_report.py").exists()
    for f in [*(REPO / "tests").rglob("*.py"), *(REPO / "notebooks").glob("*.ipynb")]:
        if f.resolve() == Path(__file__).resolve():
            continue
        text = f.read_text(encoding="utf-8")
        assert "sys.path.insert" not in text and "import sweep_report" not in text, f
