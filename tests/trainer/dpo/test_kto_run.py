"""dpo.loss_type=kto: jaxppo.dpo trains TRL's KTO on unpaired rows (prompt, completion, boolean label) made from
real HH-RLHF pairs (chosen -> True, rejected -> False), with the models, checkpoints and evaluation of DPO."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from tests.resume_helpers import rows as _rows
from tests.trainer.dpo.conftest import dpo_overrides

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def unpaired(hh_pairs, tmp_path_factory):
    from jaxppo.data.hh import split_pair

    rows = []
    with gzip.open(hh_pairs, "rt", encoding="utf-8") as fh:
        for line in fh:
            split = split_pair(**{k: v for k, v in json.loads(line).items() if k in ("chosen", "rejected")})
            if len(split) == 3:
                p, c, r = split
                rows += [{"prompt": p, "completion": c, "label": True}, {"prompt": p, "completion": r, "label": False}]
            if len(rows) >= 64:
                break
    path = tmp_path_factory.mktemp("kto") / "unpaired.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_kto_trains_through_the_preference_trainer(unpaired, stories_model, tmp_path):
    import jax

    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, fit_dpo

    out = tmp_path / "out"
    cfg = load_config(None, dpo_overrides(stories_model, unpaired, out, tmp_path / "cache", "data.schema=scored",
                                          "dpo.loss_type=kto", "dpo.desirable_weight=1.0",
                                          "dpo.undesirable_weight=1.0"))
    summary, _ = fit_dpo(cfg, run=build_dpo_run(cfg, devices=jax.devices()[:1]))
    rows = _rows(out / "metrics.jsonl")[1:]
    # policy = reference at the first step: every u = 0 and z0 = 0, so each row's loss is 1 - sig(0) = 1/2
    assert abs(rows[0]["loss"] - 0.5) < 1e-4 and abs(rows[0]["kl"]) < 1e-4
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "kl", "count/chosen", "grad_norm"} <= set(rows[0])
    assert np.mean([r["loss"] for r in rows[-3:]]) < rows[0]["loss"]
    assert summary["n_train_pairs"] + summary["n_heldout_pairs"] == 64
    assert summary["train/rewards/accuracies"] > 0.5 and "eval/rewards/accuracies_ci95" in summary


def test_kto_needs_unpaired_rows(hh_pairs, stories_model, tmp_path):
    from jaxppo.config import ConfigError, load_config
    from jaxppo.trainer.dpo.algorithm import check_dpo_config

    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, tmp_path, tmp_path / "cache", "dpo.loss_type=kto"))
    with pytest.raises(ConfigError, match="dpo.loss_type=kto trains on unpaired rows"):
        check_dpo_config(cfg, 1)
    with pytest.raises(ConfigError, match="dpo.rpo_alpha"):
        load_config(None, ["dpo.loss_type=kto", "dpo.rpo_alpha=0.5"])


def test_the_kto_config_steps_turn_hh_pairs_into_kto_rows(tmp_path, monkeypatch, capsys):
    """Step 1 of configs/kto_hh_stories260k.yaml (to-scored without a reward model) on 40 HH pairs, then step 2's
    data as the KTO trainer lays it out: chosen answers desirable, rejected ones not."""
    import re

    from jaxppo.config import load_config
    from jaxppo.data.report import DataError
    from jaxppo.data.unpaired import kto_layout, load_kto_arrays
    from jaxppo.hf import load_tokenizer
    from jaxppo.cli.reward import main
    from tests.trainer.dpo.conftest import REPO

    monkeypatch.chdir(REPO)   # the configs' paths are relative to the repository root
    text = (REPO / "configs" / "kto_hh_stories260k.yaml").read_text()
    step1 = re.search(r"python -m jaxppo\.reward to-scored (.*?)\n#\s+(.*?)\n", text)
    args = (step1.group(1).rstrip(" \\") + " " + step1.group(2)).split()
    out_dir = next(a.split("=", 1)[1] for a in args if a.startswith("trainer.output_dir="))
    cfg = load_config(REPO / "configs" / "kto_hh_stories260k.yaml")
    assert cfg.data.path == f"{out_dir}/scored.jsonl"   # step 2 reads what step 1 writes
    out = tmp_path / "unpaired"
    args = [a if not a.startswith("trainer.output_dir=") else f"trainer.output_dir={out}" for a in args]
    assert main(["to-scored", *args, "data.max_rows=40"]) == 0, capsys.readouterr().err
    data = cfg.data.__class__(**{**cfg.data.__dict__, "path": str(out / "scored.jsonl")})
    arrays, report = load_kto_arrays(data, load_tokenizer(REPO / cfg.model.path))
    n_pairs = json.loads((out / "to_scored_metrics.json").read_text())["n_pairs"]
    assert arrays["desirable"].sum() == n_pairs == (~arrays["desirable"]).sum()   # HH answers: one pair each
    with pytest.raises(DataError, match="binary feedback"):   # a reward model's scores are not labels
        kto_layout({**{k: v for k, v in arrays.items() if k != "desirable"}, "score": np.full(len(arrays["index"]), 2.0),
                    "response_ids": arrays["chosen_ids"], "response_mask": arrays["chosen_mask"]})
