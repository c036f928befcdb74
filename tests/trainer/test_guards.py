"""Guards: each triggers on a constructed case and not otherwise; checkpoint round trip replays identically."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config import load_config
from jaxppo.config.schema import GuardsConfig
from jaxppo.trainer.guards import DEFAULT_LENGTH_KEYS, GuardAction, Guards, cut_lr_scale

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
    assert "0.05" in a.message and "factor" not in a.data


def test_kl_guard_default_cut_is_relative():
    g = Guards(GuardsConfig(kl_threshold=0.05))
    a = g.check(0, {"actor/ppo_kl": 0.5})[0]
    assert a.kind == "lower_lr" and a.data["factor"] == 0.1 and "lr" not in a.data
    assert "0.1 x its current value" in a.message
    # with the shipped defaults (actor.optim.lr == 1e-6) the cut really lowers the LR
    cfg = load_config(None, [])
    assert cfg.guards.kl_lr is None and cfg.actor.optim.lr == 1e-6
    assert cut_lr_scale(1.0, a.data, cfg.actor.optim.lr) == pytest.approx(0.1)


def test_cut_lr_scale_hand_cases_and_errors():
    assert cut_lr_scale(1.0, {"factor": 0.1}, 5e-4) == pytest.approx(0.1)
    assert cut_lr_scale(0.1, {"factor": 0.1}, 5e-4) == pytest.approx(0.01)       # a second excursion compounds
    assert cut_lr_scale(1.0, {"lr": 1e-7}, 5e-4) == pytest.approx(2e-4)          # absolute: 1e-7 / 5e-4
    assert cut_lr_scale(1e-4, {"lr": 1e-7}, 5e-4) == pytest.approx(1e-4)         # never raises the LR
    assert cut_lr_scale(1.0, {"lr": 1e-6}, 1e-6) == 1.0                          # the old no-op, only if asked
    with pytest.raises(ValueError, match="'lr' or 'factor'"):
        cut_lr_scale(1.0, {"kl": 1.0}, 1e-6)
    with pytest.raises(ValueError, match="factor"):
        cut_lr_scale(1.0, {"factor": 1.5}, 1e-6)
    with pytest.raises(ValueError, match="base_lr"):
        cut_lr_scale(1.0, {"factor": 0.1}, 0.0)
    with pytest.raises(ValueError, match="scale"):
        cut_lr_scale(math.nan, {"factor": 0.1}, 1e-6)


@given(st.floats(1e-6, 1.0), st.floats(1e-3, 0.999), st.floats(1e-9, 1e-2), st.floats(1e-9, 1e-2))
def test_cut_lr_scale_properties(scale, factor, lr, base_lr):
    rel = cut_lr_scale(scale, {"factor": factor}, base_lr)
    assert rel < scale and rel == pytest.approx(scale * factor)
    ab = cut_lr_scale(scale, {"lr": lr}, base_lr)
    assert ab <= scale and ab == pytest.approx(min(scale, lr / base_lr))


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
    k = "eval/response_length"
    assert g.check(0, {k: 10.0}) == []  # first value: nothing to compare with
    assert g.check(1, {k: 20.0}) == []  # 20 is not > 2 x 10
    assert g.check(2, {k: 30.0}) == []  # mean(10, 20) = 15, 30 not > 30
    acts = g.check(3, {k: 40.1})  # mean(10, 20, 30) = 20 -> 40.1 > 40
    assert kinds(acts) == ["length_warning"]
    assert acts[0].data["running_mean"] == pytest.approx(20.0)
    assert g.check(4, {k: math.nan}) == []  # non-finite values are skipped, not averaged
    # running mean now (10+20+30+40.1)/4 = 25.025
    assert g.check(5, {k: 50.0}) == [] and kinds(g.check(6, {k: 62.0})) == ["length_warning"]


def test_length_guard_watches_the_policy_not_the_data():
    """The sampled offline minibatch's length does not depend on the policy: it never warns by default."""
    assert "response_length/mean" not in DEFAULT_LENGTH_KEYS
    g = Guards(CFG)
    assert all(g.check(i, {"response_length/mean": v}) == [] for i, v in enumerate([5.0, 10.0, 40.0, 160.0]))
    # the policy's own generations doubling in length does (each key keeps its own running mean)
    for key in ("eval/response_length", "probe/response_length"):
        assert g.check(10, {key: 8.0}) == [] and g.check(11, {key: 8.0}) == []
        acts = g.check(12, {key: 16.5})
        assert kinds(acts) == ["length_warning"] and acts[0].data["key"] == key
        assert acts[0].data["running_mean"] == pytest.approx(8.0)


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


class _DeviceCounts:
    """The train step's NaN counters (TrainState.nan_streak/nan_total) as the loop drives them: a skipped update
    adds 1 to both, a finite one zeroes the streak, a rollback action zeroes the streak."""

    def __init__(self):
        self.streak = self.total = 0

    def step(self, g: Guards, step: int, finite: bool):
        self.streak = 0 if finite else self.streak + 1
        self.total += 0 if finite else 1
        acts = g.check_nan(step, self.streak, self.total)
        if any(a.kind == "rollback" for a in acts):
            self.streak = 0
        return acts


def test_nan_guard_reads_the_device_counts():
    g, dev = Guards(CFG), _DeviceCounts()
    assert dev.step(g, 1, False) == [] and dev.step(g, 2, False) == []
    assert dev.step(g, 3, True) == []  # streak broken
    assert dev.step(g, 4, False) == [] and dev.step(g, 5, False) == []
    acts = dev.step(g, 6, False)
    assert kinds(acts) == ["rollback"] and acts[0].data["nan_steps"] == 3 and acts[0].data["nan_total"] == 5
    assert dev.step(g, 7, False) == []  # the count restarts after a rollback
    # hand cases of the rule streak >= max_nan_steps, no host state
    assert Guards(CFG).check_nan(9, 2, 10) == [] and kinds(Guards(CFG).check_nan(9, 3, 3)) == ["rollback"]
    assert kinds(Guards(GuardsConfig(max_nan_steps=1)).check_nan(0, 1, 1)) == ["rollback"]
    assert "nan_streak" not in Guards(CFG).state_dict()  # one source of truth: the TrainState
    with pytest.raises(ValueError, match="streak <= total"):
        Guards(CFG).check_nan(1, 2, 1)
    with pytest.raises(ValueError, match="streak <= total"):
        Guards(CFG).check_nan(1, -1, 0)


@given(st.lists(st.booleans(), max_size=40), st.integers(1, 5))
def test_nan_guard_matches_a_numpy_streak_model(finite, max_nan):
    """Rollback steps = where an independent run-length count of NaN steps (reset at each rollback) hits max."""
    g, dev = Guards(GuardsConfig(max_nan_steps=max_nan)), _DeviceCounts()
    got = [i for i, f in enumerate(finite) if kinds(dev.step(g, i, f)) == ["rollback"]]
    want, run = [], 0
    for i, f in enumerate(np.asarray(finite, bool)):
        run = 0 if f else run + 1
        if run == max_nan:
            want.append(i)
            run = 0
    assert got == want


def _drive(g: Guards, events, dev: _DeviceCounts):
    out = []
    for step, kind, value in events:
        if kind == "m":
            acts = g.check(step, value)
        elif kind == "ppl":
            acts = g.check_perplexity(step, value)
        else:
            acts = dev.step(g, step, kind == "ok")
        out.append([(a.kind, a.message, a.data) for a in acts])
    return out


event_st = st.one_of(
    st.tuples(st.just("m"), st.fixed_dictionaries({
        "actor/ppo_kl": st.floats(0, 0.1, allow_nan=False),
        "eval/response_length": st.floats(1, 100, allow_nan=False)})),
    st.tuples(st.just("ppl"), st.floats(5, 15, allow_nan=False)),
    st.tuples(st.just("nan"), st.none()),
    st.tuples(st.just("ok"), st.none()),
)


@given(st.lists(event_st, min_size=1, max_size=30), st.data())
def test_state_dict_round_trip_gives_identical_later_actions(events, data):
    events = [(i, k, v) for i, (k, v) in enumerate(events)]
    cut = data.draw(st.integers(0, len(events)))
    ref = Guards(CFG)
    expected = _drive(ref, events, _DeviceCounts())
    g, dev = Guards(CFG), _DeviceCounts()
    _drive(g, events[:cut], dev)
    restored = Guards.from_state_dict(CFG, json.loads(json.dumps(g.state_dict())))
    assert restored.state_dict() == g.state_dict()
    assert _drive(restored, events[cut:], dev) == expected[cut:]   # dev: the counts the checkpoint's state holds


def test_from_state_dict_rejects_bad_state():
    d = Guards(CFG).state_dict()
    with pytest.raises(ValueError, match="ppl_baseline"):
        Guards.from_state_dict(CFG, {k: v for k, v in d.items() if k != "ppl_baseline"})
    # a version-1 state (host NaN copies) still loads; its NaN counts are ignored (the TrainState holds them)
    old = Guards.from_state_dict(CFG, {**d, "version": 1, "nan_streak": 2, "nan_total": 4})
    assert old.state_dict() == d
    with pytest.raises(ValueError, match="version"):
        Guards.from_state_dict(CFG, {**d, "version": 99})


def test_guard_action_is_plain_data():
    a = GuardAction("lower_lr", "m", {"lr": 1e-6})
    assert json.loads(json.dumps(a.data)) == {"lr": 1e-6}


def test_per_weight_guard_warns_once_per_excursion():
    g = Guards(GuardsConfig(min_per_weight_mean=0.05))
    seq = [0.5, 0.06, 0.05, 0.04, 0.001, 0.2, 0.01, float("nan"), 0.01]
    fired = [kinds(g.check(i, {"replay/per_weight_mean": v})) for i, v in enumerate(seq)]
    # 0.05 is not < 0.05; warns at 0.04, quiet at 0.001, re-arms at 0.2, warns at 0.01; NaN is skipped
    assert fired == [[], [], [], ["weight_warning"], [], [], ["weight_warning"], [], []]
    a = Guards(GuardsConfig(min_per_weight_mean=0.05)).check(0, {"replay/per_weight_mean": 0.001})[0]
    assert a.data == {"per_weight_mean": pytest.approx(0.001), "threshold": 0.05}
    assert "replay.weight_floor" in a.message and "floor_fraction" in a.message


def test_per_weight_guard_state_round_trip_and_old_states():
    g = Guards(GuardsConfig())
    g.check(0, {"replay/per_weight_mean": 0.0})
    d = json.loads(json.dumps(g.state_dict()))
    assert d["weight_low"] is True
    assert kinds(Guards.from_state_dict(GuardsConfig(), d).check(1, {"replay/per_weight_mean": 0.0})) == []
    del d["weight_low"]       # a state written before the weight guard existed
    assert kinds(Guards.from_state_dict(GuardsConfig(), d).check(1, {"replay/per_weight_mean": 0.0})) == [
        "weight_warning"]
