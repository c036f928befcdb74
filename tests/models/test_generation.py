"""jaxppo.models.generate: KV cache vs full recompute, sampling distribution, top-k/top-p, EOS, compilation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models import generate, sample_from_logits
from jaxppo.models import generation as gen
from jaxppo.models.generation import TRACE_COUNT
from jaxppo.models.shared_prompts import shared_rows
from tests.models.tiny_lm import FAMILIES, left_padded_prompts, tiny_lm

N_NEW = 6


def _forward_fn(model):
    return jax.jit(lambda ids, mask: model(ids, mask))


def greedy_no_cache(model, ids, mask, n):
    """Reference: greedy decoding by a full forward over [prompt, response-so-far] at every step.

    Layout as in interfaces.md: left-padded prompt, right-padded response; token i comes from the
    logits at position P+i-1. Returns (tokens [B,n], model log-probs of those tokens [B,n]).
    """
    b, p = ids.shape
    fwd = _forward_fn(model)
    buf = np.concatenate([ids, np.zeros((b, n), np.int32)], axis=1)
    toks, lps = np.zeros((b, n), np.int32), np.zeros((b, n), np.float32)
    for i in range(n):
        m = np.concatenate([mask, np.broadcast_to((np.arange(n) < i).astype(np.int32), (b, n))], axis=1)
        logits = np.asarray(fwd(jnp.asarray(buf), jnp.asarray(m)))[:, p + i - 1]
        toks[:, i] = logits.argmax(-1)
        lps[:, i] = np.asarray(jax.nn.log_softmax(logits))[np.arange(b), toks[:, i]]
        buf[:, p + i] = toks[:, i]
    return toks, lps


def teacher_forced_logits(model, ids, mask, tokens, gen_mask):
    """Logits [B, N, V] that predicted each response token, from one full forward."""
    p, n = ids.shape[1], tokens.shape[1]
    full = np.concatenate([ids, tokens], axis=1)
    m = np.concatenate([mask, gen_mask], axis=1)
    return np.asarray(model(jnp.asarray(full), jnp.asarray(m)), np.float64)[:, p - 1:p + n - 1]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def allowed_set_np(z, top_k, top_p):
    """Independent numpy reference of the kept candidates (bool [V]) for one row of scaled logits z."""
    v = z.shape[-1]
    order = sorted(range(v), key=lambda j: (-z[j], j))
    if top_k:
        order = order[:top_k]
    probs = np.exp(z[order] - z[order].max())
    probs /= probs.sum()
    keep = np.zeros(v, bool)
    mass = 0.0
    for j, pr in zip(order, probs):
        if mass < top_p or j == order[0]:
            keep[j] = True
        mass += pr
    return keep


# ----------------------------------------------------------------------------- cache vs no cache

@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_with_cache_equals_full_recompute(family, scan):
    """Both cache forms (stacked [L, B, K, S, hd] under the layer scan, per-layer buffers unrolled)."""
    model = tiny_lm(family, seed=1, scan_layers=scan)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(7, 4, 1), width=7, seed=2)
    out = generate(model, ids, mask, jax.random.key(0), max_new_tokens=N_NEW, temperature=0.0)
    ref_toks, ref_lps = greedy_no_cache(model, ids, mask, N_NEW)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref_toks)
    np.testing.assert_allclose(np.asarray(out.logprobs), ref_lps, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(out.mask), np.ones_like(ref_toks))
    assert out.tokens.dtype == jnp.int32 and out.mask.dtype == jnp.int32 and out.logprobs.dtype == jnp.float32
    # the rows do not all decode the same thing (the test exercises the per-row positions/padding)
    assert len({tuple(r) for r in ref_toks.tolist()}) > 1


def test_cache_layout_heads_before_slots():
    for scan, stacked in ((True, True), (False, False)):
        model = tiny_lm("llama", scan_layers=scan)
        c = model.config
        cache = model.init_cache(3, 9)
        want = (3, c.num_key_value_heads, 9, c.head_dim)
        if stacked:
            assert cache.k.shape == cache.v.shape == (c.num_hidden_layers,) + want
        else:
            assert len(cache.k) == len(cache.v) == c.num_hidden_layers
            assert all(a.shape == want for a in cache.k + cache.v)
        assert cache.valid.shape == (3, 9)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_scanned_and_unrolled_layers_sample_the_same_tokens(family):
    """Sampled generation (temperature 1, same key) gives the same tokens bit for bit and the same log-probs
    with the layer scan and with unrolled layers (the per-layer weight slices are hoisted out of the decode loop)."""
    ids, mask = left_padded_prompts(61, lengths=(6, 3, 1), width=6, seed=5)
    outs = [generate(tiny_lm(family, seed=3, scan_layers=scan), ids, mask, jax.random.key(7), max_new_tokens=N_NEW,
                     temperature=1.0) for scan in (True, False)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
    np.testing.assert_array_equal(np.asarray(outs[0].mask), np.asarray(outs[1].mask))
    np.testing.assert_allclose(np.asarray(outs[0].logprobs), np.asarray(outs[1].logprobs), atol=1e-5)
    assert len({tuple(r) for r in np.asarray(outs[0].tokens).tolist()}) > 1


def test_layer_params_only_for_unrolled_layers():
    model = tiny_lm("llama", scan_layers=True)
    x = jnp.zeros((1, 2, model.config.hidden_size))
    per = tiny_lm("llama", scan_layers=False).model.layers.layer_params(jnp.float32)
    with pytest.raises(ValueError, match="layer_params is for unrolled layers"):
        model.model.layers(x, None, None, None, layer_params=per)
    unrolled = tiny_lm("llama", scan_layers=False)
    with pytest.raises(ValueError, match="got 1 layer_params for 2 layers"):
        unrolled.model.layers(x, None, None, None, layer_params=per[:1])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_teacher_forced_log_softmax(temperature):
    model = tiny_lm("qwen2", seed=3)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(5, 3, 2, 5), width=5, seed=4)
    out = generate(model, ids, mask, jax.random.key(7), max_new_tokens=N_NEW, temperature=temperature)
    toks, lps = np.asarray(out.tokens), np.asarray(out.logprobs)
    logits = teacher_forced_logits(model, ids, mask, toks, np.asarray(out.mask))
    expected = np.take_along_axis(_log_softmax(logits / temperature), toks[..., None], -1)[..., 0]
    np.testing.assert_allclose(lps, expected, atol=2e-4)
    assert len(np.unique(toks)) > 3  # it really sampled
    # the model's own log-prob of the sampled token: log_softmax of the untempered logits
    own = np.take_along_axis(_log_softmax(logits), toks[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.model_logprobs), own, atol=2e-4)
    if temperature != 1.0:
        assert np.abs(own - expected).max() > 1e-2   # log q and log π differ when q is tempered


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6), (4, 0.5)])
def test_top_k_top_p_sample_only_allowed_tokens(top_k, top_p):
    model = tiny_lm("llama", seed=5)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(6, 2, 4, 6, 1, 3), width=6, seed=6)
    t = 1.3
    out = generate(model, ids, mask, jax.random.key(11), max_new_tokens=N_NEW, temperature=t, top_k=top_k,
                   top_p=top_p)
    toks, lps = np.asarray(out.tokens), np.asarray(out.logprobs)
    z = teacher_forced_logits(model, ids, mask, toks, np.asarray(out.mask)) / t
    n_allowed = []
    for b in range(toks.shape[0]):
        for i in range(toks.shape[1]):
            keep = allowed_set_np(z[b, i], top_k, top_p)
            n_allowed.append(keep.sum())
            assert keep[toks[b, i]], (b, i, toks[b, i])
            zk = np.where(keep, z[b, i], -np.inf)
            np.testing.assert_allclose(lps[b, i], _log_softmax(zk)[toks[b, i]], atol=2e-4)
            np.testing.assert_allclose(out.model_logprobs[b, i], _log_softmax(z[b, i] * t)[toks[b, i]], atol=2e-4)
    assert max(n_allowed) > 1  # filtering left a real choice somewhere


# ----------------------------------------------------------------------------- sampler unit tests

def _sample(logits, key, temperature, top_p, top_k, use_top_p):
    return sample_from_logits(logits, key, greedy=False, temperature=temperature, top_k=top_k, use_top_p=use_top_p,
                              top_p=top_p)


class SamplerTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=6)
    @given(seed=st.integers(0, 2 ** 31 - 1), top_k=st.integers(0, 7), top_p=st.floats(0.05, 1.0),
           temperature=st.floats(0.3, 3.0))
    def test_allowed_set_and_logprob(self, seed, top_k, top_p, temperature):
        rng = np.random.default_rng(seed)
        logits = (rng.normal(size=(3, 9)) * 3).astype(np.float32)
        fn = self.variant(_sample, static_argnames=("top_k", "use_top_p"))
        tok, lp = fn(jnp.asarray(logits), jax.random.key(seed), jnp.float32(temperature), jnp.float32(top_p),
                     top_k=top_k, use_top_p=top_p < 1.0)
        tok, lp = np.asarray(tok), np.asarray(lp)
        z = logits.astype(np.float64) / np.float32(temperature)
        for b in range(3):
            keep = allowed_set_np(z[b], top_k, top_p)
            assert keep[tok[b]]
            np.testing.assert_allclose(lp[b], _log_softmax(np.where(keep, z[b], -np.inf))[tok[b]], atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_greedy_is_argmax_with_model_logprob(self):
        logits = jnp.array([[0.0, 2.0, 1.0], [5.0, -1.0, 4.0]])
        fn = self.variant(lambda lg: sample_from_logits(lg, jax.random.key(0), greedy=True, temperature=1.0,
                                                        top_k=0, use_top_p=False, top_p=1.0))
        tok, lp = fn(logits)
        np.testing.assert_array_equal(np.asarray(tok), [1, 0])
        # hand-computed: log(e^2 / (1 + e^2 + e)) and log(e^5 / (e^5 + e^-1 + e^4))
        np.testing.assert_allclose(np.asarray(lp), [2 - np.log(1 + np.e ** 2 + np.e),
                                                    5 - np.log(np.e ** 5 + np.e ** -1 + np.e ** 4)], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_empirical_frequencies_match_filtered_distribution(self):
        logits = np.array([2.0, 1.5, 1.0, 0.2, -0.5, -3.0], np.float32)
        t, k, p = 0.8, 4, 0.8
        n = 6000
        fn = self.variant(lambda lg, key: sample_from_logits(lg, key, greedy=False, temperature=t, top_k=k,
                                                             use_top_p=True, top_p=p))
        tok, _ = fn(jnp.tile(jnp.asarray(logits), (n, 1)), jax.random.key(3))
        freq = np.bincount(np.asarray(tok), minlength=6) / n
        # by hand: z = logits/0.8; top-4 = tokens 0..3; their softmax mass before token 2 is
        # p0 + p1 = 0.797 < 0.8 so token 2 is kept, before token 3 it is 0.945 >= 0.8 so token 3 is dropped
        z = logits[:3] / t
        q = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        expected = np.concatenate([q, np.zeros(3)])
        assert np.all(freq[3:] == 0)
        np.testing.assert_allclose(freq, expected, atol=4 * np.sqrt(0.25 / n))


# ----------------------------------------------------------------------------- EOS and mask

def test_eos_stops_rows_and_masks_after():
    model = tiny_lm("smollm2", seed=8)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(5, 2, 4), width=5, seed=9)
    base = np.asarray(generate(model, ids, mask, jax.random.key(0), max_new_tokens=8, temperature=0.0).tokens)
    pad = 60
    for eos in ([int(base[0, 3]), int(base[1, 1])],):
        out = generate(model, ids, mask, jax.random.key(0), max_new_tokens=8, temperature=0.0,
                       eos_token_id=eos, pad_token_id=pad)
        toks, lps, m, own = (np.asarray(x) for x in out)
        np.testing.assert_array_equal(own, lps)   # greedy: the returned log-prob is the model's own
        for b in range(3):
            hits = [i for i in range(8) if base[b, i] in eos]
            stop = hits[0] + 1 if hits else 8  # tokens kept, EOS included
            np.testing.assert_array_equal(toks[b, :stop], base[b, :stop])
            np.testing.assert_array_equal(m[b], (np.arange(8) < stop).astype(np.int32))
            assert (toks[b, stop:] == pad).all() and (lps[b, stop:] == 0).all() and (own[b, stop:] == 0).all()
            assert (lps[b, :stop] < 0).all()
        assert m[0].sum() < 8  # row 0 did stop early


def test_all_rows_finished_early_still_full_shape():
    model = tiny_lm("llama", seed=10)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(3, 3), width=3, seed=1)
    first = np.asarray(generate(model, ids, mask, jax.random.key(0), max_new_tokens=1, temperature=0.0).tokens)
    out = generate(model, ids, mask, jax.random.key(0), max_new_tokens=10, temperature=0.0,
                   eos_token_id=[int(first[0, 0]), int(first[1, 0])], pad_token_id=0)
    assert out.tokens.shape == (2, 10)
    np.testing.assert_array_equal(np.asarray(out.mask), np.eye(1, 10, dtype=np.int32).repeat(2, 0))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, 0], first[:, 0])


# ----------------------------------------------------------------------------- compilation and errors

def test_no_recompilation_across_keys_temperatures_and_prompts():
    model = tiny_lm("llama", seed=12)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(4, 2), width=4, seed=3)
    kw = dict(max_new_tokens=5, top_p=0.9, eos_token_id=2)
    generate(model, ids, mask, jax.random.key(0), temperature=1.0, **kw)
    n0 = TRACE_COUNT["generate"]
    ids2, mask2 = left_padded_prompts(model.config.vocab_size, lengths=(1, 4), width=4, seed=8)
    for s, (t, p) in enumerate([(0.5, 0.9), (1.7, 0.3), (1.0, 0.99)]):
        generate(model, ids2, mask2, jax.random.key(s), temperature=t, **{**kw, "top_p": p})
    other = tiny_lm("llama", seed=13)  # same structure, other weights
    generate(other, ids, mask, jax.random.key(0), temperature=1.0, **kw)
    assert TRACE_COUNT["generate"] == n0
    generate(model, ids, mask, jax.random.key(0), temperature=1.0, **{**kw, "max_new_tokens": 6})
    assert TRACE_COUNT["generate"] == n0 + 1  # a new shape does compile (the counter works)


@pytest.mark.parametrize("kw,ids,mask,match", [
    ({}, [[1, 2, 0]], [[1, 1, 0]], "LEFT-padded"),
    ({}, [[0, 0], [3, 4]], [[0, 0], [1, 1]], r"row\(s\) \[0\] have no real token"),
    ({}, [1, 2], [1, 1], "must be \\[batch, length\\]"),
    ({"temperature": -1.0}, [[1, 2]], [[1, 1]], "temperature must be >= 0"),
    ({"top_p": 0.0}, [[1, 2]], [[1, 1]], r"top_p must be in \(0, 1\]"),
    ({"top_k": -2}, [[1, 2]], [[1, 1]], "top_k must be an integer >= 0"),
    ({"eos_token_id": 999}, [[1, 2]], [[1, 1]], r"eos_token_id \[999\] outside the vocabulary"),
    ({"max_new_tokens": 0}, [[1, 2]], [[1, 1]], "max_new_tokens must be a positive integer"),
])
def test_bad_arguments_are_named(kw, ids, mask, match):
    model = tiny_lm("llama")
    args = {"max_new_tokens": 2, **kw}
    with pytest.raises((ValueError, TypeError), match=match):
        generate(model, np.array(ids), np.array(mask), jax.random.key(0), **args)


@pytest.mark.parametrize("scale", [6.0, 0.05])  # peaked: nucleus inside the candidates; flat: full-sort fallback
def test_nucleus_from_partial_sort_equals_full_sort(scale):
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3000)) * scale, jnp.float32)
    kw = dict(greedy=False, temperature=jnp.float32(0.9), top_k=0, use_top_p=True, top_p=jnp.float32(0.9))
    fast = jax.jit(lambda lg, key: sample_from_logits(lg, key, candidates=256, **kw))
    full = jax.jit(lambda lg, key: sample_from_logits(lg, key, candidates=None, **kw))
    z = np.asarray(logits, np.float64) / np.float32(0.9)
    for s in range(5):
        a, b = fast(logits, jax.random.key(s)), full(logits, jax.random.key(s))
        np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
        np.testing.assert_allclose(np.asarray(a[1]), np.asarray(b[1]), atol=1e-5)
        for r in range(4):
            keep = allowed_set_np(z[r], 0, 0.9)
            assert keep[int(a[0][r])]
    sizes = [allowed_set_np(z[r], 0, 0.9).sum() for r in range(4)]
    assert (max(sizes) < 256) == (scale > 1)  # the two cases really take the two paths


# ----------------------------------------------------------------------------- fast argmax / categorical

class TestFastSampling(chex.TestCase):
    """``argmax_last`` / ``categorical`` / ``token_logprob``: the same numbers as jnp.argmax,
    jax.random.categorical and log_softmax, without XLA:CPU's unvectorised variadic argmax reduction."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_argmax_last_by_hand(self):
        x = jnp.array([[1.0, 3.0, 3.0, 0.0],          # tie -> first index
                       [jnp.nan, 1.0, jnp.nan, 2.0],  # NaN counts as the maximum (first NaN), as jnp.argmax
                       [-jnp.inf] * 4,                # all -inf -> 0
                       [-jnp.inf, -5.0, -jnp.inf, -6.0]])
        out = self.variant(gen.argmax_last)(x)
        assert out.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(out), [1, 0, 0, 1])

    @settings(max_examples=30, deadline=None)
    @given(st.integers(1, 4), st.integers(1, 40), st.integers(0, 2 ** 31 - 1), st.booleans())
    def test_argmax_last_equals_numpy(self, b, v, seed, coarse):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(b, v)).astype(np.float32)
        if coarse:  # many ties
            x = np.round(x)
        expected = np.argmax(x, axis=-1)  # numpy: first index of the maximum
        for fn in (gen.argmax_last, jax.jit(gen.argmax_last)):
            np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(x))), expected)

    @settings(max_examples=20, deadline=None)
    @given(st.integers(1, 6), st.integers(2, 300), st.integers(0, 2 ** 31 - 1))
    def test_categorical_is_jax_random_categorical_bit_for_bit(self, b, v, seed):
        rng = np.random.default_rng(seed)
        z = jnp.asarray(rng.normal(size=(b, v)) * 4, jnp.float32)
        key = jax.random.key(seed)
        expected = np.asarray(jax.random.categorical(key, z, axis=-1))
        for fn in (gen.categorical, jax.jit(gen.categorical)):
            np.testing.assert_array_equal(np.asarray(fn(key, z)), expected)

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_logprob_by_hand_and_vs_numpy(self):
        z = jnp.array([[0.0, 2.0, 1.0], [5.0, -1.0, 4.0]])
        lp = self.variant(gen.token_logprob)(z, jnp.array([2, 1], jnp.int32))
        np.testing.assert_allclose(np.asarray(lp), [1 - np.log(1 + np.e ** 2 + np.e),
                                                    -1 - np.log(np.e ** 5 + np.e ** -1 + np.e ** 4)], rtol=1e-6)
        rng = np.random.default_rng(0)
        z = rng.normal(size=(5, 1000)).astype(np.float32) * 3
        tok = rng.integers(0, 1000, 5)
        out = self.variant(gen.token_logprob)(jnp.asarray(z), jnp.asarray(tok, jnp.int32))
        expected = _log_softmax(z.astype(np.float64))[np.arange(5), tok]
        np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6)



@pytest.mark.parametrize("greedy", [True, False])
def test_compiled_sampler_has_no_variadic_argmax_reduction(greedy):
    """The perf regression this guards: jnp.argmax / jax.random.categorical lower to a (value, index)
    tuple reduction that XLA:CPU runs unvectorised (the largest non-matmul cost of a decode step)."""
    import re

    fn = jax.jit(lambda lg, key: sample_from_logits(lg, key, greedy=greedy, temperature=1.0, top_k=0,
                                                    use_top_p=False, top_p=1.0))
    hlo = fn.lower(jnp.zeros((4, 512)), jax.random.key(0)).compile().as_text()
    assert re.search(r"= \(\S+, \S+\) reduce\(", hlo) is None
    assert re.search(r"reduce\(", hlo) is not None  # the check reads reductions at all
    # and the pattern does catch jnp.argmax's lowering
    old = jax.jit(lambda lg: jnp.argmax(lg, axis=-1)).lower(jnp.zeros((4, 512))).compile().as_text()
    assert re.search(r"= \(\S+, \S+\) reduce\(", old) is not None


# ----------------------------------------------------------------------------- shared prefill

def _shared_and_per_row(model, ids, mask, **kw):
    kw = dict(max_new_tokens=N_NEW, eos_token_id=None, **kw)
    return [generate(model, ids, mask, jax.random.key(11), share_prefill=s, **kw) for s in (True, False)]


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=7, top_p=0.9)])
def test_shared_prefill_equals_the_per_row_prefill(family, scan, sampling):
    """Three prompts (7, 4 and 1 real tokens) x 4 samples each: prefilling once per prompt gives the tokens, mask and
    both log-probs of prefilling every row (both cache layouts, greedy and sampled)."""
    model = tiny_lm(family, seed=5, scan_layers=scan)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(7, 4, 1), width=7, seed=4)
    ids, mask = np.repeat(ids, 4, axis=0), np.repeat(mask, 4, axis=0)
    shared, rows = _shared_and_per_row(model, ids, mask, **sampling)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(rows.tokens))
    np.testing.assert_array_equal(np.asarray(shared.mask), np.asarray(rows.mask))
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(rows.logprobs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(shared.model_logprobs), np.asarray(rows.model_logprobs), atol=1e-5)
    if sampling["temperature"] > 0:   # the 4 samples of one prompt differ: each row draws its own noise
        t = np.asarray(shared.tokens).reshape(3, 4, N_NEW)
        assert any(len({tuple(s) for s in t[g]}) > 1 for g in range(3))


def test_shared_prefill_runs_on_one_row_per_prompt(monkeypatch):
    """generate hands the compiled program one row per block of equal prompts and the block size; with
    share_prefill=False, every row and 1."""
    seen = []
    real = gen._generate

    def spy(graphdef, state, prompt_ids, *args, **kw):
        seen.append((tuple(prompt_ids.shape), kw["repeats"]))
        return real(graphdef, state, prompt_ids, *args, **kw)

    monkeypatch.setattr(gen, "_generate", spy)
    model = tiny_lm("llama", seed=5)
    ids, mask = left_padded_prompts(model.config.vocab_size, lengths=(7, 4, 1), width=7, seed=4)
    ids, mask = np.repeat(ids, 2, axis=0), np.repeat(mask, 2, axis=0)
    out = generate(model, ids, mask, jax.random.key(0), max_new_tokens=3)
    generate(model, ids, mask, jax.random.key(0), max_new_tokens=3, share_prefill=False)
    assert seen == [((3, 7), 2), ((6, 7), 1)]
    assert out.tokens.shape == (6, 3)


def test_shared_prefill_on_a_mesh_equals_one_device():
    """The model sharded over 8 devices (data 2 x fsdp 4): 8 prompts x 2 samples prefill 8 rows, split over the
    devices; 3 prompts x 4 samples (3 rows do not split 8 ways) prefill every row. Both give one device's
    row-by-row samples."""
    from jaxppo.models import shard_model
    from jaxppo.parallel import make_mesh

    mesh = make_mesh(2, 4, 1)
    sharded = shard_model(tiny_lm("llama", seed=5), mesh)
    kw = dict(max_new_tokens=N_NEW, temperature=0.8, top_k=7)
    for lengths, r, used in (((7, 4, 1, 2, 6, 5, 3, 7), 2, 2), ((7, 4, 1), 4, 1)):
        ids, mask = left_padded_prompts(sharded.config.vocab_size, lengths=lengths, width=7, seed=4)
        ids, mask = np.repeat(ids, r, axis=0), np.repeat(mask, r, axis=0)
        assert shared_rows(ids, mask, nnx.state(sharded)) == used
        one = generate(tiny_lm("llama", seed=5), ids, mask, jax.random.key(3), share_prefill=False, **kw)
        out = generate(sharded, ids, mask, jax.random.key(3), **kw)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
        np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=1e-5)
