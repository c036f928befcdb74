"""``critic.model_path``: a GAE critic whose trunk starts from its own checkpoint (not a copy of the policy)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxppo.config import ConfigError
from jaxppo.trainer.ppo.abstract import abstract_core
from jaxppo.trainer.ppo.build import build_run
from jaxppo.trainer.ppo.critic import check_critic_vocab

STORIES_VOCAB = 512


def _critic_checkpoint(path: Path, vocab: int) -> Path:
    """A random 2-layer Llama (hidden 32, unlike stories260K's 64) saved as a HF folder with ``vocab`` tokens."""
    import torch
    import transformers

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).float().save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def critic_dir(tmp_path_factory) -> Path:
    return _critic_checkpoint(tmp_path_factory.mktemp("critic"), STORIES_VOCAB)


def test_critic_trunk_is_loaded_from_its_checkpoint_trains_and_matches_the_plan(make_cfg, tmp_path, critic_dir,
                                                                               stories_model):
    from safetensors.numpy import load_file

    from jaxppo.trainer.mesh import mesh_from_config
    from jaxppo.trainer.ppo.algorithm import fit

    cfg = make_cfg(f"critic.model_path={critic_dir}", "trainer.total_steps=3", "trainer.save_every=3", "model.remat=dots",
                   "data.eval_fraction=0")
    run = build_run(cfg, devices=jax.devices()[:1])
    critic = nnx.merge(run.critic_gd, run.state.critic)
    actor = run.policy()
    assert (critic.config.hidden_size, actor.config.hidden_size) == (32, 64)
    # the critic's trunk holds the checkpoint's weights (not the policy's), and the run's model settings
    embed = load_file(str(critic_dir / "model.safetensors"))["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(critic.model.embed[...]), embed)
    assert critic.config.remat == actor.config.remat == cfg.model.remat == "dots"
    assert critic.config.compute_dtype == actor.config.compute_dtype

    # the memory plan builds the same critic (structure, shapes, LMConfig: remat included)
    mesh, rules = mesh_from_config(cfg.mesh, jax.devices()[:1])
    hf = lambda p: json.loads((Path(p) / "config.json").read_text())
    core, _, critic_gd, _ = abstract_core(cfg, mesh, rules, hf(stories_model), critic_hf_config=hf(critic_dir),
                                          prompt_len=run.train["prompt_ids"].shape[1],
                                          response_len=run.train["response_ids"].shape[1])
    planned = nnx.merge(critic_gd, core.state.critic)
    assert planned.config == critic.config
    shapes = lambda t: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), t)
    assert shapes(core.state.critic) == shapes(run.state.critic)

    before = jax.tree.map(np.asarray, run.state.critic)
    summary, final = fit(cfg, run=run)
    assert summary["steps"] == 3
    after = jax.tree.map(np.asarray, final.critic)
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))]
    assert all(moved), "every critic parameter (trunk and value head) gets updates"
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))


def test_a_critic_with_a_smaller_vocabulary_is_refused(make_cfg, tmp_path):
    small = _critic_checkpoint(tmp_path / "small_vocab", 97)
    with pytest.raises(ConfigError, match=r"critic.model_path: its vocabulary has 97 tokens, fewer than model.path's 512"):
        build_run(make_cfg(f"critic.model_path={small}"), devices=jax.devices()[:1])


def test_check_critic_vocab_by_hand():
    check_critic_vocab(512, 512)
    check_critic_vocab(640, 512)    # a padded embedding table reads every policy id
    with pytest.raises(ConfigError, match="511 tokens, fewer than model.path's 512"):
        check_critic_vocab(511, 512)
