"""jaxppo.sweeps.waste: the two wasted-iteration measures of a run, by hand."""

import math

import pytest

from jaxppo.sweeps.waste import run_waste


def test_by_hand():
    rows = [{"step": 0, "eval/reward_mean": 0.1},
            {"step": 1, "waste/zero_grad_token_frac": 0.2, "actor/grad_norm": 1.0},
            {"step": 2, "waste/zero_grad_token_frac": 0.4, "actor/grad_norm": 0.05},   # < 0.1 x median(1.0): low
            {"step": 3, "waste/zero_grad_token_frac": 0.6, "actor/grad_norm": 2.0},    # median(1, .05) = .525: not
            {"step": 4, "waste/zero_grad_token_frac": 0.0, "actor/grad_norm": 0.09}]   # median(1, .05, 2) = 1: low
    w = run_waste(rows)
    assert w["zero_grad_token_frac"] == pytest.approx(0.3)
    assert w["low_grad_update_frac"] == pytest.approx(2 / 3)


def test_rows_of_one_step_merge_and_missing_metrics_give_nan():
    rows = [{"step": 2, "actor/grad_norm": 1.0}, {"step": 1, "actor/grad_norm": 1.0},
            {"step": 2, "waste/zero_grad_token_frac": 0.5}]
    w = run_waste(rows)
    assert w["zero_grad_token_frac"] == 0.5 and w["low_grad_update_frac"] == 0.0
    assert all(math.isnan(v) for v in run_waste([{"step": 0}]).values())
