"""``python -m jaxppo.sweeps.report``: the Results table from hand-written ``summary.csv`` / ``metrics.jsonl``
(expected cells worked out by hand), the "not run" case, the README marker replacement and its errors, the
verdict rule's outcomes; and the notebooks' helper: PROFILE "full" = the sweep file's default variants (no
``--profile``) in ``<output_root>/<stem>``, sharing ``verdict`` / ``mismatch`` with :mod:`jaxppo.sweeps.results`."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxppo.sweeps import report as RP
from jaxppo.sweeps import results as R
from tests.notebooks.helper import import_sweep_report

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_SWEEPS = ("is_onpolicy", "is_offpolicy_t1.5", "is_offpolicy_t0.7", "per_decay", "stale_reuse", "pf_filters",
                   "critic_free")
NAN = float("nan")


def _sweep_file(path: Path, variants=("base", "up", "down", "same"), baseline="base") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0, 1, 2, 3, 4],
        "variants": {v: ["replay.sampling=uniform"] for v in variants}, "baseline": baseline,
        "eval": {"every_samples": 32}, "budget": {"samples": 64}}), encoding="utf-8")
    return path


def _summary_row(variant, n_seeds, n_failed, reward, kl, eff):
    return {"variant": variant, "n_seeds": n_seeds, "n_failed": n_failed, "final_reward_mean": reward[0],
            "final_reward_ci95_lo": reward[1], "final_reward_ci95_hi": reward[2], "final_kl_mean": kl,
            "efficiency_ratio": eff[0], "efficiency_ratio_ci95_lo": eff[1], "efficiency_ratio_ci95_hi": eff[2]}


# base [0.45, 0.55]; up: lo 0.60 > 0.55 (higher); down: hi 0.44 < 0.45 (lower); same: overlaps (no difference)
ROWS = [_summary_row("base", 5, 0, (0.5, 0.45, 0.55), 0.0123456, (1.0, 1.0, 1.25)),
        _summary_row("up", 5, 0, (0.7, 0.6, 0.8), 0.25, (math.inf, 1.0, math.inf)),
        _summary_row("down", 4, 1, (0.3, 0.16, 0.44), NAN, (0.0, 0.0, 0.5)),
        _summary_row("same", 5, 0, (0.52, 0.41, 0.63), 0.1, (1.1234, 0.8765, 1.5))]


def _write_summary(out: Path, rows=ROWS) -> None:
    # summary.csv as the sweep writes it (every SUMMARY_COLUMNS column; unused ones NaN)
    R.write_csv(out / "summary.csv", [{k: NAN for k in R.SUMMARY_COLUMNS} | r for r in rows], R.SUMMARY_COLUMNS)


def _metrics(out: Path, variant: str, seed: int, rows: list[dict]) -> None:
    p = out / "runs" / variant / f"seed{seed}" / "metrics.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _write_metrics(out: Path) -> None:
    # base: only is/ess at step 1 -> ESS/N (0.9 + 0.7) / 2 = 0.800; step 2 ignored
    _metrics(out, "base", 0, [{"step": 0}, {"step": 1, "is/ess": 0.9}, {"step": 2, "is/ess": 0.1}])
    _metrics(out, "base", 1, [{"step": 1, "is/ess": 0.7}])
    # up: is_diag/ess wins over is/ess (IS off: is/ess is 1 by construction) -> (0.6 + 0.5) / 2 = 0.550
    _metrics(out, "up", 0, [{"step": 1, "is/ess": 1.0, "is_diag/ess": 0.6}])
    _metrics(out, "up", 3, [{"step": 1, "is/ess": 1.0, "is_diag/ess": 0.5}])
    # down: rollout_corr/kl logged -> it is shown, not the ESS: (0.2 + 0.3 + 0.4) / 3 = 0.3000
    for s, kl in ((0, 0.2), (1, 0.3), (4, 0.4)):
        _metrics(out, "down", s, [{"step": 1, "rollout_corr/kl": kl, "is/ess": 0.5}, {"step": 2, "rollout_corr/kl": 9}])
    # same: nothing logged at step 1 -> n/a


EXPECTED = [
    ("mini", "base (baseline)", "5/5", "0.500 [0.450, 0.550]", "0.0123", "1.00 [1.00, 1.25]", "ESS/N 0.800"),
    ("mini", "up", "5/5", "0.700 [0.600, 0.800]", "0.2500", "inf [1.00, inf]", "ESS/N 0.550"),
    ("mini", "down", "4/5 (1 failed)", "0.300 [0.160, 0.440]", "n/a", "0.00 [0.00, 0.50]", "rollout_corr/kl 0.3000"),
    ("mini", "same", "5/5", "0.520 [0.410, 0.630]", "0.1000", "1.12 [0.88, 1.50]", "n/a"),
]
EXPECTED_VERDICTS = [
    "mini: up vs base: final reward 0.700 [0.600, 0.800] vs 0.500 [0.450, 0.550]: higher (the 95% intervals do not "
    "overlap); data-efficiency ratio inf [1.00, inf].",
    "mini: down vs base: final reward 0.300 [0.160, 0.440] vs 0.500 [0.450, 0.550]: lower (the 95% intervals do not "
    "overlap); data-efficiency ratio 0.00 [0.00, 0.50].",
    "mini: same vs base: final reward 0.520 [0.410, 0.630] vs 0.500 [0.450, 0.550]: no difference measured (the 95% "
    "intervals overlap); data-efficiency ratio 1.12 [0.88, 1.50].",
]


def _cells(text: str) -> list[tuple[str, ...]]:
    """The rows of the first markdown table of ``text`` (header and separator dropped), cells stripped."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [tuple(c.strip() for c in ln.strip("|").split("|")) for ln in lines[2:]]


@pytest.fixture
def mini(tmp_path):
    sweep = _sweep_file(tmp_path / "sweeps" / "mini.yaml")
    out = tmp_path / "root" / "mini"
    _write_summary(out)
    _write_metrics(out)
    return sweep, tmp_path / "root"


def test_table_cells_and_verdicts_by_hand(mini, capsys):
    sweep, root = mini
    assert RP.main([str(sweep), "--output-root", str(root)]) == 0
    text = capsys.readouterr().out
    header = [ln for ln in text.splitlines() if ln.startswith("|")][0]
    assert tuple(c.strip() for c in header.strip("|").split("|")) == RP.HEADER
    assert _cells(text) == EXPECTED
    # plain verdict lines (indented), one per non-baseline variant, in the summary's order
    assert [ln[2:] for ln in text.splitlines() if ln.startswith("  mini: ")] == EXPECTED_VERDICTS
    # every line of the table has the same width (padded columns)
    assert len({len(ln) for ln in text.splitlines() if ln.startswith("|")}) == 1


def test_markdown_verdicts_are_a_list(mini, capsys):
    sweep, root = mini
    assert RP.main([str(sweep), "--output-root", str(root), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert [ln[2:] for ln in text.splitlines() if ln.startswith("- ")] == EXPECTED_VERDICTS
    assert _cells(text) == EXPECTED


def test_not_run_sweep_is_listed_not_an_error(mini, tmp_path, capsys):
    sweep, root = mini
    other = _sweep_file(tmp_path / "sweeps" / "never.yaml", variants=("a", "b"), baseline="a")
    assert RP.main([str(other), str(sweep), "--output-root", str(root)]) == 0
    text = capsys.readouterr().out
    assert _cells(text) == [("never", "not run (no summary.csv)", "", "", "", "", ""), *EXPECTED]
    assert not any("never:" in ln for ln in text.splitlines())  # no verdicts for it


def test_only_not_run_sweeps(tmp_path, capsys):
    other = _sweep_file(tmp_path / "never.yaml", variants=("a", "b"), baseline="a")
    assert RP.main([str(other), "--output-root", str(tmp_path / "nothing")]) == 0
    text = capsys.readouterr().out
    assert _cells(text) == [("never", "not run (no summary.csv)", "", "", "", "", "")]
    assert "Verdicts" not in text


def test_bad_sweep_file_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: [0]\n", encoding="utf-8")
    assert RP.main([str(bad), "--output-root", str(tmp_path)]) == 2
    assert "base: required" in capsys.readouterr().err
    assert RP.main([str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml not found" in capsys.readouterr().err


def test_readme_markers_replaced(mini, tmp_path, capsys):
    sweep, root = mini
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n## Results\n{RP.BEGIN}\nold table\n| x |\n{RP.END}\n\nafter\n", encoding="utf-8")
    assert RP.main([str(sweep), "--output-root", str(root), "--readme", str(readme)]) == 0
    printed = capsys.readouterr().out
    text = readme.read_text(encoding="utf-8")
    before, rest = text.split(RP.BEGIN + "\n")
    block, after = rest.split(RP.END)
    assert before == "# Title\n\n## Results\n" and after == "\n\nafter\n"
    assert "old table" not in text
    assert _cells(block) == EXPECTED
    assert [ln[2:] for ln in block.splitlines() if ln.startswith("- ")] == EXPECTED_VERDICTS  # markdown form
    assert block.endswith("\n") and not block.endswith("\n\n")
    assert _cells(printed) == EXPECTED
    # idempotent: a second run leaves the file as it is
    assert RP.main([str(sweep), "--output-root", str(root), "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("content,found", [
    ("no markers here\n", "found 0 and 0"),
    (f"{RP.BEGIN}\nonly the start\n", "found 1 and 0"),
    (f"{RP.BEGIN}\n{RP.END}\n{RP.BEGIN}\n{RP.END}\n", "found 2 and 2"),
])
def test_readme_without_markers_is_an_error_naming_the_file(mini, tmp_path, capsys, content, found):
    sweep, root = mini
    readme = tmp_path / "NOTES.md"
    readme.write_text(content, encoding="utf-8")
    assert RP.main([str(sweep), "--output-root", str(root), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert str(readme) in err and RP.BEGIN in err and found in err
    assert readme.read_text(encoding="utf-8") == content  # untouched


def test_marker_order_and_missing_file(tmp_path, capsys):
    with pytest.raises(ValueError, match="X.md: .*sweep-results:end.* comes before"):
        RP.replace_between_markers(f"{RP.END}\n{RP.BEGIN}\n", "t", where="X.md")
    assert RP.replace_between_markers(f"a{RP.BEGIN}b{RP.END}c", "T\n\n", where="X") == f"a{RP.BEGIN}\nT\n{RP.END}c"
    sweep = _sweep_file(tmp_path / "s.yaml")
    assert RP.main([str(sweep), "--output-root", str(tmp_path), "--readme", str(tmp_path / "NOPE.md")]) == 2
    assert "NOPE.md: no such file" in capsys.readouterr().err


def test_module_entry_point(mini):
    sweep, root = mini
    proc = subprocess.run([sys.executable, "-m", "jaxppo.sweeps.report", str(sweep), "--output-root", str(root)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _cells(proc.stdout) == EXPECTED


# ----------------------------------------------------------------------------- the shared verdict / mismatch

def _v(lo_hi_v, lo_hi_b=(0.45, 0.55)):
    rows = [{"variant": "b", "final_reward_mean": sum(lo_hi_b) / 2, "final_reward_ci95_lo": lo_hi_b[0],
             "final_reward_ci95_hi": lo_hi_b[1], "efficiency_ratio": 1.0, "efficiency_ratio_ci95_lo": 1.0,
             "efficiency_ratio_ci95_hi": 1.0},
            {"variant": "v", "final_reward_mean": sum(lo_hi_v) / 2, "final_reward_ci95_lo": lo_hi_v[0],
             "final_reward_ci95_hi": lo_hi_v[1], "efficiency_ratio": NAN, "efficiency_ratio_ci95_lo": NAN,
             "efficiency_ratio_ci95_hi": NAN}]
    return R.verdict(rows, "v", "b")


@pytest.mark.parametrize("lo_hi,word", [
    ((0.56, 0.70), "higher"),                    # 0.56 > 0.55
    ((0.20, 0.449), "lower"),                    # 0.449 < 0.45
    ((0.50, 0.60), "no difference measured"),    # overlaps
    ((0.55, 0.60), "no difference measured"),    # touching counts as overlapping
    ((0.30, 0.45), "no difference measured"),
    ((NAN, NAN), "not measurable"),
])
def test_verdict_rule_outcomes(lo_hi, word):
    text = _v(lo_hi)
    assert f": {word} (" in text and "data-efficiency" not in text  # NaN ratio: not quoted


def test_verdict_reads_csv_strings_and_dataframes_alike(tmp_path):
    import pandas as pd

    _write_summary(tmp_path)
    csv_rows = R.read_csv(tmp_path / "summary.csv")
    assert isinstance(csv_rows[0]["final_reward_ci95_lo"], str)
    for v, want in zip(("up", "down", "same"), EXPECTED_VERDICTS):
        assert "mini: " + R.verdict(csv_rows, v, "base") == want
        assert "mini: " + R.verdict(pd.DataFrame(ROWS), v, "base") == want
    with pytest.raises(ValueError, match="'nope' is not in the summary"):
        R.verdict(csv_rows, "nope", "base")


def test_mismatch_by_hand(tmp_path):
    _write_metrics(tmp_path)
    m = R.mismatch(tmp_path, ["base", "up", "down", "same"], [0, 1, 2, 3, 4], step=1)
    assert m["base"] == {"ess": pytest.approx(0.8)}
    assert m["up"] == {"ess": pytest.approx(0.55)}
    assert m["down"] == {"rollout_corr/kl": pytest.approx(0.3), "ess": pytest.approx(0.5)}
    assert m["same"] == {}
    assert R.mismatch(tmp_path, ["down"], [0, 1, 4], step=2) == {"down": {"rollout_corr/kl": 9.0}}


# ----------------------------------------------------------------------------- the notebooks' helper

def test_notebook_helper_shares_verdict_and_mismatch():
    sr = import_sweep_report()
    assert sr.verdict is R.verdict and sr.mismatch is R.mismatch


def test_full_profile_is_the_sweep_files_default(tmp_path, monkeypatch):
    """PROFILE "full" runs ``python -m jaxppo.sweep FILE`` without --profile into <root>/<stem> (the sweep file's
    output_dir when root is runs/sweeps); "ci" passes --profile ci into <root>/<stem>_ci."""
    sr = import_sweep_report()
    f = "configs/sweeps/is_onpolicy.yaml"
    assert sr.sweep_output_dir(f, "full", "runs/sweeps") == Path("runs/sweeps/is_onpolicy")
    assert Path(yaml.safe_load((REPO / f).read_text())["output_dir"]) == Path("runs/sweeps/is_onpolicy")
    assert sr.sweep_output_dir(f, "ci", tmp_path) == tmp_path / "is_onpolicy_ci"
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        out = Path(argv[argv.index("--output-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.csv").write_text("variant,status\nx,ok\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(sr.subprocess, "run", fake_run)
    assert sr.run_sweep(f, "full", tmp_path) == tmp_path / "is_onpolicy"
    assert calls[-1][1:4] == ["-m", "jaxppo.sweep", f] and "--profile" not in calls[-1]
    assert calls[-1][calls[-1].index("--output-dir") + 1] == str(tmp_path / "is_onpolicy")
    sr.run_sweep(f, "ci", tmp_path)
    assert calls[-1][calls[-1].index("--profile") + 1] == "ci"
    # every run of the full sweep finished: nothing is run, the tables are read
    n = len(calls)
    assert sr.run_sweep(f, "full", tmp_path) == tmp_path / "is_onpolicy" and len(calls) == n
    with pytest.raises(ValueError, match="PROFILE must be 'ci' or 'full', got 'extended'"):
        sr.run_sweep(f, "extended", tmp_path)


def test_full_profile_loads_the_default_variants(tmp_path, monkeypatch):
    """``load(..., "full")`` uses the sweep file's own variants (what the lead's chain runs), not an extension."""
    sr = import_sweep_report()
    monkeypatch.chdir(REPO)  # the sweep file's base is relative to the repository root
    out = tmp_path / "is_onpolicy"
    out.mkdir()
    (out / "results.csv").write_text(",".join(R.RESULT_COLUMNS) + "\n")
    spec = sr.load(out, "configs/sweeps/is_onpolicy.yaml", "full")[3]
    assert list(spec.variants) == ["is_off", "is_token_truncate", "verl_token_tis"]
    assert len(spec.seeds) == 5 and spec.budget_samples == 1280 and spec.output_dir == str(out)


@pytest.mark.parametrize("stem", NOTEBOOK_SWEEPS)
def test_sweep_files_have_extended_not_full(stem):
    raw = yaml.safe_load((REPO / "configs" / "sweeps" / f"{stem}.yaml").read_text(encoding="utf-8"))
    assert "full" not in raw["profiles"] and set(raw["profiles"]) == {"ci", "extended"}
    assert len(raw["variants"]) == 3 and len(raw["seeds"]) == 5  # what a notebook's "full" reads
    assert f"{stem}.yaml --profile extended" in (REPO / "configs" / "sweeps" / f"{stem}.yaml").read_text()


def test_default_sweeps_are_the_notebooks():
    """The README table covers every notebook sweep, the SmolLM2-135M one (quickstart_replay) among them."""
    stems = [Path(f).stem for f in RP.DEFAULT_SWEEPS]
    assert set(stems) == set(NOTEBOOK_SWEEPS) | {"quickstart_replay"} and len(stems) == len(set(stems))
    nb_sweeps = set()
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        nb_sweeps |= set(re.findall(r"configs/sweeps/([\w.]+)\.yaml", nb.read_text(encoding="utf-8")))
    assert set(stems) <= nb_sweeps
