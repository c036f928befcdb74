"""Evaluation: bootstrap interval, held-out perplexity (vs transformers), evaluate_policy on a tiny model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, strategies as st

from jaxppo.models import CausalLM, LMConfig
from jaxppo.trainer.evaluation import bootstrap_ci, evaluate_policy, heldout_perplexity

# ----------------------------------------------------------------------------- bootstrap


def test_constant_gain_gives_a_degenerate_interval_at_the_gain():
    before = np.linspace(-1.0, 1.0, 37)
    lo, hi = bootstrap_ci(before, before + 0.3)
    assert lo == pytest.approx(0.3, abs=1e-12) and hi == pytest.approx(0.3, abs=1e-12)


def test_symmetric_noise_around_zero_contains_zero():
    d = np.concatenate([np.arange(1, 26), -np.arange(1, 26)]).astype(float)  # mean 0, symmetric
    lo, hi = bootstrap_ci(np.zeros_like(d), d)
    assert lo < 0.0 < hi
    # interval is roughly mean ± 1.96 * sd / sqrt(n)
    se = d.std() / np.sqrt(d.size)
    assert hi == pytest.approx(1.96 * se, rel=0.15) and lo == pytest.approx(-1.96 * se, rel=0.15)


def test_clear_gain_excludes_zero_and_wider_level_is_wider():
    rng = np.random.default_rng(1)
    before = rng.normal(size=200)
    after = before + 0.5 + 0.3 * rng.normal(size=200)
    lo, hi = bootstrap_ci(before, after)
    assert 0.0 < lo < 0.5 < hi
    lo99, hi99 = bootstrap_ci(before, after, level=0.99)
    assert lo99 <= lo and hi99 >= hi


def test_two_point_case_by_hand():
    # d = (0, 1): a resample mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4
    lo, hi = bootstrap_ci([0.0, 0.0], [0.0, 1.0], n_boot=4000, level=0.5)
    assert (lo, hi) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.0, 0.0], [0.0, 1.0], n_boot=4000, level=0.9)
    assert (lo, hi) == (0.0, 1.0)


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=30), st.integers(0, 3))
def test_seeded_determinism_and_interval_within_range(diffs, seed):
    d = np.asarray(diffs)
    a = bootstrap_ci(np.zeros_like(d), d, n_boot=300, seed=seed)
    b = bootstrap_ci(np.zeros_like(d), d, n_boot=300, seed=seed)
    assert a == b
    assert d.min() - 1e-9 <= a[0] <= a[1] <= d.max() + 1e-9


def test_bootstrap_bad_input():
    with pytest.raises(ValueError, match="paired"):
        bootstrap_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([], [])
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([1.0], [np.nan])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0], [2.0], level=1.0)


# ----------------------------------------------------------------------------- perplexity

def _arrays(vocab, seed=0):
    """4 rows: prompts left-padded to 5, responses right-padded to 4 (row 3 has a 1-token response)."""
    rng = np.random.default_rng(seed)
    p_len, r_len = [5, 3, 1, 4], [4, 2, 3, 1]
    P, R = 5, 4
    pi, pm = np.zeros((4, P), np.int32), np.zeros((4, P), np.int32)
    ri, rm = np.zeros((4, R), np.int32), np.zeros((4, R), np.int32)
    for b in range(4):
        pi[b, P - p_len[b]:] = rng.integers(3, vocab, p_len[b])
        pm[b, P - p_len[b]:] = 1
        ri[b, :r_len[b]] = rng.integers(3, vocab, r_len[b])
        rm[b, :r_len[b]] = 1
    return dict(prompt_ids=pi, prompt_mask=pm, response_ids=ri, response_mask=rm)


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    from jaxppo.hf import load_pretrained
    from tests.hf.tiny import save_hf_model

    path = tmp_path_factory.mktemp("tiny_llama")
    hf = save_hf_model("llama", path, seed=3)
    return hf, load_pretrained(path)


def test_perplexity_matches_transformers_on_unpadded_rows(hf_pair):
    import torch

    hf, model = hf_pair
    arrays = _arrays(hf.config.vocab_size)
    nll, ntok = 0.0, 0
    for b in range(4):  # each row alone, without any padding, through transformers
        p = arrays["prompt_ids"][b][arrays["prompt_mask"][b] == 1]
        r = arrays["response_ids"][b][arrays["response_mask"][b] == 1]
        ids = torch.tensor(np.concatenate([p, r])[None].astype(np.int64))
        with torch.no_grad():
            logp = torch.log_softmax(hf(input_ids=ids).logits[0].double(), -1).numpy()
        nll -= sum(logp[len(p) - 1 + t, r[t]] for t in range(len(r)))
        ntok += len(r)
    expected = float(np.exp(nll / ntok))
    for bs in (1, 3, 8):  # batch padding must not change the value
        assert heldout_perplexity(model, arrays, batch_size=bs) == pytest.approx(expected, rel=2e-4)


def test_perplexity_of_a_uniform_model_is_the_vocab_size():
    cfg = LMConfig(vocab_size=23, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    nnx.update(model, jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), nnx.state(model)))
    model.lm_head[...] = jnp.zeros_like(model.lm_head[...])  # all logits 0 -> uniform next-token distribution
    assert heldout_perplexity(model, _arrays(23), batch_size=2) == pytest.approx(23.0, rel=1e-5)
    with pytest.raises(ValueError, match="no response tokens"):
        heldout_perplexity(model, {**_arrays(23), "response_mask": np.zeros((4, 4), np.int32)})
    with pytest.raises(KeyError, match="response_ids"):
        heldout_perplexity(model, {k: v for k, v in _arrays(23).items() if k != "response_ids"})


# ----------------------------------------------------------------------------- evaluate_policy

class CharTokenizer:
    """decode(ids) = letters, token 2 is EOS (special)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if (i == 2 and skip_special_tokens) else chr(ord("a") + int(i) % 26) for i in ids)


def _tiny(seed):
    """A tiny random CausalLM, filled from numpy (avoids compiling one RNG kernel per parameter shape)."""
    cfg = LMConfig(vocab_size=29, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1)
    model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape).astype(s.dtype)), nnx.state(model))
    nnx.update(model, state)
    return model


def _right_padded_logprobs(model, rows):
    """log π(r_t | p, r_<t) for unpadded (p, r) pairs, all in one RIGHT-padded batch (independent layout:
    causal attention makes trailing padding irrelevant for earlier positions)."""
    T = max(len(p) + len(r) for p, r in rows)
    ids = np.zeros((len(rows), T), np.int32)
    for b, (p, r) in enumerate(rows):
        ids[b, :len(p) + len(r)] = np.concatenate([p, r])
    logits = np.asarray(model(jnp.asarray(ids)), np.float64)
    mx = logits.max(-1, keepdims=True)
    logp = logits - mx - np.log(np.exp(logits - mx).sum(-1, keepdims=True))
    return [np.array([logp[b, len(p) - 1 + t, r[t]] for t in range(len(r))]) for b, (p, r) in enumerate(rows)]


def test_evaluate_policy_rewards_kl_and_lengths():
    pol, ref = _tiny(0), _tiny(1)
    arr = _arrays(29, seed=5)
    pids = np.concatenate([arr["prompt_ids"], arr["prompt_ids"][:1]])  # 5 prompts -> batches 2, 2, 1(+pad)
    pmask = np.concatenate([arr["prompt_mask"], arr["prompt_mask"][:1]])
    seen = {}

    def reward_fn(prompts, responses):
        seen["prompts"] = prompts
        return np.array([len(r) for r in responses], np.float32)

    out = evaluate_policy(pol, ref, CharTokenizer(), pids, pmask, reward_fn, jax.random.key(0), max_new_tokens=6,
                          temperature=1.0, top_k=0, top_p=1.0, eos_token_id=2, pad_token_id=0, batch_size=2)
    rid, rm = out["response_ids"], out["response_mask"]
    assert rid.shape == (5, 6) and out["rewards"].shape == (5,) and out["rewards"].dtype == np.float32
    lengths = rm.sum(1)
    assert out["response_length"] == pytest.approx(lengths.mean())
    # rewards = decoded length (EOS skipped) -> tokens before EOS
    n_eos = np.array([int((rid[b, :lengths[b]] == 2).sum()) for b in range(5)])
    np.testing.assert_array_equal(out["rewards"], lengths - n_eos)
    assert len(out["responses"]) == 5 and seen["prompts"][0] == CharTokenizer().decode(pids[0][pmask[0] == 1])
    # k1 KL recomputed row by row without padding
    rows = [(pids[b][pmask[b] == 1], rid[b, :lengths[b]]) for b in range(5)]
    lp_pol, lp_ref = _right_padded_logprobs(pol, rows), _right_padded_logprobs(ref, rows)
    num = sum((a - b).sum() for a, b in zip(lp_pol, lp_ref))
    assert out["kl"] == pytest.approx(num / lengths.sum(), rel=1e-3, abs=1e-5)


def test_evaluate_policy_kl_zero_against_itself_and_greedy_batch_invariance():
    pol = _tiny(0)
    arr = _arrays(29, seed=7)
    rf = lambda prompts, responses: np.zeros(len(responses), np.float32)  # noqa: E731
    kw = dict(max_new_tokens=5, temperature=0.0, eos_token_id=None, pad_token_id=0)
    a = evaluate_policy(pol, pol, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"], rf, jax.random.key(0),
                        batch_size=4, **kw)
    b = evaluate_policy(pol, pol, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"], rf, jax.random.key(9),
                        batch_size=3, **kw)
    assert a["kl"] == 0.0 and a["response_length"] == 5.0
    assert a["responses"] == b["responses"]
    with pytest.raises(ValueError, match="reward_fn returned shape"):
        evaluate_policy(pol, pol, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"],
                        lambda p, r: np.zeros(1), jax.random.key(0), batch_size=4, **kw)


def test_heldout_eval_prompts_one_per_group_repeated():
    from jaxppo.trainer.evaluation import heldout_eval_prompts

    ids = np.arange(6)[:, None] * np.ones((1, 3), np.int32)
    heldout = {"prompt_ids": ids, "prompt_mask": np.ones_like(ids), "group_id": np.array([7, 7, 3, 3, 9, 9])}
    p, m = heldout_eval_prompts(heldout, 2)
    np.testing.assert_array_equal(p[:, 0], [0, 2])  # first row of the first two groups, in row order
    p, m = heldout_eval_prompts(heldout, 5, samples=3)
    np.testing.assert_array_equal(p[:, 0], [0, 0, 0, 2, 2, 2, 4, 4, 4])
    assert m.shape == p.shape
    with pytest.raises(ValueError, match="samples"):
        heldout_eval_prompts(heldout, 2, samples=0)


def test_prompt_means_average_consecutive_samples():
    from jaxppo.trainer.evaluation import prompt_means

    np.testing.assert_allclose(prompt_means([1.0, 3.0, -2.0, 0.0], 2), [2.0, -1.0])
    np.testing.assert_allclose(prompt_means([1.0, 3.0], 1), [1.0, 3.0])
    with pytest.raises(ValueError, match="multiple of samples=3"):
        prompt_means([1.0, 2.0], 3)
