"""The policy split (``trainer.policy.split_policy``): full weights or adapters, real or abstract arrays."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxppo.models import CausalLM
from jaxppo.models.adapters import attach_lora
from jaxppo.models.lora import LoraSpec
from jaxppo.parallel import make_mesh, merged_rules
from jaxppo.trainer.policy import PolicyRun, split_policy
from tests.models.tiny_lm import tiny_config, tiny_lm

IDS = np.array([[3, 5, 7, 11]], np.int32)


def _logits(model):
    return np.asarray(model(IDS))


def test_full_weights_reference_is_a_copy():
    lm = tiny_lm()
    pol = split_policy(lm)
    assert pol.base is None and pol.params_of("p") == "p"
    np.testing.assert_array_equal(_logits(pol.reference()), _logits(lm))
    for r, p in zip(jax.tree.leaves(pol.ref_params), jax.tree.leaves(pol.params)):
        assert r is not p and r.unsafe_buffer_pointer() != p.unsafe_buffer_pointer()
    assert pol.reference_weights is pol.ref_params


def test_adapters_reference_is_the_base_with_adapters_off():
    lm = tiny_lm()
    base_logits = _logits(lm)
    pol = split_policy(attach_lora(lm, LoraSpec(rank=2), seed=1))
    assert pol.base is not None and pol.params_of("p") == ("p", pol.base)
    assert all(float(np.abs(x).max()) == 0.0 for x in jax.tree.leaves(pol.ref_params))
    np.testing.assert_allclose(_logits(pol.reference()), base_logits, rtol=0, atol=0)
    assert pol.reference_weights is pol.base


def _shapes(tree):
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)


@pytest.mark.parametrize("spec", [None, LoraSpec(rank=2)])
def test_abstract_split_has_the_real_shapes_and_shardings(spec):
    mesh, rules = make_mesh(1, 1, 1, devices=jax.devices()[:1]), merged_rules(None)
    cfg = tiny_config() if spec is None else tiny_config().replace(lora=spec)
    real = split_policy(CausalLM(cfg, rngs=nnx.Rngs(0)))
    abstract = split_policy(nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0))), mesh=mesh, rules=rules)
    assert _shapes(abstract.params) == _shapes(real.params)
    assert _shapes(abstract.base) == _shapes(real.base)
    assert all(isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None
               for x in jax.tree.leaves((abstract.params, abstract.base)))


def test_policy_run_methods_read_the_state():
    class _State:
        def __init__(self, actor):
            self.actor = actor

    class _Run(PolicyRun):
        def __init__(self, parts, actor):
            self.parts, self.state = parts, _State(actor)

    pol = split_policy(tiny_lm())
    run = _Run(pol, jax.tree.map(lambda x: x * 0.5, pol.params))
    np.testing.assert_array_equal(_logits(run.policy()), _logits(pol.model(run.state.actor)))
    np.testing.assert_array_equal(_logits(run.policy(pol.params)), _logits(pol.reference()))
    assert run.actor_gd is pol.graphdef and run.ref_params is pol.ref_params and run.base is None


def test_load_policy_puts_the_checkpoint_with_its_adapters_on_the_mesh(stories_model):
    from safetensors.numpy import load_file

    from jaxppo.config import load_config
    from jaxppo.hf.from_config import load_tokenizer_of
    from jaxppo.trainer.policy import load_policy

    cfg = load_config(None, [f"model.path={stories_model}", "model.lora.rank=2", "mesh.data=2", "trainer.seed=3"])
    devices = jax.devices()[:2]
    tok = load_tokenizer_of(cfg.model)
    loaded = load_policy(cfg, devices, tokenizer=tok)
    assert loaded.tokenizer is tok and Path(loaded.model_path).resolve() == stories_model.resolve()
    assert dict(loaded.mesh.shape)["data"] == 2 and set(loaded.mesh.devices.flat) == set(devices)
    assert loaded.model.config.lora is not None and loaded.model.config.lora.rank == 2
    # the checkpoint's weights, not an initialisation
    emb = load_file(str(next(stories_model.glob("*.safetensors"))))["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(loaded.model.model.embed.get_value()), emb)
    # the adapters are initialised from trainer.seed: a second load draws the same factors
    again = load_policy(cfg, devices)
    a, b = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (loaded.model, again.model))
    assert len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
    assert again.tokenizer is not tok and again.tokenizer("Once upon")["input_ids"] == tok("Once upon")["input_ids"]
