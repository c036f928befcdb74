"""The shared-prefix forward (``CausalLM.shared_prefix_logprobs``): n continuations of one prompt with the prompt run
once give the log-probs (and gradients) of running each ``concat(prompt, response_j)`` row on its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models.layers import SharedPrefixMask, shared_prefix_attention
from tests.models.tiny_lm import tiny_lm


def _groups(vocab: int, prompt_lens, resp_lens, p: int, r: int, seed: int = 0):
    """Left-padded prompts [G, P] and right-padded responses [G, n, R] of the given real lengths."""
    rng = np.random.default_rng(seed)
    g, n = len(prompt_lens), len(resp_lens[0])
    p_ids = np.zeros((g, p), np.int32)
    p_mask = np.zeros((g, p), np.int32)
    r_ids = np.zeros((g, n, r), np.int32)
    r_mask = np.zeros((g, n, r), np.int32)
    for i, lp in enumerate(prompt_lens):
        p_ids[i, p - lp:] = rng.integers(3, vocab, size=lp)
        p_mask[i, p - lp:] = 1
        for j, lr in enumerate(resp_lens[i]):
            r_ids[i, j, :lr] = rng.integers(3, vocab, size=lr)
            r_mask[i, j, :lr] = 1
    return p_ids, p_mask, r_ids, r_mask


def _rowwise(model, p_ids, p_mask, r_ids, r_mask):
    """The reference: each (prompt, response_j) as its own row of ``continuation_logprobs``, back to [G, n, R]."""
    g, n, r = r_ids.shape
    rep = lambda a: jnp.repeat(jnp.asarray(a), n, axis=0)  # noqa: E731
    lp = model.continuation_logprobs(rep(p_ids), rep(p_mask), jnp.asarray(r_ids).reshape(g * n, r),
                                     jnp.asarray(r_mask).reshape(g * n, r))
    return lp.reshape(g, n, r)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "smollm2"])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "nojit"])
def test_shared_prefix_logprobs_equal_the_rows_run_one_by_one(family, jit):
    model = tiny_lm(family)
    batch = _groups(model.config.vocab_size, (6, 3, 1), ((4, 2, 5), (1, 5, 3), (5, 5, 2)), p=6, r=5)
    want = _rowwise(model, *batch)
    fn = lambda *a: model.shared_prefix_logprobs(*a)  # noqa: E731
    got = (jax.jit(fn) if jit else fn)(*batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[batch[3] == 0] == 0)          # padding slots of a response give 0
    assert np.all(np.asarray(got)[batch[3] == 1] < 0)           # real tokens: a log-prob


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_shared_prefix_matches_rows_for_random_lengths(data):
    """Any left-padded prompt lengths and right-padded response lengths, any number of responses per prompt
    (sliding-window family, so the window's slot arithmetic is exercised across the prompt/response seam)."""
    model = _MISTRAL
    g = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(1, 3))
    p = data.draw(st.integers(1, 6))
    r = data.draw(st.integers(1, 5))
    prompt_lens = [data.draw(st.integers(1, p)) for _ in range(g)]
    resp_lens = [[data.draw(st.integers(0, r)) for _ in range(n)] for _ in range(g)]
    batch = _groups(model.config.vocab_size, prompt_lens, resp_lens, p, r, seed=data.draw(st.integers(0, 99)))
    np.testing.assert_allclose(np.asarray(_SHARED(*batch)), np.asarray(_ROWS(*batch)), rtol=1e-5, atol=1e-5)


_MISTRAL = tiny_lm("mistral")
_SHARED = jax.jit(lambda *a: _MISTRAL.shared_prefix_logprobs(*a))
_ROWS = jax.jit(lambda *a: _rowwise(_MISTRAL, *a))


@pytest.mark.parametrize("variant", ["scan", "unrolled", "remat"])
def test_shared_prefix_gradients_equal_the_rows_gradients(variant):
    kw = {"scan": dict(scan_layers=True), "unrolled": dict(scan_layers=False),
          "remat": dict(scan_layers=True, remat=True)}[variant]
    model = tiny_lm("smollm2", **kw)
    graphdef, state = nnx.split(model)
    batch = _groups(model.config.vocab_size, (5, 2), ((3, 4), (4, 1)), p=5, r=4, seed=1)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=batch[2].shape).astype(np.float32))

    def loss(shared, st_):
        m = nnx.merge(graphdef, st_)
        lp = m.shared_prefix_logprobs(*batch) if shared else _rowwise(m, *batch)
        return jnp.sum(lp * weights)

    (l1, g1), (l0, g0) = (jax.jit(jax.value_and_grad(lambda s, sh=sh: loss(sh, s)))(state) for sh in (True, False))
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_shared_prefix_in_bfloat16_stays_close_to_the_rows():
    model = tiny_lm("llama", compute_dtype="bfloat16")
    batch = _groups(model.config.vocab_size, (6, 4), ((5, 3), (2, 5)), p=6, r=5, seed=3)
    got, want = model.shared_prefix_logprobs(*batch), _rowwise(model, *batch)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1)


def test_shared_prefix_runs_the_prompt_once():
    """What the layout is for: fewer FLOPs than the stacked rows (XLA's own count of the compiled programs), by
    about the prompt's share of the stack: here 2 responses of 8 after a prompt of 24, so the trunk sees 40 of 64
    token positions per pair."""
    model = tiny_lm("llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128)
    batch = _groups(model.config.vocab_size, (24, 24), ((8, 8), (8, 8)), p=24, r=8, seed=4)
    flops = {}
    for name, fn in (("shared", lambda *a: model.shared_prefix_logprobs(*a)), ("rows", lambda *a: _rowwise(model, *a))):
        flops[name] = jax.jit(fn).lower(*batch).compile().cost_analysis()["flops"]
    assert flops["shared"] < 0.8 * flops["rows"], flops


def test_shared_prefix_attention_checks_the_layout():
    q = jnp.zeros((2, 9, 4, 8))
    k = jnp.zeros((2, 9, 2, 8))
    bad = SharedPrefixMask(prompt=jnp.ones((2, 3, 3), bool), response=jnp.ones((4, 4, 7), bool))  # 3 + 2·4 != 9
    with pytest.raises(ValueError, match="not a prompt of 3"):
        shared_prefix_attention(q, k, k, bad)


def test_shared_prefix_on_an_fsdp_mesh_equals_one_device():
    """(data=2, fsdp=4) mesh, groups split over the batch axes: log-probs and gradients as on one device."""
    from jaxppo.models import shard_model
    from jaxppo.parallel import batch_sharding, make_mesh

    mesh = make_mesh(2, 4, 1)
    single = tiny_lm("smollm2", seed=3)
    sharded = shard_model(tiny_lm("smollm2", seed=3), mesh)
    lens = [(6, 3, 1, 4, 6, 2, 5, 5)[i] for i in range(8)]
    batch = _groups(single.config.vocab_size, lens, [(i % 4 + 1, 4 - i % 4) for i in range(8)], p=6, r=4, seed=5)
    loss = lambda m, *b: -jnp.mean(m.shared_prefix_logprobs(*b))  # noqa: E731
    vg = nnx.jit(nnx.value_and_grad(loss))
    l0, g0 = vg(single, *map(jnp.asarray, batch))
    l1, g1 = vg(sharded, *(jax.device_put(a, batch_sharding(mesh, a.ndim)) for a in batch))
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):   # float32 sums in another order (as in
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=5e-6)  # test_activation_sharding)
