"""``LMConfig``: the hashable description of a decoder-only LM (Llama / Qwen2 / Mistral / SmolLM2).

It converts to and from a Hugging Face ``config.json`` dict. Both rope layouts are read: the old one
(``rope_theta`` + ``rope_scaling``) and transformers 5's ``rope_parameters``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

# model_type -> HF class name written to ``architectures``
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_MODES = ("dots", "auto")  # LMConfig.remat's string values (besides true / false)
LOW_PRECISION = ("bfloat16", "float16")  # the 16-bit compute dtypes (unrolled on the CPU, LMConfig.unroll_layers)
AUTO_UNROLL_MAX_LAYERS = 8  # scan_layers="auto" unrolls up to this depth on CPU (compile time grows with depth)


_LAYOUT_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar("layout_backend", default=None)


@contextlib.contextmanager
def layout_backend(backend: str | None):
    """Inside the block, every ``LMConfig`` constructed without a ``backend`` gets ``backend``: its layer stack and
    remat resolve (``resolve_layers``) as on that backend, whatever backend traces it. None: no change. ``jaxppo.plan``
    builds its programs for accelerators this way on simulated CPU devices."""
    token = _LAYOUT_BACKEND.set(backend)
    try:
        yield
    finally:
        _LAYOUT_BACKEND.reset(token)


def resolve_layers(cfg: "LMConfig", backend: str) -> tuple[bool, str | None]:
    """``(unroll, remat_policy)`` of ``cfg``'s layer stack on ``backend`` ("cpu"; any other name is an accelerator:
    "gpu", "tpu"): the one rule behind ``LMConfig.unroll_layers`` and ``LMConfig.remat_policy`` (their docstrings
    give the measurements).

    ``unroll``: ``not scan_layers``; for "auto", True on the CPU when the model has at most
    ``AUTO_UNROLL_MAX_LAYERS`` layers or 16-bit compute (any depth), False on an accelerator.
    ``remat_policy``: None (``remat=False``), "full" (``True``), "dots" (``"dots"``); for "auto", "dots" on the CPU
    for a scanned float32 stack, None everywhere else."""
    cpu = backend == "cpu"
    low = cfg.compute_dtype in LOW_PRECISION
    if cfg.scan_layers == "auto":
        unroll = cpu and (cfg.num_hidden_layers <= AUTO_UNROLL_MAX_LAYERS or low)
    else:
        unroll = not cfg.scan_layers
    if cfg.remat is True:
        policy = "full"
    elif cfg.remat is False:
        policy = None
    elif cfg.remat == "dots":
        policy = "dots"
    else:
        policy = "dots" if cpu and not unroll and not low else None
    return unroll, policy


def default_scan_layers(compute_dtype: str) -> bool | str:
    """``scan_layers`` for a model loaded without one (``hf.load_pretrained``, the trainers' ``lm_config``):
    ``True`` (a scanned stack: compile time independent of depth) for float32 compute, ``"auto"`` for 16-bit
    compute, which unrolls on the CPU at any depth (``LMConfig.unroll_layers`` says why) and scans elsewhere."""
    return "auto" if str(compute_dtype) in LOW_PRECISION else True

# class defaults of transformers' configs, used when a config.json omits the field
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=2048,
                  sliding_window=None),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=32768,
                  sliding_window=None),
    "mistral": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                    max_position_embeddings=4096 * 32, sliding_window=4096),
}


def _freeze(x: Any) -> Any:
    if isinstance(x, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


def _checked_rope_scaling(rs: Any) -> Any:
    """The frozen ``rope_scaling`` mapping with ``rope_type`` (HF's older ``type`` accepted) and the fields that type
    needs; None for "default"."""
    d = dict(rs)
    rtype = d.get("rope_type", d.get("type", "default"))
    if rtype not in ROPE_TYPES:
        raise ValueError(f"LMConfig.rope_scaling: rope_type {rtype!r} is not supported; supported: {ROPE_TYPES}")
    d.pop("type", None)
    d["rope_type"] = rtype
    need = {"linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
            "default": ()}[rtype]
    for key in need:
        if key not in d:
            raise ValueError(f"LMConfig.rope_scaling: rope_type {rtype!r} needs field {key!r}, got {sorted(d)}")
    return None if rtype == "default" else _freeze(d)


@dataclass(frozen=True)
class LMConfig:
    """Shape and numerics of a decoder-only transformer.

    ``architecture`` is the HF ``model_type`` ("llama", "qwen2", "mistral"; SmolLM2 is "llama").
    Qwen2 always has q/k/v biases (no output bias); for llama ``attention_bias`` puts biases on q, k, v
    and o, like transformers. ``eos_token_id`` may be an int or a tuple of ints. ``rope_scaling`` is
    None or a mapping with ``rope_type`` in ("linear", "llama3") and its parameters; it is stored
    as a sorted tuple of pairs so the config stays hashable (read it back with ``rope_scaling_dict``).
    ``sliding_window`` (Mistral): a query attends to keys less than ``sliding_window`` positions back.
    ``scan_layers``: True applies the layer stack with ``lax.scan`` (compile time independent of depth),
    False unrolls it (one program per layer: no per-iteration weight copies or stacked activation buffers,
    per-layer KV buffers in decoding; compile time grows with depth), "auto" (default) = ``unroll_layers``.
    ``backend``: the backend whose rules ``unroll_layers`` and ``remat_policy`` apply (``resolve_layers``); None
    (default): ``jax.default_backend()`` at trace time; constructed inside ``layout_backend(b)``: ``b``. A field, so
    programs traced for another backend's layout are separate entries of jit's cache.
    ``attention``: the self-attention implementation of the forward passes without a cache (``models.attention``:
    "auto", "reference", "xla", "cudnn", "splash", "pallas_gpu"), resolved at trace time for the process's backend
    (``attention_impl``); the KV-cache decode and the shared-prefix layout use the reference einsum.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    architecture: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Any = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: bool | str = False
    scan_layers: bool | str = "auto"
    initializer_range: float = 0.02
    lora: Any = None   # a jaxppo.models.lora.LoraSpec: LoRA adapters on a frozen base (None: full weights)
    backend: str | None = None
    attention: str = "auto"

    def __post_init__(self):
        """Validate and normalise the fields, one small step each (every step raises ``ValueError`` naming the
        field): the layout backend, adapters, architecture, sizes, heads, dtypes, eos ids, rope scaling and the
        layer-stack options."""
        if self.backend is None:
            self._set("backend", _LAYOUT_BACKEND.get())
        self._check_lora()
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"LMConfig.architecture={self.architecture!r} is not supported; "
                             f"supported: {sorted(ARCHITECTURES)}")
        self._check_sizes()
        self._resolve_heads()
        self._resolve_dtypes()
        if isinstance(self.eos_token_id, (list, tuple)):
            self._set("eos_token_id", tuple(int(e) for e in self.eos_token_id))
        if self.rope_scaling is not None:
            self._set("rope_scaling", _checked_rope_scaling(self.rope_scaling))
        self._check_stack_options()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_lora(self) -> None:
        if self.lora is not None:
            from jaxppo.models.lora import LoraSpec
            if not isinstance(self.lora, LoraSpec):
                raise ValueError(f"LMConfig.lora must be a LoraSpec or None, got {type(self.lora).__name__}")

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"LMConfig.{name} must be a positive integer, got {v!r}")

    def _resolve_heads(self) -> None:
        """``num_key_value_heads`` defaults to ``num_attention_heads``, ``head_dim`` to ``hidden / heads``; the heads
        must group evenly and ``head_dim`` be even (rotary embeddings rotate pairs)."""
        if self.num_key_value_heads is None:
            self._set("num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"LMConfig: hidden_size={self.hidden_size} is not divisible by "
                                 f"num_attention_heads={self.num_attention_heads}; set head_dim")
            self._set("head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LMConfig: num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LMConfig.head_dim={self.head_dim} must be even for rotary embeddings")

    def _resolve_dtypes(self) -> None:
        for name in ("param_dtype", "compute_dtype"):
            raw = getattr(self, name)
            v = raw if isinstance(raw, str) else np.dtype(raw).name
            if v not in DTYPES:
                raise ValueError(f"LMConfig.{name}={raw!r}; expected one of {DTYPES}")
            self._set(name, v)

    def _check_stack_options(self) -> None:
        s = self.scan_layers
        if s not in (True, False, "auto") or isinstance(s, (int, float)) and not isinstance(s, bool):
            raise ValueError(f"LMConfig.scan_layers must be true, false or 'auto', got {s!r}")
        if not (isinstance(self.remat, bool) or self.remat in REMAT_MODES):
            raise ValueError(f"LMConfig.remat must be true, false, 'dots' or 'auto', got {self.remat!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"LMConfig.sliding_window must be >= 1 or None, got {self.sliding_window}")
        from jaxppo.models.attention import IMPLEMENTATIONS
        if self.attention not in IMPLEMENTATIONS:
            raise ValueError(f"LMConfig.attention must be one of {IMPLEMENTATIONS}, got {self.attention!r}")

    # ---------------------------------------------------------------- derived
    @property
    def rope_scaling_dict(self) -> dict | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def unroll_layers(self) -> bool:
        """Whether the layer stack is unrolled: ``not scan_layers``; for "auto", True when the layout's backend
        (``backend``; None: the default JAX backend, read at trace time) is the CPU and either the model has at most
        ``AUTO_UNROLL_MAX_LAYERS`` layers or its compute dtype is 16-bit (any depth).

        16-bit compute on the CPU: XLA:CPU (jax 0.10.2) has no bfloat16 ``dynamic-update-slice``, so inside a
        scanned stack every 16-bit residual the backward needs (activations, the layer's cast weights), and every
        16-bit stacked gradient, is written per iteration as convert(whole [L, ...] buffer) -> float32 update ->
        convert back: a cost that grows with L per layer. Measured (``benchmarks/model_dtype_pair.py``,
        ``results/model_dtype_pair_layouts.json``; ``benchmarks/cpu.md``, "model"),
        SmolLM2-135M shape, 30 layers, 8x128 fwd+bwd, one process, medians: bf16 scanned 6.25 s, unrolled 4.00 s
        (compile + first call 10.8 s vs 15.8 s); float32 scanned 6.90 s, unrolled 6.75 s (no gain worth the
        longer compile), so deep float32 models keep the scan; shallow float32 models (compile times equal at a few
        layers) unroll.
        """
        return resolve_layers(self, self._backend())[0]

    @property
    def remat_policy(self) -> str | None:
        """What the backward pass recomputes per layer on the layout's backend (``backend``; None: the default JAX
        backend, read at trace time): None (nothing: every activation the backward needs is saved), "full"
        (``remat=True``: only each layer's input is saved, the whole layer is recomputed) or "dots" (``remat="dots"``:
        the outputs of the matrix products are saved, the elementwise ops between them (RMSNorm, RoPE, masking,
        softmax, SiLU) are recomputed; ``jax.checkpoint_policies.dots_saveable``).

        "auto" is "dots" where it was measured faster: the CPU backend, a scanned stack (``unroll_layers`` False) and
        float32 compute. There, XLA:CPU allocates every update's buffers afresh, each first touch of a 4 KiB page
        is a page fault, and saving only the products halves the memory an update touches: the SmolLM2-135M-shaped
        fwd+bwd at 8x128 took less time and a third less peak memory (``benchmarks/cpu.md``, the peers A/B table; the
        records ``results/peers_float32.json``).
        Unrolled 16-bit stacks got slower with it, and accelerators were not measured: None there.
        """
        return resolve_layers(self, self._backend())[1]

    def attention_impl(self, seq_len: int, backend: str | None = None) -> str:
        """The implementation ``attention`` stands for in a forward over ``seq_len`` slots on ``backend`` (None: the
        process's, ``jax.default_backend()``): ``models.attention.resolve`` with the compute dtype, head dim, sliding
        window and the process's device count (a ValueError for a fused kernel the backend or shapes cannot run).
        A layout traced for another backend (``backend`` field set and not the process's: ``jaxppo.plan`` on
        simulated devices) takes what ``auto`` is on the process's backend, the program that compiles there."""
        import jax

        from jaxppo.models.attention import resolve
        here = backend or jax.default_backend()
        name = "auto" if self.backend is not None and self.backend != here else self.attention
        return resolve(name, here, dtype=self.compute_dtype,
                       head_dim=self.head_dim, seq_len=seq_len, sliding_window=self.sliding_window,
                       devices=jax.device_count())

    def _backend(self) -> str:
        if self.backend is not None:
            return self.backend
        import jax
        return jax.default_backend()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        return () if e is None else (e,) if isinstance(e, int) else tuple(e)

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.architecture == "llama" and self.attention_bias

    def replace(self, **kw) -> "LMConfig":
        return dataclasses.replace(self, **kw)

    def inv_freq(self) -> np.ndarray:
        """Rotary inverse frequencies ``theta^(-2i/d)`` (float32, [head_dim/2]), with rope scaling applied.

        linear: ``inv_freq / factor``. llama3: wavelengths ``2π/f`` above ``L/low_freq_factor`` are divided
        by ``factor``, below ``L/high_freq_factor`` kept, and in between interpolated with
        ``s = (L/wavelen - low)/(high - low)``: ``(1-s)·f/factor + s·f`` (L = original context length).
        """
        d = self.head_dim
        inv = (1.0 / (np.float32(self.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
        inv = inv.astype(np.float32)
        rs = self.rope_scaling_dict
        if rs is None:
            return inv
        if rs["rope_type"] == "linear":
            return (inv / np.float32(rs["factor"])).astype(np.float32)
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, smoothed, out).astype(np.float32)

    # ---------------------------------------------------------------- HF conversion
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> "LMConfig":
        """Build from a HF ``config.json`` dict; ``overrides`` set non-HF fields (dtypes, remat, ...).

        Raises ValueError naming the field for unsupported architectures, activations or rope types
        and for missing required fields.
        """
        mt = hf.get("model_type")
        if mt not in ARCHITECTURES:
            archs = hf.get("architectures")
            raise ValueError(f"config.json: model_type={mt!r} (architectures={archs}) is not supported; "
                             f"supported model_type values: {sorted(ARCHITECTURES)}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json: hidden_act={act!r} is not supported (only 'silu')")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if hf.get(k) is None]
        if missing:
            raise ValueError(f"config.json is missing required field(s) {missing}")
        if mt == "qwen2" and hf.get("use_sliding_window", False):
            raise ValueError("config.json: use_sliding_window=true (per-layer sliding window) is not supported "
                             "for qwen2")
        dflt = _HF_DEFAULTS[mt]
        rope = hf.get("rope_parameters")
        theta = hf.get("rope_theta")
        scaling = hf.get("rope_scaling")
        if isinstance(rope, Mapping):
            rope = dict(rope)
            theta = rope.pop("rope_theta", theta)
            scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
        if isinstance(scaling, Mapping) and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        if hf.get("partial_rotary_factor", 1.0) not in (1, 1.0, None):
            raise ValueError(f"config.json: partial_rotary_factor={hf['partial_rotary_factor']} is not supported")
        sliding = hf.get("sliding_window", dflt["sliding_window"]) if mt == "mistral" else None
        kw = dict(
            architecture=mt,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=int(hf["num_attention_heads"]),
            num_key_value_heads=hf.get("num_key_value_heads"),
            head_dim=hf.get("head_dim"),
            rms_norm_eps=float(hf.get("rms_norm_eps", dflt["rms_norm_eps"])),
            rope_theta=float(theta if theta is not None else dflt["rope_theta"]),
            rope_scaling=scaling,
            attention_bias=bool(hf.get("attention_bias", False)) if mt == "llama" else mt == "qwen2",
            mlp_bias=bool(hf.get("mlp_bias", False)) if mt == "llama" else False,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", dflt["tie_word_embeddings"])),
            max_position_embeddings=int(hf.get("max_position_embeddings") or dflt["max_position_embeddings"]),
            sliding_window=sliding,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )
        kw.update(overrides)
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` dict that transformers' ``AutoConfig`` reads back to the same model."""
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope.update(self.rope_scaling_dict)
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "initializer_range": self.initializer_range,
            "dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.architecture == "llama":
            out["attention_bias"] = self.attention_bias
            out["mlp_bias"] = self.mlp_bias
        if self.architecture == "mistral":
            out["sliding_window"] = self.sliding_window
        if self.architecture == "qwen2":
            out["use_sliding_window"] = False
            out["sliding_window"] = None
        return out
