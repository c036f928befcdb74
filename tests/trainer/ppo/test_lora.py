"""PPO / GRPO with LoRA adapters (model.lora.rank > 0) end to end on stories260K: only the adapters (and the
critic's adapters and value head) are in the train state and change, the frozen base is one set of arrays that
the reference and the critic share and that no step donates or changes, hf/ holds the merged model."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _names(tree) -> list[str]:
    return ["/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@pytest.mark.slow
def test_lora_ppo_with_gae_critic_on_the_shared_base(make_cfg, tmp_path):
    from jaxppo.hf import load_pretrained
    from jaxppo.trainer.ppo.algorithm import fit
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("model.lora.rank=4", "model.lora.alpha=8", "trainer.total_steps=6", "trainer.save_every=3",
                   "replay.refresh_every=3", "data.eval_fraction=0.1", "trainer.eval_prompts=4",
                   "trainer.save_hf=true")
    run = build_run(cfg, devices=jax.devices()[:1])
    assert run.base is not None    # the reference: the base with all-zero adapters, no copy of the base
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(run.ref_params))
    assert _names(run.ref_params) == _names(run.state.actor)
    actor_names, critic_names = _names(run.state.actor), _names(run.state.critic)
    assert actor_names and all("_lora_" in n for n in actor_names)
    assert any("value_head" in n for n in critic_names) and any("_lora_" in n for n in critic_names)
    assert all("_lora_" in n or "value_head" in n for n in critic_names), "the critic must not hold a base"
    assert 0 < run.params_trainable < run.params_total / 4
    base0 = jax.tree.map(np.array, run.base)
    actor0 = jax.tree.map(np.array, run.state.actor)
    ref_logits = np.asarray(run.reference()(run.train["prompt_ids"][:2], run.train["prompt_mask"][:2]))

    summary, state = fit(cfg, run=run)
    assert summary["model/params_trainable"] == run.params_trainable
    assert summary["model/params_total"] == run.params_total
    # the base is still alive (never donated) and unchanged; the adapters moved
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(run.base)):
        np.testing.assert_array_equal(a, np.asarray(b))
    moved = [np.max(np.abs(np.asarray(b) - a)) for a, b in zip(jax.tree.leaves(actor0), jax.tree.leaves(state.actor))]
    assert max(moved) > 0
    np.testing.assert_array_equal(np.asarray(run.reference()(run.train["prompt_ids"][:2],
                                                             run.train["prompt_mask"][:2])), ref_logits)
    # hf/: the merged model, the same logits as the adapter forward
    ids, mask = run.train["prompt_ids"][:3], run.train["prompt_mask"][:3]
    merged = load_pretrained(tmp_path / "run" / "hf")
    np.testing.assert_allclose(np.asarray(merged(ids, mask)), np.asarray(run.policy(state.actor)(ids, mask)),
                               atol=1e-4)
    assert np.isfinite(summary["eval/reward_after"])
    ckpt = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert ckpt["model/params_trainable"] == run.params_trainable


def test_lora_grpo_on_an_int8_base_runs_a_few_steps(make_cfg):
    from jaxppo.trainer.ppo.algorithm import fit
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("model.lora.rank=2", "model.lora.targets=[q,v]", "algorithm.adv_estimator=grpo",
                   "model.lora.quantize_base=int8", "trainer.total_steps=3", "trainer.save_every=3",
                   "data.eval_fraction=0")
    run = build_run(cfg, devices=jax.devices()[:1])
    assert run.state.critic is None and run.critic_gd is None
    assert run.base["model"]["layers"]["q"].get_value().dtype == np.int8   # QLoRA: int8 codes + scales
    names = _names(run.state.actor)
    assert len(names) == 4 and all(any(k in n for n in names) for k in ("q_lora_a", "q_lora_b", "v_lora_a",
                                                                        "v_lora_b"))
    # the reference log-probs in the buffer are the QUANTIZED base's (the reference this run trains against), not
    # the loaded float weights' (which differ by the int8 rounding)
    from jaxppo.data import compute_behaviour_logprobs
    from jaxppo.hf import load_pretrained

    rows = {k: run.train[k][:8] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")}
    np.testing.assert_allclose(run.train["ref_logp"][:8], compute_behaviour_logprobs(run.reference(), rows),
                               atol=1e-5)
    unquantized = compute_behaviour_logprobs(load_pretrained(cfg.model.path), rows)
    assert np.max(np.abs(run.train["ref_logp"][:8] - unquantized)) > 1e-4
    _, state = fit(cfg, run=run)
    assert int(state.step) == 3 and int(state.nan_total) == 0


def test_lora_config_errors(make_cfg):
    from jaxppo.config import ConfigError

    with pytest.raises(ConfigError, match="model.lora.targets"):
        make_cfg("model.lora.rank=2", "model.lora.targets=[q,wq]")
    with pytest.raises(ConfigError, match="model.lora.dropout"):
        make_cfg("model.lora.dropout=0.1")                       # dropout without adapters
    assert make_cfg("model.lora.rank=2", "model.lora.dropout=0.1").model.lora.dropout == 0.1
    with pytest.raises(ConfigError, match="model.lora.rank"):
        make_cfg("model.lora.rank=-1")


@pytest.mark.slow
def test_lora_sigkill_resume_matches_uninterrupted(tmp_path, stories_model, scored_data, compile_cache):
    """The resume test of test_loop.py with adapters and adapter dropout: the checkpoint holds adapters, optimizer
    and replay state only (the base is re-read from model.path), and a SIGKILLed run resumed with resume=auto logs
    the same metrics as an uninterrupted one (the dropout masks derive from the state's rng and step)."""
    from tests.resume_helpers import deterministic_rows, kill_at_checkpoint_then_resume
    from tests.trainer.ppo.test_algorithm import _cli

    extra = ("data.eval_fraction=0", "model.lora.rank=4", "model.lora.dropout=0.1", "trainer.total_steps=8")
    res = kill_at_checkpoint_then_resume(lambda out: _cli(out, stories_model, scored_data, compile_cache, *extra),
                                         tmp_path, 4, wait_s=240, finish_s=300)
    a, b = deterministic_rows(res.full), deterministic_rows(res.victim)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 9))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after resume"
    assert json.loads((res.victim / "summary.json").read_text())["resumed_from"] >= 4
    # no base weights in the checkpoint: far smaller than the 260K-parameter model's float32 weights x 3
    size = sum(f.stat().st_size for f in (res.full / "checkpoints" / "8").rglob("*") if f.is_file())
    assert size < 260_032 * 4 * 3, size


@pytest.mark.slow
def test_lora_with_share_trunk_trains_the_head_through_the_policy_adapters(make_cfg):
    from jaxppo.trainer.ppo.algorithm import fit
    from jaxppo.trainer.ppo.build import build_run

    cfg = make_cfg("model.lora.rank=2", "critic.share_trunk=true", "trainer.total_steps=2", "trainer.save_every=2",
                   "data.eval_fraction=0")
    run = build_run(cfg, devices=jax.devices()[:1])
    names = _names(run.state.critic)
    assert names and all("_lora_" not in n for n in names)        # a bare value head on the policy's trunk
    head0 = jax.tree.map(np.array, run.state.critic)
    _, state = fit(cfg, run=run)
    assert int(state.nan_total) == 0
    assert max(np.max(np.abs(np.asarray(b) - a)) for a, b in zip(jax.tree.leaves(head0),
                                                                 jax.tree.leaves(state.critic))) > 0
