"""LoRA adapters in PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

``peft.PeftModel.from_pretrained(base, dir)`` loads them onto the base model in ``transformers``. Names and layouts
(PEFT's Llama / Qwen2 / Mistral keys; HF's ``nn.Linear`` is ``y = x·Wᵀ``)::

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight   [r, in]  = A_i ᵀ
    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_B.weight   [out, r] = B_i (r, out flattened) ᵀ
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight

with ``lora_alpha = alpha``, ``r = rank`` (PEFT's scale ``alpha / r``, ours), our flattening of ``out`` (heads, then
head_dim) being HF's row order (``hf.mapping``). The base is the model with the adapters off (``hf/`` holds the
merged model; a quantized base is written dequantized by ``save_pretrained`` of the base, not here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxppo.hf.safetensors_io import save_file
from jaxppo.models.transformer import CausalLM
from jaxppo.parallel.host import is_main_process, to_host

HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
              "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def peft_tensor_names(lm: CausalLM) -> dict[str, tuple[str, str, int]]:
    """PEFT key -> (our target, "a" | "b", layer) for every adapter tensor of ``lm``."""
    spec = lm.config.lora
    out = {}
    for i in range(lm.config.num_hidden_layers):
        for t in spec.targets:
            stem = f"base_model.model.model.layers.{i}.{HF_MODULES[t]}"
            out[f"{stem}.lora_A.weight"] = (t, "a", i)
            out[f"{stem}.lora_B.weight"] = (t, "b", i)
    return out


def save_adapter(lm: CausalLM, out_dir: str | Path, *, base_model: str | None = None) -> Path:
    """Write ``lm``'s adapters (float32) to ``out_dir`` in PEFT's LoRA format; returns ``out_dir``."""
    spec = lm.config.lora
    if spec is None:
        raise ValueError("save_adapter: the model has no adapters (LMConfig.lora is None)")
    layers = lm.model.layers
    names = peft_tensor_names(lm)

    def array(name):
        t, which, i = names[name]
        x = np.asarray(to_host(getattr(layers, f"{t}_lora_{which}").get_value()[i]), np.float32)
        return x.T if which == "a" else x.reshape(x.shape[0], -1).T     # [r, in] / [out, r]

    shapes = {}
    for name, (t, which, _) in names.items():
        s = getattr(layers, f"{t}_lora_{which}").get_value().shape   # [L, in, r] / [L, r, *out]
        shapes[name] = (s[2], s[1]) if which == "a" else (int(np.prod(s[2:])), s[1])
    out = Path(out_dir)
    if not is_main_process():
        for n in names:
            array(n)
        return out
    out.mkdir(parents=True, exist_ok=True)
    save_file([(n, shapes[n], np.dtype(np.float32)) for n in names], array, out / "adapter_model.safetensors",
              {"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model, "r": spec.rank,
        "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "target_modules": sorted(
            HF_MODULES[t].split(".")[-1] for t in spec.targets), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {}, "revision": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


__all__ = ["HF_MODULES", "peft_tensor_names", "save_adapter"]
