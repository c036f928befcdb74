"""LoRA export: hf/ (merged) and hf/adapter/ (PEFT's format) load in transformers / peft with our logits."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxppo.hf import load_pretrained, save_pretrained
from jaxppo.models.adapters import attach_lora, reference_adapters, split_frozen
from jaxppo.models.lora import LoraSpec
from tests.hf.tiny import hf_logits, left_padded_batch, save_hf_model


@pytest.mark.parametrize("family,targets", [("llama", ("q", "k", "v", "o", "gate", "up", "down")),
                                            ("qwen2", ("q", "v", "down"))])
def test_merged_and_peft_adapter_match_our_adapter_forward(family, targets, tmp_path):
    import transformers
    from peft import PeftModel

    save_hf_model(family, tmp_path / "src")
    lm = attach_lora(load_pretrained(tmp_path / "src"), LoraSpec(rank=4, alpha=8.0, targets=targets), seed=0)
    rng = np.random.default_rng(0)
    for t in targets:   # B = 0 would make any export look right
        var = getattr(lm.model.layers, f"{t}_lora_b")
        var.set_value(jnp.asarray(rng.normal(0, 0.3, var.get_value().shape), jnp.float32))
    ids, mask = left_padded_batch(lm.config.vocab_size, seed=2)
    real = mask.astype(bool)
    ours = np.asarray(lm(jnp.asarray(ids), jnp.asarray(mask)))
    gd, trainable, base = split_frozen(lm)
    base_logits = np.asarray(nnx.merge(gd, reference_adapters(trainable), base)(jnp.asarray(ids), jnp.asarray(mask)))
    assert np.max(np.abs(ours[real] - base_logits[real])) > 1e-2

    save_pretrained(nnx.merge(gd, reference_adapters(trainable), base), tmp_path / "base")   # adapters off
    save_pretrained(lm, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).float().eval()
    assert np.max(np.abs(hf_logits(merged, ids, mask)[real] - ours[real])) < 1e-4
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).float().eval()
    assert np.max(np.abs(hf_logits(hf_base, ids, mask)[real] - base_logits[real])) < 1e-4
    peft_model = PeftModel.from_pretrained(hf_base, str(tmp_path / "hf" / "adapter")).eval()
    keys = set(peft_model.state_dict())
    assert "base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight" in keys
    assert np.max(np.abs(hf_logits(peft_model, ids, mask)[real] - ours[real])) < 1e-4
