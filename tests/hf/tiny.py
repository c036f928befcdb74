"""Tiny random transformers models of each supported family, saved as HF directories (test helper)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

torch.set_num_threads(1)

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "llama": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3-rope": (transformers.LlamaConfig, dict(
        tie_word_embeddings=False, head_dim=8,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64))),
    "llama-bias": (transformers.LlamaConfig, dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False)),
    "smollm2": (transformers.LlamaConfig, dict(tie_word_embeddings=True, num_attention_heads=6,
                                               num_key_value_heads=2, hidden_size=48,
                                               rope_parameters=dict(rope_type="default", rope_theta=100000.0))),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=False, rms_norm_eps=1e-6,
                                             rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "mistral": (transformers.MistralConfig, dict(tie_word_embeddings=False, sliding_window=4, head_dim=16)),
}


def make_hf_model(family: str, seed: int = 0):
    """A transformers CausalLM of ``family`` with every parameter random (norms near 1, biases non-zero)."""
    cls, extra = FAMILIES[family]
    cfg = cls(**{**BASE, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def save_hf_model(family: str, path: Path, seed: int = 0):
    model = make_hf_model(family, seed)
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def left_padded_batch(vocab: int, seed: int = 0):
    """ids [3, 9] with rows of 9, 6 and 3 real tokens (left padded with 0) and their mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(3, 9)).astype(np.int32)
    mask = np.ones((3, 9), np.int32)
    mask[1, :3] = 0
    mask[2, :6] = 0
    ids[mask == 0] = 0
    return ids, mask


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers logits with positions from the mask (cumsum - 1), as left-padded generation uses."""
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(pos, dtype=torch.long))
    return out.logits.float().numpy()
