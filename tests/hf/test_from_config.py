"""The policy model of a config's model section (``hf.from_config``): loaded and abstract agree."""

from __future__ import annotations

import json

import jax
import pytest
from flax import nnx

from jaxppo.config import load_config
from jaxppo.hf.from_config import abstract_model, load_model, load_tokenizer_of


def _shapes(model):
    return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), nnx.state(model))


@pytest.mark.parametrize("lora", ["0", "4"])
def test_abstract_model_has_the_loaded_models_shapes(stories_model, lora):
    cfg = load_config(None, [f"model.path={stories_model}", f"model.lora.rank={lora}"])
    loaded = load_model(cfg.model, adapters_seed=0)
    abstract = abstract_model(json.loads((stories_model / "config.json").read_text()), cfg.model)
    assert (loaded.config.lora is None) == (lora == "0")
    assert _shapes(abstract) == _shapes(loaded)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(abstract)))


def test_no_adapters_without_a_seed(stories_model):
    cfg = load_config(None, [f"model.path={stories_model}", "model.lora.rank=4"])
    assert load_model(cfg.model).config.lora is None
    assert load_tokenizer_of(cfg.model).get_vocab()
