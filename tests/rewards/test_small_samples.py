"""The reward model's held-out accuracy: bootstrap interval over prompts, both length baselines, the small-sample
warning, and the reward-model folder checked before any data is read."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.rewards.model_training import grouped_bootstrap_accuracy, length_baseline_accuracy


def test_one_prompt_gives_a_point_interval():
    assert grouped_bootstrap_accuracy(np.array([1.0, 0.0, 1.0]), np.array([7, 7, 7])) == (pytest.approx(2 / 3),
                                                                                        pytest.approx(2 / 3))


def test_two_prompts_by_hand():
    # prompt a: 1 of 1 right, prompt b: 0 of 3 right. A resample draws (a, a) p=1/4 -> 1, (b, b) p=1/4 -> 0,
    # a and b p=1/2 -> 1/4: the 95% percentile interval is [0, 1]; pairs are not resampled one by one
    correct, groups = np.array([1.0, 0.0, 0.0, 0.0]), np.array(["a", "b", "b", "b"])
    assert grouped_bootstrap_accuracy(correct, groups, n_boot=4000) == (0.0, 1.0)
    lo, hi = grouped_bootstrap_accuracy(correct, groups, n_boot=4000, level=0.4)  # middle 40%: only 1/4
    assert lo == hi == 0.25


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=30),
       st.integers(0, 3))
def test_interval_lies_between_the_worst_and_best_prompt(rows, seed):
    groups = np.array([g for g, _ in rows])
    correct = np.array([c for _, c in rows])
    lo, hi = grouped_bootstrap_accuracy(correct, groups, n_boot=200, seed=seed)
    per_prompt = [correct[groups == g].mean() for g in np.unique(groups)]
    assert min(per_prompt) - 1e-12 <= lo <= hi <= max(per_prompt) + 1e-12


def test_both_length_baselines_by_hand():
    # chosen lengths 1, 3, 2; rejected 2, 1, 2: shorter chosen in row 0, longer in row 1, tie in row 2
    arrays = {"chosen_mask": np.array([[1, 0, 0], [1, 1, 1], [1, 1, 0]]),
              "rejected_mask": np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0]])}
    rows = np.arange(3)
    assert length_baseline_accuracy(arrays, rows) == pytest.approx(1.5 / 3)
    assert length_baseline_accuracy(arrays, rows, longer=True) == pytest.approx(1.5 / 3)
    assert length_baseline_accuracy(arrays, np.array([0, 1, 1]), longer=True) == pytest.approx(2 / 3)
    assert length_baseline_accuracy(arrays, np.array([0, 1, 1])) == pytest.approx(1 / 3)


@pytest.mark.parametrize("command", ["score", "to-scored"])
def test_a_wrong_reward_model_path_is_reported_before_the_data_is_read(command, tmp_path, capsys):
    from jaxppo.cli.reward import main

    missing_data = tmp_path / "no_such_pairs.jsonl"   # would fail later with 'data file not found'
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"data: {{path: {missing_data}, schema: preference}}\n", encoding="utf-8")
    assert main([command, "--config", str(cfg), f"reward.model_path={tmp_path / 'nope'}",
                 f"trainer.output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"reward.model_path={tmp_path / 'nope'}: no such folder" in err


def test_train_with_a_model_reward_checks_its_folder_first(tmp_path, capsys):
    from jaxppo.cli.train import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"data: {{path: {tmp_path / 'no_such_rows.jsonl'}}}\n"
                   f"reward: {{kind: model, model_path: {tmp_path}}}\n"
                   f"trainer: {{output_dir: {tmp_path / 'out'}}}\n", encoding="utf-8")
    assert main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path} is not a reward-model folder: config.json is missing" in err
