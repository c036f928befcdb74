"""SLURM resources of ``--slurm`` from the sweep file's ``slurm:`` mapping: written as ``#SBATCH`` lines, each
overridden by its ``--slurm-*`` flag, and every bad value a one-line error (exit 2) naming the key or the flag."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from jaxppo.cli.sweep import main
from jaxppo.sweeps.spec import SweepError, parse_sweep

REPO = Path(__file__).resolve().parents[2]
BASE = {"base": str(REPO / "configs" / "smoke.yaml"), "seeds": [0], "variants": {"a": [], "b": ["replay.alpha=0.5"]},
        "baseline": "a", "eval": {"every_samples": 64}, "budget": {"samples": 128}}


def _parse(**extra):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_sweep(dict(BASE, **extra))


def test_the_slurm_mapping_is_optional_and_typed():
    assert _parse().slurm.time is None and _parse().slurm.partition is None
    s = _parse(slurm={"partition": "gpu,debug", "time": "1-02:30:00", "gpus": 2, "cpus": 8, "mem": "64G",
                      "max_parallel": 4}).slurm
    assert (s.partition, s.time, s.gpus, s.cpus, s.mem, s.max_parallel) == ("gpu,debug", "1-02:30:00", 2, 8, "64G", 4)


@pytest.mark.parametrize("slurm, needle", [
    ({"time": "2h"}, "slurm.time: expected a SLURM time limit"),
    ({"time": 7200}, "slurm.time: got the number 7200: quote the time limit"),   # YAML's reading of 02:00:00
    ({"mem": "16GB"}, "slurm.mem: expected a memory size"),
    ({"gpus": 0}, "slurm.gpus: expected an integer >= 1, got 0"),
    ({"cpus": "four"}, "slurm.cpus"),
    ({"max_parallel": -1}, "slurm.max_parallel: expected an integer >= 1"),
    ({"partition": "gpu debug"}, "slurm.partition: expected a partition name"),
    ({"partiton": "gpu"}, "unknown key 'slurm.partiton'; did you mean 'slurm.partition'?"),
    ("gpu", "slurm: expected a mapping"),
])
def test_a_bad_slurm_value_names_its_key(slurm, needle):
    with pytest.raises(SweepError) as e:
        _parse(slurm=slurm)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _write(tmp_path: Path, **extra) -> Path:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(dict(BASE, output_dir=str(tmp_path / "out"), **extra)))
    return f


def test_slurm_script_takes_the_files_resources_and_flags_override_them(tmp_path, capsys):
    f = _write(tmp_path, slurm={"partition": "gpu", "time": "02:00:00", "gpus": 1, "cpus": 4, "mem": "16G",
                                "max_parallel": 2})
    script = tmp_path / "a.sbatch"
    assert main(["--config", str(f), "--slurm", str(script)]) == 0
    text = script.read_text()
    for line in ("--array=0-1%2", "--partition=gpu", "--time=02:00:00", "--gpus-per-task=1", "--cpus-per-task=4",
                 "--mem=16G"):
        assert f"#SBATCH {line}\n" in text, text
    assert main(["--config", str(f), "--slurm", str(script), "--slurm-time", "00:30:00", "--slurm-mem", "8G"]) == 0
    text = script.read_text()
    assert "#SBATCH --time=00:30:00\n" in text and "#SBATCH --mem=8G\n" in text
    assert "#SBATCH --partition=gpu\n" in text and "#SBATCH --cpus-per-task=4\n" in text   # kept from the file
    assert "02:00:00" not in text and "16G" not in text
    capsys.readouterr()


def test_slurm_errors_are_one_line_naming_the_key_or_the_flag(tmp_path, capsys):
    bad_file = _write(tmp_path, slurm={"mem": "lots"})
    assert main(["--config", str(bad_file), "--slurm", str(tmp_path / "x.sbatch")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m jaxppo.sweep: error: slurm.mem: expected a memory size"), err
    assert not any(line.startswith("python -m jaxppo.sweep: error") for line in err[:-1])

    good = _write(tmp_path, slurm={"time": "01:00:00"})
    for flag, value, needle in (("--slurm-time", "soon", "--slurm-time: expected a SLURM time limit"),
                                ("--slurm-gpus", "0", "--slurm-gpus: expected an integer >= 1, got 0"),
                                ("--slurm-partition", "a;b", "--slurm-partition: expected a partition name")):
        assert main(["--config", str(good), "--slurm", str(tmp_path / "y.sbatch"), flag, value]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"python -m jaxppo.sweep: error: {needle}"), err
    assert not (tmp_path / "x.sbatch").exists() and not (tmp_path / "y.sbatch").exists()
