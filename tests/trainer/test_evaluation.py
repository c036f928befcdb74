"""Evaluation: bootstrap interval, held-out perplexity (vs transformers), evaluate_policy on a tiny model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

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


def test_evaluate_policy_kl_is_the_models_own_log_probs_under_tempered_top_k_sampling():
    """The KL's policy term is ``log π`` of the sampled tokens (untempered), not the sampling distribution's."""
    pol, ref = _tiny(0), _tiny(1)
    arr = _arrays(29, seed=6)
    rf = lambda prompts, responses: np.zeros(len(responses), np.float32)  # noqa: E731
    out = evaluate_policy(pol, ref, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"], rf, jax.random.key(3),
                          max_new_tokens=6, temperature=0.7, top_k=5, eos_token_id=2, pad_token_id=0, batch_size=2)
    rid, lengths = out["response_ids"], out["response_mask"].sum(1)
    rows = [(arr["prompt_ids"][b][arr["prompt_mask"][b] == 1], rid[b, :lengths[b]]) for b in range(len(rid))]
    lp_pol, lp_ref = _right_padded_logprobs(pol, rows), _right_padded_logprobs(ref, rows)
    num = sum((a - b).sum() for a, b in zip(lp_pol, lp_ref))
    assert out["kl"] == pytest.approx(num / lengths.sum(), rel=1e-4, abs=1e-6)


def test_evaluate_policy_packed_kl_equals_padded():
    """``packing=True`` (``data.packing``): the same samples (the same key) and the same KL through packed rows."""
    pol, ref = _tiny(0), _tiny(1)
    arr = _arrays(29, seed=5)
    rf = lambda prompts, responses: np.zeros(len(responses), np.float32)  # noqa: E731
    kw = dict(max_new_tokens=6, temperature=1.0, eos_token_id=2, pad_token_id=0, batch_size=3)
    a = evaluate_policy(pol, ref, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"], rf, jax.random.key(0), **kw)
    b = evaluate_policy(pol, ref, CharTokenizer(), arr["prompt_ids"], arr["prompt_mask"], rf, jax.random.key(0),
                        packing=True, **kw)
    np.testing.assert_array_equal(b["response_ids"], a["response_ids"])
    assert a["kl"] != 0.0 and b["kl"] == pytest.approx(a["kl"], rel=1e-5, abs=1e-6)


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


@pytest.mark.parametrize("n,batch_size,unit,expected", [
    (96, 64, 2, 48),    # 48 prompts x 2 samples: two batches of 48, not 64 + 32 padded to 64
    (96, 64, 8, 48),
    (160, 64, 8, 56),   # 3 batches of 7 blocks: 8 rows of padding, not 32
    (7, 32, 1, 7),      # one batch of every row
    (7, 32, 8, 8),      # one block of 8 (a mesh of 8): 1 row of padding, and the batch splits over the devices
    (5, 2, 1, 2),
    (64, 64, 1, 64),
    (65, 64, 1, 33),
    (10, 4, 8, 4),      # a block larger than the batch: min(batch_size, n)
])
def test_even_batch_hand_cases(n, batch_size, unit, expected):
    from jaxppo.trainer.evaluation import even_batch

    assert even_batch(n, batch_size, unit) == expected


@given(st.integers(1, 400), st.integers(1, 96), st.integers(1, 16))
def test_even_batch_is_the_smallest_whole_block_batch_with_the_fewest_batches(n, batch_size, unit):
    from jaxppo.trainer.evaluation import even_batch

    b = even_batch(n, batch_size, unit)
    if unit > batch_size:
        assert b == min(batch_size, n)
        return
    blocks = -(-n // unit)
    # brute force over every whole-block batch size that fits: the fewest batches, then the smallest batch
    sizes = [unit * j for j in range(1, batch_size // unit + 1)]
    fewest = min(-(-blocks // (s // unit)) for s in sizes)
    ref = min(s for s in sizes if -(-blocks // (s // unit)) == fewest)
    assert b == ref and b % unit == 0 and b <= batch_size
    k = -(-n // b)
    assert k == fewest and k * b - n < k * unit


def test_generation_batch_keeps_samples_together_and_splits_over_the_mesh(monkeypatch):
    from jaxppo.models import sharding
    from jaxppo.trainer.evaluation import generation_batch

    arr = _arrays(29, seed=1)
    pids, pmask = np.repeat(arr["prompt_ids"], 3, axis=0), np.repeat(arr["prompt_mask"], 3, axis=0)  # 4 prompts x 3
    assert generation_batch(pids, pmask, None, 8) == 6      # blocks of 3: 2 batches of 2 prompts
    assert generation_batch(pids, pmask, None, 2) == 2      # a block of 3 does not fit: rows, 6 batches of 2
    monkeypatch.setattr(sharding, "batch_multiple", lambda state: 2)
    assert generation_batch(pids, pmask, None, 8) == 6      # blocks of 3 x 2 devices: one block per batch
    assert generation_batch(pids, pmask, None, 5) == 4      # 6 > 5: blocks of the 2 devices, 3 batches of 4


def test_evaluate_policy_runs_even_batches(monkeypatch):
    """12 rows (6 prompts x 2 samples) with ``batch_size=8`` run as 2 batches of 6, not 8 + 4 padded to 8."""
    import jaxppo.models as models

    shapes = []
    generate = models.generate

    def spy(model, ids, mask, key, **kw):
        shapes.append(tuple(ids.shape))
        return generate(model, ids, mask, key, **kw)

    monkeypatch.setattr(models, "generate", spy)
    pol = _tiny(0)
    arr = _arrays(29, seed=2)
    pids = np.repeat(np.concatenate([arr["prompt_ids"], arr["prompt_ids"][:2]]), 2, axis=0)
    pmask = np.repeat(np.concatenate([arr["prompt_mask"], arr["prompt_mask"][:2]]), 2, axis=0)
    rf = lambda prompts, responses: np.zeros(len(responses), np.float32)  # noqa: E731
    out = evaluate_policy(pol, pol, CharTokenizer(), pids, pmask, rf, jax.random.key(0), max_new_tokens=4,
                          temperature=1.0, eos_token_id=None, pad_token_id=0, batch_size=8)
    assert shapes == [(6, 5), (6, 5)] and out["response_ids"].shape == (12, 4)


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


# ----------------------------------------------------------------------------- the shared evaluation path

def _numpy_bootstrap_mean(x, n_boot, seed, level):
    """Independent reference: the same resampling stream (numpy default_rng, chunks of 256 rows of n indices),
    one mean per resample, linear-interpolated percentiles."""
    x = np.asarray(x, np.float64)
    rng = np.random.default_rng(seed)
    means = []
    left = n_boot
    while left:
        m = min(256, left)
        means.extend(x[rng.integers(0, x.size, size=(m, x.size))].mean(axis=1))
        left -= m
    return tuple(np.quantile(np.asarray(means), [(1 - level) / 2, (1 + level) / 2]))


def test_bootstrap_mean_ci_hand_cases_and_numpy_reference():
    from jaxppo.trainer.evaluation import bootstrap_mean_ci

    assert bootstrap_mean_ci([2.5] * 7) == (2.5, 2.5)                       # a constant: a point
    # two prompts (0, 1): resample means 0, 0.5, 1 with probability 1/4, 1/2, 1/4
    assert bootstrap_mean_ci([0.0, 1.0], n_boot=4000, level=0.5) == (0.5, 0.5)
    assert bootstrap_mean_ci([0.0, 1.0], n_boot=4000, level=0.9) == (0.0, 1.0)
    x = np.random.default_rng(3).normal(size=23)
    for n_boot, seed, level in ((2000, 0, 0.95), (300, 5, 0.8), (257, 1, 0.99)):
        np.testing.assert_allclose(bootstrap_mean_ci(x, n_boot=n_boot, seed=seed, level=level),
                                   _numpy_bootstrap_mean(x, n_boot, seed, level), rtol=0, atol=1e-12)
    for bad, match in (([], "empty"), ([[1.0]], "1-D"), ([np.inf], "NaN or inf")):
        with pytest.raises(ValueError, match=match):
            bootstrap_mean_ci(bad)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_mean_ci([1.0], n_boot=0)


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=20), st.lists(st.floats(-5, 5), min_size=20, max_size=20),
       st.integers(0, 3))
def test_paired_interval_is_the_one_sample_interval_of_the_differences(after, before, seed):
    """bootstrap_ci(before, after) == bootstrap_mean_ci(after − before): the refactor keeps the numbers."""
    from jaxppo.trainer.evaluation import bootstrap_mean_ci

    a, b = np.asarray(after), np.asarray(before[:len(after)])
    assert bootstrap_ci(b, a, n_boot=200, seed=seed) == bootstrap_mean_ci(a - b, n_boot=200, seed=seed)
    lo, hi = bootstrap_mean_ci(a, n_boot=200, seed=seed)
    assert a.min() - 1e-9 <= lo <= hi <= a.max() + 1e-9


def _result(rewards, kl=0.0, length=3.0):
    n = len(rewards)
    return {"rewards": np.asarray(rewards, np.float32), "kl": kl, "response_length": length,
            "prompts": [f"p{i}" for i in range(n)], "responses": [f"r{i}" for i in range(n)]}


def test_compare_final_summary_and_eval_samples(tmp_path):
    import json
    from types import SimpleNamespace

    from jaxppo.trainer.evaluation import compare, final_summary, write_eval_samples

    before, after = _result([0.0, 1.0, 2.0, 4.0], length=5.0), _result([1.0, 1.0, 4.0, 4.0], kl=0.25, length=6.0)
    c = compare(before, after, 2, seed=3)                  # prompts (0,1) (2,4) -> before [0.5, 3], after [1, 4]
    np.testing.assert_allclose(c["before"], [0.5, 3.0])
    np.testing.assert_allclose(c["after"], [1.0, 4.0])
    assert (c["reward_before"], c["reward_after"], c["n_prompts"]) == (1.75, 2.5, 2)
    assert c["gain"] == pytest.approx(0.75)
    assert c["gain_ci95"] == list(bootstrap_ci([0.5, 3.0], [1.0, 4.0], seed=3))
    ev = SimpleNamespace(samples=2, seed=3)
    s = final_summary(ev, before, after)
    assert s == {"eval/n_prompts": 2, "eval/samples_per_prompt": 2, "eval/reward_before": 1.75,
                 "eval/reward_after": 2.5, "eval/reward_gain": c["gain"], "eval/reward_gain_ci95": c["gain_ci95"],
                 "eval/kl": 0.25, "eval/response_length_before": 5.0, "eval/response_length_after": 6.0}
    with pytest.raises(ValueError, match="same ones"):
        compare(before, _result([1.0, 2.0]), 1)
    write_eval_samples(tmp_path / "a.jsonl", before, after)
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows[3] == {"prompt": "p3", "before": "r3", "after": "r3", "reward_before": 4.0, "reward_after": 4.0}
    write_eval_samples(tmp_path / "b.jsonl", before, after, names=("reference", "policy"), response_prefix="response_")
    row = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])
    assert row == {"prompt": "p0", "response_reference": "r0", "response_policy": "r0", "reward_reference": 0.0,
                   "reward_policy": 1.0}


def test_heldout_eval_is_evaluate_policy_with_the_config(monkeypatch):
    """HeldoutEval calls evaluate_policy with the config's prompts, sampling, key and reward; step_metrics gives
    eval/reward_mean (mean of per-prompt means), the bootstrap interval over prompts, eval/kl and the length."""
    from jaxppo.config import load_config
    from jaxppo.trainer import evaluation
    from jaxppo.trainer.evaluation import EVAL_KEY_SALT, bootstrap_mean_ci, heldout_eval

    cfg = load_config(None, ["trainer.eval_prompts=2", "trainer.eval_samples=3", "trainer.seed=4",
                             "rollout.max_new_tokens=9", "data.max_response_length=7", "rollout.temperature=0.5",
                             "rollout.top_k=3", "rollout.batch_size=5", "reward.kind=length",
                             "reward.target_length=5"])
    ids = np.arange(8)[:, None] * np.ones((1, 2), np.int32)
    heldout = {"prompt_ids": ids, "prompt_mask": np.ones_like(ids), "group_id": np.array([5, 5, 1, 1, 1, 2, 2, 8])}
    tok = SimpleTok()
    ev = heldout_eval(cfg, heldout, tok, (2, 3))
    assert ev.available and ev.samples == 3 and ev.seed == 4
    np.testing.assert_array_equal(ev.prompt_ids[:, 0], [0, 0, 0, 2, 2, 2])
    assert dict(ev.gen) == dict(max_new_tokens=7, temperature=0.5, top_k=3, top_p=1.0, eos_token_id=(2, 3),
                                pad_token_id=0, batch_size=5, packing=False)   # data.packing's default
    np.testing.assert_array_equal(jax.random.key_data(ev.key) if jnp.issubdtype(ev.key.dtype, jax.dtypes.prng_key)
                                  else ev.key, jax.random.fold_in(jax.random.PRNGKey(4), EVAL_KEY_SALT))
    from jaxppo.rewards import length_reward

    texts = ["a b c d e", "a", "a b c d e f g h i j k l"]
    got = ev.reward_fn(["p"] * 3, texts)                                # the length reward of the config
    np.testing.assert_allclose(got, length_reward(["p"] * 3, texts, target_length=5))
    assert not np.allclose(got, length_reward(["p"] * 3, texts, target_length=32))
    seen = {}

    def fake(model, ref, tokenizer, prompt_ids, prompt_mask, reward_fn, key, **kw):
        seen.update(model=model, ref=ref, tokenizer=tokenizer, n=prompt_ids.shape[0], kw=kw, reward_fn=reward_fn)
        return _result([1.0, 2.0, 3.0, 0.0, 0.0, 6.0], kl=0.5, length=4.0)

    monkeypatch.setattr(evaluation, "evaluate_policy", fake)
    res = ev("POLICY", "REF")
    assert (seen["model"], seen["ref"], seen["tokenizer"], seen["n"]) == ("POLICY", "REF", tok, 6)
    assert seen["kw"] == dict(ev.gen) and seen["reward_fn"] is ev.reward_fn
    m = ev.step_metrics(res)                                 # per-prompt means [2, 2]
    lo, hi = bootstrap_mean_ci([2.0, 2.0], seed=4)
    assert m == {"eval/reward_mean": 2.0, "eval/reward_ci_lo": lo, "eval/reward_ci_hi": hi, "eval/kl": 0.5,
                 "eval/response_length": 4.0}
    empty = heldout_eval(cfg, {k: v[:0] for k, v in heldout.items()}, tok, None)
    assert not empty.available
    with pytest.raises(ValueError, match="no held-out prompts"):
        empty("POLICY", "REF")


class SimpleTok:
    pad_token_id = 0
    eos_token_id = 2
