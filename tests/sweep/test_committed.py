"""Every committed sweep (``results/sweeps/<name>`` of ``configs/sweeps/<name>.yaml``) through the documented
command: ``python -m jaxppo.sweep --config configs/sweeps/<name>.yaml`` runs nothing (all its runs are finished),
exits 0 and rewrites ``results.csv`` and ``summary.csv`` byte for byte, although the config schema has grown and
defaults have changed since the runs were made (it says so in a note)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(f.stem for f in (REPO / "configs" / "sweeps").glob("*.yaml")
                   if (REPO / "results" / "sweeps" / f.stem / "summary.csv").is_file())
RUN_FILES = ("config.json", "summary.json", "metrics.jsonl")   # what the tables are read from


def test_the_committed_sweeps_are_found():
    assert len(COMMITTED) >= 10 and "aa" in COMMITTED and "quickstart_replay" in COMMITTED


@pytest.mark.parametrize("name", COMMITTED)
def test_the_sweep_command_rewrites_the_committed_tables(name, tmp_path, monkeypatch, capsys):
    from jaxppo.cli.sweep import main

    src = REPO / "results" / "sweeps" / name
    out = tmp_path / name
    for f in (src / "runs").glob("*/seed*/summary.json"):   # the finished runs' files only (no checkpoints)
        d = out / f.parent.relative_to(src)
        d.mkdir(parents=True)
        for k in RUN_FILES:
            shutil.copy(f.parent / k, d / k)
    assert out.is_dir(), f"{name}: no finished run committed"
    monkeypatch.chdir(REPO)   # the sweep files name their base config relative to the repository
    assert main(["--config", f"configs/sweeps/{name}.yaml", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ", 0 to run" in printed
    for table in ("results.csv", "summary.csv"):
        assert (out / table).read_text() == (src / table).read_text(), f"{name}/{table} differs from the committed one"
