"""LoRA adapters (jaxppo.models.lora / adapters): formulas by hand, the model with adapters vs the base, merged
weights, gradients only for the adapters, the (trainable, base) split and the reference without a copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.models import CausalLM
from jaxppo.models.adapters import (
    TRAINABLE,
    attach_lora,
    lora_critic,
    merged_model,
    reference_adapters,
    split_frozen,
    trunk_of,
)
from jaxppo.models.lora import TARGETS, LoRAParam, LoraSpec, lora_delta, merged_weight, param_counts
from tests.models.tiny_lm import tiny_config, tiny_lm

IDS = np.array([[5, 9, 3, 17, 2, 40], [0, 0, 7, 8, 33, 1]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int32)


def test_lora_delta_and_merged_weight_by_hand():
    x = jnp.array([[1.0, 2.0]])
    a = jnp.array([[1.0], [-1.0]])        # [in=2, r=1]: x·A = 1 - 2 = -1
    b = jnp.array([[3.0, 0.5, -2.0]])     # [r=1, out=3]
    np.testing.assert_allclose(lora_delta(x, a, b, scale=2.0), [[-6.0, -1.0, 4.0]])
    w = jnp.zeros((2, 3))
    # W' = W + s·A·B = 2 · [[3, .5, -2], [-3, -.5, 2]]
    np.testing.assert_allclose(merged_weight(w, a, b, 2.0), [[6.0, 1.0, -4.0], [-6.0, -1.0, 4.0]])
    # o-style weight with two input axes [H=1, hd=2, D=3]: the same numbers in W's shape
    np.testing.assert_allclose(merged_weight(w.reshape(1, 2, 3), a, b, 2.0, n_in=2).reshape(2, 3),
                               [[6.0, 1.0, -4.0], [-6.0, -1.0, 4.0]])


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.floats(0.1, 4.0), st.integers(0, 2 ** 16))
def test_merged_weight_equals_adapter_forward(r, d_in, d_out, scale, seed):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    x, w = jax.random.normal(k[0], (3, d_in)), jax.random.normal(k[1], (d_in, d_out))
    a, b = jax.random.normal(k[2], (d_in, r)), jax.random.normal(k[3], (r, d_out))
    np.testing.assert_allclose(x @ merged_weight(w, a, b, scale), x @ w + lora_delta(x, a, b, scale), atol=1e-4,
                               rtol=1e-5)


def test_spec_rejects_bad_values():
    for kw, word in [(dict(rank=0), "rank"), (dict(rank=2, alpha=0.0), "alpha"), (dict(rank=2, targets=("x",)),
                     "targets"), (dict(rank=2, targets=()), "targets"), (dict(rank=2, dropout=1.0), "dropout")]:
        with pytest.raises(ValueError, match=word):
            LoraSpec(**kw)
    assert LoraSpec(rank=4, alpha=8).scale == 2.0


def _with_random_b(lm: CausalLM, seed: int = 1) -> CausalLM:
    """Adapters that change the output (B = 0 at init leaves the model as it is)."""
    rng = np.random.default_rng(seed)
    for t in lm.config.lora.targets:
        var = getattr(lm.model.layers, f"{t}_lora_b")
        var.set_value(jnp.asarray(rng.normal(0, 0.2, var.get_value().shape), jnp.float32))
    return lm


@pytest.mark.parametrize("family", ["llama", "qwen2", "smollm2"])
@pytest.mark.parametrize("scan", [True, False])
def test_adapters_at_init_equal_the_base_exactly_and_merge(family, scan):
    base = tiny_lm(family, scan_layers=scan)
    want = np.asarray(base(IDS, MASK))
    lm = attach_lora(tiny_lm(family, scan_layers=scan), LoraSpec(rank=3, alpha=6.0), seed=0)
    assert lm.config.lora.rank == 3 and all(isinstance(getattr(lm.model.layers, f"{t}_lora_a"), LoRAParam)
                                            for t in TARGETS)
    np.testing.assert_array_equal(np.asarray(lm(IDS, MASK)), want)                  # B = 0: exactly the base
    fwd = nnx.jit(lambda m: m(IDS, MASK))
    np.testing.assert_allclose(np.asarray(fwd(lm)), np.asarray(fwd(base)), atol=1e-6)   # jitted too
    _with_random_b(lm)
    adapted = np.asarray(lm(IDS, MASK))
    assert np.max(np.abs(adapted - want)) > 1e-2                                    # the adapters do something
    merged = merged_model(lm)
    assert merged.config.lora is None
    np.testing.assert_allclose(np.asarray(merged(IDS, MASK)), adapted, atol=1e-4)    # W + s·A·B, float32
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m: m(IDS, MASK))(lm)), adapted, atol=1e-5)


def test_gradients_reach_only_the_adapters():
    lm = _with_random_b(attach_lora(tiny_lm("llama"), LoraSpec(rank=2, targets=("q", "v", "down")), seed=0))
    graphdef, state = nnx.split(lm)

    def loss(s):
        return jnp.mean(nnx.merge(graphdef, s)(IDS, MASK) ** 2)

    for g in (jax.grad(loss)(state), jax.jit(jax.grad(loss))(state)):
        flat = {"/".join(map(str, p)): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(g)[0]}
        lora = {k: v for k, v in flat.items() if "_lora_" in k}
        assert sorted(lora) and all(np.abs(v).max() > 0 for v in lora.values()), "adapter gradients missing"
        base = {k: v for k, v in flat.items() if "_lora_" not in k}
        assert base and all(np.all(v == 0) for v in base.values()), [k for k, v in base.items() if np.any(v)]


def test_split_reference_and_counts():
    lm = _with_random_b(attach_lora(tiny_lm("llama"), LoraSpec(rank=2), seed=0))
    gd, trainable, base = split_frozen(lm)
    n_lora, n_all = param_counts(lm)
    assert sum(x.size for x in jax.tree.leaves(trainable)) == n_lora
    assert n_lora + sum(x.size for x in jax.tree.leaves(base)) == n_all
    cfg = lm.config
    # 7 targets, per layer r·(in + out): q/k/v/gate/up: in D; o: in H·hd; down: in F
    D, F, L, hd, H, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.head_dim, \
        cfg.num_attention_heads, cfg.num_key_value_heads
    assert n_lora == L * 2 * ((D + H * hd) + 2 * (D + K * hd) + (H * hd + D) + 2 * (D + F) + (F + D))
    # the reference = the base with adapters off, sharing its arrays; equal to the model before adapters
    ref = nnx.merge(gd, reference_adapters(trainable), base)
    np.testing.assert_array_equal(np.asarray(ref(IDS, MASK)), np.asarray(tiny_lm("llama")(IDS, MASK)))
    assert ref.model.layers.q.get_value() is base["model"]["layers"]["q"].get_value()
    again = nnx.merge(gd, trainable, base)
    np.testing.assert_array_equal(np.asarray(again(IDS, MASK)), np.asarray(lm(IDS, MASK)))


def test_critic_on_the_shared_base_has_its_own_adapters_and_head():
    lm = attach_lora(tiny_lm("llama"), LoraSpec(rank=2), seed=0)
    _, _, base = split_frozen(lm)
    cgd, ctrain = lora_critic(lm.config, seed=5)
    names = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(ctrain)[0]}
    assert any("value_head" in n for n in names) and any("_lora_" in n for n in names)
    assert not any(n.endswith(("/q", "/embed")) for n in names), "the critic must not hold base weights"
    critic = nnx.merge(cgd, ctrain, trunk_of(base))
    values = critic(IDS, MASK)
    assert values.shape == IDS.shape and np.isfinite(np.asarray(values)).all()
    # at init (B = 0) its trunk is the base's: values = head(base hidden states)
    h = tiny_lm("llama").model(IDS, MASK)
    np.testing.assert_allclose(np.asarray(values), np.asarray(critic.value_head(h)), atol=1e-6)
    paths = lambda t: sorted(str(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0])  # noqa: E731
    assert paths(nnx.state(critic, TRAINABLE)) == paths(ctrain)


def test_attach_twice_and_bad_spec_fail():
    lm = attach_lora(tiny_lm("llama"), LoraSpec(rank=2), seed=0)
    with pytest.raises(ValueError, match="already has adapters"):
        attach_lora(lm, LoraSpec(rank=2))
    with pytest.raises(TypeError, match="LoraSpec"):
        attach_lora(tiny_lm("llama"), {"rank": 2})
    with pytest.raises(ValueError, match="LMConfig.lora"):
        tiny_config("llama", lora={"rank": 2})


@pytest.mark.parametrize("fmt", ["int8", "nf4"])
def test_quantized_base_dequantizes_within_bounds_and_exports_merged(fmt):
    from jaxppo.models.layers import weight
    from jaxppo.models.quant import nf4_error_bound

    kw = dict(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, intermediate_size=128,
              initializer_range=0.1)   # last dims multiples of 64 (NF4 blocks)
    ref = tiny_lm("llama", **kw)
    lm = attach_lora(tiny_lm("llama", **kw), LoraSpec(rank=2, quantize_base=fmt), seed=0)
    layers = lm.model.layers
    assert layers.q.get_value().dtype == (jnp.int8 if fmt == "int8" else jnp.uint8)
    raw = {n: getattr(layers, n).get_value() for n in layers.base_names()}
    for t in TARGETS:
        w, got = np.asarray(getattr(ref.model.layers, t).get_value()), np.asarray(weight(raw, t, jnp.float32))
        if fmt == "int8":
            bound = np.asarray(raw[t + "_scale"]) / 2 * (1 + 1e-5)
        else:
            bound = np.asarray(nf4_error_bound(jnp.asarray(w)))
        assert np.all(np.abs(got - w) <= bound), t
    want = np.asarray(ref(IDS, MASK))
    q_logits = np.asarray(lm(IDS, MASK))
    assert np.max(np.abs(q_logits - want)) < (0.05 if fmt == "int8" else 0.5) * np.max(np.abs(want))
    gd, trainable, base = split_frozen(lm)
    np.testing.assert_array_equal(np.asarray(nnx.merge(gd, reference_adapters(trainable), base)(IDS, MASK)),
                                  q_logits)                     # reference = the quantized base, adapters off
    _with_random_b(lm)
    merged = merged_model(lm)
    assert merged.model.layers.q.get_value().dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(merged(IDS, MASK)), np.asarray(lm(IDS, MASK)), atol=1e-4)


def test_nf4_needs_last_dims_divisible_by_64():
    with pytest.raises(ValueError, match="multiple of the block size 64"):
        attach_lora(tiny_lm("llama"), LoraSpec(rank=2, quantize_base="nf4"))


@pytest.mark.parametrize("jit", [False, True])
def test_adapters_under_bfloat16_compute(jit):
    """Adapters with ``compute_dtype=bfloat16`` (float32 parameters): at init (B = 0) the output is the bf16 base's
    exactly; with adapters that act it stays within bf16 rounding of the float32 adapter forward; the gradients
    reach the adapters in float32 and the base gets none (adapters in bf16 and f32)."""
    run = (lambda f: jax.jit(f)) if jit else (lambda f: f)
    base16 = tiny_lm("llama", compute_dtype="bfloat16")
    lm16 = attach_lora(tiny_lm("llama", compute_dtype="bfloat16"), LoraSpec(rank=2), seed=0)
    gd16, st16 = nnx.split(lm16)
    gdb, stb = nnx.split(base16)
    fwd16 = run(lambda s: nnx.merge(gd16, s)(IDS, MASK))
    np.testing.assert_array_equal(np.asarray(fwd16(st16)), np.asarray(run(lambda s: nnx.merge(gdb, s)(IDS, MASK))(stb)))
    lm32 = _with_random_b(attach_lora(tiny_lm("llama"), LoraSpec(rank=2), seed=0))
    _with_random_b(lm16)
    gd16, st16 = nnx.split(lm16)
    out16 = np.asarray(run(lambda s: nnx.merge(gd16, s)(IDS, MASK))(st16)).astype(np.float32)
    out32 = np.asarray(lm32(IDS, MASK))
    base32 = np.asarray(tiny_lm("llama")(IDS, MASK))
    # measured: mean |bf16 - f32| 0.037 with adapters (0.022 without) while the adapters move the logits by 2.3
    err, effect = np.mean(np.abs(out16 - out32)), np.mean(np.abs(out32 - base32))
    assert err < 0.05 * effect and err < 0.1, (err, effect)

    def loss(s):
        return jnp.mean(nnx.merge(gd16, s)(IDS, MASK).astype(jnp.float32) ** 2)

    g = run(jax.grad(loss))(st16)
    flat = {"/".join(map(str, p)): v for p, v in jax.tree_util.tree_flatten_with_path(g)[0]}
    lora = {k: v for k, v in flat.items() if "_lora_" in k}
    assert lora and all(v.dtype == jnp.float32 and np.abs(np.asarray(v)).max() > 0 for v in lora.values())
    assert all(np.all(np.asarray(v) == 0) for k, v in flat.items() if "_lora_" not in k)


@pytest.mark.parametrize("fmt", ["int8", "nf4"])
def test_stacked_quantization_is_per_layer_and_equals_the_whole_stack(fmt):
    """quantize_stacked quantizes one layer at a time (bounded float32 temporaries on a 24 GB card) and gives the
    same codes and scales as quantizing the whole [L, ...] stack at once (scales per output channel, NF4 blocks
    along the last axis: nothing crosses a layer)."""
    from jaxppo.models.lora import _N_IN, quantize_stacked
    from jaxppo.models.quant import quantize_int8, quantize_nf4_last

    w = jax.random.normal(jax.random.PRNGKey(3), (3, 64, 128), jnp.float32).astype(jnp.bfloat16)
    got = quantize_stacked({"up": (w, ("layers", "embed", "mlp"))}, fmt)
    if fmt == "int8":
        whole = quantize_int8(w, n_in=_N_IN["up"], lead=1)
        np.testing.assert_array_equal(np.asarray(got["up"].get_value()), np.asarray(whole.q))
        np.testing.assert_array_equal(np.asarray(got["up_scale"].get_value()), np.asarray(whole.scale))
    else:
        packed, absmax = quantize_nf4_last(w)
        np.testing.assert_array_equal(np.asarray(got["up"].get_value()), np.asarray(packed))
        np.testing.assert_array_equal(np.asarray(got["up_absmax"].get_value()), np.asarray(absmax))


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("fmt", ["int8", "nf4"])
def test_quantized_base_under_bfloat16_compute_uses_float32_scales(fmt, scan):
    """With ``compute_dtype=bfloat16`` a quantized base is dequantized from its float32 scales / block maxima and
    rounded to bf16 once: the logits equal those of the same bf16-compute model whose base holds the float32
    dequantized weights (the scales are never rounded to bf16 first, which moved the weights by up to 1 bf16 ulp)."""
    from jaxppo.models.layers import weight

    kw = dict(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, intermediate_size=128,
              initializer_range=0.1, compute_dtype="bfloat16", scan_layers=scan)
    lm = attach_lora(tiny_lm("llama", **kw), LoraSpec(rank=2, quantize_base=fmt), seed=0)
    layers = lm.model.layers
    params = layers.param_dict(jnp.bfloat16)
    assert all(params[t + sfx].dtype == jnp.float32 for t in TARGETS for sfx in ("_scale", "_absmax")
               if t + sfx in params)
    raw = {n: getattr(layers, n).get_value() for n in layers.base_names()}
    plain = attach_lora(tiny_lm("llama", **kw), LoraSpec(rank=2), seed=0)
    for t in TARGETS:   # the float32 dequantized weights, stored as float32 parameters of an unquantized base
        getattr(plain.model.layers, t).set_value(weight(raw, t, jnp.float32))
    np.testing.assert_array_equal(np.asarray(lm(IDS, MASK)), np.asarray(plain(IDS, MASK)))


def test_compact_replaces_the_arrays_with_equal_ones_in_place():
    """``adapters.compact`` (run after quantizing a base, on accelerators) re-places every array through the host:
    same values, dtypes and shardings (an 8-device FSDP mesh here), the old buffers deleted; a no-op on the CPU
    unless forced, as with_adapters calls it."""
    from jaxppo.models import shard_model
    from jaxppo.models.adapters import compact
    from jaxppo.parallel import make_mesh

    kw = dict(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, intermediate_size=128)
    lm = shard_model(attach_lora(tiny_lm("llama", **kw), LoraSpec(rank=2, quantize_base="nf4"), seed=0),
                     make_mesh(2, 4, 1))
    before = jax.tree.leaves(nnx.state(lm))
    want = [(np.asarray(x), x.dtype, x.sharding) for x in before]
    logits = np.asarray(lm(IDS, MASK))
    assert compact(lm) is False and jax.tree.leaves(nnx.state(lm))[0] is before[0]   # CPU: left as it is
    assert compact(lm, force=True) is True
    after = jax.tree.leaves(nnx.state(lm))
    assert all(x.is_deleted() for x in before) and not any(x.is_deleted() for x in after)
    for x, (v, dt, sh) in zip(after, want):
        assert x.dtype == dt and x.sharding == sh
        np.testing.assert_array_equal(np.asarray(x), v)
    np.testing.assert_array_equal(np.asarray(lm(IDS, MASK)), logits)
