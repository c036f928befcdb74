"""Models with LoRA adapters on one frozen base: attaching adapters, and the (trainable, frozen) split.

With ``LMConfig.lora`` set, a model's variables fall into two groups:

- trainable: the :class:`~jaxppo.models.lora.LoRAParam` factors and a scalar head (``value_head`` /
  ``score_head``), selected by :data:`TRAINABLE`;
- frozen: everything else (embedding, stacked layer weights, norms, LM head): the *base*.

``nnx.split(model, TRAINABLE, ...)`` gives ``(graphdef, trainable, base)`` and ``nnx.merge(graphdef, trainable,
base)`` the model again, so the trainer keeps ``trainable`` in its state (optimizer, checkpoints) and passes
``base`` to its jitted functions as an argument that is never donated nor updated. The reference policy is
``nnx.merge(graphdef, reference_adapters(trainable), base)`` (adapters off: B = 0; no copy of the weights), and a
critic is a ``ValueModel`` whose trunk is the same base (its ``model`` subtree, :func:`trunk_of`) with its own
adapters and value head. A quantized base (``LoraSpec.quantize_base``) holds int8 / NF4 codes of the seven
projections (``DecoderLayers.quantize``), dequantized one layer at a time inside the layer loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.models.config import LMConfig
from jaxppo.models.heads import ValueModel
from jaxppo.models.layers import weight
from jaxppo.models.lora import LoRAParam, LoraSpec, init_adapters, merged_layer_weights
from jaxppo.models.transformer import CausalLM, layer_param_shapes

HEAD_NAMES = ("value_head", "score_head")
TRAINABLE = nnx.Any(LoRAParam, *(nnx.PathContains(h) for h in HEAD_NAMES))


def attach_lora(lm: CausalLM, spec: LoraSpec, *, seed: int = 0) -> CausalLM:
    """Add fresh adapters (``A ~ N(0, 1/r²)``, ``B = 0``, float32 whatever the base dtype) to a loaded ``CausalLM``
    in place and return it; the base arrays are kept as they are (same buffers). Raises when ``lm`` already has
    adapters."""
    if not isinstance(spec, LoraSpec):
        raise TypeError(f"attach_lora needs a LoraSpec, got {type(spec).__name__}")
    if lm.config.lora is not None:
        raise ValueError("attach_lora: the model already has adapters")
    cfg = lm.config.replace(lora=spec)
    layers = lm.model.layers
    adapters = init_adapters(layer_param_shapes(cfg), spec, jax.random.PRNGKey(seed), jnp.float32)
    lm.config = lm.model.config = layers.config = cfg
    for name, param in adapters.items():
        setattr(layers, name, param)
    if spec.quantize_base is not None:
        layers.quantize(spec.quantize_base)
    return lm


def with_adapters(lm: CausalLM, lora_cfg, *, seed: int, mesh=None, rules=None) -> CausalLM:
    """``lm`` with the adapters of the ``model.lora`` config section attached (base quantized with its
    ``quantize_base``) and sharded on ``mesh``; ``lm`` unchanged when ``lora_cfg.rank`` is 0 or it already has
    adapters. The training commands call this right after loading, BEFORE any reference or behaviour pass: the
    reference policy of a run with adapters is the (quantized) base with adapters off, so its log-probs must come
    from that model — and the unquantized weights are released before those passes allocate."""
    from jaxppo.models import shard_model
    from jaxppo.models.lora import spec_from_config

    spec = spec_from_config(lora_cfg)
    if spec is None or lm.config.lora is not None:
        return lm
    attach_lora(lm, spec, seed=seed)
    if mesh is not None:
        shard_model(lm, mesh, rules)
    if spec.quantize_base is not None:
        compact(lm)
    return lm


def compact(model: nnx.Module, *, force: bool = False) -> bool:
    """Re-place every array of ``model`` through host memory, in place (same values, dtypes and shardings), so the
    device allocator lays the live arrays out again side by side. After a quantized base replaced the loaded
    float weights one projection at a time, the codes sit between the holes the float stacks left, and a large
    block may find no room although enough memory is free in total. The old device buffers are deleted first
    (nothing else may hold them). Only on an accelerator (``force``: on the CPU too, for tests) and when this
    process holds every shard (arrays spanning several processes are left as they are); returns whether it
    re-placed."""
    state = nnx.state(model)
    leaves = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    if not leaves or not all(x.is_fully_addressable for x in leaves):
        return False
    if next(iter(leaves[0].devices())).platform == "cpu" and not force:
        return False
    shardings = jax.tree.map(lambda x: x.sharding, state)
    host = jax.tree.map(np.asarray, state)
    for x in leaves:
        x.delete()
    nnx.update(model, jax.device_put(host, shardings))
    return True


def split_frozen(model: nnx.Module):
    """``(graphdef, trainable, base)`` of a model with adapters (:data:`TRAINABLE` vs the rest)."""
    if model.config.lora is None:
        raise ValueError(f"{type(model).__name__} has no adapters (LMConfig.lora is None)")
    return nnx.split(model, TRAINABLE, ...)


def trunk_of(base: nnx.State) -> nnx.State:
    """The trunk (``model`` subtree) of a ``CausalLM`` base state, the frozen part of a critic on that base."""
    return nnx.State({"model": base["model"]})


def lora_critic(cfg: LMConfig, *, seed: int):
    """``(critic_graphdef, trainable)`` of a ``ValueModel`` on the base of ``cfg`` (which has ``lora`` set): its own
    adapters (seeded by ``seed``) and value head are materialised; the trunk is not (it is ``trunk_of(base)``)."""
    if cfg.lora is None:
        raise ValueError("lora_critic: LMConfig.lora is None")
    gd = nnx.split(nnx.eval_shape(lambda: ValueModel(cfg, rngs=nnx.Rngs(seed))), TRAINABLE, ...)[0]
    # built in jit: the random trunk that ValueModel.__init__ draws is not an output, so XLA drops it
    trainable = jax.jit(lambda: nnx.split(ValueModel(cfg, rngs=nnx.Rngs(seed)), TRAINABLE, ...)[1])()
    return gd, trainable


def merged_model(lm: CausalLM) -> CausalLM:
    """A ``CausalLM`` without adapters whose target weights are ``W + s·A·B`` (per layer, in the parameter dtype;
    the product in float32; a quantized base is dequantized first) and whose other weights are ``lm``'s: what
    ``hf/`` exports. ``lm`` without adapters is returned as it is."""
    spec = lm.config.lora
    if spec is None:
        return lm
    layers = lm.model.layers
    raw = {n: getattr(layers, n)[...] for n in layers.base_names()}
    dt = jnp.dtype(lm.config.param_dtype)
    weights = {n: weight(raw, n, dt) for n in layer_param_shapes(lm.config)}
    adapters = {n: getattr(layers, n)[...] for t in spec.targets for n in (f"{t}_lora_a", f"{t}_lora_b")}
    weights.update(jax.jit(merged_layer_weights, static_argnums=2)({t: weights[t] for t in spec.targets}, adapters,
                                                                   spec))
    out = nnx.eval_shape(lambda: CausalLM(lm.config.replace(lora=None), rngs=nnx.Rngs(0)))
    out.model.embed.set_value(lm.model.embed[...])
    out.model.norm.set_value(lm.model.norm[...])
    if lm.lm_head is not None:
        out.lm_head.set_value(lm.lm_head[...])
    for n, w in weights.items():
        getattr(out.model.layers, n).set_value(w)
    return out


def reference_adapters(trainable: nnx.State) -> nnx.State:
    """All-zero factors shaped like ``trainable``: ``nnx.merge(graphdef, reference_adapters(t), base)`` is the base
    with its adapters off (``B = 0``: exactly the base's output), the reference policy. Small new buffers: the base is
    shared, not copied."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype, device=getattr(x, "sharding", None)), trainable)


def merge_with_base(graphdef, trainable, base):
    """``nnx.merge(graphdef, trainable, base)``; ``base=None``: a model without adapters (``trainable`` = all)."""
    return nnx.merge(graphdef, trainable) if base is None else nnx.merge(graphdef, trainable, base)


__all__ = ["HEAD_NAMES", "TRAINABLE", "attach_lora", "lora_critic", "merge_with_base",
           "merged_model", "reference_adapters", "split_frozen", "trunk_of", "with_adapters"]
