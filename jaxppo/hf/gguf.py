"""Read a llama.cpp ``.gguf`` file as HF-named tensors in HF layout (dequantized with the ``gguf`` package).

Names: ``token_embd`` -> ``model.embed_tokens``, ``blk.{i}.attn_q`` -> ``model.layers.{i}.self_attn.q_proj``,
``ffn_gate`` -> ``mlp.gate_proj``, ``attn_norm`` -> ``input_layernorm``, ``ffn_norm`` ->
``post_attention_layernorm``, ``output_norm`` -> ``model.norm``, ``output`` -> ``lm_head`` (absent when tied).

llama.cpp's converter permutes the rows of Llama's ``q_proj``/``k_proj`` (weights and biases) from
HF's half-split rotary layout to interleaved pairs: ``W.reshape(n, 2, r/(2n), ...).swapaxes(1, 2)``
with ``n`` the head count of that projection. ``get`` applies the inverse,
``W.reshape(n, r/(2n), 2, ...).swapaxes(1, 2).reshape(W.shape)``. Qwen2 GGUFs are not permuted.
Tensors are dequantized one at a time, when asked for.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

_LAYER_PARTS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# GGUF general.architecture -> HF model_type, and whether q/k rows are permuted for rotary
SUPPORTED = {"llama": ("llama", True), "qwen2": ("qwen2", False)}


def hf_name(gguf_name: str) -> str | None:
    """HF tensor name of a GGUF tensor name (None when it has no HF counterpart)."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_PARTS:
        return f"model.layers.{parts[1]}.{_LAYER_PARTS[parts[2]]}.{suffix}"
    return None


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved pairs -> half-split), rows = first axis."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute a tensor with {rows} rows for {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _TruncatedTensor(ValueError):
    """A tensor whose data runs past the end of the file (raised while the reader lists the tensors)."""


def _checked_reader(base: type) -> type:
    """``base`` (gguf's ``GGUFReader``) with a check run before it maps the tensors: a tensor whose data runs past
    the end of the file is a :class:`_TruncatedTensor` naming the file and the tensor (the reader alone fails with a
    reshape error that names neither)."""

    class Checked(base):
        def _build_tensors(self, start_offs, fields):
            from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

            size = len(self.data)
            for f in fields:
                try:
                    _, name_data, _, dims, raw_dtype, offset = f.parts
                    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
                    end = int(start_offs) + int(offset[0]) + math.prod(int(d) for d in dims) * type_size // block
                    name = bytes(name_data).decode("utf-8", "replace")
                except Exception:  # noqa: BLE001,S112 - an entry this check cannot read: the reader reports it
                    continue
                if end > size:
                    raise _TruncatedTensor(
                        f"{self._jaxppo_path}: the GGUF file is truncated: it has {size} bytes but tensor {name!r} "
                        f"(shape {tuple(int(d) for d in reversed(dims.tolist()))}) needs bytes up to {end} "
                        "(an incomplete download or copy? fetch the file again)")
            return super()._build_tensors(start_offs, fields)

        def __init__(self, path, *args, **kwargs):
            self._jaxppo_path = path
            super().__init__(path, *args, **kwargs)

    return Checked


class GGUFSource:
    """A ``.gguf`` file seen as a ``TensorSource`` (``config_dict``, ``shapes``, ``get``)."""

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {self.path} does not exist")
        try:
            self._reader = _checked_reader(GGUFReader)(str(self.path))
        except _TruncatedTensor as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # the gguf package raises plain ValueError/struct errors on bad files
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                magic = fh.read(4)
            if magic == b"GGUF":
                short = re.search(r"cannot reshape array of size (\d+) into shape \(([\d, ]+)\)", str(e))
                if short and int(short[1]) < math.prod(int(v) for v in short[2].split(",") if v.strip()):
                    raise ValueError(f"{self.path}: the GGUF file is truncated: it has {size} bytes and a tensor "
                                     f"of shape ({short[2]}) finds only {short[1]} of its values (an incomplete "
                                     "download or copy? fetch the file again)") from None
                raise ValueError(f"{self.path}: the GGUF file is truncated or damaged ({size} bytes; the GGUF reader "
                                 f"failed: {e}); an incomplete download or copy? fetch the file again") from None
            raise ValueError(f"{self.path}: not a readable GGUF file ({e})") from None
        self._fields = self._reader.fields
        self._check_complete()
        arch = self._field("general.architecture")
        if arch not in SUPPORTED:
            raise ValueError(f"{self.path}: general.architecture={arch!r} is not supported; "
                             f"supported GGUF architectures: {sorted(SUPPORTED)}")
        self.arch = arch
        self.model_type, self.permuted = SUPPORTED[arch]
        self._tensors = {}
        unknown = []
        for t in self._reader.tensors:
            name = hf_name(t.name)
            if name is None:
                unknown.append(t.name)
            else:
                self._tensors[name] = t
        if unknown:
            hint = " (rope_freqs: llama3 rope scaling baked into a tensor is not supported from GGUF)" \
                if any(u.startswith("rope_freqs") for u in unknown) else ""
            raise ValueError(f"{self.path}: GGUF tensor(s) with no Hugging Face counterpart: {unknown[:8]}{hint}")
        self._config = self._build_config()

    def _check_complete(self) -> None:
        """ValueError naming the file when a tensor's data runs past its end (a truncated file, e.g. an
        interrupted download): the reader maps such a tensor to fewer bytes than its shape needs."""
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size or t.data.nbytes < int(t.n_bytes):
                raise ValueError(f"{self.path}: the GGUF file is truncated: it has {size} bytes but tensor "
                                 f"{t.name!r} needs bytes up to {end} (an incomplete download or copy? fetch the "
                                 "file again)")

    def _field(self, key: str, default=None):
        f = self._fields.get(key)
        return default if f is None else f.contents()

    def _build_config(self) -> dict:
        a = self.arch
        need = {k: self._field(f"{a}.{k}") for k in ("embedding_length", "feed_forward_length", "block_count",
                                                     "attention.head_count")}
        missing = [f"{a}.{k}" for k, v in need.items() if v is None]
        if missing:
            raise ValueError(f"{self.path}: GGUF metadata is missing {missing}")
        heads = int(need["attention.head_count"])
        kv = int(self._field(f"{a}.attention.head_count_kv", heads))
        hidden = int(need["embedding_length"])
        emb = self._tensors.get("model.embed_tokens.weight")
        vocab = self._field(f"{a}.vocab_size")
        if vocab is None:
            tokens = self._fields.get("tokenizer.ggml.tokens")
            vocab = len(tokens.data) if tokens is not None else (int(emb.shape[-1]) if emb is not None else None)
        scaling = self._field(f"{a}.rope.scaling.type")
        rope_scaling = None
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise ValueError(f"{self.path}: {a}.rope.scaling.type={scaling!r} is not supported")
            rope_scaling = {"rope_type": "linear", "factor": float(self._field(f"{a}.rope.scaling.factor"))}
        cfg = {
            "model_type": self.model_type,
            "architectures": ["Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"],
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(need["feed_forward_length"]),
            "num_hidden_layers": int(need["block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": int(self._field(f"{a}.attention.key_length", hidden // heads)),
            "hidden_act": "silu",
            "rms_norm_eps": float(self._field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._field(f"{a}.rope.freq_base", 10000.0)),
            "rope_scaling": rope_scaling,
            "max_position_embeddings": int(self._field(f"{a}.context_length", 2048)),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "bos_token_id": self._field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self._field("tokenizer.ggml.eos_token_id"),
            "pad_token_id": self._field("tokenizer.ggml.padding_token_id"),
        }
        if self.model_type == "llama":
            cfg["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in self._tensors
        return cfg

    def config_dict(self) -> dict:
        return dict(self._config)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        # GGUF lists dimensions fastest-first; numpy/HF order is the reverse
        return {n: tuple(int(s) for s in reversed(t.shape)) for n, t in self._tensors.items()}

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` (HF name) dequantized to float32 in HF layout."""
        from gguf import quants

        t = self._tensors[name]
        arr = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = self.shapes()[name]
        arr = arr.reshape(shape)
        if self.permuted and (".self_attn.q_proj." in name or ".self_attn.k_proj." in name):
            heads = self._config["num_attention_heads"] if ".q_proj." in name else self._config["num_key_value_heads"]
            arr = unpermute_rotary(arr, heads)
        return arr
