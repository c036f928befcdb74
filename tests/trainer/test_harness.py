"""The harness's phase clocks: ``Clocks.timing`` adds the wall time of its body to one phase, and a run's
``summary.json`` has the seconds of its evaluations, perplexity checks and checkpoint waits inside its loop time."""

from __future__ import annotations

import json
import time

import jax
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_clocks_add_each_body_to_its_phase(monkeypatch):
    from jaxppo.trainer import harness

    ticks = iter([10.0, 10.5, 20.0, 22.0, 30.0, 30.25])   # three bodies: 0.5 s, 2 s, 0.25 s
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(ticks))
    clocks = harness.Clocks()
    with clocks.timing("evaluations"):
        pass
    with clocks.timing("perplexity"):
        pass
    with pytest.raises(RuntimeError), clocks.timing("evaluations"):   # a body that raises is counted too
        raise RuntimeError("x")
    assert clocks.summary() == {"time/evaluations_s": 0.75, "time/perplexity_s": 2.0, "time/checkpoints_s": 0.0}


def test_a_run_summary_has_its_phase_times_inside_the_loop(make_cfg, tmp_path, monkeypatch):
    from jaxppo.trainer import harness
    from jaxppo.trainer.ppo import algorithm as ppo
    from jaxppo.trainer.ppo.build import build_run

    pause = 0.2
    calls = {"ppl": 0, "eval": 0}

    def slow_ppl(algo, params):
        calls["ppl"] += 1
        time.sleep(pause)
        return 10.0

    evaluate = ppo.PPO.evaluate

    def slow_evaluate(self, params):
        calls["eval"] += 1
        time.sleep(pause)
        return evaluate(self, params)

    monkeypatch.setattr(harness, "heldout_ppl", slow_ppl)
    monkeypatch.setattr(ppo.PPO, "evaluate", slow_evaluate)
    cfg = make_cfg("trainer.total_steps=2", "guards.ppl_every=1", "trainer.eval_every=1", "trainer.save_every=1")
    run = build_run(cfg, devices=jax.devices()[:1])
    ppo.train(cfg, run=run)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the baseline and steps 1 and 2; the evaluations at steps 1 and 2 (step 0 is the reference's own evaluation)
    assert calls == {"ppl": 3, "eval": 2}
    assert summary["time/perplexity_s"] >= 3 * pause
    assert summary["time/evaluations_s"] >= 2 * pause
    assert summary["time/checkpoints_s"] > 0 and summary["time/export_s"] >= 0
    updates = rows[-1]["perf/train_time_s"]
    inside = updates + summary["time/perplexity_s"] + summary["time/evaluations_s"] + summary["time/checkpoints_s"]
    assert inside <= summary["time/train_s"]
    assert summary["time/setup_s"] + summary["time/train_s"] + summary["time/eval_s"] + summary["time/export_s"] \
        <= summary["time/total_s"]
