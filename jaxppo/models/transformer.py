"""Decoder-only transformer (Llama / Qwen2 / Mistral / SmolLM2) as Flax NNX modules.

Layer parameters are stacked along a leading ``layers`` axis and applied with ``lax.scan``
(``config.scan_layers``; otherwise an unrolled Python loop), optionally rematerialised per layer
(``config.remat``). Parameters are stored in ``config.param_dtype`` and cast to
``config.compute_dtype`` at use; logits are returned in float32.

Padding: ``attention_mask`` is 1 on real tokens, 0 on padding (left padding supported); positions
are ``cumsum(mask) - 1``, and a key is visible iff it is real and not in the future.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.models.attention import SegmentMask, segment_attention, self_attention_mask
from jaxppo.models.config import LMConfig
from jaxppo.models.lora import QUANT_SUFFIXES, TARGETS, init_adapters, quantize_stacked
from jaxppo.models.lora_dropout import Drop, layer_keys
from jaxppo.models.layers import (SharedPrefixMask, apply_rope, attention, attention_allowed, is_low_precision,
                                  lead_subscripts, make_param, mixed_einsum, out_proj, positions_from_mask, qkv, rms_norm,
                                  rope_cos_sin, shared_prefix_attention, swiglu)
from jaxppo.models.sharding import constrain_batch, mesh_of, vocab_parallel_axes


class KVCache(NamedTuple):
    """Keys/values of every layer in compute dtype, heads before slots (attention reads them without a transpose),
    and ``valid`` [B, S] (1 where a slot holds a real token). Slot order is sequence order (left-padded prompt
    first). With ``lax.scan`` over layers ``k``/``v`` are stacked arrays [L, B, K, S, hd]; with unrolled
    layers they are tuples of L arrays [B, K, S, hd] (one buffer per layer, updated in place, never sliced)."""

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]
    valid: jax.Array

    def repeat_rows(self, repeats: int) -> "KVCache":
        """Each batch row ``repeats`` times in a row (row ``b`` becomes rows ``b·r .. b·r + r − 1``), in either
        layout: the cache of a batch whose rows repeat each prompt ``repeats`` times, from the prompts' own."""
        def rep(x: jax.Array, axis: int) -> jax.Array:
            return jnp.repeat(x, repeats, axis=axis)

        def kv(x):
            return tuple(rep(a, 0) for a in x) if isinstance(x, tuple) else rep(x, 1)

        return KVCache(kv(self.k), kv(self.v), rep(self.valid, 0))


def layer_param_shapes(cfg: LMConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...], str]]:
    """name -> (shape, logical axes, init) of the stacked per-layer parameters (leading axis = layers)."""
    L, D, H, K, hd, F = (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.intermediate_size)
    out = {
        "attn_norm": ((L, D), ("layers", "norm"), "ones"),
        "q": ((L, D, H, hd), ("layers", "embed", "heads", "head_dim"), "normal"),
        "k": ((L, D, K, hd), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
        "v": ((L, D, K, hd), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
        "o": ((L, H, hd, D), ("layers", "heads", "head_dim", "embed"), "normal"),
        "mlp_norm": ((L, D), ("layers", "norm"), "ones"),
        "gate": ((L, D, F), ("layers", "embed", "mlp"), "normal"),
        "up": ((L, D, F), ("layers", "embed", "mlp"), "normal"),
        "down": ((L, F, D), ("layers", "mlp", "embed"), "normal"),
    }
    if cfg.qkv_bias:
        out["q_b"] = ((L, H, hd), ("layers", "heads", "head_dim"), "zeros")
        out["k_b"] = ((L, K, hd), ("layers", "kv_heads", "head_dim"), "zeros")
        out["v_b"] = ((L, K, hd), ("layers", "kv_heads", "head_dim"), "zeros")
    if cfg.o_bias:
        out["o_b"] = ((L, D), ("layers", "embed"), "zeros")
    if cfg.mlp_bias:
        out["gate_b"] = ((L, F), ("layers", "mlp"), "zeros")
        out["up_b"] = ((L, F), ("layers", "mlp"), "zeros")
        out["down_b"] = ((L, D), ("layers", "embed"), "zeros")
    return out


def _layer(cfg: LMConfig, p: dict, x, cos, sin, allowed, cache=None, index=None, layer=None, drop_key=None):
    """One pre-norm block: ``x + attn(norm(x))`` then ``x + swiglu(norm(x))``.

    ``drop_key``: this layer's adapter-dropout key (``jaxppo.models.lora_dropout``; None: no dropout).

    With ``cache=(k_buf, v_buf)`` the new keys/values are written at slots ``index..`` and attention reads the
    layer's whole buffer; the buffers are this layer's own [B, K, S, hd] when ``layer`` is None, else the
    stacked [L, B, K, S, hd] arrays of which row ``layer`` is updated and read. Returns ``(x, cache)``.
    """
    drop = None if drop_key is None else Drop(drop_key, cfg.lora.dropout)
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q, k, v = qkv(h, p, drop)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    if cache is not None:
        k_buf, v_buf = cache
        k_new, v_new = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, hd]
        if layer is None:
            k_buf = jax.lax.dynamic_update_slice(k_buf, k_new.astype(k_buf.dtype), (0, 0, index, 0))
            v_buf = jax.lax.dynamic_update_slice(v_buf, v_new.astype(v_buf.dtype), (0, 0, index, 0))
            k, v = k_buf, v_buf
        else:
            start = (layer, 0, 0, index, 0)
            k_buf = jax.lax.dynamic_update_slice(k_buf, k_new[None].astype(k_buf.dtype), start)
            v_buf = jax.lax.dynamic_update_slice(v_buf, v_new[None].astype(v_buf.dtype), start)
            k, v = k_buf[layer], v_buf[layer]
        o = attention(q, k, v, allowed, kv_heads_first=True)
        cache = (k_buf, v_buf)
    elif isinstance(allowed, SharedPrefixMask):
        o = shared_prefix_attention(q, k, v, allowed)
    elif isinstance(allowed, SegmentMask):
        o = segment_attention(q, k, v, allowed, cfg.attention_impl(q.shape[1]))
    else:
        o = attention(q, k, v, allowed)
    x = x + out_proj(o, p, drop)
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    x = x + swiglu(h, p, drop)
    return x, cache


class DecoderLayers(nnx.Module):
    """All decoder blocks, parameters stacked over a leading ``layers`` axis (see ``layer_param_shapes``).

    Applied with ``lax.scan`` or unrolled (``LMConfig.unroll_layers``). Unrolled, each layer reads its own
    slice of the stacked parameters (``layer_params``: ``jnp.split``, whose transpose in the backward is
    one concatenation), and the activations each layer saves for the backward are separate buffers; the
    scan instead writes them into stacked buffers (zero-filled, one dynamic-update-slice per layer) and
    copies each layer's weights out of the stack at every iteration.
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = jnp.dtype(config.param_dtype)
        for name, (shape, axes, init) in layer_param_shapes(config).items():
            key = rngs.params() if init == "normal" else None
            setattr(self, name, make_param(key, shape, axes, pd, init, config.initializer_range))
        if config.lora is not None and config.lora.quantize_base is not None:
            self.quantize(config.lora.quantize_base)
        if config.lora is not None:
            adapters = init_adapters(layer_param_shapes(config), config.lora, rngs.params(), jnp.float32)
            for name, param in adapters.items():   # float32 factors whatever the base dtype
                setattr(self, name, param)

    def quantize(self, fmt: str) -> None:
        """Store the seven projections q/k/v/o/gate/up/down in ``fmt`` (int8 / nf4, ``lora.quantize_stacked``)
        in place, one projection after the other: each float stack is released (when nothing else holds it) before
        the next is quantized, so the load's peak is the float model plus one projection's codes twice (the
        per-layer parts and their stack; ``jaxppo.plan`` reports it as ``load_bytes``). Dequantized per layer at
        use (``layers.weight``)."""
        shapes = layer_param_shapes(self.config)
        for n in TARGETS:
            for name, param in quantize_stacked({n: (getattr(self, n)[...], shapes[n][1])}, fmt).items():
                setattr(self, name, param)

    def base_names(self) -> list[str]:
        """Names of the stacked base arrays (with a quantized base, the scales / block maxima too)."""
        names = list(layer_param_shapes(self.config))
        return names + [n + sfx for n in TARGETS for sfx in QUANT_SUFFIXES if hasattr(self, n + sfx)]

    def param_dict(self, dtype) -> dict[str, jax.Array]:
        """Stacked arrays by name (cast to ``dtype`` unless None). With adapters (``config.lora``) the base
        weights are frozen (``stop_gradient``) and the factors ``<t>_lora_a`` / ``<t>_lora_b`` are added, ``B``
        multiplied by the scale alpha/r (``jaxppo.models.lora``)."""
        cast = (lambda a: a) if dtype is None else (lambda a: _cast_float(a, dtype))
        spec = self.config.lora
        out = {n: _cast_param(n, _frozen(getattr(self, n)[...], spec), dtype) for n in self.base_names()}
        if spec is not None:
            for t in spec.targets:
                out[f"{t}_lora_a"] = cast(getattr(self, f"{t}_lora_a")[...])
                b = getattr(self, f"{t}_lora_b")[...]
                out[f"{t}_lora_b"] = cast(b * jnp.asarray(spec.scale, b.dtype))
        return out

    def layer_params(self, dtype) -> list[dict[str, jax.Array]]:
        """Per-layer parameter dicts (cast to ``dtype``), layer ``i`` = the stacked arrays' row ``i``."""
        n = self.config.num_hidden_layers
        rows = {k: [r[0] for r in jnp.split(a, n, axis=0)] for k, a in self.param_dict(dtype).items()}
        return [{k: rows[k][i] for k in rows} for i in range(n)]

    def __call__(self, x, cos, sin, allowed, cache: tuple | None = None, index=None,
                 layer_params: list[dict] | None = None, lora_key: jax.Array | None = None):
        """``x`` [B, T, D] through every block; returns ``(x, cache)``.

        ``cache=(k, v)`` as in ``KVCache`` (stacked when scanning, per-layer tuples when unrolled).
        ``layer_params``: the result of ``self.layer_params(x.dtype)`` computed once by the caller (the decode
        loop slices the weights once per generation, not once per token); unrolled layers only.
        ``lora_key``: adapter dropout (training only; ``jaxppo.models.lora_dropout``), layer ``l`` gets
        ``split(lora_key, L)[l]``; ignored unless the adapters have ``dropout > 0``; not with a cache.
        """
        cfg = self.config
        n = cfg.num_hidden_layers
        mesh = mesh_of(self.q[...])  # activations stay batch-split: each layer gathers its FSDP weight shards
        x = constrain_batch(x, mesh)
        keys = layer_keys(lora_key, cfg.lora, n)
        if keys is not None and cache is not None:
            raise ValueError("DecoderLayers: adapter dropout (lora_key) is for training passes, not cached decoding")

        def body(carry, xs):
            pl, li = xs[:2]
            pl = {k: _cast_param(k, a, x.dtype) for k, a in pl.items()}  # one layer at a time (no-op unrolled)
            if cache is None:
                y, _ = _layer(cfg, pl, carry, cos, sin, allowed, drop_key=None if keys is None else xs[2])
                return constrain_batch(y, mesh), None
            y, c = _layer(cfg, pl, carry[0], cos, sin, allowed, carry[1:], index, li)
            return (constrain_batch(y, mesh),) + c, None

        policy = cfg.remat_policy
        if policy is not None:
            saveable = jax.checkpoint_policies.dots_saveable if policy == "dots" else None
            body = jax.checkpoint(body, prevent_cse=not cfg.unroll_layers, policy=saveable)
        if not cfg.unroll_layers:
            if layer_params is not None:
                raise ValueError("DecoderLayers: layer_params is for unrolled layers (LMConfig.unroll_layers)")
            carry = x if cache is None else (x,) + tuple(cache)
            xs = (self.param_dict(None), jnp.arange(n)) + (() if keys is None else (keys,))
            carry, _ = jax.lax.scan(body, carry, xs)
            return (carry, None) if cache is None else (carry[0], carry[1:])
        per = self.layer_params(x.dtype) if layer_params is None else layer_params
        if len(per) != n:
            raise ValueError(f"DecoderLayers: got {len(per)} layer_params for {n} layers")
        if cache is None:
            for i in range(n):
                x, _ = body(x, (per[i], i) + (() if keys is None else (keys[i],)))
            return x, None
        ks, vs = list(cache[0]), list(cache[1])
        for i in range(n):
            (x, ks[i], vs[i]), _ = body((x, ks[i], vs[i]), (per[i], None))
        return x, (tuple(ks), tuple(vs))


class Transformer(nnx.Module):
    """Embedding -> decoder blocks -> final RMSNorm. ``__call__`` returns the final-normed hidden states."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = jnp.dtype(config.param_dtype)
        self.embed = make_param(rngs.params(), (config.vocab_size, config.hidden_size), ("vocab", "embed"), pd,
                                "normal", config.initializer_range)
        self.layers = DecoderLayers(config, rngs=rngs)
        self.norm = make_param(None, (config.hidden_size,), ("norm",), pd, "ones")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.config.compute_dtype)

    def _embed(self, input_ids):
        _check_ids(input_ids)
        return jnp.take(_frozen(self.embed[...], self.config.lora), input_ids, axis=0).astype(self.compute_dtype)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 lora_key: jax.Array | None = None) -> jax.Array:
        """Hidden states [B, T, D] (compute dtype) after the final norm (``lora_key``: adapter dropout,
        ``DecoderLayers.__call__``)."""
        input_ids = jnp.asarray(input_ids)
        mask = _mask_or_ones(input_ids, attention_mask)
        positions = positions_from_mask(mask)
        cos, sin = rope_cos_sin(positions, jnp.asarray(self.config.inv_freq()))
        t = input_ids.shape[1]
        allowed = self_attention_mask(mask, self.config.sliding_window, self.config.attention_impl(t))
        x, _ = self.layers(self._embed(input_ids), cos, sin, allowed, lora_key=lora_key)
        return rms_norm(x, _frozen(self.norm[...], self.config.lora), self.config.rms_norm_eps)

    def packed(self, ids: jax.Array, segment_ids: jax.Array, positions: jax.Array, *,
               branch_ids: jax.Array | None = None, lora_key: jax.Array | None = None) -> jax.Array:
        """Hidden states [N, L, D] (compute dtype, final-normed) of packed rows (``jaxppo.models.packing``).

        ``ids``, ``segment_ids`` (0 = padding, 1.. one per sequence), ``positions`` (rotary, from 0 in each
        sequence) are [N, L]. Query slot ``i`` attends to key slot ``j`` iff ``seg_i = seg_j > 0`` and ``j <= i``
        (``i - j < w`` with a sliding window ``w``): causal inside a sequence, never across
        (``models.attention.SegmentMask``, run by ``model.attention``'s implementation). Each sequence's hidden
        states equal those of its padded row (``__call__``) when its tokens sit in consecutive slots.
        ``branch_ids`` [N, L] (groups packed with their prompt once, ``packing.pack_shared``): key ``j`` is seen
        only if ``branch_j`` is 0 or ``branch_i``, so each continuation's hidden states equal those of the padded
        row ``concat(prompt, continuation)``. ``lora_key``: adapter dropout (``DecoderLayers.__call__``; masks drawn
        for the packed layout).
        """
        ids = jnp.asarray(ids)
        _mask_or_ones(ids, segment_ids)
        seg = jnp.asarray(segment_ids).astype(jnp.int32)
        positions = jnp.asarray(positions)
        cos, sin = rope_cos_sin(positions, jnp.asarray(self.config.inv_freq()))
        allowed = self_attention_mask(seg, self.config.sliding_window, self.config.attention_impl(ids.shape[1]),
                                      branch_ids=branch_ids, positions=None if branch_ids is None else positions)
        x, _ = self.layers(self._embed(ids), cos, sin, allowed, lora_key=lora_key)
        return rms_norm(x, _frozen(self.norm[...], self.config.lora), self.config.rms_norm_eps)

    def shared_prefix(self, prompt_ids: jax.Array, prompt_mask: jax.Array, response_ids: jax.Array,
                      response_mask: jax.Array, *, lora_key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Hidden states of ``n`` continuations of each prompt with the prompt run once.

        ``prompt_ids``/``prompt_mask`` [G, P] (left padded), ``response_ids``/``response_mask`` [G, n, R]. Row ``g``
        is laid out as ``prompt_g, response_g0, ..., response_g(n-1)`` ([G, P+n·R]); response ``j``'s tokens get the
        rotary positions and attention (``layers.shared_prefix_attention``) they have in the row
        ``concat(prompt_g, response_gj)``, so the result equals ``self(concat(prompt, response_j))`` for every ``j``
        while the prompt's P positions go through the layers once instead of ``n`` times.
        Returns the final-normed hidden states ``(prompt [G, P, D], responses [G, n, R, D])``. ``lora_key``: adapter
        dropout (``DecoderLayers.__call__``; the masks are drawn for the ``[G, P+n·R]`` layout, not per row).
        """
        g, p = prompt_ids.shape
        n, r = response_ids.shape[1:]
        pm = prompt_mask.astype(jnp.int32)
        rm = response_mask.astype(jnp.int32).reshape(g * n, r)
        pm_rep = jnp.repeat(pm, n, axis=0)                                          # [G·n, P]
        full = jnp.concatenate([pm_rep, rm], axis=1)                                # each response's own row's mask
        pos = jnp.concatenate([positions_from_mask(pm), positions_from_mask(full)[:, p:].reshape(g, n * r)], axis=1)
        cos, sin = rope_cos_sin(pos, jnp.asarray(self.config.inv_freq()))
        w = self.config.sliding_window
        allowed = SharedPrefixMask(prompt=attention_allowed(jnp.arange(p), jnp.arange(p), pm, w),
                                   response=attention_allowed(p + jnp.arange(r), jnp.arange(p + r), full, w))
        ids = jnp.concatenate([prompt_ids, response_ids.reshape(g, n * r)], axis=1)
        x, _ = self.layers(self._embed(ids), cos, sin, allowed, lora_key=lora_key)
        h = rms_norm(x, _frozen(self.norm[...], self.config.lora), self.config.rms_norm_eps)
        return h[:, :p], h[:, p:].reshape(g, n, r, h.shape[-1])

    def init_cache(self, batch: int, length: int) -> KVCache:
        """An empty cache of ``length`` slots (layout in ``KVCache``: per-layer tuples when layers are unrolled)."""
        c = self.config
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        valid = jnp.zeros((batch, length), jnp.int32)
        if c.unroll_layers:
            zeros = lambda: tuple(jnp.zeros(shape, self.compute_dtype) for _ in range(c.num_hidden_layers))  # noqa
            return KVCache(zeros(), zeros(), valid)
        shape = (c.num_hidden_layers,) + shape
        return KVCache(jnp.zeros(shape, self.compute_dtype), jnp.zeros(shape, self.compute_dtype), valid)

    def forward_cached(self, input_ids: jax.Array, positions: jax.Array, input_valid: jax.Array,
                       cache: KVCache, index, layer_params: list | None = None) -> tuple[jax.Array, KVCache]:
        """Run ``input_ids`` [B, T] placed at cache slots ``index .. index+T-1``.

        ``positions`` [B, T] are their rotary positions, ``input_valid`` [B, T] marks real tokens.
        Attention sees every valid cached slot up to the query's own slot. Returns the final-normed
        hidden states [B, T, D] and the updated cache. ``layer_params``: see ``DecoderLayers.__call__``.
        """
        t = input_ids.shape[1]
        valid = jax.lax.dynamic_update_slice(cache.valid, input_valid.astype(cache.valid.dtype), (0, index))
        q_slots = index + jnp.arange(t)
        k_slots = jnp.arange(cache.valid.shape[1])
        allowed = attention_allowed(q_slots, k_slots, valid, self.config.sliding_window)
        cos, sin = rope_cos_sin(positions, jnp.asarray(self.config.inv_freq()))
        x, (k, v) = self.layers(self._embed(input_ids), cos, sin, allowed, (cache.k, cache.v), index, layer_params)
        return rms_norm(x, _frozen(self.norm[...], self.config.lora), self.config.rms_norm_eps), KVCache(k, v, valid)


class CausalLM(nnx.Module):
    """Causal LM: ``Transformer`` trunk (``self.model``) and an LM head (tied to the embedding or ``lm_head``).

    ``model(input_ids [B,T] int32, attention_mask [B,T] | None) -> logits [B,T,V] float32``.
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        if not isinstance(config, LMConfig):
            raise TypeError(f"CausalLM needs an LMConfig, got {type(config).__name__}")
        self.config = config
        self.model = Transformer(config, rngs=rngs)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = make_param(rngs.params(), (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                                      jnp.dtype(config.param_dtype), "normal", config.initializer_range)

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        """``h @ W_out`` in float32 (``W_out = embedding.T`` when tied).

        16-bit compute off a mesh keeps the leading dims (``"btd,vd->btv"``), so XLA:CPU runs the weight gradient
        as a 16-bit GEMM (as in ``layers.dense``). On a mesh the product is vocab-parallel
        (``sharding.vocab_parallel_axes``): the rows ``h`` [N, D] are gathered within each data group, ``W_out`` is
        split by vocab columns, each device computes its ``[N, V / n]`` slice, and the logits are returned
        batch-split (rows over the batch axes, whole vocab).
        """
        lead, d = h.shape[:-1], h.shape[-1]
        tied = self.lm_head is None
        w = _frozen(self.model.embed[...] if tied else self.lm_head[...], self.config.lora)
        mesh = mesh_of(w)
        if mesh is None and is_low_precision(h.dtype):  # leading dims kept: 16-bit weight gradient (layers.dense)
            s = lead_subscripts(len(lead))
            return mixed_einsum(f"{s}d,vd->{s}v" if tied else f"{s}d,dv->{s}v", h, w.astype(h.dtype), jnp.float32)
        h2 = constrain_batch(h, mesh).reshape(-1, d)
        vp = vocab_parallel_axes(mesh, h2.shape[0], w.shape[0] if tied else w.shape[1])
        if vp is not None:
            row, vocab = vp
            h2 = jax.lax.with_sharding_constraint(h2, NamedSharding(mesh, PartitionSpec(row, None)))
            w = jax.lax.with_sharding_constraint(
                w, NamedSharding(mesh, PartitionSpec(vocab, None) if tied else PartitionSpec(None, vocab)))
        if is_low_precision(h.dtype):  # 16-bit GEMMs forward and backward, float32 accumulation and logits
            out = mixed_einsum("nd,vd->nv" if tied else "nd,dv->nv", h2, w.astype(h.dtype), jnp.float32)
        elif tied:  # contract with the embedding's last dim: [N, D] x [V, D] -> [N, V]
            out = jax.lax.dot_general(h2, w.astype(h.dtype), (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32)
        else:
            out = jnp.dot(h2, w.astype(h.dtype), preferred_element_type=jnp.float32)
        if vp is not None:
            out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec(vp[0], vp[1])))
        return constrain_batch(out.reshape(*lead, -1), mesh)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                      lora_key: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden states; ``lora_key``: adapter dropout (training passes only,
        ``jaxppo.models.lora_dropout``)."""
        return self.model(input_ids, attention_mask, lora_key=lora_key)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 lora_key: jax.Array | None = None) -> jax.Array:
        return self.logits_from_hidden(self.model(input_ids, attention_mask, lora_key=lora_key))

    def continuation_logprobs(self, prompt_ids: jax.Array, prompt_mask: jax.Array, response_ids: jax.Array,
                              response_mask: jax.Array, *, lora_key: jax.Array | None = None) -> jax.Array:
        """``log π(y_t | x, y_<t)`` [B, R] float32 of each response token, 0 where ``response_mask`` is 0.

        The trunk runs over ``concat(prompt, response)`` [B, P+R]; only the R positions ``P-1 .. P+R-2`` that
        predict a response token go through the LM head (not all P+R), and the log-prob is
        ``(z_y − m) − log Σ_v exp(z_v − m)`` with ``m = max_v z_v`` (no [B, R, V] log-softmax is stored).
        ``lora_key``: adapter dropout (the DPO update's loss only; ``jaxppo.models.lora_dropout``).
        """
        p, r = prompt_ids.shape[1], response_ids.shape[1]
        ids = jnp.concatenate([prompt_ids, response_ids], axis=1).astype(jnp.int32)
        mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(jnp.int32)
        h = self.model(ids, mask, lora_key=lora_key)[:, p - 1:p + r - 1]
        return _token_logprobs(self.logits_from_hidden(h), response_ids, response_mask)

    def packed_logprobs(self, packed, response_ids: jax.Array, response_mask: jax.Array, *,
                        lora_key: jax.Array | None = None) -> jax.Array:
        """``continuation_logprobs`` [B, R] of the batch that ``packed`` (``jaxppo.models.packing.Packed``) packs:
        the trunk runs on the packed rows (``Transformer.packed``), the head only on the ``H`` slots
        ``packed.head_index`` that predict real response tokens; 0 where ``response_mask`` is 0."""
        from jaxppo.models.packing import head_gather, head_scatter, head_targets

        h = head_gather(self.model.packed(packed.ids, packed.segment_ids, packed.positions,
                                          branch_ids=packed.branch_ids, lora_key=lora_key), packed)
        lp = _token_logprobs(self.logits_from_hidden(h), head_targets(response_ids, packed),
                             jnp.ones(h.shape[:1], jnp.float32))
        return head_scatter(lp, packed, response_ids.shape) * response_mask.astype(jnp.float32)

    def shared_prefix_logprobs(self, prompt_ids: jax.Array, prompt_mask: jax.Array, response_ids: jax.Array,
                               response_mask: jax.Array) -> jax.Array:
        """``log π(y_t | x, y_<t)`` [G, n, R] of ``n`` responses per prompt (``response_ids`` [G, n, R]), equal to
        ``continuation_logprobs`` of each ``(prompt, response_j)`` pair but with the prompt run through the trunk
        once per group (``Transformer.shared_prefix``): a DPO pair's chosen and rejected answers share one prompt
        pass. The head scores the R positions that predict response tokens: the prompt's last slot (shared by the
        ``n`` responses) and each response's first R-1 slots.
        """
        hp, hr = self.model.shared_prefix(prompt_ids, prompt_mask, response_ids, response_mask)
        g, n, r, d = hr.shape
        last = jnp.broadcast_to(hp[:, None, -1:], (g, n, 1, d))
        h = jnp.concatenate([last, hr[:, :, :r - 1]], axis=2)
        return _token_logprobs(self.logits_from_hidden(h), response_ids, response_mask)

    def init_cache(self, batch: int, length: int) -> KVCache:
        return self.model.init_cache(batch, length)

    def forward_cached(self, input_ids, positions, input_valid, cache: KVCache, index, layer_params=None):
        """Logits [B, T, V] float32 of tokens placed at cache slots ``index..`` and the updated cache."""
        h, cache = self.model.forward_cached(input_ids, positions, input_valid, cache, index, layer_params)
        return self.logits_from_hidden(h), cache


@partial(jax.jit, static_argnums=0)
def continuation_logprobs(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask) -> jax.Array:
    """Jitted ``nnx.merge(graphdef, state).continuation_logprobs(...)`` (see :meth:`CausalLM.continuation_logprobs`).

    One module-level jit, so the behaviour/reference pass, the held-out perplexity and the evaluation's KL
    passes share one compiled program per (model structure, shapes).
    """
    return nnx.merge(graphdef, state).continuation_logprobs(prompt_ids, prompt_mask, response_ids, response_mask)


@partial(jax.jit, static_argnums=0)
def packed_logprobs(graphdef, state, packed, response_ids, response_mask) -> jax.Array:
    """Jitted ``nnx.merge(graphdef, state).packed_logprobs(...)`` (:meth:`CausalLM.packed_logprobs`): one program per
    (model structure, packed shape, response shape)."""
    return nnx.merge(graphdef, state).packed_logprobs(packed, response_ids, response_mask)


def _token_logprobs(z: jax.Array, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """``(z_y − m) − log Σ_v exp(z_v − m)`` with ``m = max_v z_v`` (held constant in the gradient), times ``mask``:
    the log-prob of each token ``ids`` [...] under the logits ``z`` [..., V] (no [..., V] log-softmax stored)."""
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(z - m), axis=-1))
    tok = jnp.take_along_axis(z, ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return ((tok - m[..., 0]) - lse) * mask.astype(jnp.float32)


def _cast_float(a: jax.Array, dtype) -> jax.Array:
    """``a`` in ``dtype`` if it is floating; integer codes of a quantized base stay as they are."""
    return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a


def _cast_param(name: str, a: jax.Array, dtype) -> jax.Array:
    """A layer parameter for compute in ``dtype`` (None: as stored): floating weights cast, but a quantized base's
    integer codes and its float32 scales / block maxima (``<name>_scale``, ``<name>_absmax``) kept, so the weight
    is dequantized in float32 and rounded to ``dtype`` once (``layers.weight``), not from bf16-rounded scales."""
    if dtype is None or name.endswith(QUANT_SUFFIXES):
        return a
    return _cast_float(a, dtype)


def _frozen(a: jax.Array, spec) -> jax.Array:
    """``a`` with its gradient stopped when the model has adapters (the base is frozen), else ``a``."""
    return a if spec is None else jax.lax.stop_gradient(a)


def _mask_or_ones(input_ids: jax.Array, attention_mask) -> jax.Array:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if attention_mask is None:
        return jnp.ones(input_ids.shape, jnp.int32)
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {attention_mask.shape} does not match input_ids {input_ids.shape}")
    return attention_mask.astype(jnp.int32)


def _check_ids(input_ids) -> None:
    if not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise TypeError(f"input_ids must be integers, got dtype {input_ids.dtype}")


def param_count(model: nnx.Module) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
