"""``python -m jaxppo.sweeps.report``: the Results tables from hand-written ``summary.csv`` / ``metrics.jsonl``
(expected cells worked out by hand), the power line, the "not run" case, the marker replacement in ``--out`` and its
errors; and the notebooks' helper (:mod:`jaxppo.sweeps.notebook`): PROFILE "full" = the sweep file's default
variants (no ``--profile``) in ``<output_root>/<stem>``, sharing ``verdict`` / ``mismatch`` with
:mod:`jaxppo.sweeps.results`."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxppo.sweeps import notebook as sr
from jaxppo.sweeps import report as RP
from jaxppo.sweeps import results as R
from jaxppo.sweeps import stats

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_SWEEPS = ("is_onpolicy", "is_offpolicy_t1.5", "is_offpolicy_t0.7", "per_decay", "stale_reuse", "pf_filters",
                   "critic_free")
NAN = float("nan")
pytestmark = pytest.mark.filterwarnings("ignore:sweep .* evaluation points:UserWarning")


def _sweep_file(path: Path, variants=("base", "up", "down", "same"), baseline="base") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0, 1, 2, 3, 4],
        "variants": {v: ["replay.sampling=uniform"] for v in variants}, "baseline": baseline,
        "eval": {"every_samples": 32}, "budget": {"samples": 256}}), encoding="utf-8")
    return path


def _row(variant, n_seeds, n_failed, reward, sd, kl, diff=None, auc=None, passage=None, t_p=NAN):
    r = {"variant": variant, "metric": "eval/reward_mean", "n_seeds": n_seeds, "n_failed": n_failed,
         "final_reward_mean": reward[0], "final_reward_ci95_lo": reward[1], "final_reward_ci95_hi": reward[2],
         "final_seed_sd": sd, "final_kl_mean": kl, "n_pairs": 0}
    if diff is not None:
        r |= {"n_pairs": n_seeds, "final_diff": diff[0], "final_diff_lo": diff[1], "final_diff_hi": diff[2],
              "final_diff_p": diff[3], "final_diff_sd": diff[4], "final_diff_t_p": t_p, "auc_diff": auc[0], "auc_diff_lo": auc[1],
              "auc_diff_hi": auc[2], "target": 0.4, "earlier": passage[0], "later": passage[1], "ties": passage[2],
              "passage_p": passage[3], "median_samples_to_target": passage[4],
              "baseline_median_samples_to_target": passage[5]}
    return r


# base is the noise reference; up: paired interval above 0; down: below 0; same: contains 0. Paired t-test p
# .003 / .02 / .6, Holm over the 3 variants: .009 / .04 / .6 -> higher, lower, no difference
ROWS = [_row("base", 5, 0, (0.5, 0.45, 0.55), 0.04, 0.0123456),
        _row("up", 5, 0, (0.7, 0.6, 0.8), 0.08, 0.25, (0.2, 0.1, 0.3, 0.0625, 0.08), (0.1, 0.05, 0.15),
             (5, 0, 0, 0.0625, 32.0, 128.0), t_p=0.003),
        _row("down", 4, 1, (0.3, 0.16, 0.44), 0.09, NAN, (-0.2, -0.35, -0.05, 0.125, 0.1), (-0.1, -0.2, 0.0),
             (0, 3, 1, 0.25, NAN, 96.0), t_p=0.02),
        _row("same", 5, 0, (0.52, 0.41, 0.63), 0.09, 0.1, (0.02, -0.06, 0.1, 0.8125, 0.06), (0.0, -0.05, 0.05),
             (1, 1, 3, 1.0, 128.0, 128.0), t_p=0.6)]


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
    ("base (baseline)", "5/5", "0.500 [0.450, 0.550]", "0.040", "0.0123", "", "", "", "ESS/N 0.800"),
    ("up", "5/5", "0.700 [0.600, 0.800]", "0.080", "0.2500", "0.200 [0.100, 0.300], p 0.062", "0.100 [0.050, 0.150]",
     "5/0/0, p 0.062 (<= 32 vs 128)", "ESS/N 0.550"),
    ("down", "4/5 (1 failed)", "0.300 [0.160, 0.440]", "0.090", "n/a", "-0.200 [-0.350, -0.050], p 0.125",
     "-0.100 [-0.200, 0.000]", "0/3/1, p 0.250 (> 256 vs 96)", "rollout_corr/kl 0.3000"),
    ("same", "5/5", "0.520 [0.410, 0.630]", "0.090", "0.1000", "0.020 [-0.060, 0.100], p 0.812",
     "0.000 [-0.050, 0.050]", "1/1/3, p 1.000 (128 vs 128)", "n/a"),
]
EXPECTED_WORDS = {"up": "higher", "down": "lower", "same": "no difference measured"}


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


def _main(*args) -> int:
    return RP.main([*map(str, args), "--print"])


def test_table_cells_power_line_and_verdicts_by_hand(mini, capsys):
    sweep, root = mini
    assert _main(sweep, "--output-root", root) == 0
    text = capsys.readouterr().out
    header = [ln for ln in text.splitlines() if ln.startswith("|")][0]
    assert tuple(c.strip() for c in header.strip("|").split("|")) == RP.HEADER
    assert _cells(text) == EXPECTED
    assert text.startswith("#### mini (held-out reward; baseline base; primary test final; 256 samples, evaluated "
                           "every 32)\n")
    # power: pooled sd over the paired variants sqrt((4*.08^2 + 3*.1^2 + 4*.06^2) / 11), n = min pairs = 4
    sd = math.sqrt((4 * 0.08 ** 2 + 3 * 0.1 ** 2 + 4 * 0.06 ** 2) / 11)
    mde = stats.min_detectable_effect(sd, 4)
    power = [ln for ln in text.splitlines() if ln.startswith("Power:")]
    assert power == [f"Power: with 4 paired seeds and the pooled sd {sd:.4f} of the paired final differences, the "
                     f"paired t-test detects a final difference of {mde:.3f} with 80% power at the 5% level; the exact "
                     "sign-flip test's smallest p is 0.125 (it cannot reach 0.05 with this many seeds)."]
    verdicts = [ln[2:] for ln in text.splitlines() if ln.startswith("- ")]
    assert [v.split(":")[0] for v in verdicts] == ["up vs base", "down vs base", "same vs base"]
    holm = {"up": "0.009", "down": "0.040", "same": "0.600"}
    for v in verdicts:
        name = v.split()[0]
        assert f": {EXPECTED_WORDS[name]} (primary, final value: final difference " in v
        assert f", Holm p {holm[name]}); Holm over 3 variants)" in v
    assert "no finding" not in text and text.count("Verdicts (primary test: final value, seed-paired, p-values "
                                                   "Holm-adjusted over the sweep's variants") == 1
    assert "A/A calibration: not run for this sweep" in text
    assert len({len(ln) for ln in text.splitlines() if ln.startswith("|")}) == 1   # padded columns


def test_power_line_when_the_arms_are_identical():
    rows = [{"n_pairs": "10", "final_diff_sd": "0.0"}]
    line = RP.power_line(rows, {"final_seed_sd": "0.038"})
    mde = stats.min_detectable_effect(math.sqrt(2) * 0.038, 10)
    assert line == ("Power: every paired final difference is exactly 0 (the arms ran the same computation); with "
                    f"independent arms at the baseline's seed sd 0.0380, 10 paired seeds would detect a final difference "
                    f"of {mde:.3f} with 80% power at the 5% level; the exact sign-flip test's smallest p is 0.001953.")
    assert RP.power_line(rows, {"final_seed_sd": "0"}).startswith("Power: not estimable")


def test_the_sweeps_own_calibration_is_quoted(mini, capsys):
    sweep, root = mini
    fam = {"fwer_primary": {"rate": 0.048, "interval": [0.038, 0.060], "ok": True},
           "fwer_secondary": {"rate": 0.027, "interval": [0.019, 0.038], "ok": True}}
    doc = {"n": 2000, "variants": 3, "primary": "final", "all_ok": True, "family_ok": True,
           "rule": {"interval_level": 0.99, "mc_z": 2.576},
           "designs": [{"n_seeds": 5, "tails": "normal", "family": fam,
                        "uncorrected_any": {"rate": 0.31, "interval": [0.28, 0.34]}}]}
    (root / "mini" / "calibration.json").write_text(json.dumps(doc), encoding="utf-8")
    assert _main(sweep, "--output-root", root) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("A/A calibration")]
    path = (root / "mini" / "calibration.json").as_posix()
    assert line == [f"A/A calibration ({path}: 2000 synthetic sweeps per design with this sweep's fitted noise, 3 "
                    "variant(s), 5 seeds, primary final): family-wise false-claim rates, normal noise: primary 4.8% "
                    "[3.8%, 6.0%], secondary 2.7% [1.9%, 3.8%] (uncorrected, any test: 31.0%); within the nominal 5% "
                    "(exact 99% interval's lower end <= 5% and rate <= 5% + 2.576 Monte Carlo errors): yes; every "
                    "single test and coverage: yes."]


def test_not_run_sweep_is_listed_not_an_error(mini, tmp_path, capsys):
    sweep, root = mini
    other = _sweep_file(tmp_path / "sweeps" / "never.yaml", variants=("a", "b"), baseline="a")
    assert _main(other, sweep, "--output-root", root) == 0
    text = capsys.readouterr().out
    assert f"not run (no {root / 'never' / 'summary.csv'})" in text
    assert _cells(text) == EXPECTED
    assert text.index("#### never") < text.index("#### mini")


def test_bad_sweep_file_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: [0]\n", encoding="utf-8")
    assert _main(bad, "--output-root", tmp_path) == 2
    assert "missing required key 'base'" in capsys.readouterr().err
    assert _main(tmp_path / "missing.yaml") == 2
    assert "missing.yaml not found" in capsys.readouterr().err


def test_out_markers_replaced_and_created(mini, tmp_path, capsys):
    sweep, root = mini
    doc = tmp_path / "docs" / "results.md"
    assert RP.main([str(sweep), "--output-root", str(root), "--out", str(doc)]) == 0   # created with the markers
    first = doc.read_text(encoding="utf-8")
    capsys.readouterr()
    assert first.startswith(f"# Results\n\n{RP.BEGIN}\n#### mini") and first.endswith(f"{RP.END}\n")
    doc.write_text(f"# Title\n\n## Results\n{RP.BEGIN}\nold table\n| x |\n{RP.END}\n\nafter\n", encoding="utf-8")
    assert RP.main([str(sweep), "--output-root", str(root), "--readme", str(doc)]) == 0   # the old option name
    printed = capsys.readouterr().out
    text = doc.read_text(encoding="utf-8")
    before, rest = text.split(RP.BEGIN + "\n")
    block, after = rest.split(RP.END)
    assert before == "# Title\n\n## Results\n" and after == "\n\nafter\n"
    assert "old table" not in text and _cells(block) == EXPECTED and block == printed
    # idempotent: a second run leaves the file byte for byte as it is
    assert RP.main([str(sweep), "--output-root", str(root), "--out", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("content,found", [
    ("no markers here\n", "found 0 and 0"),
    (f"{RP.BEGIN}\nonly the start\n", "found 1 and 0"),
    (f"{RP.BEGIN}\n{RP.END}\n{RP.BEGIN}\n{RP.END}\n", "found 2 and 2"),
])
def test_out_without_markers_is_an_error_naming_the_file(mini, tmp_path, capsys, content, found):
    sweep, root = mini
    doc = tmp_path / "NOTES.md"
    doc.write_text(content, encoding="utf-8")
    assert RP.main([str(sweep), "--output-root", str(root), "--out", str(doc)]) == 2
    err = capsys.readouterr().err
    assert str(doc) in err and RP.BEGIN in err and found in err
    assert doc.read_text(encoding="utf-8") == content  # untouched


def test_marker_order():
    with pytest.raises(ValueError, match="X.md: .*sweep-results:end.* comes before"):
        RP.replace_between_markers(f"{RP.END}\n{RP.BEGIN}\n", "t", where="X.md")
    assert RP.replace_between_markers(f"a{RP.BEGIN}b{RP.END}c", "T\n\n", where="X") == f"a{RP.BEGIN}\nT\n{RP.END}c"


def test_module_entry_point(mini):
    sweep, root = mini
    proc = subprocess.run([sys.executable, "-m", "jaxppo.sweeps.report", str(sweep), "--output-root", str(root),
                           "--print"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _cells(proc.stdout) == EXPECTED


# ----------------------------------------------------------------------------- the shared verdict / mismatch

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
    assert sr.verdict is R.verdict and sr.mismatch is R.mismatch


def test_full_profile_is_the_sweep_files_default(tmp_path, monkeypatch):
    """PROFILE "full" runs ``python -m jaxppo.sweep --config FILE`` without --profile into <root>/<stem> (the sweep
    file's output_dir when root is results/sweeps); "ci" passes --profile ci into <root>/<stem>_ci."""
    f = "configs/sweeps/is_onpolicy.yaml"
    assert sr.sweep_output_dir(f, "full", "results/sweeps") == Path("results/sweeps/is_onpolicy")
    assert Path(yaml.safe_load((REPO / f).read_text()).get("output_dir", "results/sweeps/is_onpolicy")) == Path(
        "results/sweeps/is_onpolicy")
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
    assert calls[-1][1:5] == ["-m", "jaxppo.sweep", "--config", f] and "--profile" not in calls[-1]
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
    monkeypatch.chdir(REPO)  # the sweep file's base is relative to the repository root
    out = tmp_path / "is_onpolicy"
    out.mkdir()
    (out / "results.csv").write_text(",".join(R.RESULT_COLUMNS) + "\n")
    spec = sr.load(out, "configs/sweeps/is_onpolicy.yaml", "full")[3]
    assert list(spec.variants) == ["is_off", "is_token_truncate", "verl_token_tis"]
    assert len(spec.seeds) == 10 and spec.budget_samples == 1280 and spec.output_dir == str(out)


@pytest.mark.parametrize("stem", NOTEBOOK_SWEEPS)
def test_sweep_files_have_extended_not_full(stem):
    raw = yaml.safe_load((REPO / "configs" / "sweeps" / f"{stem}.yaml").read_text(encoding="utf-8"))
    assert "full" not in raw["profiles"] and set(raw["profiles"]) == {"ci", "extended"}
    assert len(raw["variants"]) >= 3 and len(raw["seeds"]) >= 5  # what a notebook's "full" reads
    # >= 8 evaluations after step 0, the first at <= 1/8 of the budget, committed outputs
    assert raw["budget"]["samples"] // raw["eval"]["every_samples"] >= 8
    assert raw["output_dir"] == f"results/sweeps/{stem}"
    assert f"{stem}.yaml --profile extended" in (REPO / "configs" / "sweeps" / f"{stem}.yaml").read_text()


def test_default_sweeps_are_the_notebooks_and_the_preregistered_ones():
    """The results tables cover every notebook sweep, the SmolLM2-135M one (quickstart_replay) among them; the other
    default sweeps are sweeps of the pre-registered experiments (tested, or named in a registration's design to be
    described), each with its committed summary."""
    import yaml

    stems = [Path(f).stem for f in RP.DEFAULT_SWEEPS]
    assert len(stems) == len(set(stems)) and set(NOTEBOOK_SWEEPS) | {"quickstart_replay"} <= set(stems)
    nb_sweeps = set()
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        nb_sweeps |= set(re.findall(r"configs/sweeps/([\w.]+)\.yaml", nb.read_text(encoding="utf-8")))
    regs = [yaml.safe_load(d.read_text(encoding="utf-8")) for d in (REPO / "results" / "preregistered").glob("*.yaml")]
    prereg = {Path(f).stem for r in regs for f in r["sweeps"].values()}
    prereg |= {s for s in stems for r in regs if re.search(rf"\b{re.escape(s)}\.yaml", r["design"])}
    others = set(stems) - nb_sweeps
    assert others and others <= prereg
    assert all((REPO / "results" / "sweeps" / s / "summary.csv").is_file() for s in others)


def _results_rows() -> list[dict]:
    """results.csv rows: base's evaluations at 0 samples 0.30 / 0.34 / 0.26 (seeds 0-2), a failed seed 3 and a
    NaN seed 4 (both left out), later grid points and another variant that must not count."""
    rows = [{"variant": "base", "seed": s, "samples": 0, "reward": r, "status": "ok"}
            for s, r in ((0, 0.30), (1, 0.34), (2, 0.26))]
    rows += [{"variant": "base", "seed": 3, "samples": 0, "reward": 0.9, "status": "failed"},
             {"variant": "base", "seed": 4, "samples": 0, "reward": NAN, "status": "ok"},
             {"variant": "base", "seed": 0, "samples": 32, "reward": 0.9, "status": "ok"},
             {"variant": "up", "seed": 0, "samples": 0, "reward": 0.9, "status": "ok"}]
    return rows


def test_initial_eval_sd_by_hand():
    # mean 0.30, deviations 0, +0.04, -0.04: variance (0.0016 + 0.0016) / 2 = 0.0016, sd 0.04
    sd, n = R.initial_eval_sd(_results_rows(), "base")
    assert n == 3 and sd == pytest.approx(0.04, abs=1e-12)
    sd, n = R.initial_eval_sd(_results_rows(), "up")
    assert n == 1 and math.isnan(sd)
    assert R.initial_eval_sd([{k: str(v) for k, v in r.items()} for r in _results_rows()], "base")[0] == \
        pytest.approx(0.04, abs=1e-12)   # the strings of read_csv


def test_noise_line_printed_under_the_table(mini, capsys):
    sweep, root = mini
    R.write_csv(root / "mini" / "results.csv", _results_rows(), ("variant", "seed", "samples", "reward", "status"))
    assert _main(sweep, "--output-root", root) == 0
    lines = capsys.readouterr().out.splitlines()
    noise = [ln for ln in lines if ln.startswith("Evaluation noise:")]
    # sd 0.04 at 0 samples against base's final seed sd 0.04: 0.04^2 / 0.04^2 = 100%
    assert noise == ["Evaluation noise: at 0 samples (the same initial policy, each seed's own evaluation key) the "
                     "held-out value varies with sd 0.0400 over 3 seeds, against the baseline's final seed sd 0.0400; "
                     "the evaluation alone is 100% of the final seed variance."]
    assert lines.index(noise[0]) > max(i for i, ln in enumerate(lines) if ln.startswith("Power:"))
    assert RP.noise_line([], "base", {"final_seed_sd": "0.04"}) == \
        "Evaluation noise: not measurable (0 seeds evaluated at 0 samples)."


def test_calibrate_option_fits_each_sweep_and_is_quoted(tmp_path, capsys):
    """``--calibrate`` runs the A/A calibration of each finished sweep with its own noise, variants, seeds and
    primary test (normal and heavy-tailed noise) into the sweep's calibration.json, which the table then quotes."""
    import numpy as np

    sweep = _sweep_file(tmp_path / "sweeps" / "cal.yaml", variants=("a", "b", "c"), baseline="a")
    out = tmp_path / "root" / "cal"
    rng = np.random.default_rng(0)
    x = list(range(0, 257, 32))
    curves = [R.RunCurve(v, s, "ok", steps=[i for i in range(len(x))], samples=x, tokens=[0.0] * len(x),
                         reward=list(0.1 + 0.001 * np.asarray(x) + 0.05 * rng.normal(size=len(x))),
                         kl=[0.0] * len(x), wall=[0.0] * len(x)) for v in ("a", "b", "c") for s in range(4)]
    R.write_csv(out / "results.csv", R.result_rows(curves), R.RESULT_COLUMNS)
    R.write_csv(out / "summary.csv", R.summarize(curves, ["a", "b", "c"], "a", 256), R.SUMMARY_COLUMNS)
    assert RP.main([str(sweep), "--output-root", str(tmp_path / "root"), "--calibrate", "--calibration-sweeps", "20",
                    "--print"]) == 0
    doc = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert doc["variants"] == 2 and doc["primary"] == "final" and doc["n"] == 20
    assert [(d["n_seeds"], d["tails"]) for d in doc["designs"]] == [(4, "normal"), (4, "t4")]
    assert doc["model"]["x"] == x and "baseline a" in doc["model"]["source"]
    text = capsys.readouterr().out
    assert f"A/A calibration ({(out / 'calibration.json').as_posix()}: 20 synthetic sweeps per design" in text
    assert "normal noise: primary " in text and "t4 noise: primary " in text


def test_ci_outputs_and_the_cache_stay_out_of_results(tmp_path, monkeypatch):
    """A notebook run with PROFILE "ci" and OUTPUT_ROOT results/sweeps writes its toy sweep and the compilation cache
    under the git-ignored runs/ (runs/sweeps/<stem>_ci, runs/sweeps/xla_cache), never into results/; the full
    profile keeps results/sweeps/<stem> (the committed record); roots outside results/ are used as they are."""
    f = "configs/sweeps/is_onpolicy.yaml"
    root = REPO / "results" / "sweeps"
    assert sr.sweep_output_dir(f, "ci", root) == REPO / "runs" / "sweeps" / "is_onpolicy_ci"
    assert sr.sweep_output_dir(f, "full", root) == root / "is_onpolicy"
    assert sr.sweep_output_dir(f, "ci", tmp_path) == tmp_path / "is_onpolicy_ci"
    envs, outs = [], []

    def fake_run(argv, **kw):
        envs.append(kw["env"])
        out = Path(argv[argv.index("--output-dir") + 1])
        outs.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.csv").write_text("variant,status\nx,ok\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(sr.subprocess, "run", fake_run)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    # a stand-in repository: its results/ maps to its runs/ (the real checkout is not written)
    fake_repo = tmp_path / "repo"
    monkeypatch.chdir(fake_repo.mkdir() or fake_repo)
    sr.run_sweep(f, "ci", fake_repo / "results" / "sweeps")
    assert outs[-1] == fake_repo / "runs" / "sweeps" / "is_onpolicy_ci"
    assert envs[-1]["JAX_COMPILATION_CACHE_DIR"] == str(fake_repo / "runs" / "sweeps" / "xla_cache")
    assert not (fake_repo / "results").exists()


def test_runner_cache_of_a_committed_sweep_is_under_runs(tmp_path, monkeypatch):
    from jaxppo.sweeps.runner import run_env, scratch_path

    monkeypatch.chdir(tmp_path)
    assert scratch_path("results/sweeps/x/xla_cache") == tmp_path / "runs" / "sweeps" / "x" / "xla_cache"
    assert scratch_path(tmp_path / "elsewhere") == tmp_path / "elsewhere"

    class Spec:
        output_dir = "results/sweeps/x"

    env = run_env(Spec(), base_env={})
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "runs" / "sweeps" / "x" / "xla_cache")
    assert run_env(Spec(), base_env={"JAX_COMPILATION_CACHE_DIR": "/c"})["JAX_COMPILATION_CACHE_DIR"] == "/c"
