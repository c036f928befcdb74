"""jaxppo.models.shared_prompts: block sizes of rows that repeat their prompt, and the log-probs of such rows with
each prompt run once (equal to the row-by-row pass)."""

import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.models.shared_prompts import prompt_repeats, rows_logprobs, shared_rows
from jaxppo.models.transformer import continuation_logprobs
from tests.models.tiny_lm import FAMILIES, left_padded_prompts, tiny_lm


def _repeats(rows, masks=None) -> int:
    ids = np.asarray(rows, np.int32)
    return prompt_repeats(ids, np.ones_like(ids) if masks is None else np.asarray(masks, np.int32))


def test_prompt_repeats_hand_cases():
    a, b = [5, 6, 7], [8, 9, 10]
    assert _repeats([a, a, b, b]) == 2
    assert _repeats([a, a, a, b, b, b]) == 3
    assert _repeats([a, a, a, a]) == 4
    assert _repeats([a, b]) == 1
    assert _repeats([a, a, b]) == 1
    assert _repeats([a]) == 1
    assert _repeats([a, a, b, b, b, b]) == 2       # runs of 2 and 4: blocks of 2
    assert _repeats([a, a, b, b, a, a]) == 2       # a prompt that comes back later starts a block of its own
    assert _repeats([a, a], [[1, 1, 1], [0, 1, 1]]) == 1   # equal ids, different masks: different rows


def _blocks_equal(ids: np.ndarray, r: int) -> bool:
    return ids.shape[0] % r == 0 and all((ids[k:k + r] == ids[k]).all() for k in range(0, ids.shape[0], r))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1, max_size=6))
def test_prompt_repeats_is_the_largest_block_size(runs):
    """Rows made of runs of prompts (a prompt may follow itself): the result is the largest ``r`` whose consecutive
    blocks of ``r`` rows are each one prompt, by brute force over every divisor of the row count."""
    prompts = np.array([[3, 4], [5, 6], [7, 8]], np.int32)
    ids = np.concatenate([np.repeat(prompts[p:p + 1], n, axis=0) for p, n in runs])
    r = prompt_repeats(ids, np.ones_like(ids))
    best = max(d for d in range(1, ids.shape[0] + 1) if _blocks_equal(ids, d))
    assert r == best


def _grouped_rows(vocab: int, lengths, r: int, width: int = 7, resp: int = 5, seed: int = 0):
    """Prompts (``lengths`` real tokens each) repeated ``r`` times in a row, with a response of its own per row
    (1..resp real tokens, right-padded)."""
    ids, mask = left_padded_prompts(vocab, lengths=lengths, width=width, seed=seed)
    ids, mask = np.repeat(ids, r, axis=0), np.repeat(mask, r, axis=0)
    rng = np.random.default_rng(seed + 1)
    b = ids.shape[0]
    n = rng.integers(1, resp + 1, size=b)
    r_mask = (np.arange(resp)[None, :] < n[:, None]).astype(np.int32)
    r_ids = rng.integers(3, vocab, size=(b, resp)).astype(np.int32) * r_mask
    return ids, mask, r_ids, r_mask


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rows_logprobs_equal_the_row_by_row_pass(family, scan):
    """3 prompts x 4 responses of different lengths: each prompt run once gives every row's log-probs."""
    model = tiny_lm(family, seed=2, scan_layers=scan)
    rows = _grouped_rows(model.config.vocab_size, (7, 4, 1), 4)
    gd, state = nnx.split(model)
    assert shared_rows(rows[0], rows[1], state) == 4
    shared = np.asarray(rows_logprobs(gd, state, *rows))
    plain = np.asarray(continuation_logprobs(gd, state, *rows))
    assert shared.shape == plain.shape == rows[2].shape
    np.testing.assert_allclose(shared, plain, atol=1e-5)
    assert (shared[rows[3] == 0] == 0).all() and (shared[rows[3] == 1] < 0).all()
    np.testing.assert_array_equal(np.asarray(rows_logprobs(gd, state, *rows, share=False)), plain)


def test_rows_logprobs_use_the_shared_pass_only_for_blocks(monkeypatch):
    """Blocks of equal prompts go through the shared-prefix program with one prompt row per block; rows without
    blocks (or share=False) through the row-by-row one."""
    import jaxppo.models.shared_prompts as sp

    calls = []
    real = sp.shared_prefix_logprobs

    def spy(gd, state, prompt_ids, *rest):
        calls.append((tuple(prompt_ids.shape), tuple(rest[1].shape)))
        return real(gd, state, prompt_ids, *rest)

    monkeypatch.setattr(sp, "shared_prefix_logprobs", spy)
    model = tiny_lm("llama", seed=2)
    gd, state = nnx.split(model)
    rows = _grouped_rows(model.config.vocab_size, (7, 4, 1), 2)
    rows_logprobs(gd, state, *rows)
    rows_logprobs(gd, state, *rows, share=False)
    single = _grouped_rows(model.config.vocab_size, (7, 4, 1), 1)
    rows_logprobs(gd, state, *single)
    assert calls == [((3, 7), (3, 2, 5))]


def test_shared_rows_on_a_mesh_needs_whole_shards():
    """On a data 2 x fsdp 4 mesh the B/r prompt rows must split 8 ways; otherwise every row runs (r = 1)."""
    from jaxppo.models import shard_model
    from jaxppo.parallel import make_mesh

    state = nnx.state(shard_model(tiny_lm("llama", seed=2), make_mesh(2, 4, 1)))
    one = nnx.state(tiny_lm("llama", seed=2))
    ids = np.repeat(np.arange(8 * 3, dtype=np.int32).reshape(8, 3), 4, axis=0)    # 8 prompts x 4
    mask = np.ones_like(ids)
    assert shared_rows(ids, mask, state) == 4 and shared_rows(ids, mask, one) == 4
    assert shared_rows(ids[:12], mask[:12], state) == 1 and shared_rows(ids[:12], mask[:12], one) == 4
    assert shared_rows(ids, mask, one, share=False) == 1


def test_rows_logprobs_on_a_mesh_equal_one_device():
    from jaxppo.models import shard_model
    from jaxppo.parallel import make_mesh

    model = tiny_lm("llama", seed=2)
    rows = _grouped_rows(model.config.vocab_size, (7, 4, 1, 2, 6, 5, 3, 7), 2)
    gd, state = nnx.split(model)
    one = np.asarray(continuation_logprobs(gd, state, *rows))
    sgd, sstate = nnx.split(shard_model(tiny_lm("llama", seed=2), make_mesh(2, 4, 1)))
    assert shared_rows(rows[0], rows[1], sstate) == 2
    np.testing.assert_allclose(np.asarray(rows_logprobs(sgd, sstate, *rows)), one, atol=1e-5)


def test_behaviour_pass_of_grouped_rows_equals_the_row_by_row_pass():
    """compute_behaviour_logprobs (the reference and perplexity passes) on 5 prompts x 4 rows in batches of 8: the
    log-probs of the row-by-row pass, the last batch (4 rows, padded) included."""
    from jaxppo.data.behaviour import compute_behaviour_logprobs

    model = tiny_lm("llama", seed=2)
    ids, mask, r_ids, r_mask = _grouped_rows(model.config.vocab_size, (7, 4, 1, 3, 6), 4)
    arrays = {"prompt_ids": ids, "prompt_mask": mask, "response_ids": r_ids, "response_mask": r_mask}
    got = compute_behaviour_logprobs(model, arrays, batch_size=8)
    gd, state = nnx.split(model)
    want = np.asarray(continuation_logprobs(gd, state, ids, mask, r_ids, r_mask))
    np.testing.assert_allclose(got, want, atol=1e-5)
