"""Tiny random ``CausalLM``s of each family for model tests (peaked logits: large init std)."""

from __future__ import annotations

import numpy as np
from flax import nnx

from jaxppo.models import CausalLM, LMConfig

BASE = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, initializer_range=0.35, max_position_embeddings=128)
FAMILIES = {
    "llama": dict(architecture="llama"),
    "qwen2": dict(architecture="qwen2"),
    "mistral": dict(architecture="mistral", sliding_window=3),
    "smollm2": dict(architecture="llama", tie_word_embeddings=True, rope_theta=100000.0),
}


def tiny_config(family: str = "llama", **kw) -> LMConfig:
    return LMConfig(**{**BASE, **FAMILIES[family], **kw})


def tiny_lm(family: str = "llama", seed: int = 0, **kw) -> CausalLM:
    model = CausalLM(tiny_config(family, **kw), rngs=nnx.Rngs(seed))
    if tiny_config(family, **kw).qkv_bias:  # biases start at zero: make them matter
        rng = np.random.default_rng(seed)
        for name in ("q_b", "k_b", "v_b"):
            var = getattr(model.model.layers, name)
            var.set_value(var.get_value() + rng.normal(0, 0.3, var.get_value().shape).astype(np.float32))
    return model


def left_padded_prompts(vocab: int, lengths=(7, 4, 1), width: int = 7, seed: int = 0):
    """ids/mask [len(lengths), width], row b has ``lengths[b]`` real tokens at the right end (pad 0)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), np.int32)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = rng.integers(3, vocab, size=n)
        mask[b, width - n:] = 1
    return ids, mask
