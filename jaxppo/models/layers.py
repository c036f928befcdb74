"""Transformer building blocks as pure functions over arrays, plus the parameter constructor.

Every parameter is an ``nnx.Param`` carrying ``logical_axes`` metadata (one logical name per
dimension, e.g. ``("embed", "mlp")``); ``jaxppo.parallel.logical_to_spec`` maps them to mesh axes.
Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``D`` hidden, ``H`` query heads,
``K`` key/value heads, ``hd`` head dim, ``F`` MLP width.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo.models.lora_dropout import Drop, target_input
from jaxppo.models.quant import dequantize_nf4_last

MASK_VALUE = -1e30  # finite, so a fully masked row (a left-pad query) gives a uniform row, not NaN


def make_param(key: jax.Array | None, shape: Sequence[int], axes: Sequence[str | None], dtype,
               init: str = "normal", std: float = 0.02) -> nnx.Param:
    """An ``nnx.Param`` of ``shape`` with ``logical_axes=axes``; init "normal" (N(0, std²)), "zeros" or "ones"."""
    shape = tuple(int(s) for s in shape)
    axes = tuple(axes)
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {axes} do not match shape {shape}")
    if init == "normal":
        value = (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    elif init == "ones":
        value = jnp.ones(shape, dtype)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value, logical_axes=axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``weight · x / sqrt(mean(x², -1) + eps)``; the statistics in float32, the result in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Token positions ``max(cumsum(mask) - 1, 0)`` along the time axis ([B, T] int32); left padding gets 0."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def rope_cos_sin(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables ([B, T, hd], float32) for half-split rotary embeddings: angle = position · inv_freq."""
    ang = positions.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x`` [B, T, heads, hd]: ``x·cos + rotate_half(x)·sin`` with ``rotate_half([a, b]) = [-b, a]``."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c = cos[:, :, None, :].astype(x.dtype)
    s = sin[:, :, None, :].astype(x.dtype)
    return x * c + rot * s


def attention_allowed(q_slots: jax.Array, k_slots: jax.Array, k_valid: jax.Array,
                      sliding_window: int | None) -> jax.Array:
    """Boolean [B, T, S]: key s is visible to query t iff it is a real token, not in the future
    (``k_slot ≤ q_slot``) and, with a sliding window w, ``q_slot − k_slot < w``.

    ``q_slots`` [T] or [B, T], ``k_slots`` [S], ``k_valid`` [B, S].
    """
    q = q_slots if q_slots.ndim == 2 else q_slots[None, :]
    diff = q[:, :, None] - k_slots[None, None, :]
    ok = (diff >= 0) & k_valid[:, None, :].astype(bool)
    if sliding_window is not None:
        ok = ok & (diff < sliding_window)
    return ok


def attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, *,
              kv_heads_first: bool = False) -> jax.Array:
    """Grouped-query softmax attention.

    ``q`` [B, T, H, hd], ``k``/``v`` [B, S, K, hd] (H = K·G), or [B, K, S, hd] with ``kv_heads_first`` (the
    KV-cache layout: the score and value contractions then read the keys without a transpose),
    ``allowed`` [B, T, S] bool.
    ``out[b,t,h] = Σ_s softmax_s(q·k_s / sqrt(hd) | allowed) v_s``; scores and softmax in float32.
    """
    b, t, h, hd = q.shape
    kh = k.shape[1] if kv_heads_first else k.shape[2]
    kv = "bksd" if kv_heads_first else "bskd"
    qg = q.reshape(b, t, kh, h // kh, hd)
    # not mixed_einsum: XLA:CPU (jax 0.10.2) cannot run these batched bf16 x bf16 -> f32 dots in every layout
    # ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32" for the value product at decode time)
    scores = jnp.einsum(f"btkgd,{kv}->bkgts", qg, k, preferred_element_type=jnp.float32) * (hd ** -0.5)
    scores = jnp.where(allowed[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum(f"bkgts,{kv}->btkgd", probs, v)
    return out.reshape(b, t, h, hd)


class SharedPrefixMask(NamedTuple):
    """What attention may see in the shared-prefix layout (``shared_prefix_attention``): each of ``G`` rows is a
    prompt of ``P`` slots followed by ``n`` responses of ``R`` slots each, every response continuing the same prompt.
    ``prompt`` [G, P, P] bool (the prompt's own causal mask), ``response`` [G·n, R, P+R] bool (response ``j`` of
    row ``g`` is row ``g·n + j``: its keys are the prompt's P slots, then its own R)."""

    prompt: jax.Array
    response: jax.Array


def shared_prefix_attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: SharedPrefixMask) -> jax.Array:
    """Attention of ``n`` continuations of one prompt that runs the prompt once.

    ``q`` [G, P+n·R, H, hd], ``k``/``v`` [G, P+n·R, K, hd] in the layout of ``SharedPrefixMask``. The prompt's
    queries attend to the prompt (``attention`` with ``allowed.prompt``); the queries of response ``j`` attend to
    ``concat(prompt keys, response j's keys)`` (``allowed.response``), which are the keys, in the same order, that
    the row ``concat(prompt, response_j)`` gives them, so each output equals that row's. Returns [G, P+n·R, H, hd].
    """
    g, t, h, hd = q.shape
    p = allowed.prompt.shape[-1]
    r = allowed.response.shape[1]
    n = (t - p) // r
    if p + n * r != t or allowed.response.shape[0] != g * n:
        raise ValueError(f"shared_prefix_attention: {t} slots are not a prompt of {p} and {n} responses of {r} "
                         f"(the response mask has {allowed.response.shape[0]} rows for {g} prompts)")

    def split(a):  # [G, P+nR, ., hd] -> prompt [G, P, ., hd], responses [G·n, R, ., hd]
        return a[:, :p], a[:, p:].reshape(g * n, r, *a.shape[2:])

    qp, qr = split(q)
    kp, kr = split(k)
    vp, vr = split(v)

    def with_prompt(prompt_part, own):  # [G·n, P+R, K, hd]: the prompt's keys/values ahead of each response's own
        shape = prompt_part.shape[1:]
        rep = jnp.broadcast_to(prompt_part[:, None], (g, n) + shape).reshape(g * n, *shape)
        return jnp.concatenate([rep, own], axis=1)

    op = attention(qp, kp, vp, allowed.prompt)
    o_r = attention(qr, with_prompt(kp, kr), with_prompt(vp, vr), allowed.response)
    return jnp.concatenate([op, o_r.reshape(g, n * r, h, hd)], axis=1)


def is_low_precision(dtype) -> bool:
    """True for the 16-bit float compute dtypes (bfloat16, float16), whose matmuls go through ``mixed_einsum``."""
    dt = jnp.dtype(dtype)
    return jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 4


def _einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


@partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _mixed_einsum(spec: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
    return _einsum_f32(spec, a, b).astype(out_dtype)


def _mixed_einsum_fwd(spec, a, b, out_dtype):
    return _mixed_einsum(spec, a, b, out_dtype), (a, b)


def _mixed_einsum_bwd(spec, out_dtype, res, g):
    a, b = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g = g.astype(a.dtype)  # the cotangent enters both products in the operands' (16-bit) dtype
    # operand order = output order (no transpose of the result): for dense, dA = dot_general(G, B) contracting
    # G's and B's last dims, dB = dot_general(A, G) contracting their first dims
    da = _einsum_f32(f"{out},{sb}->{sa}", g, b).astype(a.dtype)
    db = _einsum_f32(f"{sa},{out}->{sb}", a, g).astype(b.dtype)
    return da, db


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def mixed_einsum(spec: str, a: jax.Array, b: jax.Array, out_dtype=None) -> jax.Array:
    """``einsum(spec, a, b)`` accumulated in float32 and returned in ``out_dtype`` (default ``a.dtype``).

    For 16-bit operands (``is_low_precision``) the backward is written by hand so that its two products are
    16-bit x 16-bit -> float32 as well: with ``C = A·B`` and cotangent ``G`` (cast to the operands' dtype),
    ``dA = G·Bᵀ`` and ``dB = Aᵀ·G``, each accumulated in float32 and returned in its operand's dtype. JAX's own
    transpose of a ``preferred_element_type=float32`` dot would take the float32 cotangent against a 16-bit
    operand, i.e. run every backward GEMM in float32 behind converts (what made bfloat16 slower than float32
    on XLA:CPU). float32 operands take plain ``jnp.einsum`` (``preferred_element_type=float32``): unchanged.

    Every index of ``a`` must appear in ``b`` or the output, and likewise for ``b`` (true of every product here).
    """
    out_dtype = a.dtype if out_dtype is None else jnp.dtype(out_dtype)
    if a.dtype != b.dtype:
        raise TypeError(f"mixed_einsum {spec!r}: operand dtypes differ ({a.dtype} vs {b.dtype})")
    if not is_low_precision(a.dtype):
        return _einsum_f32(spec, a, b).astype(out_dtype)
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    if not (set(sa) <= set(sb) | set(out) and set(sb) <= set(sa) | set(out)):
        raise ValueError(f"mixed_einsum {spec!r}: an index summed within one operand alone is not supported")
    return _mixed_einsum(spec, a, b, out_dtype)


def lead_subscripts(ndim: int) -> str:
    """Einsum letters for ``ndim`` leading (batch) dims, none of them ``d``: keeping them in a 16-bit product
    lets XLA:CPU run its weight gradient as a 16-bit GEMM (``dense``)."""
    return "abcefghijkl"[:ndim]


def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x`` [..., D] times ``w`` [D, *out] -> [..., *out]; accumulates in float32, returns ``x.dtype``.

    float32: one 2-D matmul ``[N, D] @ [D, prod(out)]`` (flattening the leading dims keeps XLA's CPU backward on
    plain GEMMs; keeping them was ~0.8x in a paired fwd+bwd of the 30-layer model). 16-bit (``mixed_einsum``): the
    leading dims are kept (``"abd,dm->abm"``), so the weight gradient ``xᵀ·g`` contracts several dims; XLA:CPU then
    lowers it through a transposed copy to a canonical 16-bit YNNPACK GEMM, whereas the flattened form's single
    contraction over the lhs's first dim is upcast to a float32 dot (XLA:CPU, jax 0.10.2).
    """
    lead, d, out = x.shape[:-1], x.shape[-1], w.shape[1:]
    if is_low_precision(x.dtype):
        s = lead_subscripts(len(lead))
        return mixed_einsum(f"{s}d,dm->{s}m", x, w.reshape(d, -1)).reshape(*lead, *out)
    y = jnp.dot(x.reshape(-1, d), w.reshape(d, -1), preferred_element_type=jnp.float32)
    return y.astype(x.dtype).reshape(*lead, *out)


def weight(p: dict, name: str, dtype) -> jax.Array:
    """The layer's weight ``name`` in ``dtype``: ``p[name]`` itself, or dequantized from a quantized base
    (``jaxppo.models.quant``): int8 codes times ``<name>_scale``, or NF4 codes (packed along the last axis) with
    their block maxima ``<name>_absmax``."""
    w = p[name]
    if name + "_scale" in p:
        return (w.astype(jnp.float32) * p[name + "_scale"].astype(jnp.float32)).astype(dtype)
    if name + "_absmax" in p:
        return dequantize_nf4_last(w, p[name + "_absmax"], dtype)
    return w


def linear(x: jax.Array, p: dict, name: str, w: jax.Array | None = None, drop: Drop | None = None) -> jax.Array:
    """``dense(x, W)`` for ``W = p[name]`` (or ``w``; dequantized by :func:`weight`), plus the LoRA term
    ``(x̃·A)·B`` when the layer dict has ``<name>_lora_a`` [in, r] / ``<name>_lora_b`` [r, *out] (``B``
    pre-multiplied by the scale alpha/r; ``jaxppo.models.lora``). ``x̃ = x``, or with ``drop`` the adapter dropout
    of ``x`` (``jaxppo.models.lora_dropout``: the adapter branch only, never ``x·W``)."""
    y = dense(x, weight(p, name, x.dtype) if w is None else w)
    a = p.get(name + "_lora_a")
    if a is not None:
        y = y + dense(dense(target_input(x, drop, name), a), p[name + "_lora_b"])
    return y


def swiglu(x: jax.Array, p: dict, drop: Drop | None = None) -> jax.Array:
    """``down(silu(gate(x)) · up(x))`` (optional biases ``gate_b``, ``up_b``, ``down_b``; ``drop``: :func:`linear`)."""
    g = linear(x, p, "gate", drop=drop)
    u = linear(x, p, "up", drop=drop)
    if "gate_b" in p:
        g = g + p["gate_b"]
        u = u + p["up_b"]
    y = linear(jax.nn.silu(g) * u, p, "down", drop=drop)
    if "down_b" in p:
        y = y + p["down_b"]
    return y


def qkv(x: jax.Array, p: dict, drop: Drop | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Projections ``q`` [B,T,H,hd], ``k``, ``v`` [B,T,K,hd] from ``x`` [B,T,D] (biases when present; ``drop``:
    :func:`linear`)."""
    q, k, v = linear(x, p, "q", drop=drop), linear(x, p, "k", drop=drop), linear(x, p, "v", drop=drop)
    if "q_b" in p:
        q, k, v = q + p["q_b"], k + p["k_b"], v + p["v_b"]
    return q, k, v


def out_proj(o: jax.Array, p: dict, drop: Drop | None = None) -> jax.Array:
    """``o`` [B,T,H,hd] -> [B,T,D] through ``p["o"]`` [H,hd,D] (+ ``o_b``; ``drop``: :func:`linear`)."""
    w = weight(p, "o", o.dtype)
    y = linear(o.reshape(*o.shape[:-2], -1), p, "o", w.reshape(-1, w.shape[-1]), drop)
    if "o_b" in p:
        y = y + p["o_b"]
    return y
