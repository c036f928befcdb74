"""Bad data is visible: ``jaxppo.train`` prints the data report (rows seen, kept, skipped by reason), writes it into
``summary.json``, and stops with a one-line error when fewer usable rows remain than one minibatch or no held-out
prompt is left while ``data.eval_fraction > 0`` (the harness's ``check_rows``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from tests.trainer.conftest import REPO, overrides_for_cli
from tests.xla_flags import cli_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GOOD = {"prompt": "Once upon a time, there was a cat.", "response": "The cat was happy and played all day.",
        "score": 0.5}


def _bad_rows() -> list[str]:
    """A NaN score, a string score, an empty prompt and a broken JSON line."""
    return [json.dumps({**GOOD, "prompt": "A dog ran.", "score": float("nan")}),
            json.dumps({**GOOD, "prompt": "A bird sang.", "score": "high"}),
            json.dumps({**GOOD, "prompt": "", "score": 0.1}),
            '{"prompt": "A fish swam.", "response": "It swam', ]


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxppo.train", *args], cwd=REPO,
                          env=cli_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600)


def test_five_row_file_with_one_good_row_stops_with_the_counts(tmp_path, stories_model):
    data = tmp_path / "scored.jsonl"
    data.write_text("\n".join([*_bad_rows(), json.dumps(GOOD)]) + "\n", encoding="utf-8")
    p = _cli(overrides_for_cli(stories_model, data, tmp_path / "out", "trainer.total_steps=4"))
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr[-3000:]
    msg = lines[0]
    assert "1 usable training rows, fewer than one minibatch (actor.ppo_mini_batch_size=16)" in msg
    assert "kept 1 of 5 rows, skipped 4" in msg, msg


def test_report_is_printed_and_written_into_the_summary(tmp_path, stories_model, capsys):
    from jaxppo.config import load_config
    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run

    data = tmp_path / "scored.jsonl"
    good = [json.dumps({**GOOD, "prompt": f"Story {i}: once upon a time.", "score": (i % 5) / 5.0})
            for i in range(24)]
    data.write_text("\n".join([*_bad_rows(), *good]) + "\n", encoding="utf-8")
    cfg = load_config(None, overrides_for_cli(stories_model, data, tmp_path / "run", "actor.ppo_mini_batch_size=8",
                                              "actor.ppo_micro_batch_size=8", "trainer.total_steps=2",
                                              "trainer.save_every=100", "replay.capacity=64"))
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    printed = capsys.readouterr().out
    assert "kept 24 of 28 rows, skipped 4" in printed
    on_disk = json.loads((Path(cfg.trainer.output_dir) / "summary.json").read_text())
    for s in (summary, on_disk):
        assert s["data/rows_seen"] == 28 and s["data/rows_kept"] == 24 and s["data/rows_skipped"] == 4
        assert sum(v for k, v in s.items() if k.startswith("data/skipped/")) == 4
        assert s["data_report"]["rows_skipped"] == 4 and len(s["data_report"]["skipped"]) >= 3


def test_no_heldout_prompt_while_evaluation_is_on_is_an_error(tmp_path, stories_model):
    from jaxppo.config import load_config
    from jaxppo.data.report import DataError
    from jaxppo.trainer.ppo.build import build_run

    data = tmp_path / "scored.jsonl"
    data.write_text("\n".join(json.dumps({**GOOD, "score": i / 20}) for i in range(20)) + "\n", encoding="utf-8")
    cfg = load_config(None, overrides_for_cli(stories_model, data, tmp_path / "run", "actor.ppo_mini_batch_size=8",
                                              "actor.ppo_micro_batch_size=8"))
    with pytest.raises(DataError, match=r"data.eval_fraction=0.25 but no held-out prompt remains .* kept 20 of 20"):
        build_run(cfg, devices=jax.devices()[:1])


def test_a_pairs_file_given_to_train_points_to_to_scored(tmp_path, stories_model):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Once {i}", "chosen": "A cat.", "rejected": "A dog."}) + "\n"
                            for i in range(4)), encoding="utf-8")
    p = _cli(overrides_for_cli(stories_model, data, tmp_path / "out", "trainer.total_steps=4"))
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr[-3000:]
    assert "all 4 rows were skipped: 4 x missing_field" in lines[0]
    assert "a preference pair; turn pairs into scored rows with `python -m jaxppo.reward to-scored`" in lines[0]
