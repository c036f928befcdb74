"""plot_metrics: the PNGs of present metric groups, missing keys skipped, non-finite values tolerated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxppo.trainer.plots import plot_metrics, reward_keys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _image(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    return imread(str(path))


def test_all_groups(tmp_path):
    rows = [{"step": s, "critic/score/mean": 0.1 * s, "actor/ppo_kl": 0.01 * s, "actor/kl_loss": 0.02,
             "actor/pg_loss": -0.1, "critic/vf_loss": 1.0 / s} for s in range(1, 6)]
    rows[2]["actor/pg_loss"] = "nan"  # non-finite values as metrics_log writes them
    rows.append({"step": 5, "eval/reward_before": 0.1, "eval/reward_after": 0.4, "eval/kl": 0.03})
    _write(tmp_path / "metrics.jsonl", rows)
    paths = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert [p.name for p in paths] == ["reward.png", "kl.png", "losses.png"]
    img = _image(paths[0])
    # reward figure has 3 stacked panels (score, eval/reward_after, eval/reward_before) -> taller than wide
    assert img.shape[0] > img.shape[1] and img.std() > 0
    assert _image(paths[2]).shape[0] < img.shape[0]  # 2 panels


def test_missing_groups_are_skipped(tmp_path):
    _write(tmp_path / "m.jsonl", [{"step": 1, "critic/vf_loss": 2.0}, {"step": 2, "critic/vf_loss": 1.0},
                                  {"step": 3, "perf/throughput": 9.0}])
    paths = plot_metrics(tmp_path / "m.jsonl", tmp_path / "out")
    assert [p.name for p in paths] == ["losses.png"]
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["losses.png"]
    _write(tmp_path / "empty.jsonl", [])
    assert plot_metrics(tmp_path / "empty.jsonl", tmp_path / "out2") == []
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        plot_metrics(tmp_path / "nope.jsonl", tmp_path)


def test_reward_keys_selection():
    names = {"critic/score/mean", "eval/reward_after", "eval/kl", "eval/perplexity", "eval/score_x", "x/reward"}
    assert reward_keys(names) == ["critic/score/mean", "eval/reward_after", "eval/score_x"]
    assert reward_keys({"eval/kl"}) == []


def test_plot_from_a_real_logger_file(tmp_path):
    from jaxppo.trainer.metrics_log import MetricsLogger

    with MetricsLogger(tmp_path, total_steps=4, tensorboard=False, progress=False) as lg:
        for s in range(1, 5):
            lg.log(s, {"actor/ppo_kl": np.float32(s) / 100, "actor/kl_loss": float("inf") if s == 2 else 0.1})
    assert [p.name for p in plot_metrics(tmp_path / "metrics.jsonl", tmp_path)] == ["kl.png"]
