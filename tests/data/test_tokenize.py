import numpy as np
import pytest

from jaxppo.data.report import DataError, DataReport
from jaxppo.data.schemas import PreferencePair, ScoredTrajectory
from jaxppo.data.tokenize import left_pad, right_pad, tokenize_preference, tokenize_scored


def row(prompt, response, score=1.0, i=0, **kw):
    return ScoredTrajectory(prompt=prompt, response=response, score=score, index=i, **kw)


def test_shapes_padding_and_masks_by_hand(char_tok):
    # "ab" -> BOS a b = [1, 3, 4]; "cd" -> [5, 6]; "e" -> [7]
    out = tokenize_scored([row("ab", "cd", 0.5), row("a", "e", -1.0, i=7)], char_tok,
                          max_prompt_length=4, max_response_length=3)
    np.testing.assert_array_equal(out["prompt_ids"], [[0, 1, 3, 4], [0, 0, 1, 3]])
    np.testing.assert_array_equal(out["prompt_mask"], [[0, 1, 1, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(out["response_ids"], [[5, 6, 0], [7, 0, 0]])
    np.testing.assert_array_equal(out["response_mask"], [[1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(out["score"], np.array([0.5, -1.0], np.float32))
    np.testing.assert_array_equal(out["index"], [0, 7])
    np.testing.assert_array_equal(out["has_behaviour"], [False, False])
    assert out["behaviour_logprobs"].shape == (2, 3) and not out["behaviour_logprobs"].any()
    for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_id", "index"):
        assert out[k].dtype == np.int32, k
    assert out["score"].dtype == out["behaviour_logprobs"].dtype == np.float32


@pytest.mark.parametrize("policy,expected", [("left", [3, 4, 5, 6]), ("right", [1, 3, 4, 5])])
def test_prompt_truncation_sides(char_tok, policy, expected):
    rep = DataReport()
    out = tokenize_scored([row("abcd", "x")], char_tok, max_prompt_length=4, max_response_length=2,
                          truncation=policy, report=rep)
    np.testing.assert_array_equal(out["prompt_ids"][0], expected)
    assert rep.truncated == {"prompt": 1} and rep.tokens_dropped == {"prompt": 1}


def test_response_truncation_keeps_the_start_and_cuts_logprobs(char_tok):
    rep = DataReport()
    lp = np.array([-0.1, -0.2, -0.3, -0.4, -0.5], np.float32)
    out = tokenize_scored([row("a", "abcde", behaviour_logprobs=lp)], char_tok, max_prompt_length=3,
                          max_response_length=3, report=rep)
    np.testing.assert_array_equal(out["response_ids"][0], [3, 4, 5])
    np.testing.assert_array_equal(out["behaviour_logprobs"][0], lp[:3])
    assert out["has_behaviour"][0]
    assert rep.truncated == {"response": 1} and rep.tokens_dropped == {"response": 2}


def test_skip_and_error_policies(char_tok):
    rows = [row("a", "b"), row("abcdef", "b", i=1), row("a", "bbbbbb", i=2)]
    rep = DataReport()
    out = tokenize_scored(rows, char_tok, max_prompt_length=3, max_response_length=3, truncation="skip", report=rep)
    np.testing.assert_array_equal(out["index"], [0])
    assert rep.skipped == {"prompt_too_long": 1, "response_too_long": 1}
    assert rep.rows_kept == 1
    with pytest.raises(DataError, match=r"row 1: prompt has 7 tokens > data.max_prompt_length=3.*truncation=error"):
        tokenize_scored(rows, char_tok, max_prompt_length=3, max_response_length=3, truncation="error")


def test_token_level_bad_inputs_are_counted(char_tok):
    rows = [row("a", "bc", behaviour_logprobs=np.array([-1.0, -1.0, -1.0], np.float32)),  # 3 lps, 2 tokens
            row("a", "b", i=1, response_ids=np.array([99], np.int32)),  # outside the 30-token vocabulary
            row("a", "!!", i=2),  # tokenizes to nothing
            row("a", "b", i=3)]
    rep = DataReport()
    out = tokenize_scored(rows, char_tok, max_prompt_length=3, max_response_length=3, report=rep)
    np.testing.assert_array_equal(out["index"], [3])
    assert rep.skipped == {"logprob_length_mismatch": 1, "bad_token_ids": 1, "empty_tokens": 1}
    assert "3 behaviour_logprobs for 2 response tokens" in rep.examples["logprob_length_mismatch"][0]


def test_given_token_ids_are_used_verbatim(char_tok):
    out = tokenize_scored([row("zzz", "zzz", prompt_ids=np.array([1, 9]), response_ids=np.array([8, 2]))],
                          char_tok, max_prompt_length=3, max_response_length=3)
    np.testing.assert_array_equal(out["prompt_ids"][0], [0, 1, 9])
    np.testing.assert_array_equal(out["response_ids"][0], [8, 2, 0])


def test_group_ids_from_prompt_or_column(char_tok):
    out = tokenize_scored([row("a", "b"), row("c", "b"), row("a", "d")], char_tok, max_prompt_length=3,
                          max_response_length=2)
    np.testing.assert_array_equal(out["group_id"], [0, 1, 0])
    out = tokenize_scored([row("a", "b", group_id="x"), row("a", "b", group_id=5), row("c", "b", group_id="x")],
                          char_tok, max_prompt_length=3, max_response_length=2)
    np.testing.assert_array_equal(out["group_id"], [0, 1, 0])


def test_preference_arrays(char_tok):
    pairs = [PreferencePair("ab", "cd", "e", 0), PreferencePair("a", "xyzw", "xyzq", 1)]
    rep = DataReport()
    out = tokenize_preference(pairs, char_tok, max_prompt_length=3, max_response_length=3, report=rep)
    np.testing.assert_array_equal(out["prompt_ids"], [[1, 3, 4]])
    np.testing.assert_array_equal(out["chosen_ids"], [[5, 6, 0]])
    np.testing.assert_array_equal(out["chosen_mask"], [[1, 1, 0]])
    np.testing.assert_array_equal(out["rejected_ids"], [[7, 0, 0]])
    np.testing.assert_array_equal(out["rejected_mask"], [[1, 0, 0]])
    assert rep.skipped == {"identical_after_truncation": 1}  # "xyzw" and "xyzq" agree in their first 3 tokens
    assert "data.max_response_length=3" in rep.examples["identical_after_truncation"][0]
    assert rep.fitted == {"prompt": 1, "chosen": 1, "rejected": 1} and rep.truncated == {}


def test_texts_that_tokenize_alike_are_an_identical_pair_not_a_truncation(char_tok):
    # the character tokenizer drops '!' and digits: "ab!" and "ab1" are the same two tokens, nothing cut
    rep = DataReport()
    tokenize_preference([PreferencePair("p", "ab!", "ab1", 0), PreferencePair("p", "ab", "abc", 1)], char_tok,
                        max_prompt_length=4, max_response_length=4, report=rep)
    assert rep.skipped == {"identical_pair": 1} and rep.rows_kept == 1


def test_truncation_warning_names_the_key_above_the_stated_share(char_tok):
    from jaxppo.data.report import TRUNCATION_WARN_SHARE

    assert TRUNCATION_WARN_SHARE == 0.1
    # 10 responses, 2 longer than 3 tokens: 20% > 10% -> a warning; 1 of 10 (10%, not above) -> none
    for n_long, warned in ((2, True), (1, False)):
        rows = [row("a", "bcdefg" if i < n_long else "bc", i=i) for i in range(10)]
        rep = DataReport()
        tokenize_scored(rows, char_tok, max_prompt_length=3, max_response_length=3, report=rep)
        assert rep.fitted == {"prompt": 10, "response": 10}
        assert rep.truncated.get("response", 0) == n_long and rep.tokens_dropped.get("response", 0) == 3 * n_long
        w = rep.warnings()
        assert bool(w) == warned
        if warned:
            assert w == ["warning: 2 of 10 response texts (20% > 10%) were truncated to data.max_response_length=3 "
                         "(6 tokens cut): raise data.max_response_length to keep them whole"]
            assert w[0] in rep.summary() and "truncated      2 of 10 response" in rep.summary()
            assert DataReport.from_dict(rep.to_dict()).summary() == rep.summary()


def test_real_tokenizer_fixed_shapes(stories_tokenizer):
    rows = [row("Once upon a time", " there was a cat. " * 20), row("The dog", " ran.", i=1)]
    out = tokenize_scored(rows, stories_tokenizer, max_prompt_length=8, max_response_length=16)
    assert out["prompt_ids"].shape == (2, 8) and out["response_ids"].shape == (2, 16)
    assert out["prompt_ids"][0, -5:].tolist() == [1, 403, 407, 261, 378]  # BOS + "Once upon a time"
    assert out["response_mask"][0].all() and out["response_mask"][1].sum() < 16
    assert out["prompt_mask"][1, 0] == 0 and out["prompt_mask"][1, -1] == 1


def test_pads_reject_long_sequences():
    with pytest.raises(ValueError, match="sequence 0 has 3 tokens > 2"):
        left_pad([[1, 2, 3]], 2, 0)
    with pytest.raises(ValueError, match="sequence 0 has 3 tokens > 2"):
        right_pad([[1, 2, 3]], 2, 0)


