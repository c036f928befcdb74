"""Mixed precision in the model: ``layers.mixed_einsum`` (16-bit products both ways, float32 accumulation), the
16-bit forward/backward of a whole model, and that float32 models do not change."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models import CausalLM
from jaxppo.models.layers import dense, is_low_precision, mixed_einsum
from tests.models.tiny_lm import tiny_config

BF16 = jnp.bfloat16


def _ints(shape, seed, lo=-4, hi=5):
    """Small integers: exact in bfloat16, and so are their products' sums (below 2^8) in float32."""
    return jnp.asarray(np.random.default_rng(seed).integers(lo, hi, size=shape), jnp.float32)


def test_is_low_precision():
    assert is_low_precision(BF16) and is_low_precision(jnp.float16)
    assert not is_low_precision(jnp.float32) and not is_low_precision(jnp.int16)


@pytest.mark.parametrize("jit", [False, True])
def test_mixed_einsum_hand_case_value_and_grads(jit):
    """``C = A·B``, ``L = Σ C ⊙ G``: ``dL/dA = G·Bᵀ``, ``dL/dB = Aᵀ·G`` -- exact on small integers, in bf16."""
    a = jnp.array([[1.0, 2.0, 0.0], [-1.0, 3.0, 1.0]])            # [2, 3]
    b = jnp.array([[2.0, 1.0], [0.0, -1.0], [4.0, 2.0]])           # [3, 2]
    g = jnp.array([[1.0, -2.0], [3.0, 1.0]])                       # [2, 2]
    want_c = np.array([[2.0, -1.0], [2.0, -2.0]])
    want_da = np.array([[0.0, 2.0, 0.0], [7.0, -1.0, 14.0]])       # g @ b.T
    want_db = np.array([[-2.0, -3.0], [11.0, -1.0], [3.0, 1.0]])   # a.T @ g

    def loss(a, b):
        c = mixed_einsum("nd,dm->nm", a, b)
        return jnp.sum(c.astype(jnp.float32) * g), c

    fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    fn = jax.jit(fn) if jit else fn
    (_, c), (da, db) = fn(a.astype(BF16), b.astype(BF16))
    assert c.dtype == BF16 and da.dtype == BF16 and db.dtype == BF16
    np.testing.assert_array_equal(np.asarray(c, np.float32), want_c)
    np.testing.assert_array_equal(np.asarray(da, np.float32), want_da)
    np.testing.assert_array_equal(np.asarray(db, np.float32), want_db)


def test_mixed_einsum_float32_output_and_errors():
    a, b = _ints((3, 4), 0).astype(BF16), _ints((4, 5), 1).astype(BF16)
    assert mixed_einsum("nd,dm->nm", a, b, jnp.float32).dtype == jnp.float32
    with pytest.raises(TypeError, match="operand dtypes differ"):
        mixed_einsum("nd,dm->nm", a, b.astype(jnp.float32))
    with pytest.raises(ValueError, match="summed within one operand alone"):
        mixed_einsum("nd,km->nm", a, b)


@settings(max_examples=8)  # each example compiles two gradients
@given(spec=st.sampled_from(["nd,dm->nm", "nd,md->nm", "btkgd,bskd->bkgts", "bkgts,bskd->btkgd"]),
       seed=st.integers(0, 2 ** 16))
def test_mixed_einsum_grads_equal_the_float32_einsum_on_integer_operands(spec, seed):
    """On integer-valued operands every product and sum is exact, so the hand-written 16-bit backward must
    equal JAX's own float32 gradient bit for bit (any wrong transpose or index order shows up)."""
    sizes = dict(zip("nmdbtskg", np.random.default_rng(seed).integers(2, 5, size=8)))
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    a = _ints([sizes[c] for c in sa], seed, -2, 3)
    b = _ints([sizes[c] for c in sb], seed + 1, -2, 3)
    g = _ints([sizes[c] for c in out], seed + 2, -2, 3)

    def lo(a, b):
        return jnp.sum(mixed_einsum(spec, a, b, jnp.float32) * g)

    def hi(a, b):
        return jnp.sum(jnp.einsum(spec, a, b, precision="highest") * g)

    got = jax.grad(lo, argnums=(0, 1))(a.astype(BF16), b.astype(BF16))
    want = jax.grad(hi, argnums=(0, 1))(a, b)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y))


def _dot_operand_types(hlo_text: str, max_rank: int | None = None) -> list[str]:
    """``"lhs,rhs->out"`` element types of every ``stablehlo.dot_general`` in a lowered module (only those whose
    operands have at most ``max_rank`` dimensions, when given)."""
    t = r"tensor<((?:\d+x)*)(\w+)>"
    pat = re.compile(rf"stablehlo\.dot_general[^\n]*:\s*\({t}, {t}\)\s*->\s*{t}")
    return [f"{a},{b}->{c}" for da, a, db, b, _, c in pat.findall(hlo_text)
            if max_rank is None or max(da.count("x"), db.count("x")) <= max_rank]


def test_bf16_model_backward_has_only_bf16_gemms():
    """Forward and backward of a bf16-compute model: every 2-D GEMM (the 7 projections and the LM head, forward,
    input and weight gradients) takes bf16 x bf16 -> f32, none a float32 operand. Before ``mixed_einsum``, JAX's
    transpose of ``preferred_element_type=float32`` dots took the float32 cotangent: 2 of the 3 GEMMs of each
    projection were f32 x bf16 (run as float32 behind converts). (Attention's batched products keep JAX's own
    rule: see ``layers.attention``.)"""
    model = CausalLM(tiny_config("smollm2", compute_dtype="bfloat16"), rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 61, size=(2, 6)), jnp.int32)

    def loss(p):
        return jnp.mean(jax.nn.logsumexp(nnx.merge(gd, p)(ids), -1))

    text = jax.jit(jax.grad(loss)).lower(params).as_text()
    types = _dot_operand_types(text, max_rank=3)  # [B, T, D] activations and 2-D weights; not attention's [B, .., T, S]
    assert len(types) >= 3 * (7 + 1)  # 7 projections per layer (inside the scan body) + the head, x3
    assert set(types) == {"bf16,bf16->f32"}, sorted(set(types))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's lowering of the weight gradients")
def test_bf16_weight_gradients_compile_to_16bit_gemms_on_cpu():
    """XLA:CPU runs a bf16 dot in 16 bits only when its lhs contracts its last dim; a weight gradient ``xᵀ·g`` over
    flattened rows (one contraction over the lhs's first dim) was upcast to a float32 dot, one per projection.
    ``dense`` and, off a mesh, the LM head keep the leading dims in 16 bits, so the compiled backward has no such
    dot left; it failed with 7 of them per layer (and the head's) before."""
    model = CausalLM(tiny_config("smollm2", compute_dtype="bfloat16"), rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 61, size=(2, 6)), jnp.int32)

    def loss(p):
        return jnp.mean(jax.nn.logsumexp(nnx.merge(gd, p)(ids), -1))

    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    first_dim = [ln for ln in hlo.splitlines() if " dot(" in ln and "lhs_contracting_dims={0}" in ln]
    assert first_dim == []


def test_float32_dense_and_attention_unchanged():
    """The float32 path is the plain ``jnp.dot`` (preferred float32): same values as the matmul, no custom rule."""
    x, w = _ints((2, 3, 4), 3), _ints((4, 2, 5), 4)
    np.testing.assert_array_equal(np.asarray(dense(x, w)), np.einsum("btd,dhe->bthe", np.asarray(x), np.asarray(w)))
    text = jax.jit(jax.grad(lambda x: jnp.sum(dense(x, w)))).lower(x).as_text()
    assert "custom" not in text and set(_dot_operand_types(text)) == {"f32,f32->f32"}


@pytest.mark.parametrize("jit", [True])  # un-jitted dtypes: the hand case above and tests/trainer/ppo's test
def test_bf16_compute_logits_and_grads_are_float32_and_close(jit):
    """float32 parameters, bfloat16 compute: float32 logits and float32 gradients (the master weights' dtype),
    close to the float32 model's (bf16 has 8 significant bits): measured 0.5-1.1% relative error per gradient
    leaf at this init (std 0.02), the same as before the 16-bit backward (JAX's float32 one: 0.5-1.0%)."""
    cfg = tiny_config("smollm2", initializer_range=0.02)
    m32 = CausalLM(cfg, rngs=nnx.Rngs(0))
    gd16, _ = nnx.split(CausalLM(cfg.replace(compute_dtype="bfloat16"), rngs=nnx.Rngs(0)))
    gd32, params = nnx.split(m32)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 61, size=(2, 8)), jnp.int32)

    def loss(gd, p):
        z = nnx.merge(gd, p)(ids)
        return jnp.mean(jax.nn.logsumexp(z[:, :-1], -1) - jnp.take_along_axis(z[:, :-1], ids[:, 1:, None], -1)[..., 0]), z

    fns = [jax.value_and_grad(lambda p, gd=gd: loss(gd, p), has_aux=True) for gd in (gd32, gd16)]
    if jit:
        fns = [jax.jit(f) for f in fns]
    (l32, z32), g32 = fns[0](params)
    (l16, z16), g16 = fns[1](params)
    assert z16.dtype == jnp.float32 and l16.dtype == jnp.float32
    assert {x.dtype for x in jax.tree.leaves(g16)} == {jnp.dtype(jnp.float32)}
    assert abs(float(l16) - float(l32)) < 1e-3 * abs(float(l32))
    for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(a - b) <= 0.03 * np.linalg.norm(b)


def test_bf16_compute_generation_runs_and_matches_float32_greedy_start():
    """KV-cache decoding with bf16 compute executes (a batched bf16 x bf16 -> f32 value product once failed
    here at run time on XLA:CPU) and, greedy, starts like the float32 model on this peaked tiny model."""
    from jaxppo.models import generate
    from tests.models.tiny_lm import left_padded_prompts

    cfg = tiny_config("smollm2")
    m32 = CausalLM(cfg, rngs=nnx.Rngs(0))
    m16 = nnx.eval_shape(lambda: CausalLM(cfg.replace(compute_dtype="bfloat16"), rngs=nnx.Rngs(0)))
    nnx.update(m16, nnx.state(m32))
    ids, mask = left_padded_prompts(61)
    outs = [generate(m, ids, mask, jax.random.key(0), max_new_tokens=4, temperature=0.0) for m in (m32, m16)]
    toks = [np.asarray(o.tokens) for o in outs]
    assert toks[1].shape == toks[0].shape and int(np.asarray(outs[1].mask).sum()) > 0
    np.testing.assert_array_equal(toks[1][:, 0], toks[0][:, 0])
