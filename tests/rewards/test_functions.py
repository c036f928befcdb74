import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.rewards.functions import format_reward, length_reward, vader_reward


def test_vader_sign_on_clear_sentences():
    pos = "What a wonderful, happy day! I love it."
    neg = "This is a terrible, horrible, sad story. I hate it."
    s = vader_reward(["p", "p", "p"], [pos, neg, "The cat sat on the mat."])
    assert s.dtype == np.float32 and s.shape == (3,)
    assert s[0] > 0.8 and s[1] < -0.8 and s[2] == 0.0


def test_vader_single_word_by_hand():
    # VADER: compound = v / sqrt(v^2 + 15) with the lexicon valence v("good") = 1.9
    assert vader_reward([""], ["good"])[0] == pytest.approx(1.9 / math.sqrt(1.9 ** 2 + 15), abs=1e-4)


def test_vader_ignores_the_prompt():
    a = vader_reward(["I hate everything"], ["A lovely sunny morning."])
    b = vader_reward(["I love everything"], ["A lovely sunny morning."])
    assert a[0] == b[0] > 0


def test_length_reward_by_hand():
    r = length_reward(["", "", "", ""], ["one two three four", "a b", "", "w " * 8], target_length=4)
    np.testing.assert_allclose(r, [0.0, -0.5, -1.0, -1.0])
    assert r.dtype == np.float32
    with pytest.raises(ValueError, match="target_length"):
        length_reward([""], ["a"], target_length=0)


@given(st.lists(st.text(max_size=30), min_size=1, max_size=10), st.integers(1, 20))
def test_length_reward_is_at_most_zero_and_zero_only_at_target(responses, target):
    r = length_reward([""] * len(responses), responses, target_length=target)
    assert (r <= 0).all()
    for x, resp in zip(r, responses):
        assert (x == 0) == (len(resp.split()) == target)


def test_format_reward_by_hand():
    r = format_reward(["", "", "", "", ""], ["The end.", "  Why? ", "no capital.", "No stop", "Multi\nline!"])
    np.testing.assert_array_equal(r, [1, 1, 0, 0, 1])
    np.testing.assert_array_equal(format_reward([""], ["42"], pattern=r"\d+"), [1.0])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        format_reward([""], ["x"], pattern="(")


def test_bad_arguments():
    with pytest.raises(ValueError, match="2 prompts and 1 responses"):
        vader_reward(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="response 0 must be a string"):
        length_reward(["a"], [3])
