import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config.schema import DataConfig
from jaxppo.data.pipeline import load_rows, split_by_group, tokenize_rows
from jaxppo.data.report import DataError


def test_file_to_arrays_with_counters(tmp_path, char_tok):
    p = tmp_path / "d.jsonl"
    rows = [{"q": "ab", "a": "cd", "r": 1.0}, {"q": "ab", "a": "x", "r": float("nan")},
            {"q": "abcdefgh", "a": "e", "r": 2.0}, {"q": "c", "a": "", "r": 0.0}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(path=str(p), schema="scored", columns={"prompt": "q", "response": "a", "score": "r"},
                     max_prompt_length=4, max_response_length=2)
    loaded = load_rows(cfg)
    arrays = tokenize_rows(loaded, char_tok, cfg)
    rep = loaded.report
    assert rep.rows_seen == 4 and rep.rows_kept == 2
    assert rep.skipped == {"non_finite_score": 1, "empty_text": 1}
    assert rep.truncated == {"prompt": 1}
    np.testing.assert_array_equal(arrays["index"], [0, 2])
    np.testing.assert_array_equal(arrays["score"], [1.0, 2.0])


def test_nothing_left_after_tokenization_is_an_error(tmp_path, char_tok):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "abcdef", "response": "b", "score": 1.0}) + "\n")
    cfg = DataConfig(path=str(p), max_prompt_length=2, truncation="skip")
    with pytest.raises(DataError, match="no usable row.*prompt_too_long"):
        tokenize_rows(load_rows(cfg), char_tok, cfg)


@given(st.lists(st.sampled_from("abcdefgh"), min_size=2, max_size=40), st.floats(0.05, 0.9), st.integers(0, 5))
def test_split_by_group_is_disjoint_and_complete(keys, frac, seed):
    train, ev = split_by_group(keys, frac, seed)
    assert sorted(np.concatenate([train, ev]).tolist()) == list(range(len(keys)))
    assert not {keys[i] for i in train} & {keys[i] for i in ev}
    if len(set(keys)) >= 2:
        assert len(train) and len(ev)


def test_split_by_group_fraction_by_hand():
    keys = [f"p{i}" for i in range(10) for _ in range(3)]  # 10 prompts x 3 rows
    train, ev = split_by_group(keys, 0.2, seed=0)
    assert len({keys[i] for i in ev}) == 2 and len(ev) == 6 and len(train) == 24


def test_prompt_groups_are_dense_ids_of_the_tokenized_rows_prompts():
    """The one by-prompt grouping of pairs (DPO and the reward model): ids in order of first appearance over the
    tokenized rows; a conversational prompt is keyed by its messages."""
    from jaxppo.data import Message, PreferencePair
    from jaxppo.data.pipeline import LoadedRows, prompt_groups
    from jaxppo.data.report import DataReport

    conv = (Message("user", "hi"),)
    rows = [PreferencePair(prompt=p, chosen="a", rejected="b", index=i)
            for i, p in enumerate(["q1", conv, "q1", "q2", conv])]
    loaded = LoadedRows("preference", rows, DataReport())
    groups = prompt_groups(loaded, {"index": np.array([4, 0, 2, 3])})   # row 1 was dropped by tokenization
    assert groups.dtype == np.int32 and groups.tolist() == [0, 1, 1, 2]
    train, ev = split_by_group(groups.tolist(), 0.5, 0)
    assert sorted([*train, *ev]) == [0, 1, 2, 3] and {groups[i] for i in train}.isdisjoint(groups[i] for i in ev)
