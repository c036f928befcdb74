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

from jaxppo.models.config import LMConfig
from jaxppo.models.layers import (apply_rope, attention, attention_allowed, make_param, out_proj, positions_from_mask,
                                  qkv, rms_norm, rope_cos_sin, swiglu)


class KVCache(NamedTuple):
    """Keys/values of every layer, ``k``/``v`` [L, B, S, K, hd] in compute dtype, and ``valid`` [B, S]
    (1 where a slot holds a real token). Slot order is sequence order (left-padded prompt first)."""

    k: jax.Array
    v: jax.Array
    valid: jax.Array


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


def _layer(cfg: LMConfig, p: dict, x, cos, sin, allowed, cache=None, index=None, layer=None):
    """One pre-norm block: ``x + attn(norm(x))`` then ``x + swiglu(norm(x))``.

    With ``cache=(k_all, v_all)`` the new keys/values are written at slot ``index`` of layer ``layer``
    and attention reads the whole cached layer; returns ``(x, cache)``.
    """
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q, k, v = qkv(h, p)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    if cache is not None:
        k_all, v_all = cache
        start = (layer, 0, index, 0, 0)
        k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), start)
        v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), start)
        k, v = k_all[layer], v_all[layer]
        cache = (k_all, v_all)
    o = attention(q, k, v, allowed)
    x = x + out_proj(o, p)
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    x = x + swiglu(h, p)
    return x, cache


class DecoderLayers(nnx.Module):
    """All decoder blocks, parameters stacked over a leading ``layers`` axis (see ``layer_param_shapes``)."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = jnp.dtype(config.param_dtype)
        for name, (shape, axes, init) in layer_param_shapes(config).items():
            key = rngs.params() if init == "normal" else None
            setattr(self, name, make_param(key, shape, axes, pd, init, config.initializer_range))

    def param_dict(self, dtype) -> dict[str, jax.Array]:
        return {n: getattr(self, n)[...].astype(dtype) for n in layer_param_shapes(self.config)}

    def __call__(self, x, cos, sin, allowed, cache: tuple | None = None, index=None):
        cfg = self.config
        p = self.param_dict(x.dtype)

        def body(carry, xs):
            pl, li = xs
            if cache is None:
                y, _ = _layer(cfg, pl, carry, cos, sin, allowed)
                return y, None
            y, c = _layer(cfg, pl, carry[0], cos, sin, allowed, carry[1:], index, li)
            return (y,) + c, None

        if cfg.remat:
            body = jax.checkpoint(body, prevent_cse=not cfg.scan_layers)
        carry = x if cache is None else (x,) + tuple(cache)
        n = cfg.num_hidden_layers
        if cfg.scan_layers:
            carry, _ = jax.lax.scan(body, carry, (p, jnp.arange(n)))
        else:
            for i in range(n):
                carry, _ = body(carry, (jax.tree.map(lambda a, i=i: a[i], p), i))
        if cache is None:
            return carry, None
        return carry[0], carry[1:]


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
        return jnp.take(self.embed[...], input_ids, axis=0).astype(self.compute_dtype)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Hidden states [B, T, D] (compute dtype) after the final norm."""
        input_ids = jnp.asarray(input_ids)
        mask = _mask_or_ones(input_ids, attention_mask)
        positions = positions_from_mask(mask)
        cos, sin = rope_cos_sin(positions, jnp.asarray(self.config.inv_freq()))
        t = input_ids.shape[1]
        slots = jnp.arange(t)
        allowed = attention_allowed(slots, slots, mask, self.config.sliding_window)
        x, _ = self.layers(self._embed(input_ids), cos, sin, allowed)
        return rms_norm(x, self.norm[...], self.config.rms_norm_eps)

    def init_cache(self, batch: int, length: int) -> KVCache:
        c = self.config
        shape = (c.num_hidden_layers, batch, length, c.num_key_value_heads, c.head_dim)
        return KVCache(jnp.zeros(shape, self.compute_dtype), jnp.zeros(shape, self.compute_dtype),
                       jnp.zeros((batch, length), jnp.int32))

    def forward_cached(self, input_ids: jax.Array, positions: jax.Array, input_valid: jax.Array,
                       cache: KVCache, index) -> tuple[jax.Array, KVCache]:
        """Run ``input_ids`` [B, T] placed at cache slots ``index .. index+T-1``.

        ``positions`` [B, T] are their rotary positions, ``input_valid`` [B, T] marks real tokens.
        Attention sees every valid cached slot up to the query's own slot. Returns the final-normed
        hidden states [B, T, D] and the updated cache.
        """
        t = input_ids.shape[1]
        valid = jax.lax.dynamic_update_slice(cache.valid, input_valid.astype(cache.valid.dtype), (0, index))
        q_slots = index + jnp.arange(t)
        k_slots = jnp.arange(cache.valid.shape[1])
        allowed = attention_allowed(q_slots, k_slots, valid, self.config.sliding_window)
        cos, sin = rope_cos_sin(positions, jnp.asarray(self.config.inv_freq()))
        x, (k, v) = self.layers(self._embed(input_ids), cos, sin, allowed, (cache.k, cache.v), index)
        return rms_norm(x, self.norm[...], self.config.rms_norm_eps), KVCache(k, v, valid)


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
        """``h @ W_out`` in float32 (``W_out = embedding.T`` when tied)."""
        lead, d = h.shape[:-1], h.shape[-1]
        h2 = h.reshape(-1, d)
        if self.lm_head is None:  # contract with the embedding's last dim: [N, D] x [V, D] -> [N, V]
            w = self.model.embed[...].astype(h.dtype)
            out = jax.lax.dot_general(h2, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        else:
            out = jnp.dot(h2, self.lm_head[...].astype(h.dtype), preferred_element_type=jnp.float32)
        return out.reshape(*lead, -1)

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        return self.model(input_ids, attention_mask)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        return self.logits_from_hidden(self.model(input_ids, attention_mask))

    def continuation_logprobs(self, prompt_ids: jax.Array, prompt_mask: jax.Array, response_ids: jax.Array,
                              response_mask: jax.Array) -> jax.Array:
        """``log π(y_t | x, y_<t)`` [B, R] float32 of each response token, 0 where ``response_mask`` is 0.

        The trunk runs over ``concat(prompt, response)`` [B, P+R]; only the R positions ``P-1 .. P+R-2`` that
        predict a response token go through the LM head (not all P+R), and the log-prob is
        ``(z_y − m) − log Σ_v exp(z_v − m)`` with ``m = max_v z_v`` (no [B, R, V] log-softmax is stored).
        """
        p, r = prompt_ids.shape[1], response_ids.shape[1]
        ids = jnp.concatenate([prompt_ids, response_ids], axis=1).astype(jnp.int32)
        mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(jnp.int32)
        z = self.logits_from_hidden(self.model(ids, mask)[:, p - 1:p + r - 1])
        m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
        lse = jnp.log(jnp.sum(jnp.exp(z - m), axis=-1))
        tok = jnp.take_along_axis(z, response_ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return ((tok - m[..., 0]) - lse) * response_mask.astype(jnp.float32)

    def init_cache(self, batch: int, length: int) -> KVCache:
        return self.model.init_cache(batch, length)

    def forward_cached(self, input_ids, positions, input_valid, cache: KVCache, index):
        """Logits [B, T, V] float32 of tokens placed at cache slots ``index..`` and the updated cache."""
        h, cache = self.model.forward_cached(input_ids, positions, input_valid, cache, index)
        return self.logits_from_hidden(h), cache


@partial(jax.jit, static_argnums=0)
def continuation_logprobs(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask) -> jax.Array:
    """Jitted ``nnx.merge(graphdef, state).continuation_logprobs(...)`` (see :meth:`CausalLM.continuation_logprobs`).

    One module-level jit, so the behaviour/reference pass, the held-out perplexity and the evaluation's KL
    passes share one compiled program per (model structure, shapes).
    """
    return nnx.merge(graphdef, state).continuation_logprobs(prompt_ids, prompt_mask, response_ids, response_mask)


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
