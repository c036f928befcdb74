"""Every advantage estimator learns with prioritized and with uniform replay (held-out gain CI above zero), and the
PER-weight metrics and guard report a collapse before it stalls a run.

Before the PER weights got their relative floor (``jaxppo.replay.weights``), GRPO/RLOO with prioritized replay
learned nothing: groups whose responses all got the same reward sit at the priority floor, the classic
normalization ``(m_min / m_i)^β`` then shrinks every informative weight ~1e3-1e6x, and the KL term wins.
"""

from __future__ import annotations

import json

import jax
import pytest

from jaxppo.trainer.ppo.algorithm import train
from jaxppo.trainer.ppo.build import build_run

ESTIMATORS = ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["prioritized", "uniform"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_learns_with_every_sampling(make_cfg, tmp_path, estimator, sampling):
    cfg = make_cfg(f"algorithm.adv_estimator={estimator}", f"replay.sampling={sampling}", "trainer.eval_prompts=16",
                   "trainer.eval_samples=2", "trainer.save_every=100")
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    lo, hi = summary["eval/reward_gain_ci95"]
    assert lo > 0, (estimator, sampling, summary["eval/reward_before"], summary["eval/reward_after"], lo, hi)
    rows = [r for r in _rows(tmp_path / "run" / "metrics.jsonl") if "replay/per_weight_mean" in r]
    assert rows
    for r in rows:
        for k in ("replay/per_weight_min", "replay/per_weight_max", "replay/floor_fraction",
                  "replay/weight_clipped_fraction"):
            assert k in r, k
        if sampling == "prioritized":     # κ = 0.1 (default), β <= 1: every weight >= 0.1
            assert r["replay/per_weight_min"] >= 0.1 - 1e-6, r
        else:
            assert r["replay/per_weight_min"] == r["replay/per_weight_max"] == 1.0
    events = tmp_path / "run" / "events.jsonl"
    assert not events.exists() or "weight_warning" not in events.read_text()


def test_classic_weights_collapse_is_reported(make_cfg, tmp_path):
    """``replay.weight_floor=0`` (the classic weights) with GRPO: items sit at the floor (``replay/floor_fraction``
    > 0), the mean PER weight falls below ``guards.min_per_weight_mean`` and the guard says so, once."""
    cfg = make_cfg("algorithm.adv_estimator=grpo", "replay.weight_floor=0", "replay.beta0=1.0",
                   "trainer.total_steps=8", "trainer.eval_prompts=8")
    train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    rows = [r for r in _rows(tmp_path / "run" / "metrics.jsonl") if "replay/per_weight_mean" in r]
    assert max(r["replay/floor_fraction"] for r in rows) > 0
    assert min(r["replay/per_weight_mean"] for r in rows) < cfg.guards.min_per_weight_mean
    warnings = [e for e in _rows(tmp_path / "run" / "events.jsonl") if e["kind"] == "weight_warning"]
    assert len(warnings) >= 1 and "replay.weight_floor" in warnings[0]["message"]
