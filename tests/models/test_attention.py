"""The attention implementations of ``jaxppo.models.attention`` against the reference einsum (``layers.attention``):
grouped queries, causal, left and right padding, packed segments and a sliding window, forward and gradients, in
float32 (1e-5) and bfloat16 (loose); the Pallas kernels in interpret mode. cuDNN does not run on a CPU: its choice
(``resolve``) and the one-line error for it on a CPU are tested instead.

Comparisons read the real query rows only (a padding query's output is unspecified) and take gradients of a loss
that weights only those rows, so a padding row's gradient would show up if it leaked into real ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.config import ConfigError
from jaxppo.models.attention import (CPU_AUTO, IMPLEMENTATIONS, SegmentMask, check_backend, resolve,
                                     segment_attention, self_attention_mask)
from jaxppo.models.layers import MASK_VALUE, attention_allowed


def rows(t: int) -> np.ndarray:
    """Segment ids of 4 rows of ``t`` slots: left-padded, right-padded, packed (3 sequences and trailing padding),
    and full."""
    a, b = t // 4, t // 3
    left = np.r_[np.zeros(a), np.ones(t - a)]
    right = np.r_[np.ones(t - b), np.zeros(b)]
    packed = np.r_[np.full(a, 1), np.full(b, 2), np.full(t - a - b - 3, 3), np.zeros(3)]
    return np.stack([left, right, packed, np.ones(t)]).astype(np.int32)


def qkv(t: int, h: int = 4, kh: int = 2, hd: int = 8, dtype=jnp.float32, seed: int = 0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (4, t, h, hd), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (4, t, kh, hd), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (4, t, kh, hd), jnp.float32).astype(dtype)
    w = jax.random.normal(ks[3], (4, t, h, hd), jnp.float32)   # loss weights: sum(out * w) on real rows
    return q, k, v, w


def einsum_reference(q, k, v, allowed):
    """The attention formula written out independently, in float32 (GQA by repeating the kv heads)."""
    g = q.shape[2] // k.shape[2]
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(allowed[:, None], s, MASK_VALUE)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v)


def value_and_grads(fn, q, k, v, w, real):
    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * w * real[:, :, None, None]), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def compare(impl: str, t: int, window, dtype, tol, interpret: bool = False):
    seg = jnp.asarray(rows(t))
    real = (seg != 0).astype(jnp.float32)
    q, k, v, w = qkv(t, dtype=dtype)
    mask = SegmentMask(seg, window)
    out, grads = value_and_grads(lambda q, k, v: segment_attention(q, k, v, mask, impl, interpret=interpret),
                                 q, k, v, w, real)
    q32, k32, v32 = (a.astype(jnp.float32) for a in (q, k, v))
    want, want_grads = value_and_grads(lambda q, k, v: einsum_reference(q, k, v, mask.dense()), q32, k32, v32, w, real)
    assert out.dtype == dtype and out.shape == q.shape
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    sel = np.asarray(real, bool)
    np.testing.assert_allclose(np.asarray(out, np.float32)[sel], np.asarray(want)[sel], atol=tol, rtol=tol)
    for got, exp in zip(grads, want_grads):
        assert bool(jnp.all(jnp.isfinite(got.astype(jnp.float32))))
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(exp), atol=tol * 4, rtol=tol * 4)


def test_dense_mask_of_padded_rows_is_todays_mask():
    mask = jnp.asarray(rows(12)[:2])   # one sequence per row, left- and right-padded
    for window in (None, 3):
        got = SegmentMask(mask, window).dense()
        want = attention_allowed(jnp.arange(12), jnp.arange(12), mask, window)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_dense_mask_confines_packed_segments():
    seg = jnp.asarray([[1, 1, 2, 2, 2, 0]])
    got = np.asarray(SegmentMask(seg, 2).dense()[0]).astype(int)
    want = np.array([[1, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0],
                     [0, 0, 1, 0, 0, 0],
                     [0, 0, 1, 1, 0, 0],
                     [0, 0, 0, 1, 1, 0],
                     [0, 0, 0, 0, 1, 0]])   # the padding query: the real keys within the window
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_reference_and_xla_float32(impl):
    compare(impl, 24, 5, jnp.float32, 1e-5)


def test_xla_bfloat16():
    compare("xla", 24, 5, jnp.bfloat16, 3e-2)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_fully_masked_rows_are_finite_with_finite_gradients(impl):
    """A row that sees no key (the dense mask of a left-padding query) gives a finite output and gradients."""
    q, k, v, w = qkv(8)
    allowed = jnp.zeros((4, 8, 8), bool)
    out, grads = value_and_grads(lambda q, k, v: segment_attention(q, k, v, allowed, impl), q, k, v, w,
                                 jnp.ones((4, 8)))
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in (out, *grads))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_pallas_gpu_kernel_interpreted(dtype, tol):
    compare("pallas_gpu", 32, None, dtype, tol, interpret=True)


def test_splash_kernel_interpreted():
    """float32, packed rows and a sliding window; T = 128, the kernel's smallest block."""
    compare("splash", 128, 40, jnp.float32, 1e-5, interpret=True)


def test_fused_kernels_refuse_a_dense_mask():
    q, k, v, _ = qkv(8)
    with pytest.raises(ValueError, match="SegmentMask"):
        segment_attention(q, k, v, jnp.ones((4, 8, 8), bool), "splash")


@pytest.mark.parametrize("backend,dtype,t,window,want", [
    ("cpu", "bfloat16", 128, None, CPU_AUTO),
    ("cpu", "float32", 128, None, CPU_AUTO),
    ("gpu", "bfloat16", 128, None, "cudnn"),
    ("gpu", "bfloat16", 128, 64, "cudnn"),
    ("gpu", "float32", 128, None, "xla"),      # cuDNN flash attention is 16-bit only
    ("gpu", "bfloat16", 127, None, "xla"),     # odd length
    ("tpu", "bfloat16", 256, None, "splash"),
    ("tpu", "float32", 384, 64, "splash"),
    ("tpu", "bfloat16", 200, None, "xla"),     # not a multiple of 128
])
def test_auto_per_backend(backend, dtype, t, window, want):
    assert resolve("auto", backend, dtype=dtype, head_dim=64, seq_len=t, sliding_window=window) == want


def test_auto_leaves_splash_to_a_single_tpu_device():
    """The Pallas kernels are not partitioned: on several TPU devices auto takes xla; cuDNN partitions itself."""
    kw = dict(dtype="bfloat16", head_dim=64, seq_len=256)
    assert resolve("auto", "tpu", devices=8, **kw) == "xla"
    assert resolve("auto", "gpu", devices=8, **kw) == "cudnn"


def test_auto_on_cpu_is_the_reference():
    assert CPU_AUTO == "reference"


@pytest.mark.parametrize("name,backend", [("cudnn", "cpu"), ("splash", "gpu"), ("pallas_gpu", "tpu"),
                                          ("cudnn", "tpu")])
def test_fused_kernel_on_another_backend_is_a_one_line_error(name, backend):
    with pytest.raises(ValueError, match=rf"^model.attention='{name}' runs on a [GT]PU only, this process's "
                                         rf"backend is '{backend}'; use auto, xla or reference$"):
        check_backend(name, backend)


def test_explicit_kernel_that_does_not_fit_names_the_reason():
    with pytest.raises(ValueError, match="model.attention='cudnn': .*bfloat16/float16, not float32"):
        resolve("cudnn", "gpu", dtype="float32", head_dim=64, seq_len=128)
    with pytest.raises(ValueError, match="model.attention='pallas_gpu': .*no sliding window"):
        resolve("pallas_gpu", "gpu", dtype="bfloat16", head_dim=64, seq_len=128, sliding_window=8)


def test_every_name_resolves_or_refuses_on_cpu():
    for name in IMPLEMENTATIONS:
        try:
            got = resolve(name, "cpu", dtype="float32", head_dim=8, seq_len=128)
        except ValueError as e:
            assert name in ("cudnn", "splash", "pallas_gpu") and "runs on a" in str(e)
        else:
            assert got in ("reference", "xla")


def test_config_key_names_the_implementations():
    from typing import get_args

    from jaxppo.config import load_config
    from jaxppo.config.schema import Attention

    assert get_args(Attention) == IMPLEMENTATIONS
    assert load_config(overrides=["model.attention=xla"]).model.attention == "xla"
    assert load_config().model.attention == "auto"
    with pytest.raises(ConfigError, match="model.attention"):
        load_config(overrides=["model.attention=flash"])


def test_model_attention_choice_reaches_the_layers():
    """A tiny mistral (sliding window 3), left-padded rows: ``attention="xla"`` gives the logits of the reference on
    the real tokens (1e-5); ``"auto"`` is the reference on the CPU, fed the dense mask of today's layers
    (``attention_allowed``); an unknown name is refused, a GPU kernel fails on the CPU."""
    from flax import nnx

    from jaxppo.models import CausalLM
    from tests.models.tiny_lm import left_padded_prompts, tiny_config

    cfg = tiny_config("mistral")
    ids, mask = left_padded_prompts(cfg.vocab_size)
    state = nnx.state(CausalLM(cfg, rngs=nnx.Rngs(0)))

    def logits(name):
        model = CausalLM(cfg.replace(attention=name), rngs=nnx.Rngs(1))
        nnx.update(model, state)
        return np.asarray(jax.jit(lambda i, m: model(i, m))(ids, mask))

    ref, real = logits("reference"), np.asarray(mask, bool)
    width = ids.shape[1]
    assert cfg.attention == "auto" and cfg.attention_impl(width) == "reference"
    allowed = self_attention_mask(jnp.asarray(mask), cfg.sliding_window, cfg.attention_impl(width))
    np.testing.assert_array_equal(np.asarray(allowed), np.asarray(
        attention_allowed(jnp.arange(width), jnp.arange(width), jnp.asarray(mask), cfg.sliding_window)))
    np.testing.assert_allclose(logits("xla")[real], ref[real], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="LMConfig.attention"):
        cfg.replace(attention="flash")
    with pytest.raises(ValueError, match="model.attention='cudnn' runs on a GPU only"):
        logits("cudnn")


def test_a_layout_for_another_backend_compiles_what_runs_here():
    """``jaxppo.plan`` traces a GPU layout on CPU devices: a cudnn choice becomes this backend's auto there."""
    from tests.models.tiny_lm import tiny_config

    assert tiny_config(backend="gpu", attention="cudnn").attention_impl(64, "cpu") == CPU_AUTO
    with pytest.raises(ValueError, match="runs on a GPU only"):
        tiny_config(attention="cudnn").attention_impl(64, "cpu")
    assert tiny_config(backend="cpu", attention="xla").attention_impl(64, "cpu") == "xla"


def test_cudnn_on_cpu_is_a_one_line_config_error():
    from jaxppo.config import load_config
    from jaxppo.hf.from_config import check_attention_backend

    cfg = load_config(overrides=["model.attention=cudnn"])
    with pytest.raises(ConfigError) as err:
        check_attention_backend(cfg.model, "cpu")
    assert str(err.value) == ("model.attention='cudnn' runs on a GPU only, this process's backend is 'cpu'; "
                              "use auto, xla or reference")
    check_attention_backend(cfg.model, "gpu")
    check_attention_backend(load_config().model, "cpu")
