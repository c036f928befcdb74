"""Packed batches (``jaxppo.models.packing`` + ``Transformer.packed``): the planner's hand cases, and per sequence the
same log-probs, entropies, values, losses and gradients as the padded layout, for every family, jit and eager, on
one device and an 8-device mesh."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models import shard_model
from jaxppo.models.heads import ScalarHead
from jaxppo.models.adapters import attach_lora
from jaxppo.models.layers import positions_from_mask
from jaxppo.models.lora import LoraSpec
from jaxppo.models.packing import ProgramLog, first_fit_decreasing, gather, pack, pack_batch, row_budgets
from jaxppo.parallel import batch_sharding, make_mesh
from jaxppo.trainer.ppo.forward import logp_entropy, response_hidden
from tests.models.tiny_lm import FAMILIES, tiny_lm

P, R = 6, 5


class Tokens(NamedTuple):
    prompt_ids: jax.Array
    prompt_mask: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array


def padded_batch(prompt_lens, response_lens, vocab=61, seed=0):
    """A batch in the repo's layout: prompts left padded to P, responses right padded to R (pad id 0)."""
    rng = np.random.default_rng(seed)
    b = len(prompt_lens)
    pm = (np.arange(P)[None, :] >= P - np.asarray(prompt_lens)[:, None]).astype(np.int32)
    rm = (np.arange(R)[None, :] < np.asarray(response_lens)[:, None]).astype(np.int32)
    return SimpleNamespace(prompt_ids=rng.integers(1, vocab, (b, P)).astype(np.int32) * pm, prompt_mask=pm,
                           response_ids=rng.integers(1, vocab, (b, R)).astype(np.int32) * rm, response_mask=rm)


# ---------------------------------------------------------------- planner, by hand

def test_row_budgets_hand_cases():
    assert row_budgets(32) == [4, 8, 12, 16, 20, 24, 28, 32]
    assert row_budgets(5) == [1, 2, 3, 4, 5]
    assert row_budgets(10, buckets=8, multiple_of=4) == [4, 8, 12]
    assert row_budgets(7, buckets=2) == [4, 7]
    with pytest.raises(ValueError):
        row_budgets(0)


def test_first_fit_decreasing_hand_case():
    # decreasing order: 5 (i=1) -> row 0 [0,5); 4 (i=3) -> row 1 [0,4); 3 (i=0) -> row 2; 2 (i=2) -> row 1 [4,6)
    row, start = first_fit_decreasing(np.array([3, 5, 2, 4]), 6)
    assert row.tolist() == [2, 0, 1, 1] and start.tolist() == [0, 0, 4, 0]
    with pytest.raises(ValueError, match="exceeds"):
        first_fit_decreasing(np.array([7]), 6)


def test_pack_hand_case():
    #            prompt (P=3, left pad)  response (R=2, right pad)   real tokens
    # seq 0:     [0, 5, 6]                [10, 0]                    5 6 10       (3)
    # seq 1:     [7, 8, 9]                [11, 12]                   7 8 9 11 12  (5)
    # seq 2:     [0, 0, 4]                [13, 14]                   4 13 14      (3)
    pm = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    pi = pm * np.array([[0, 5, 6], [7, 8, 9], [0, 0, 4]])
    rm = np.array([[1, 0], [1, 1], [1, 1]])
    ri = rm * np.array([[10, 0], [11, 12], [13, 14]])
    pk = pack(pi, pm, ri, rm)   # L = 5: seq 1 fills row 0; seqs 0 and 2 (3 + 3 > 5) take rows 1 and 2
    assert pk.ids.tolist() == [[7, 8, 9, 11, 12], [5, 6, 10, 0, 0], [4, 13, 14, 0, 0]]
    assert pk.segment_ids.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert pk.positions.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0], [0, 1, 2, 0, 0]]
    # response token t is predicted by the sequence's token p_b + t - 1: seq 0 -> slot of "6" (row 1, slot 1) = 6
    assert pk.response_index.tolist() == [[6, 0], [2, 3], [10, 11]]
    assert pk.token_index.tolist() == [[0, 5, 6, 7, 0], [0, 1, 2, 3, 4], [0, 0, 10, 11, 12]]
    assert pk.last_index.tolist() == [7, 4, 12]
    # the 5 real response tokens in (sequence, token) order: slots as response_index, targets b·R + t; the budget
    # of 5 among row_budgets(B·R = 6, 8) = 1, 2, 3, 4, 5, 6 is 5 (no padding entry)
    assert pk.head_index.tolist() == [6, 2, 3, 10, 11] and pk.head_target.tolist() == [0, 2, 3, 4, 5]
    pk2 = pack(pi, pm, ri, rm, buckets=2)   # budgets 3, 6: one padding entry (slot 0, target B·R = 6)
    assert pk2.head_index.tolist() == [6, 2, 3, 10, 11, 0] and pk2.head_target.tolist() == [0, 2, 3, 4, 5, 6]
    # rows of 8: seq 1 (5) in row 0, seq 0 (3) after it in row 0 (segment 2), seq 2 in row 1
    pk8 = pack(pi, pm, ri, rm, row_length=8)
    assert pk8.segment_ids.tolist() == [[1] * 5 + [2] * 3, [1] * 3 + [0] * 5]
    assert pk8.positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert pk8.response_index[0].tolist() == [6, 0] and pk8.last_index.tolist() == [7, 4, 10]


def test_pack_rejects_bad_layouts():
    b = padded_batch([2, 3], [1, 2])
    with pytest.raises(ValueError, match="left padded"):
        pack(b.prompt_ids, b.prompt_mask[:, ::-1], b.response_ids, b.response_mask)
    with pytest.raises(ValueError, match="right padded"):
        pack(b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask[:, ::-1])
    with pytest.raises(ValueError, match="no prompt token"):
        pack_batch(padded_batch([0, 3], [1, 2]))


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, P), st.integers(0, R)), min_size=1, max_size=12),
       width=st.integers(P + R, 3 * (P + R)), buckets=st.integers(1, 8), mult=st.integers(1, 4))
def test_pack_property(lens, width, buckets, mult):
    """Every real token of the padded rows, at its padded position, is found at ``token_index``; segments are
    consecutive and never share a row slot; the row count is a budget and at most B rounded to the multiple."""
    b = padded_batch([a for a, _ in lens], [c for _, c in lens])
    pk = pack_batch(b, row_length=width, buckets=buckets, multiple_of=mult)
    n = len(lens)
    assert pk.ids.shape[0] in row_budgets(n, buckets, mult) and pk.ids.shape[1] == width
    ids = np.concatenate([b.prompt_ids, b.response_ids], 1)
    mask = np.concatenate([b.prompt_mask, b.response_mask], 1).astype(bool)
    pos = np.asarray(positions_from_mask(jnp.asarray(mask)))
    flat = lambda a: a.reshape(-1)  # noqa: E731
    np.testing.assert_array_equal(flat(pk.ids)[pk.token_index][mask], ids[mask])
    np.testing.assert_array_equal(flat(pk.positions)[pk.token_index][mask], pos[mask])
    assert (flat(pk.segment_ids)[pk.token_index][mask] > 0).all()
    assert (pk.segment_ids > 0).sum() == mask.sum()           # nothing else is real
    for i in range(n):                                        # one segment per sequence, its slots consecutive
        slots = pk.token_index[i][mask[i]]
        assert np.array_equal(slots, slots[0] + np.arange(slots.size))
        assert len(set(flat(pk.segment_ids)[slots])) == 1
        assert pk.last_index[i] == slots[-1]
        r = b.response_mask[i].astype(bool)
        np.testing.assert_array_equal(pk.response_index[i][r], pk.token_index[i][P - 1:P + R - 1][r])
    real_r = b.response_mask.astype(bool)
    k = int(real_r.sum())
    h = pk.head_index.shape[0]
    assert h in row_budgets(n * R, buckets, mult) and h >= k and pk.head_target.shape == (h,)
    assert k == 0 or h < k + max(-(-n * R // buckets), 1) + mult           # the smallest budget that holds them
    np.testing.assert_array_equal(pk.head_index[:k], pk.response_index[real_r])
    np.testing.assert_array_equal(pk.head_target[:k], np.flatnonzero(real_r))
    assert (pk.head_target[k:] == n * R).all() and (pk.head_index[k:] == 0).all()
    used = [tuple(x) for x in np.stack([pk.token_index[mask] // width, flat(pk.segment_ids)[pk.token_index[mask]]], 1)]
    assert len({u for u in used}) == n                        # (row, segment) pairs identify the sequences


def test_program_log_counts_shapes():
    log = ProgramLog()
    log.add(pack_batch(padded_batch([6, 6, 6, 6], [5, 5, 5, 5])))
    log.add(pack_batch(padded_batch([1, 1, 1, 1], [0, 1, 0, 1])))
    # (N, L, H): 20 real response tokens -> H = 20 of row_budgets(20, 8) = 3, 5, 8, ..., 20; 2 -> H = 3
    assert log.shapes == {(4, 11, 20), (1, 11, 3)} and log.real == 44 + 6 and log.padded_slots == 88


# ---------------------------------------------------------------- model: packed == padded

def _outputs(lm, head, batch, packed, weights):
    """The shared-trunk update's quantities: log-probs, entropies, values [B, R] and a loss mixing all three."""
    h = response_hidden(lm.model, batch, packed=packed)
    logits = lm.logits_from_hidden(h)
    logp, ent = logp_entropy(logits, batch.response_ids, batch.response_mask)
    values = head(h) * batch.response_mask
    loss = jnp.sum(weights * (logp + 0.1 * ent + 0.5 * values ** 2))
    return loss, (logp, ent, values)


def _run(models, tok, packed, weights):
    lm, head = models
    return _outputs(lm, head, tok, packed, weights)


def _float_param(path, x) -> bool:
    """The differentiable parameters (a quantized base's integer codes are not)."""
    return isinstance(x, nnx.Param) and jnp.issubdtype(jnp.asarray(x.get_value()).dtype, jnp.floating)


def assert_grads_close(g_want, g_got, tol=1e-5):
    """Per gradient leaf ``max|got − want| <= tol · max(max|want|, 1)``: within ``tol`` absolutely for leaves of
    scale <= 1, relatively above. Another row layout changes float32 sums (XLA:CPU's matmuls differ in the last
    bits for another row count, and the weight gradients add the per-token terms in another order): ~1e-6 of the
    leaf's scale here; one wrong token or attention link moves them by far more."""
    want, got = jax.tree.leaves(g_want), jax.tree.leaves(g_got)
    assert len(want) == len(got) > 5
    for a, b in zip(want, got):
        a, b = np.asarray(a), np.asarray(b)
        scale = max(float(np.abs(a).max()), 1.0)
        assert float(np.abs(a - b).max()) <= tol * scale, (a.shape, float(np.abs(a - b).max()), scale)


_VG = nnx.value_and_grad(_run, has_aux=True, argnums=nnx.DiffState(0, _float_param))
_VG_JIT = nnx.jit(_VG)        # one function object: its programs are reused across examples of equal shapes


def _compare(lm, batch, jit, packed_kw=None, atol=1e-5, check_pass=False):
    head = ScalarHead(lm.config.hidden_size, rngs=nnx.Rngs(5), std=0.5)
    pk = pack_batch(batch, **(packed_kw or {}))
    w = jnp.asarray(np.random.default_rng(1).normal(size=batch.response_ids.shape).astype(np.float32))
    tok = Tokens(**{k: jnp.asarray(v) for k, v in vars(batch).items()})
    vg = _VG_JIT if jit else _VG
    (l0, o0), g0 = vg((lm, head), tok, None, w)
    (l1, o1), g1 = vg((lm, head), tok, jax.tree.map(jnp.asarray, pk), w)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=atol)
    for a, b, name in zip(o0, o1, ("logp", "entropy", "values")):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=atol, err_msg=name)
    assert_grads_close(g0, g1)
    if not check_pass:
        return
    # the jitted module-level pass of the behaviour log-probs agrees too
    from jaxppo.models.transformer import continuation_logprobs, packed_logprobs

    gd, state = nnx.split(lm)
    ref = continuation_logprobs(gd, state, tok.prompt_ids, tok.prompt_mask, tok.response_ids, tok.response_mask)
    got = packed_logprobs(gd, state, pk, tok.response_ids, tok.response_mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=atol)


LENS = st.lists(st.tuples(st.integers(1, P), st.integers(0, R)), min_size=4, max_size=4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=4, deadline=None)
@given(lens=LENS, seed=st.integers(0, 2 ** 16))
def test_packed_equals_padded_jit(family, lens, seed):
    """Fixed B, P, R (few compiled programs): random lengths and tokens, rows of P+R (and 2 buckets: 2 packed
    shapes); the behaviour pass's jitted functions too."""
    batch = padded_batch([a for a, _ in lens], [c for _, c in lens], seed=seed)
    _compare(_model(family), batch, jit=True, packed_kw=dict(buckets=2), check_pass=True)


@pytest.mark.parametrize("family", ["mistral"])
def test_packed_equals_padded_eager(family):
    """Un-jitted (unrolled layers: an eager scan recompiles its body at every call), rows long enough to hold
    several sequences side by side (mistral: the sliding window inside a row shared by segments)."""
    batch = padded_batch([6, 1, 3, 2], [5, 0, 2, 4], seed=3)
    _compare(tiny_lm(family, seed=1, scan_layers=False), batch, jit=False, packed_kw=dict(row_length=2 * (P + R)))


def _lora(quantize_base=None):
    lm = attach_lora(tiny_lm("llama", seed=2), LoraSpec(rank=2, alpha=4.0, quantize_base=quantize_base), seed=0)
    for t in lm.config.lora.targets:                            # B starts at 0: make the adapters matter
        var = getattr(lm.model.layers, f"{t}_lora_b")
        var.set_value(var.get_value() + 0.3)
    return lm


@pytest.mark.parametrize("variant", ["remat-scan", "unrolled", "lora", "lora-int8"])
def test_packed_equals_padded_variants(variant):
    lm = {"remat-scan": lambda: tiny_lm("llama", seed=2, remat=True, scan_layers=True),
          "unrolled": lambda: tiny_lm("llama", seed=2, scan_layers=False),
          "lora": _lora, "lora-int8": lambda: _lora("int8")}[variant]()
    batch = padded_batch([6, 1, 3, 2, 5], [5, 0, 2, 4, 1], seed=4)
    _compare(lm, batch, jit=True, packed_kw=dict(row_length=P + R + 3))


def test_packed_bf16_close_to_padded():
    """16-bit compute: the same computation on other rows, so equal up to bfloat16 rounding, not bit for bit."""
    batch = padded_batch([6, 1, 3, 2], [5, 0, 2, 4], seed=5)
    lm = tiny_lm("llama", seed=2, compute_dtype="bfloat16", initializer_range=0.1)
    pk = pack_batch(batch)
    gd, state = nnx.split(lm)
    from jaxppo.models.transformer import continuation_logprobs, packed_logprobs

    ref = continuation_logprobs(gd, state, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                batch.response_mask)
    got = packed_logprobs(gd, state, pk, batch.response_ids, batch.response_mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=0.1)


def test_no_attention_across_segments():
    """Changing another sequence in the same packed row changes nothing of this one's outputs."""
    lm = _model("llama")
    batch = padded_batch([3, 2], [2, 3], seed=6)
    pk = pack_batch(batch, row_length=P + R)
    assert pk.ids.shape[0] == 1                                 # both in one row
    fwd = nnx.jit(lambda m, ids: m.model.packed(ids, pk.segment_ids, pk.positions))
    h = fwd(lm, pk.ids)
    ids2 = pk.ids.copy()
    ids2[pk.segment_ids == 2] = (ids2[pk.segment_ids == 2] + 7) % 61
    h2 = fwd(lm, ids2)
    one = pk.segment_ids == 1
    np.testing.assert_array_equal(np.asarray(h)[one], np.asarray(h2)[one])
    assert not np.allclose(np.asarray(h)[~one & (pk.segment_ids > 0)], np.asarray(h2)[~one & (pk.segment_ids > 0)])


def test_gather_masks_invalid():
    x = jnp.arange(24.0).reshape(2, 3, 4)
    out = gather(x, jnp.array([[5, 0]]), jnp.array([[1, 0]]))
    np.testing.assert_array_equal(np.asarray(out), [[np.arange(20.0, 24.0), np.zeros(4)]])


def test_packed_on_8_device_mesh():
    """Rows split over data x fsdp = 2 x 4 (packed rows a multiple of 8): the single-device numbers."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    mesh = make_mesh(2, 4, 1)
    batch = padded_batch([6, 1, 3, 2, 5, 4, 2, 1], [5, 0, 2, 4, 1, 3, 5, 2], seed=7)
    pk = pack_batch(batch, multiple_of=8)
    assert pk.ids.shape[0] % 8 == 0
    kw = dict(vocab_size=64, scan_layers=True)
    single = tiny_lm("smollm2", seed=3, **kw)
    sharded = shard_model(tiny_lm("smollm2", seed=3, **kw), mesh)
    w = np.random.default_rng(2).normal(size=batch.response_ids.shape).astype(np.float32)

    def loss(m, packed, response_ids, response_mask):
        return jnp.sum(w * m.packed_logprobs(packed, response_ids, response_mask))

    vg = nnx.jit(nnx.value_and_grad(loss))
    l0, g0 = vg(single, jax.tree.map(jnp.asarray, pk), batch.response_ids, batch.response_mask)
    pk_s = jax.tree.map(lambda a: jax.device_put(a, batch_sharding(mesh, a.ndim)), pk)
    l1, g1 = vg(sharded, pk_s, jax.device_put(batch.response_ids, batch_sharding(mesh, 2)),
                jax.device_put(batch.response_mask, batch_sharding(mesh, 2)))
    ref = jnp.sum(w * single.continuation_logprobs(batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                                   batch.response_mask))
    np.testing.assert_allclose(float(l0), float(ref), rtol=1e-5)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    ref_g = nnx.jit(nnx.grad(lambda m: jnp.sum(w * m.continuation_logprobs(
        batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask))))(single)
    assert_grads_close(ref_g, g0)
    assert_grads_close(g0, g1)


_MODELS: dict = {}


def _model(family):
    if family not in _MODELS:
        _MODELS[family] = tiny_lm(family, seed=1)
    return _MODELS[family]
