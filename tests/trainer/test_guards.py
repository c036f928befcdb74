"""Guards: each triggers on a constructed case and not otherwise; checkpoint round trip replays identically."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from jaxppo.config import load_config
from jaxppo.config.schema import GuardsConfig
from jaxppo.trainer.guards import Guards, GuardAction

CFG = GuardsConfig(kl_threshold=0.05, kl_lr=1e-6, length_factor=2.0, ppl_every=500, ppl_tolerance=0.2,
                   max_nan_steps=3)


def kinds(actions):
    return [a.kind for a in actions]


def test_accepts_full_config_and_rejects_other_types():
    g = Guards(load_config(None, ["guards.kl_threshold=0.1"]))
    assert g.cfg.kl_threshold == 0.1
    with pytest.raises(TypeError, match="GuardsConfig"):
        Guards({"kl_threshold": 0.1})


def test_kl_guard_fires_once_per_excursion():
    g = Guards(CFG)
    seq = [0.01, 0.049, 0.05, 0.06, 0.2, 0.04, 0.07, 0.07]
    fired = [kinds(g.check(i, {"actor/ppo_kl": v})) for i, v in enumerate(seq)]
    # 0.05 is not > 0.05; fires at 0.06, stays quiet at 0.2, re-arms at 0.04, fires at 0.07 once
    assert fired == [[], [], [], ["lower_lr"], [], [], ["lower_lr"], []]
    a = Guards(CFG).check(0, {"actor/ppo_kl": np.float32(0.5)})[0]
    assert a.data["lr"] == 1e-6 and a.data["key"] == "actor/ppo_kl" and a.data["kl"] == pytest.approx(0.5)
    assert "0.05" in a.message


def test_kl_guard_ignores_missing_and_nonfinite_and_other_keys():
    g = Guards(CFG)
    assert g.check(0, {"actor/kl_loss": 9.0, "critic/vf_loss": 9.0}) == []
    assert g.check(1, {"actor/ppo_kl": math.nan}) == []
    assert g.check(2, {"actor/ppo_kl": math.inf}) == []
    g2 = Guards(CFG, kl_keys=("eval/kl", "actor/kl_loss"))
    assert kinds(g2.check(0, {"actor/kl_loss": 0.06})) == ["lower_lr"]
    assert g2.check(1, {"actor/ppo_kl": 1.0}) == []


def test_length_guard_against_running_mean():
    g = Guards(CFG)
    k = "response_length/mean"
    assert g.check(0, {k: 10.0}) == []  # first value: nothing to compare with
    assert g.check(1, {k: 20.0}) == []  # 20 is not > 2 x 10
    assert g.check(2, {k: 30.0}) == []  # mean(10, 20) = 15, 30 not > 30
    acts = g.check(3, {k: 40.1})  # mean(10, 20, 30) = 20 -> 40.1 > 40
    assert kinds(acts) == ["length_warning"]
    assert acts[0].data["running_mean"] == pytest.approx(20.0)
    assert g.check(4, {k: math.nan}) == []  # non-finite values are skipped, not averaged
    # running mean now (10+20+30+40.1)/4 = 25.025
    assert g.check(5, {k: 50.0}) == [] and kinds(g.check(6, {k: 62.0})) == ["length_warning"]


def test_perplexity_guard_baseline_and_rollback():
    g = Guards(CFG)
    assert g.should_check_perplexity(0) and g.should_check_perplexity(1000) and not g.should_check_perplexity(499)
    assert g.check_perplexity(0, 10.0) == []
    assert g.ppl_baseline == 10.0
    assert g.check_perplexity(500, 11.99) == []
    assert g.check_perplexity(1000, 12.0) == []  # exactly (1 + 0.2) x baseline is not above it
    acts = g.check_perplexity(1500, 12.01)
    assert kinds(acts) == ["rollback"] and acts[0].data["baseline"] == 10.0
    assert acts[0].data["limit"] == pytest.approx(12.0)
    assert kinds(g.check_perplexity(2000, math.nan)) == ["rollback"]
    assert g.ppl_baseline == 10.0  # the baseline never moves
    with pytest.raises(ValueError, match="baseline"):
        Guards(CFG).check_perplexity(0, math.inf)


def test_nan_guard_counts_consecutive_steps():
    g = Guards(CFG)
    assert g.note_nan(1) == [] and g.note_nan(2) == []
    g.note_finite(3)  # streak broken
    assert g.note_nan(4) == [] and g.note_nan(5) == []
    acts = g.note_nan(6)
    assert kinds(acts) == ["rollback"] and acts[0].data["nan_steps"] == 3 and acts[0].data["nan_total"] == 5
    assert g.note_nan(7) == []  # the count restarts after a rollback
    g1 = Guards(GuardsConfig(max_nan_steps=1))
    assert kinds(g1.note_nan(0)) == ["rollback"]


def _drive(g: Guards, events):
    out = []
    for step, kind, value in events:
        if kind == "m":
            acts = g.check(step, value)
        elif kind == "ppl":
            acts = g.check_perplexity(step, value)
        elif kind == "nan":
            acts = g.note_nan(step)
        else:
            acts = g.note_finite(step)
        out.append([(a.kind, a.message, a.data) for a in acts])
    return out


event_st = st.one_of(
    st.tuples(st.just("m"), st.fixed_dictionaries({
        "actor/ppo_kl": st.floats(0, 0.1, allow_nan=False),
        "response_length/mean": st.floats(1, 100, allow_nan=False)})),
    st.tuples(st.just("ppl"), st.floats(5, 15, allow_nan=False)),
    st.tuples(st.just("nan"), st.none()),
    st.tuples(st.just("ok"), st.none()),
)


@given(st.lists(event_st, min_size=1, max_size=30), st.data())
def test_state_dict_round_trip_gives_identical_later_actions(events, data):
    events = [(i, k, v) for i, (k, v) in enumerate(events)]
    cut = data.draw(st.integers(0, len(events)))
    ref = Guards(CFG)
    expected = _drive(ref, events)
    g = Guards(CFG)
    _drive(g, events[:cut])
    restored = Guards.from_state_dict(CFG, json.loads(json.dumps(g.state_dict())))
    assert restored.state_dict() == g.state_dict()
    assert _drive(restored, events[cut:]) == expected[cut:]


def test_from_state_dict_rejects_bad_state():
    d = Guards(CFG).state_dict()
    with pytest.raises(ValueError, match="nan_streak"):
        Guards.from_state_dict(CFG, {k: v for k, v in d.items() if k != "nan_streak"})
    with pytest.raises(ValueError, match="version"):
        Guards.from_state_dict(CFG, {**d, "version": 99})


def test_guard_action_is_plain_data():
    a = GuardAction("lower_lr", "m", {"lr": 1e-6})
    assert json.loads(json.dumps(a.data)) == {"lr": 1e-6}
