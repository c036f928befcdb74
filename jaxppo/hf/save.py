"""Export a ``CausalLM`` as a Hugging Face directory: ``config.json`` + safetensors (+ tokenizer files).

Tensors are gathered to the host one at a time and streamed into the file; with
``max_shard_bytes`` the weights are split into ``model-0000k-of-0000n.safetensors`` files plus a
``model.safetensors.index.json``, as transformers writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxppo.hf.load import _resolve
from jaxppo.hf.mapping import expected_names
from jaxppo.hf.peft import save_adapter
from jaxppo.hf.safetensors_io import save_file
from jaxppo.models.adapters import merged_model
from jaxppo.models.transformer import CausalLM
from jaxppo.parallel.host import is_main_process, to_host


def save_pretrained(model: CausalLM, out_dir: str | Path, tokenizer=None, *,
                    max_shard_bytes: int = 5 * 2 ** 30) -> Path:
    """Write ``model`` (weights in its parameter dtype) to ``out_dir`` for ``AutoModelForCausalLM``; a model with
    LoRA adapters is written merged (``jaxppo.models.adapters.merged_model``), and its adapters alone in PEFT's
    format under ``out_dir/adapter`` (``jaxppo.hf.peft``).

    ``tokenizer``: a transformers tokenizer whose files are saved alongside. Returns ``out_dir``.

    Several processes (``jax.distributed``): call it on every process; each tensor is all-gathered in the
    same order everywhere and only process 0 writes files.
    """
    if not isinstance(model, CausalLM):
        raise TypeError(f"save_pretrained expects a jaxppo CausalLM, got {type(model).__name__}")
    adapted = model if model.config.lora is not None else None
    model = merged_model(model)   # adapters (LMConfig.lora): W + s·A·B, the model transformers loads
    out = Path(out_dir)
    main = is_main_process()
    if main:
        out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    entries = []  # (hf name, shape, dtype, map, layer)
    for name, (m, layer) in expected_names(cfg).items():
        var = _resolve(model, m.ours)
        dt = np.dtype(var.get_value().dtype)
        entries.append((name, m.hf_shape, dt, m, layer))
    by_name = {e[0]: e for e in entries}

    def produce(name):
        _, _, dt, m, layer = by_name[name]
        value = _resolve(model, m.ours).get_value()
        arr = to_host(value[layer] if layer is not None else value)
        return np.ascontiguousarray(m.to_hf(arr)).astype(dt, copy=False)

    shards: list[list] = [[]]
    size = 0
    for e in entries:
        nbytes = int(np.prod(e[1])) * e[2].itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += nbytes
    if not main:  # take part in the gathers (collectives), in the file order process 0 uses; write nothing
        for group in shards:
            for e in group:
                produce(e[0])
        return out
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()
    if len(shards) == 1:
        save_file([(e[0], e[1], e[2]) for e in shards[0]], produce, out / "model.safetensors", {"format": "pt"})
    else:
        n = len(shards)
        weight_map = {}
        total = 0
        for k, group in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{n:05d}.safetensors"
            save_file([(e[0], e[1], e[2]) for e in group], produce, out / fname, {"format": "pt"})
            for e in group:
                weight_map[e[0]] = fname
                total += int(np.prod(e[1])) * e[2].itemsize
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    gen = {k: v for k, v in (("bos_token_id", cfg.bos_token_id), ("pad_token_id", cfg.pad_token_id),
                             ("eos_token_id", list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else
                              cfg.eos_token_id)) if v is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    if adapted is not None:   # and the adapters alone, for PEFT on the base (hf.peft)
        save_adapter(adapted, out / "adapter")
    return out
