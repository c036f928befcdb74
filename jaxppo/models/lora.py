"""LoRA adapters on the stacked per-layer projections of :mod:`jaxppo.models.transformer`.

A target projection ``W`` (stacked ``[L, *in, *out]``, e.g. ``q`` ``[L, D, H, hd]``, ``o`` ``[L, H, hd, D]``)
gets two stacked low-rank factors, applied per layer inside the same ``lax.scan`` (or unrolled loop) as ``W``::

    A [L, in, r]  ~ N(0, 1/r²)      (``in`` = the product of W's input dims)
    B [L, r, *out] = 0
    y = x·W + s · (x·A)·B           s = alpha / r

so at initialisation the adapted model equals the base exactly (B = 0), and the merged weight
``W' = W + s · A·B`` (reshaped to W's shape) gives the same output as the adapter forward.

Adapter dropout (``LoraSpec.dropout = p``, :mod:`jaxppo.models.lora_dropout`, PEFT's ``lora_dropout``) replaces
``x`` by ``x ⊙ ξ / (1 − p)`` (``ξ ~ Bernoulli(1 − p)``) in the adapter branch only, ``y = x·W + s · (drop(x)·A)·B``,
and only when the model is called with an explicit ``lora_key`` -- which the trainers pass in their update's loss and
nowhere else (evaluation, reference / behaviour log-probs, the prepare pass and the merged export run without it).

The factors are :class:`LoRAParam` variables (a subclass of ``nnx.Param``: filters that select ``nnx.Param``
see them too; ``nnx.split(model, LoRAParam, ...)`` separates them from the frozen base). Inside the layer the
factor arrays travel in the per-layer parameter dict under ``"<target>_lora_a"`` / ``"<target>_lora_b"``
(``B`` already multiplied by ``s``), where :func:`jaxppo.models.layers.linear` reads them.

We do not use qwix (``qwix.LoraProvider``) or ``nnx.LoRA`` here: both attach adapters to module call sites
(``nnx.Linear`` / ``nnx.Einsum`` / intercepted ``dot_general`` under a module path), while our seven projections
are slices of stacked arrays used by plain functions inside one ``DecoderLayers`` module under ``lax.scan``
(README, "Adapters"; docs/design.md).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo.models.layers import dense

TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
# number of leading (after the layer axis) input dims of each target's stacked weight; the rest are outputs
_N_IN = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


class LoRAParam(nnx.Param):
    """A trainable adapter factor (the base weights stay plain ``nnx.Param``)."""


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Adapter hyper-parameters: ``rank`` r ≥ 1, ``alpha`` (scale ``s = alpha / r``), ``targets`` (a subset of
    :data:`TARGETS`), ``dropout`` on the adapter input (0 ≤ p < 1; training passes only, module doc),
    ``quantize_base`` (QLoRA: the seven frozen projections stored as int8 or NF4, dequantized per layer)."""

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS
    dropout: float = 0.0
    quantize_base: str | None = None   # None | "int8" | "nf4": storage of the frozen projections (models.quant)

    def __post_init__(self):
        if self.quantize_base not in (None, "int8", "nf4"):
            raise ValueError(f"LoraSpec.quantize_base must be None, 'int8' or 'nf4', got {self.quantize_base!r}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraSpec.rank must be a positive integer, got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"LoraSpec.alpha must be a finite number > 0, got {self.alpha!r}")
        targets = tuple(self.targets)
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets or len(set(targets)) != len(targets):
            raise ValueError(f"LoraSpec.targets must be distinct names from {list(TARGETS)}, got {list(targets)}")
        if not (0.0 <= self.dropout < 1.0):
            raise ValueError(f"LoraSpec.dropout must be in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "alpha", float(self.alpha))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def spec_from_config(lora_cfg) -> LoraSpec | None:
    """The ``LoraSpec`` of a ``model.lora`` config section (None when its ``rank`` is 0: no adapters)."""
    if lora_cfg is None or int(lora_cfg.rank) == 0:
        return None
    return LoraSpec(rank=int(lora_cfg.rank), alpha=float(lora_cfg.alpha), targets=tuple(lora_cfg.targets),
                    dropout=float(lora_cfg.dropout), quantize_base=lora_cfg.quantize_base)


def adapter_shapes(weight_shapes: dict[str, tuple[tuple[int, ...], tuple[str | None, ...], str]], spec: LoraSpec
                   ) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """``"<t>_lora_a"`` / ``"<t>_lora_b"`` -> (shape, logical axes) for each target ``t`` of ``spec``, from the
    stacked weight table ``transformer.layer_param_shapes`` (``A`` [L, in, r], ``B`` [L, r, *out])."""
    out = {}
    for t in spec.targets:
        shape, axes, _ = weight_shapes[t]
        n_in = _N_IN[t]
        d_in = math.prod(shape[1:1 + n_in])
        in_axis = axes[1] if n_in == 1 else None
        out[f"{t}_lora_a"] = ((shape[0], d_in, spec.rank), ("layers", in_axis, None))
        out[f"{t}_lora_b"] = ((shape[0], spec.rank) + tuple(shape[1 + n_in:]), ("layers", None) + tuple(axes[1 + n_in:]))
    return out


def init_adapters(weight_shapes, spec: LoraSpec, key: jax.Array, dtype) -> dict[str, LoRAParam]:
    """Fresh factors: ``A ~ N(0, 1/r²)`` (PEFT's "gaussian" init), ``B = 0``; one key per target."""
    params = {}
    shapes = adapter_shapes(weight_shapes, spec)
    keys = jax.random.split(key, len(spec.targets))
    for t, k in zip(spec.targets, keys):
        (sa, aa), (sb, ab) = shapes[f"{t}_lora_a"], shapes[f"{t}_lora_b"]
        a = (jax.random.normal(k, sa, jnp.float32) / spec.rank).astype(dtype)
        params[f"{t}_lora_a"] = LoRAParam(a, logical_axes=aa)
        params[f"{t}_lora_b"] = LoRAParam(jnp.zeros(sb, dtype), logical_axes=ab)
    return params


def _per_layer(fn, w: jax.Array):
    """``fn`` of each layer ``w[i]`` of a stacked ``[L, ...]`` weight, jitted, results stacked along a new axis 0:
    the quantizer's float32 temporaries are one layer's (a whole 7B MLP stack in float32 is 7 GiB, more than a
    24 GB card has left next to the loaded weights). Equal to ``fn`` of the stack for the per-row formats here
    (int8 scales per output channel, NF4 blocks along the last axis, never across a layer)."""
    jfn = jax.jit(fn)
    parts = [jfn(w[i]) for i in range(w.shape[0])]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *parts)


def layer_quantizer(name: str, fmt: str):
    """The function that quantizes ONE layer of projection ``name`` in ``fmt``: int8 -> ``Int8Weight`` (scales per
    output channel), nf4 -> ``(packed, absmax)`` along the last axis (``jaxppo.models.quant``)."""
    from jaxppo.models.quant import quantize_int8, quantize_nf4_last

    if fmt == "int8":
        return lambda wi: quantize_int8(wi, n_in=_N_IN[name])
    if fmt == "nf4":
        return quantize_nf4_last
    raise ValueError(f"unknown quantization format {fmt!r}; expected 'int8' or 'nf4'")


def quantize_stacked(weights: dict[str, tuple[jax.Array, tuple]], fmt: str) -> dict[str, nnx.Param]:
    """The stacked projections ``{name: (w [L, *in, *out], logical axes)}`` of :data:`TARGETS` stored in ``fmt``:
    int8 -> ``name`` (int8 codes, w's shape) + ``<name>_scale`` (float32, 1 on the input axes); nf4 ->
    ``name`` (uint8, two codes per byte along the last axis) + ``<name>_absmax`` (float32, one per 64 values)."""
    out = {}
    for name, (w, axes) in weights.items():
        x = _per_layer(layer_quantizer(name, fmt), w)
        if fmt == "int8":
            out[name] = nnx.Param(x.q, logical_axes=axes)
            out[name + "_scale"] = nnx.Param(x.scale, logical_axes=(axes[0],) + (None,) * _N_IN[name]
                                             + tuple(axes[1 + _N_IN[name]:]))
        else:
            packed, absmax = x
            out[name] = nnx.Param(packed, logical_axes=axes)
            out[name + "_absmax"] = nnx.Param(absmax, logical_axes=axes)
    return out


QUANT_SUFFIXES = ("_scale", "_absmax")


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float = 1.0) -> jax.Array:
    """``s · (x·A)·B``: ``x`` [..., in], ``a`` [in, r], ``b`` [r, *out] -> [..., *out] (two thin matmuls)."""
    y = dense(dense(x, a), b)
    return y if scale == 1.0 else y * jnp.asarray(scale, y.dtype)


def merged_weight(w: jax.Array, a: jax.Array, b: jax.Array, scale: float, n_in: int = 1) -> jax.Array:
    """``W + s · A·B`` in ``w``'s shape and dtype (one layer: ``w`` [*in, *out], ``a`` [in, r], ``b`` [r, *out]);
    the product is formed in float32."""
    d_in = math.prod(w.shape[:n_in])
    ab = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32).reshape(b.shape[0], -1))
    delta = (scale * ab).reshape(d_in, *w.shape[n_in:]).reshape(w.shape)
    return (w.astype(jnp.float32) + delta).astype(w.dtype)


def merged_layer_weights(weights: dict[str, jax.Array], adapters: dict[str, jax.Array], spec: LoraSpec
                         ) -> dict[str, jax.Array]:
    """Stacked ``weights`` (``[L, ...]``) with every target merged, ``W'_l = W_l + s·A_l·B_l`` for each layer l."""
    out = dict(weights)
    for t in spec.targets:
        a, b = adapters[f"{t}_lora_a"], adapters[f"{t}_lora_b"]
        out[t] = jax.vmap(lambda w, a_, b_, n=_N_IN[t]: merged_weight(w, a_, b_, spec.scale, n))(weights[t], a, b)
    return out


def param_counts(model: nnx.Module) -> tuple[int, int]:
    """``(trainable adapter parameters, all parameters)`` of ``model``."""
    n_lora = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, LoRAParam)))
    n_all = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return int(n_lora), int(n_all)


__all__ = ["TARGETS", "LoRAParam", "LoraSpec", "adapter_shapes", "init_adapters", "lora_delta",
           "merged_layer_weights", "merged_weight", "param_counts", "quantize_stacked", "spec_from_config"]
