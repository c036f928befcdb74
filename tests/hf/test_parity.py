"""Parity of jaxppo.models with transformers (torch CPU) on tiny random models of every family."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.hf import load_pretrained, save_pretrained
from tests.hf.tiny import FAMILIES, hf_logits, left_padded_batch, save_hf_model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers_with_left_padding(family, tmp_path):
    hf = save_hf_model(family, tmp_path / family)
    ids, mask = left_padded_batch(hf.config.vocab_size)
    expected = hf_logits(hf, ids, mask)
    model = load_pretrained(tmp_path / family)
    got = np.asarray(jax.jit(lambda i, m: model(i, m))(jnp.asarray(ids), jnp.asarray(mask)))
    assert got.dtype == np.float32 and got.shape == expected.shape
    real = mask.astype(bool)
    assert np.max(np.abs(got[real] - expected[real])) < 1e-4
    # the logits are far from trivial (so the bound above means something)
    assert np.std(expected[real]) > 0.1


@pytest.mark.parametrize("family", ["llama", "qwen2", "smollm2"])
def test_export_reloads_in_transformers_with_same_logits(family, tmp_path):
    import transformers
    hf = save_hf_model(family, tmp_path / "src")
    ids, mask = left_padded_batch(hf.config.vocab_size, seed=1)
    model = load_pretrained(tmp_path / "src")
    save_pretrained(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    assert type(back) is type(hf)
    real = mask.astype(bool)
    exported = hf_logits(back, ids, mask)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    assert np.max(np.abs(exported[real] - hf_logits(hf, ids, mask)[real])) < 1e-5
    assert np.max(np.abs(exported[real] - ours[real])) < 1e-4


def test_save_rejects_non_lm(tmp_path):
    from jaxppo.models import ValueModel
    from tests.models.tiny_lm import tiny_lm
    with pytest.raises(TypeError, match="save_pretrained expects a jaxppo CausalLM, got ValueModel"):
        save_pretrained(ValueModel.from_lm(tiny_lm()), tmp_path / "out")
