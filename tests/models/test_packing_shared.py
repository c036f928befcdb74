"""Groups packed with their prompt once (``jaxppo.models.packing.pack_shared``, attention's branch rule): the
planner's hand case and properties, and per continuation the same log-probs and gradients as the padded rows
``concat(prompt, continuation)``, for every family (mistral: the sliding window counted in positions), jit and
eager, and under the implementations that cannot express branches (they run the xla path)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models.attention import SegmentMask, branch_capable, segment_attention
from jaxppo.models.layers import attention_allowed, positions_from_mask
from jaxppo.models.packing import pack_shared, row_budgets
from tests.models.tiny_lm import FAMILIES, tiny_lm

P, R, N = 6, 5, 2


def groups(prompt_lens, response_lens, vocab=61, seed=0):
    """Prompts left padded to P, ``N`` continuations each right padded to R: (pi [B,P], pm, ri [B,N,R], rm)."""
    rng = np.random.default_rng(seed)
    b = len(prompt_lens)
    pm = (np.arange(P)[None, :] >= P - np.asarray(prompt_lens)[:, None]).astype(np.int32)
    rm = (np.arange(R)[None, None, :] < np.asarray(response_lens)[:, :, None]).astype(np.int32)
    return (rng.integers(1, vocab, (b, P)).astype(np.int32) * pm, pm,
            rng.integers(1, vocab, (b, N, R)).astype(np.int32) * rm, rm)


def stack(pi, pm, ri, rm):
    """The padded ``[n·B]`` stack, continuation-major: row ``c·B + b`` is ``concat(prompt_b, response_bc)``."""
    n = ri.shape[1]
    return (np.tile(pi, (n, 1)), np.tile(pm, (n, 1)), ri.transpose(1, 0, 2).reshape(-1, ri.shape[2]),
            rm.transpose(1, 0, 2).reshape(-1, rm.shape[2]))


def test_pack_shared_hand_case():
    #          prompt (P=3)   continuation 0 (R=2)   continuation 1
    # group 0: [0, 5, 6]      [10, 0]                [11, 12]        5 6 | 10 | 11 12      (5 tokens)
    # group 1: [7, 8, 9]      [13, 14]               [0, 0]          7 8 9 | 13 14 |       (5 tokens)
    pm = np.array([[0, 1, 1], [1, 1, 1]])
    pi = pm * np.array([[0, 5, 6], [7, 8, 9]])
    rm = np.array([[[1, 0], [1, 1]], [[1, 1], [0, 0]]])
    ri = rm * np.array([[[10, 0], [11, 12]], [[13, 14], [0, 0]]])
    pk = pack_shared(pi, pm, ri, rm)       # L = P + 2R = 7: 5 + 5 > 7, one group per row
    assert pk.ids.tolist() == [[5, 6, 10, 11, 12, 0, 0], [7, 8, 9, 13, 14, 0, 0]]
    assert pk.segment_ids.tolist() == [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0]]
    assert pk.branch_ids.tolist() == [[0, 0, 1, 2, 2, 0, 0], [0, 0, 0, 1, 1, 0, 0]]
    # each continuation's positions continue its prompt's: continuation 1 of group 0 restarts at 2
    assert pk.positions.tolist() == [[0, 1, 2, 2, 3, 0, 0], [0, 1, 2, 3, 4, 0, 0]]
    # the stack: rows (g0,c0), (g1,c0), (g0,c1), (g1,c1); token 0 of every continuation is predicted by the
    # prompt's last slot (group 0: slot 1; group 1: slot 9), token t by the continuation's token t-1
    assert pk.response_index.tolist() == [[1, 0], [9, 10], [1, 3], [0, 0]]
    assert pk.token_index.tolist() == [[0, 0, 1, 2, 0], [7, 8, 9, 10, 11], [0, 0, 1, 3, 4], [7, 8, 9, 0, 0]]
    assert pk.last_index.tolist() == [2, 11, 4, 9]        # an empty continuation: the prompt's last token
    assert pk.head_index.tolist() == [1, 9, 10, 1, 3] and pk.head_target.tolist() == [0, 2, 3, 4, 5]


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, P), st.integers(0, R), st.integers(0, R)), min_size=1, max_size=10),
       extra=st.integers(0, 2 * (P + 2 * R)), buckets=st.integers(1, 8), mult=st.integers(1, 4))
def test_pack_shared_property(lens, extra, buckets, mult):
    """Every real token of every stack row, at its padded position, is found at ``token_index`` with its padded
    row's rotary position; a group's prompt is packed once (the real slots are the prompts' and continuations'
    tokens, no more), in the prompt branch, each continuation in its own; the row count is a budget."""
    pi, pm, ri, rm = groups([a for a, _, _ in lens], [[c, d] for _, c, d in lens])
    width = P + N * R + extra
    pk = pack_shared(pi, pm, ri, rm, row_length=width, buckets=buckets, multiple_of=mult)
    b = len(lens)
    assert pk.ids.shape[0] in row_budgets(b, buckets, mult) and pk.ids.shape[1] == width
    assert (pk.segment_ids > 0).sum() == pm.sum() + rm.sum()
    spi, spm, sri, srm = stack(pi, pm, ri, rm)
    ids, mask = np.concatenate([spi, sri], 1), np.concatenate([spm, srm], 1).astype(bool)
    pos = np.asarray(positions_from_mask(jnp.asarray(mask)))
    flat = lambda a: a.reshape(-1)  # noqa: E731
    np.testing.assert_array_equal(flat(pk.ids)[pk.token_index][mask], ids[mask])
    np.testing.assert_array_equal(flat(pk.positions)[pk.token_index][mask], pos[mask])
    branch = flat(pk.branch_ids)[pk.token_index]
    cont = np.repeat(np.arange(N), b)[:, None]
    assert (branch[:, :P][mask[:, :P]] == 0).all()
    assert (branch[:, P:][mask[:, P:]] == np.broadcast_to(cont + 1, (N * b, R))[mask[:, P:]]).all()
    np.testing.assert_array_equal(pk.token_index[:b, :P][spm[:b] > 0], pk.token_index[b:, :P][spm[b:] > 0])
    for i in range(N * b):
        r = srm[i].astype(bool)
        want = np.concatenate([pk.token_index[i][P - 1:P], pk.token_index[i][P:P + R - 1]])
        np.testing.assert_array_equal(pk.response_index[i][r], want[r])
        assert pk.last_index[i] == pk.token_index[i][mask[i]][-1]
    k = int(srm.sum())
    np.testing.assert_array_equal(pk.head_index[:k], pk.response_index[srm.astype(bool)])
    np.testing.assert_array_equal(pk.head_target[:k], np.flatnonzero(srm))
    assert (pk.head_target[k:] == N * b * R).all()


def test_branch_rule_of_the_dense_mask():
    """A continuation sees its prompt and its own earlier tokens, never another continuation; with positions and a
    window, the window counts positions (the padded row's distances), not slots."""
    seg = jnp.array([[1, 1, 1, 1, 1, 0]])
    branch = jnp.array([[0, 0, 1, 2, 2, 0]])
    pos = jnp.array([[0, 1, 2, 2, 3, 0]])
    got = np.asarray(SegmentMask(seg, None, branch, pos).dense()[0]).astype(int)
    want = np.array([[1, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0],
                     [1, 1, 0, 1, 0, 0],     # continuation 1's first token: the prompt and itself
                     [1, 1, 0, 1, 1, 0],
                     [1, 1, 0, 0, 0, 0]])    # padding query (branch 0): the prompt keys (any rule is right)
    np.testing.assert_array_equal(got, want)
    windowed = np.asarray(SegmentMask(seg, 2, branch, pos).dense()[0]).astype(int)
    # window 2 in positions: slot 3 (position 2) sees slot 1 (position 1) and itself, not slot 0 (position 0)
    assert windowed[3].tolist() == [0, 1, 0, 1, 0, 0] and windowed[4].tolist() == [0, 0, 0, 1, 1, 0]
    # with one branch the rule is the segment rule of the padded row concat(prompt, continuation 1)
    row = jnp.array([[1, 1, 1, 1]])
    np.testing.assert_array_equal(np.asarray(attention_allowed(jnp.arange(4), jnp.arange(4), row, 2)[0]).astype(int),
                                  windowed[np.ix_([0, 1, 3, 4], [0, 1, 3, 4])])


@pytest.mark.parametrize("impl", ["xla", "cudnn", "splash", "pallas_gpu"])
def test_kernels_without_the_branch_rule_run_xla(impl):
    """Rows with branches under an implementation that has no branch rule (``branch_capable``) give the reference
    einsum's output (they run the xla path on the dense mask; no kernel is compiled, so this runs on the CPU)."""
    if impl == "cudnn":
        assert branch_capable("cudnn", None) and not branch_capable("cudnn", 4)
        window = 4
    else:
        window = None
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 6, h, 8)).astype(np.float32)) for h in (4, 2, 2))
    mask = SegmentMask(jnp.array([[1, 1, 1, 1, 1, 0]]), window, jnp.array([[0, 0, 1, 2, 2, 0]]),
                       jnp.array([[0, 1, 2, 2, 3, 0]]))
    want = segment_attention(q, k, v, mask.dense(), "reference")
    got = segment_attention(q, k, v, mask, impl)
    real = np.asarray(mask.segment_ids[0]) > 0
    np.testing.assert_allclose(np.asarray(got)[0, real], np.asarray(want)[0, real], rtol=1e-5, atol=1e-6)


def _loss(lm, plan, sri, srm, w):
    lp = lm.packed_logprobs(plan, sri, srm) if plan is not None else None
    return jnp.sum(w * lp), lp


def _padded_loss(lm, spi, spm, sri, srm, w):
    lp = lm.continuation_logprobs(spi, spm, sri, srm)
    return jnp.sum(w * lp), lp


_VG_PACKED = nnx.value_and_grad(_loss, has_aux=True)
_VG_PADDED = nnx.value_and_grad(_padded_loss, has_aux=True)
_JIT = {"packed": nnx.jit(_VG_PACKED), "padded": nnx.jit(_VG_PADDED)}
_MODELS: dict[str, object] = {}


def _compare(lm, pi, pm, ri, rm, jit: bool, **kw):
    plan = jax.tree.map(jnp.asarray, pack_shared(pi, pm, ri, rm, **kw))
    spi, spm, sri, srm = (jnp.asarray(a) for a in stack(pi, pm, ri, rm))
    w = jnp.asarray(np.random.default_rng(1).normal(size=sri.shape).astype(np.float32))
    packed_vg, padded_vg = (_JIT["packed"], _JIT["padded"]) if jit else (_VG_PACKED, _VG_PADDED)
    (l0, lp0), g0 = padded_vg(lm, spi, spm, sri, srm, w)
    (l1, lp1), g1 = packed_vg(lm, plan, sri, srm, w)
    np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=1e-5)
    leaves0, leaves1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(leaves0) == len(leaves1) > 5
    for a, b in zip(leaves0, leaves1):
        scale = max(float(jnp.max(jnp.abs(a))), 1.0)
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * scale


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=3, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, P), st.integers(0, R), st.integers(0, R)), min_size=4, max_size=4),
       seed=st.integers(0, 2 ** 16))
def test_shared_packed_equals_padded_jit(family, lens, seed):
    """Random lengths and tokens, fixed shapes (few programs): every continuation's log-probs and the gradient of
    a weighted sum of them equal the padded stack's, float32."""
    if family not in _MODELS:
        _MODELS[family] = tiny_lm(family, seed=1)
    _compare(_MODELS[family], *groups([a for a, _, _ in lens], [[c, d] for _, c, d in lens], seed=seed), jit=True)


def test_shared_packed_equals_padded_eager_with_a_window():
    """Un-jitted log-probs (the gradients are the jitted test's), mistral's sliding window (3), rows long enough for
    several groups side by side."""
    lm = tiny_lm("mistral", seed=1, scan_layers=False)
    pi, pm, ri, rm = groups([6, 1, 3, 2], [[5, 2], [0, 3], [2, 2], [4, 0]], seed=3)
    plan = pack_shared(pi, pm, ri, rm, row_length=2 * (P + N * R))
    assert plan.ids.shape[0] < len(pi)                       # groups share rows
    spi, spm, sri, srm = (jnp.asarray(a) for a in stack(pi, pm, ri, rm))
    want = lm.continuation_logprobs(spi, spm, sri, srm)
    got = lm.packed_logprobs(jax.tree.map(jnp.asarray, plan), sri, srm)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
