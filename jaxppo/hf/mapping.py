"""Name and layout mapping between Hugging Face Llama-family tensors and ``jaxppo.models`` parameters.

HF stores ``nn.Linear`` weights as [out, in]; ours are [in, out] with heads split out:
``q_proj.weight [H·hd, D] -> q [D, H, hd]``, ``o_proj.weight [D, H·hd] -> o [H, hd, D]``,
``gate/up_proj.weight [F, D] -> [D, F]``, ``down_proj.weight [D, F] -> [F, D]``.
Per-layer tensors ``model.layers.{i}.*`` fill row ``i`` of our stacked ``model.layers.*`` parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from jaxppo.models.config import LMConfig

# tensors some checkpoints carry that are not parameters (recomputed from the config)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class TensorMap:
    ours: str  # attribute path below the CausalLM, e.g. "model.layers.q"
    hf: str  # HF name; "{i}" is the layer index for per-layer tensors
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    per_layer: bool


def _ident(x):
    return x


def _t(x):
    return np.swapaxes(x, -1, -2)


def tensor_maps(cfg: LMConfig) -> list[TensorMap]:
    """Every tensor a HF checkpoint of ``cfg`` holds, with how it maps onto our parameters."""
    D, H, K, hd, F, V = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)

    def proj_in(heads):  # [heads*hd, D] -> [D, heads, hd]
        return (lambda w: _t(w).reshape(D, heads, hd)), (lambda x: _t(x.reshape(D, heads * hd)))

    q_in, q_out = proj_in(H)
    kv_in, kv_out = proj_in(K)
    maps = [TensorMap("model.embed", "model.embed_tokens.weight", (V, D), _ident, _ident, False),
            TensorMap("model.norm", "model.norm.weight", (D,), _ident, _ident, False)]
    if not cfg.tie_word_embeddings:
        maps.append(TensorMap("lm_head", "lm_head.weight", (V, D), _t, _t, False))
    p = "model.layers.{i}."
    L = "model.layers."
    maps += [
        TensorMap(L + "attn_norm", p + "input_layernorm.weight", (D,), _ident, _ident, True),
        TensorMap(L + "q", p + "self_attn.q_proj.weight", (H * hd, D), q_in, q_out, True),
        TensorMap(L + "k", p + "self_attn.k_proj.weight", (K * hd, D), kv_in, kv_out, True),
        TensorMap(L + "v", p + "self_attn.v_proj.weight", (K * hd, D), kv_in, kv_out, True),
        TensorMap(L + "o", p + "self_attn.o_proj.weight", (D, H * hd),
                  lambda w: _t(w).reshape(H, hd, D), lambda x: _t(x.reshape(H * hd, D)), True),
        TensorMap(L + "mlp_norm", p + "post_attention_layernorm.weight", (D,), _ident, _ident, True),
        TensorMap(L + "gate", p + "mlp.gate_proj.weight", (F, D), _t, _t, True),
        TensorMap(L + "up", p + "mlp.up_proj.weight", (F, D), _t, _t, True),
        TensorMap(L + "down", p + "mlp.down_proj.weight", (D, F), _t, _t, True),
    ]
    if cfg.qkv_bias:
        for name, heads in (("q", H), ("k", K), ("v", K)):
            maps.append(TensorMap(L + name + "_b", p + f"self_attn.{name}_proj.bias", (heads * hd,),
                                  lambda b, h=heads: b.reshape(h, hd), lambda x: x.reshape(-1), True))
    if cfg.o_bias:
        maps.append(TensorMap(L + "o_b", p + "self_attn.o_proj.bias", (D,), _ident, _ident, True))
    if cfg.mlp_bias:
        maps += [TensorMap(L + "gate_b", p + "mlp.gate_proj.bias", (F,), _ident, _ident, True),
                 TensorMap(L + "up_b", p + "mlp.up_proj.bias", (F,), _ident, _ident, True),
                 TensorMap(L + "down_b", p + "mlp.down_proj.bias", (D,), _ident, _ident, True)]
    return maps


def expected_names(cfg: LMConfig) -> dict[str, tuple[TensorMap, int | None]]:
    """HF tensor name -> (its map, layer index or None)."""
    out: dict[str, tuple[TensorMap, int | None]] = {}
    for m in tensor_maps(cfg):
        if m.per_layer:
            for i in range(cfg.num_hidden_layers):
                out[m.hf.format(i=i)] = (m, i)
        else:
            out[m.hf] = (m, None)
    return out


def check_names_and_shapes(cfg: LMConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Raise ValueError naming every missing, unexpected or mis-shaped tensor of a checkpoint.

    ``shapes``: HF name -> shape of what the checkpoint holds. A tied model may also carry
    ``lm_head.weight`` (it must have the embedding's shape); it is not loaded.
    """
    exp = expected_names(cfg)
    problems = []
    missing = sorted(n for n in exp if n not in shapes)
    if missing:
        problems.append(f"missing tensor(s): {_short(missing)}")
    extra = sorted(n for n in shapes if n not in exp and not n.endswith(IGNORED_SUFFIXES)
                   and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    if extra:
        problems.append(f"unexpected tensor(s) for a {cfg.architecture} model with this config: {_short(extra)}")
    for n, (m, _) in exp.items():
        if n in shapes and tuple(shapes[n]) != m.hf_shape:
            problems.append(f"tensor {n!r} has shape {tuple(shapes[n])}, expected {m.hf_shape} from the config")
    if cfg.tie_word_embeddings and "lm_head.weight" in shapes and tuple(shapes["lm_head.weight"]) != (
            cfg.vocab_size, cfg.hidden_size):
        problems.append(f"tensor 'lm_head.weight' has shape {tuple(shapes['lm_head.weight'])}, expected "
                        f"{(cfg.vocab_size, cfg.hidden_size)}")
    if problems:
        raise ValueError(f"{where}: checkpoint does not match its config: " + "; ".join(problems))


def _short(names: list[str], k: int = 8) -> str:
    s = ", ".join(repr(n) for n in names[:k])
    return s + (f" and {len(names) - k} more" if len(names) > k else "")
