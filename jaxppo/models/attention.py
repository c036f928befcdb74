"""Self-attention kernels and the choice between them (``LMConfig.attention``, the config key ``model.attention``).

Every implementation computes the same grouped-query attention as ``layers.attention`` (the reference einsum):
``q`` [B, T, H, hd], ``k``/``v`` [B, T, K, hd] with H = K·G, scale ``1/sqrt(hd)``, softmax in float32, output
[B, T, H, hd] in ``q``'s dtype. What a query may see is a ``SegmentMask``: self-attention over slots ``0..T-1`` of a
row whose ``segment_ids`` [B, T] (int32) say which sequence each slot holds, 0 marking padding. A query ``t`` of a
real segment sees key ``s`` iff ``seg[s] == seg[t]``, ``s <= t`` and, with a sliding window ``w``, ``t - s < w``.
Padded rows (one sequence per row, left- or right-padded) are ``segment_ids = attention_mask``; packed rows number
their sequences 1, 2, ... Packed groups that share a prompt (``packing.pack_shared``) also carry ``branch_ids`` (0
on the prompt, ``c + 1`` on continuation ``c``) and ``positions``: a query then sees a key only if the key's branch
is 0 or the query's own, and the window counts positions, not slots. A padding query's output is finite and
unspecified (each implementation has its own rule for it; nothing reads it) and, as nothing reads it, it sends no
gradient to the real queries, keys or values.

Implementations (``IMPLEMENTATIONS``):

- ``reference``: ``layers.attention`` on the dense mask ``SegmentMask.dense()`` (the einsum, float32 scores
  [B, K, G, T, T]); any backend.
- ``xla``: ``jax.nn.dot_product_attention(implementation="xla")`` with the dense mask; any backend; grouped
  queries natively.
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN flash attention; GPU only, 16-bit
  ``q``/``k``/``v``, head dim a multiple of 8 and at most 128 (256 on Hopper and later), ``T`` even (a mask
  travels as an additive bias, which the training kernel needs even lengths for). Causality and the window are
  cuDNN's own masks (blocks above the diagonal are skipped); segments and padding enter as the bias
  ``0 / -0.7·max`` built from the dense mask.
- ``splash``: the TPU Pallas splash-attention kernel (``jax.experimental.pallas.ops.tpu.splash_attention``),
  segment ids and a causal or local mask natively, grouped queries natively (its MHA form with K kv heads);
  TPU only (``interpret=True`` runs it anywhere, slowly), ``T`` a multiple of 128. A padding query sees the
  padding keys at or before it (segment 0 is a segment to the kernel), so no row is empty.
- ``pallas_gpu``: the GPU Pallas (Triton) flash-attention kernel (``jax.experimental.pallas.ops.gpu.attention``),
  segment ids and causality natively; no sliding window; keys and values repeated to H heads (the kernel has no
  grouped form); GPU only (``interpret=True`` anywhere), ``T`` at most 32, a multiple of 32 up to 128 or a
  multiple of 128.
- ``auto``: ``resolve``: cudnn on a GPU and splash on a single TPU device where ``fits`` says the shapes and dtypes
  allow it, else xla; ``CPU_AUTO`` on the CPU.

Branches are expressed by the dense mask only: with ``branch_ids``, ``splash`` and ``pallas_gpu`` (segment ids
only) and ``cudnn`` with a sliding window (a window over slots) run the ``xla`` path instead.

Several devices: cudnn is partitioned by JAX itself (its custom partitioning splits batch and heads); the Pallas
kernels are not wrapped in ``shard_map`` here, so XLA would run them on gathered operands: ``auto`` does not pick
splash when the process sees more than one device, and an explicit ``splash`` / ``pallas_gpu`` is for one device.

The backend a choice is made for is the process's (``jax.default_backend()``), not an ``LMConfig``'s layout
backend: a fused kernel compiles only on its own device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.models.layers import attention as reference_attention

IMPLEMENTATIONS = ("auto", "reference", "xla", "cudnn", "splash", "pallas_gpu")
BACKEND_OF = {"cudnn": "gpu", "splash": "tpu", "pallas_gpu": "gpu"}  # fused kernels and the one backend each runs on
# auto on the CPU: the reference einsum, which keeps every CPU result of earlier versions bit for bit.
# benchmarks/attention.py times it against xla on the CPU at the SmolLM2-135M attention shape (forward + backward)
# and writes results/attention_cpu.json; change this only where that record, taken on an idle machine, shows xla
# faster at every measured length.
CPU_AUTO = "reference"
SPLASH_BLOCKS = (512, 256, 128)  # splash block sizes tried largest first: the first dividing T is used


@functools.partial(jax.tree_util.register_dataclass, data_fields=["segment_ids", "branch_ids", "positions"],
                   meta_fields=["sliding_window"])
@dataclass(frozen=True)
class SegmentMask:
    """Self-attention visibility over the slots ``0..T-1`` of each row: ``segment_ids`` [B, T] int (0 = padding,
    each sequence of a row its own id) and the static ``sliding_window`` (None: unbounded); for groups sharing a
    prompt also ``branch_ids`` and ``positions`` [B, T] int (``packing.pack_shared``). Module docstring: the rule."""

    segment_ids: jax.Array
    sliding_window: int | None = None
    branch_ids: jax.Array | None = None
    positions: jax.Array | None = None

    def dense(self) -> jax.Array:
        """Boolean [B, T, T]: ``allowed[b, t, s] = seg[s] != 0 & (seg[s] == seg[t] | seg[t] == 0) & s <= t``
        ``& t - s < w``. A padding query sees every real key at or before it (any choice is right for an unused row;
        this one makes the mask of a padded row, ``segment_ids = attention_mask``, equal
        ``layers.attention_allowed(arange(T), arange(T), attention_mask, w)``). With ``branch_ids`` also
        ``& (branch[s] == 0 | branch[s] == branch[t])`` (a padding query, branch 0, then sees the prompts' keys), and
        the window is ``pos[t] - pos[s] < w``."""
        seg = self.segment_ids.astype(jnp.int32)
        t = seg.shape[-1]
        slots = jnp.arange(t)
        diff = slots[:, None] - slots[None, :]
        ok = (diff >= 0)[None]
        if self.sliding_window is not None:
            if self.branch_ids is None:
                ok = ok & (diff < self.sliding_window)[None]
            else:
                pos = self.positions.astype(jnp.int32)
                ok = ok & (pos[:, :, None] - pos[:, None, :] < self.sliding_window)
        qs, ks = seg[:, :, None], seg[:, None, :]
        ok = ok & (ks != 0) & ((ks == qs) | (qs == 0))
        if self.branch_ids is not None:
            br = self.branch_ids.astype(jnp.int32)
            ok = ok & ((br[:, None, :] == 0) | (br[:, None, :] == br[:, :, None]))
        return ok


def check_backend(name: str, backend: str) -> None:
    """ValueError (one line, naming ``model.attention``) unless ``name`` is an implementation that runs on
    ``backend`` ("cpu", "gpu", "tpu")."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention={name!r} is not an attention implementation; one of {IMPLEMENTATIONS}")
    need = BACKEND_OF.get(name)
    if need is not None and need != backend:
        raise ValueError(f"model.attention={name!r} runs on a {need.upper()} only, this process's backend is "
                         f"{backend!r}; use auto, xla or reference")


def fits(name: str, *, dtype, head_dim: int, seq_len: int, sliding_window: int | None = None) -> str | None:
    """None when the fused kernel ``name`` takes queries of ``dtype``, ``head_dim`` and ``seq_len`` slots (and the
    window), else the reason it does not; None for reference and xla (they take anything)."""
    dt = jnp.dtype(dtype)
    if name == "cudnn":
        if dt not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            return f"cuDNN flash attention takes bfloat16/float16, not {dt.name}"
        if head_dim % 8 or head_dim > 256:
            return f"cuDNN flash attention needs a head dim that is a multiple of 8 and <= 256, not {head_dim}"
        if seq_len % 2:
            return f"cuDNN flash attention with a mask needs an even length, not {seq_len}"
    elif name == "splash":
        if seq_len % 128:
            return f"splash attention needs a length that is a multiple of 128, not {seq_len}"
    elif name == "pallas_gpu":
        if sliding_window is not None:
            return "the Pallas GPU kernel has no sliding window"
        if seq_len > 32 and seq_len % (32 if seq_len <= 128 else 128):
            return (f"the Pallas GPU kernel needs a length <= 32, a multiple of 32 up to 128 or a multiple of 128, "
                    f"not {seq_len}")
    return None


def resolve(name: str, backend: str, *, dtype, head_dim: int, seq_len: int,
            sliding_window: int | None = None, devices: int = 1) -> str:
    """The implementation ``name`` stands for on ``backend`` for these shapes and ``devices`` (the process's device
    count). ``auto``: ``CPU_AUTO`` on "cpu"; cudnn on "gpu" and splash on "tpu" (one device only) when ``fits``, else
    xla; any other backend xla. An explicit name is checked (``check_backend``; a fused kernel the shapes do not fit
    is a ValueError with ``fits``' reason)."""
    check_backend(name, backend)
    if name == "auto":
        if backend == "cpu":
            return CPU_AUTO
        fused = {"gpu": "cudnn", "tpu": "splash" if devices == 1 else None}.get(backend)
        if fused is None:
            return "xla"
        why = fits(fused, dtype=dtype, head_dim=head_dim, seq_len=seq_len, sliding_window=sliding_window)
        return "xla" if why else fused
    why = fits(name, dtype=dtype, head_dim=head_dim, seq_len=seq_len, sliding_window=sliding_window)
    if why:
        raise ValueError(f"model.attention={name!r}: {why}")
    return name


def self_attention_mask(segment_ids: jax.Array, sliding_window: int | None, implementation: str, *,
                        branch_ids: jax.Array | None = None, positions: jax.Array | None = None):
    """What the layers receive for ``implementation`` (resolved, not "auto"): the dense mask for reference (built
    once per forward, not per layer), else the ``SegmentMask`` (with ``branch_ids``: module docstring)."""
    if branch_ids is not None and positions is None:
        raise ValueError("self_attention_mask: branch_ids need the rows' positions")
    mask = SegmentMask(segment_ids, sliding_window, branch_ids, positions)
    return mask.dense() if implementation == "reference" else mask


def branch_capable(implementation: str, sliding_window: int | None) -> bool:
    """Whether ``implementation`` applies a ``SegmentMask``'s branch rule itself (the dense-mask paths, and cudnn
    without a window: its bias is the dense mask)."""
    return implementation in ("reference", "xla") or (implementation == "cudnn" and sliding_window is None)


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: SegmentMask | jax.Array, implementation: str,
                      *, interpret: bool = False) -> jax.Array:
    """Grouped-query self-attention (module docstring) by ``implementation`` (resolved, not "auto"). ``mask``: a
    ``SegmentMask``, or for reference / xla the dense [B, T, S] boolean mask as well. ``interpret``: run a Pallas
    kernel in the Pallas interpreter (any backend)."""
    dense = not isinstance(mask, SegmentMask)
    if not dense and mask.branch_ids is not None and not branch_capable(implementation, mask.sliding_window):
        implementation = "xla"
    if implementation == "reference":
        return reference_attention(q, k, v, mask if dense else mask.dense())
    if implementation == "xla":
        allowed = mask if dense else mask.dense()
        return jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], implementation="xla")
    if dense:
        raise ValueError(f"attention implementation {implementation!r} takes a SegmentMask, not a dense mask")
    if implementation == "cudnn":
        return _cudnn(q, k, v, mask)
    if implementation == "splash":
        return _splash(q, k, v, mask, interpret=interpret)
    if implementation == "pallas_gpu":
        return _pallas_gpu(q, k, v, mask, interpret=interpret)
    raise ValueError(f"unknown attention implementation {implementation!r}; one of {IMPLEMENTATIONS[1:]}")


def _cudnn(q, k, v, mask: SegmentMask) -> jax.Array:
    w = mask.sliding_window
    return jax.nn.dot_product_attention(q, k, v, mask=mask.dense()[:, None], is_causal=True,
                                        local_window_size=None if w is None else (w - 1, 0),
                                        implementation="cudnn")


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, t: int, window: int | None, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    block = next(b for b in SPLASH_BLOCKS if t % b == 0)
    one = sa.CausalMask((t, t)) if window is None else sa.LocalMask((t, t), (window - 1, 0), 0)
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return sa.make_splash_mha(sa.MultiHeadMask([one] * heads), block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)


def _splash(q, k, v, mask: SegmentMask, *, interpret: bool) -> jax.Array:
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    b, t, h, hd = q.shape
    why = fits("splash", dtype=q.dtype, head_dim=hd, seq_len=t)
    if why:
        raise ValueError(why)
    kernel = _splash_kernel(h, t, mask.sliding_window, interpret)
    seg = mask.segment_ids.astype(jnp.int32)
    scale = np.asarray(hd ** -0.5, q.dtype)

    def one_row(qr, kr, vr, sr):  # [T, H, hd], [T, K, hd], [T, K, hd], [T] -> [T, H, hd]
        out = kernel((qr * scale).transpose(1, 0, 2), kr.transpose(1, 0, 2), vr.transpose(1, 0, 2),
                     segment_ids=SegmentIds(q=sr, kv=sr))
        return out.transpose(1, 0, 2)

    return jax.vmap(one_row)(q, k, v, seg).astype(q.dtype)


def _pallas_gpu(q, k, v, mask: SegmentMask, *, interpret: bool) -> jax.Array:
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    b, t, h, hd = q.shape
    why = fits("pallas_gpu", dtype=q.dtype, head_dim=hd, seq_len=t, sliding_window=mask.sliding_window)
    if why:
        raise ValueError(why)
    g = h // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    d = gpu_attention.BlockSizes.get_default()
    sizes = gpu_attention.BlockSizes(block_q=min(d.block_q, t), block_k=min(d.block_k, t),
                                     block_q_dkv=min(d.block_q_dkv, t), block_kv_dkv=min(d.block_kv_dkv, t),
                                     block_q_dq=min(d.block_q_dq, t), block_kv_dq=min(d.block_kv_dq, t))
    return gpu_attention.mha(q, k, v, mask.segment_ids.astype(jnp.int32), sm_scale=hd ** -0.5, causal=True,
                             block_sizes=sizes, interpret=interpret)


__all__ = ["BACKEND_OF", "CPU_AUTO", "IMPLEMENTATIONS", "SegmentMask", "branch_capable", "check_backend", "fits",
           "resolve", "segment_attention", "self_attention_mask"]
