"""plot_metrics: a single run's figures (held-out reward from step 0 with intervals, KL to the reference, the
offline minibatch score labelled as data, IS and replay diagnostics), missing keys skipped, non-finite values
tolerated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxppo.trainer.plots import DATA_TITLE, figure_specs, plot_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _image(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    return imread(str(path))


def _quickstart_like_rows():
    """The quickstart's shape: the minibatch score FALLS while the held-out reward rises 0.094 -> 0.282."""
    rows = []
    for s in range(1, 25):
        r = {"step": s, "critic/score/mean": 0.5 - 0.01 * s, "actor/ppo_kl": 0.001 * s, "actor/kl_loss": 0.02,
             "actor/pg_loss": -0.1, "critic/vf_loss": 1.0 / s, "is/ess": 0.9, "is/weight_mean": 1.0,
             "rollout_corr/kl": 0.01, "replay/priority_mean": 1.0 + s, "replay/beta": 0.4 + 0.01 * s}
        if s % 8 == 0:
            r.update({"eval/reward_mean": {8: 0.15, 16: 0.2, 24: 0.282}[s], "eval/kl": 0.01 * s,
                      "eval/reward_ci_lo": {8: 0.1, 16: 0.15, 24: 0.2}[s],
                      "eval/reward_ci_hi": {8: 0.2, 16: 0.25, 24: 0.35}[s]})
        rows.append(r)
    rows[2]["actor/pg_loss"] = "nan"  # non-finite values as metrics_log writes them
    return rows


def _spec(specs, name):
    [spec] = [s for s in specs if s.name == name]
    return spec


def test_single_run_figures_tell_the_heldout_story(tmp_path):
    _write(tmp_path / "metrics.jsonl", _quickstart_like_rows())
    paths = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots", reward_before=0.094)
    assert [p.name for p in paths] == ["reward.png", "data.png", "kl.png", "losses.png", "is.png", "replay.png"]
    for p in paths:
        img = _image(p)
        assert img.std() > 0
    from jaxppo.trainer.metrics_log import read_jsonl

    specs = figure_specs(read_jsonl(tmp_path / "metrics.jsonl"), reward_before=0.094)
    reward = _spec(specs, "reward")
    assert [p.title.split(" (")[0] for p in reward.panels] == ["held-out reward", "KL to the reference"]
    [line] = reward.panels[0].lines
    assert line.xs == [0, 8, 16, 24] and line.ys == [0.094, 0.15, 0.2, 0.282]      # from step 0 = reference
    assert line.lo == [None, 0.1, 0.15, 0.2] and line.hi == [None, 0.2, 0.25, 0.35]
    kl = reward.panels[1].lines[0]
    assert kl.xs == [0, 8, 16, 24] and kl.ys[0] == 0.0      # the KL line starts at the reference, KL = 0
    data = _spec(specs, "data")
    assert data.title == DATA_TITLE == "offline minibatch score (data, not the policy)"
    assert data.panels[0].lines[0].ys[0] == 0.49 and len(data.panels[0].lines[0].xs) == 24
    assert "critic/score/mean" not in [p.title for p in reward.panels]
    assert [p.title for p in _spec(specs, "is").panels] == ["is/ess", "is/weight_mean", "rollout_corr/kl"]
    assert [p.title for p in _spec(specs, "replay").panels] == ["replay/beta", "replay/priority_mean"]
    assert _spec(specs, "losses").panels[0].lines[0].xs == [1, 2] + list(range(4, 25))   # step 3 was NaN


def test_step_zero_from_the_log_and_the_final_point_from_the_summary(tmp_path):
    rows = [{"step": 0, "eval/reward_mean": 0.1, "eval/kl": 0.0}, {"step": 4, "critic/score/mean": 0.3},
            {"step": 4, "eval/reward_mean": 0.2}]
    summary = {"steps": 10, "eval/reward_before": 0.09, "eval/reward_after": 0.3,
               "eval/reward_gain_ci95": [0.1, 0.3], "eval/kl": 0.05}
    [line] = _spec(figure_specs(rows, summary=summary), "reward").panels[0].lines
    # the logged step-0 value wins over the summary's; the final point's interval = before + gain CI
    assert line.xs == [0, 4, 10] and line.ys == [0.1, 0.2, 0.3]
    assert line.lo[:2] == [None, None] and line.lo[2] == pytest.approx(0.19) and line.hi[2] == pytest.approx(0.39)
    kl = _spec(figure_specs(rows, summary=summary), "reward").panels[1].lines[0]
    assert kl.xs == [0, 10] and kl.ys == [0.0, 0.05]
    # a summary.json beside metrics.jsonl is read when no summary is passed
    _write(tmp_path / "metrics.jsonl", rows[1:2])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert [p.name for p in plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "out")] == ["reward.png", "data.png"]
    [line] = _spec(figure_specs(rows[1:2], summary=summary), "reward").panels[0].lines
    assert line.xs == [0, 10] and line.ys == [0.09, 0.3]


def test_missing_groups_are_skipped(tmp_path):
    _write(tmp_path / "m.jsonl", [{"step": 1, "critic/vf_loss": 2.0}, {"step": 2, "critic/vf_loss": 1.0},
                                  {"step": 3, "perf/throughput": 9.0}])
    paths = plot_metrics(tmp_path / "m.jsonl", tmp_path / "out")
    assert [p.name for p in paths] == ["losses.png"]
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["losses.png"]
    # only the minibatch score: data.png, never a reward figure
    _write(tmp_path / "s.jsonl", [{"step": 1, "critic/score/mean": 0.5}])
    assert [p.name for p in plot_metrics(tmp_path / "s.jsonl", tmp_path / "out3")] == ["data.png"]
    _write(tmp_path / "empty.jsonl", [])
    assert plot_metrics(tmp_path / "empty.jsonl", tmp_path / "out2") == []
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        plot_metrics(tmp_path / "nope.jsonl", tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        plot_metrics(tmp_path / "m.jsonl", tmp_path / "out", summary=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="reward_before"):
        plot_metrics(tmp_path / "m.jsonl", tmp_path / "out", reward_before=float("nan"))


def test_plot_from_a_real_logger_file(tmp_path):
    from jaxppo.trainer.metrics_log import MetricsLogger

    with MetricsLogger(tmp_path, total_steps=4, tensorboard=False, progress=False) as lg:
        for s in range(1, 5):
            lg.log(s, {"actor/ppo_kl": np.float32(s) / 100, "actor/kl_loss": float("inf") if s == 2 else 0.1})
    assert [p.name for p in plot_metrics(tmp_path / "metrics.jsonl", tmp_path)] == ["kl.png"]


def test_critic_free_run_plots_its_data_score(tmp_path):
    """A critic-free estimator (grpo) logs the minibatch score as data/score/mean and no critic/* key: data.png
    still shows it (hand-written metrics.jsonl of such a run)."""
    rows = [{"step": 1, "data/score/mean": 0.25, "actor/advantages/mean": 0.0, "actor/pg_loss": -0.5,
             "actor/ppo_kl": 0.001},
            {"step": 2, "data/score/mean": "nan", "actor/pg_loss": -0.4, "actor/ppo_kl": 0.002},
            {"step": 3, "data/score/mean": 0.75, "actor/pg_loss": -0.3, "actor/ppo_kl": 0.003}]
    _write(tmp_path / "metrics.jsonl", rows)
    paths = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert [p.name for p in paths] == ["data.png", "kl.png", "losses.png"]
    assert _image(tmp_path / "plots" / "data.png").std() > 0
    from jaxppo.trainer.metrics_log import read_jsonl

    data = _spec(figure_specs(read_jsonl(tmp_path / "metrics.jsonl")), "data")
    assert data.title == DATA_TITLE
    [panel] = data.panels
    assert panel.title == "data/score/mean"
    assert (panel.lines[0].xs, panel.lines[0].ys) == ([1, 3], [0.25, 0.75])   # the non-finite step left out


def test_kl_panel_starts_at_zero_with_the_reference():
    """Without a step-0 evaluation row the reward line still starts at the reference (``eval/reward_before``) and
    the KL line starts there too, at KL(reference || reference) = 0."""
    rows = [{"step": 4, "critic/score/mean": 0.3}]
    summary = {"steps": 10, "eval/reward_before": 0.1, "eval/reward_after": 0.3, "eval/kl": 0.05}
    panels = _spec(figure_specs(rows, summary=summary), "reward").panels
    assert panels[0].lines[0].xs == [0, 10]
    kl = panels[1].lines[0]
    assert kl.xs == [0, 10] and kl.ys == [0.0, 0.05]

