"""``python -m jaxppo.prompts``: the held-out side is exactly the prompts the DPO run holds out, the train side is
disjoint from it, together they are every prompt of the pairs; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.trainer.dpo.conftest import dpo_overrides

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _prompts(path: Path) -> list:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def test_sides_match_the_dpo_runs_split(tmp_path, stories_model, hh_pairs, capsys):
    from jaxppo.config import load_config
    from jaxppo.data import load_rows
    from jaxppo.cli.prompts import main
    from jaxppo.trainer.dpo.algorithm import build_dpo_run

    over = dpo_overrides(stories_model, hh_pairs, tmp_path / "run", tmp_path / "cache")
    with pytest.raises(SystemExit) as e:    # a missing config file: one line, status 2
        main(["--side", "train", "--out", str(tmp_path / "x.jsonl"), "--config", str(tmp_path / "none.yaml"), *over])
    assert e.value.code == 2 and "config file not found" in capsys.readouterr().err
    cfg_file = tmp_path / "dpo.yaml"
    cfg_file.write_text("{}\n")
    for side in ("train", "heldout"):
        assert main(["--config", str(cfg_file), "--side", side, "--out", str(tmp_path / f"{side}.jsonl"), *over]) == 0
    train, held = _prompts(tmp_path / "train.jsonl"), _prompts(tmp_path / "heldout.jsonl")

    cfg = load_config(str(cfg_file), over)
    run = build_dpo_run(cfg, devices=jax.devices()[:1])
    by_index = {r.index: r.prompt for r in load_rows(cfg.data).rows}
    run_held = list(dict.fromkeys(by_index[int(i)] for i in np.sort(run.heldout["index"])))
    run_train = list(dict.fromkeys(by_index[int(i)] for i in np.sort(run.train["index"])))
    assert held == run_held and len(held) > 0          # exactly DPO's held-out prompts, in file order
    assert train == run_train and len(train) > 0
    assert not set(train) & set(held)
    assert "training prompts" in capsys.readouterr().out


def test_non_preference_config_is_one_line_error(tmp_path, stories_model, hh_pairs, capsys):
    from jaxppo.cli.prompts import main

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("{}\n")
    over = dpo_overrides(stories_model, hh_pairs, tmp_path / "run", tmp_path / "cache")
    over = [o for o in over if not o.startswith("data.schema=")] + ["data.schema=scored"]
    assert main(["--config", str(cfg_file), "--side", "train", "--out", str(tmp_path / "p.jsonl"), *over]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.schema must be 'preference'" in err[0]
