import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.data.report import SKIP_REASONS, DataError, DataReport
from jaxppo.data.validation import require_rows, validate_preference, validate_scored

GOOD = {"prompt": "once", "response": "upon", "score": 0.5}


def _scored(bad_row, **kw):
    rep = DataReport()
    rows = validate_scored([GOOD, bad_row], report=rep, **kw)
    return rows, rep


@pytest.mark.parametrize("bad,reason,needle", [
    ({"prompt": "a", "score": 1.0}, "missing_field", "'response' (or 'completion') is missing"),
    ({"prompt": "a", "response": None, "score": 1.0}, "missing_field", "'response' is missing"),
    ({"prompt": "a", "response": "b"}, "missing_field", "'score' (or 'label') is missing"),
    ({"prompt": 5, "response": "b", "score": 1.0}, "not_a_string",
     "'prompt' must be a string or a list of chat messages, got int"),
    ({"prompt": {"role": "user"}, "response": "b", "score": 1.0}, "not_a_string", "got dict"),
    ({"prompt": ["a"], "response": "b", "score": 1.0}, "bad_message", "'prompt'[0] is a str, not a"),
    ({"prompt": "a", "response": "   ", "score": 1.0}, "empty_text", "'response' is empty"),
    ({"prompt": "", "response": "b", "score": 1.0}, "empty_text", "'prompt' is empty"),
    ({"prompt": b"a\xff", "response": "b", "score": 1.0}, "invalid_utf8", "'prompt' is not valid UTF-8"),
    ({"prompt": "a\ud800", "response": "b", "score": 1.0}, "invalid_utf8", "'prompt' is not valid UTF-8"),
    ({"prompt": "a", "response": "b" * 11, "score": 1.0}, "text_too_long", "11 characters > data.max_text_chars=10"),
    ({"prompt": "a", "response": "b", "score": float("nan")}, "non_finite_score", "'score' is nan"),
    ({"prompt": "a", "response": "b", "score": float("inf")}, "non_finite_score", "'score' is inf"),
    ({"prompt": "a", "response": "b", "score": -math.inf}, "non_finite_score", "'score' is -inf"),
    ({"prompt": "a", "response": "b", "score": "1.5"}, "bad_score", "'score' must be a number, got str"),
    ({"prompt": "a", "response": "b", "score": True}, "bad_score", "got bool"),
    ({"prompt": "a", "response": "b", "score": 1.0, "behaviour_logprobs": [-0.1, float("nan")]},
     "bad_logprobs", "[1] is nan"),
    ({"prompt": "a", "response": "b", "score": 1.0, "behaviour_logprobs": [0.5]}, "bad_logprobs", "above 0"),
    ({"prompt": "a", "response": "b", "score": 1.0, "behaviour_logprobs": "x"}, "bad_logprobs", "must be a list"),
    ({"prompt": "a", "response": "b", "score": 1.0, "response_ids": [4, 5, 6], "behaviour_logprobs": [-1.0, -2.0]},
     "logprob_length_mismatch", "2 behaviour_logprobs for 3 response_ids"),
    ({"prompt": "a", "response": "b", "score": 1.0, "response_ids": [4, -1]}, "bad_token_ids", "[1] is not a token id"),
    ({"prompt": "a", "response": "b", "score": 1.0, "response_ids": []}, "empty_tokens", "empty list"),
    ({"prompt": "a", "response": "b", "score": 1.0, "group_id": 1.5}, "bad_group_id", "integer or a string"),
])
def test_each_bad_scored_kind_is_counted_with_a_message(bad, reason, needle):
    rows, rep = _scored(bad, max_text_chars=10)
    assert [r.prompt for r in rows] == ["once"]
    assert rep.skipped == {reason: 1}
    assert reason in SKIP_REASONS
    assert needle in rep.examples[reason][0]
    assert rep.examples[reason][0].startswith("row 1:")
    assert rep.rows_seen == 2 and rep.rows_kept == 1


def test_good_scored_row_fields():
    row = {"prompt": "a", "response": "b c", "score": 2, "behaviour_logprobs": [-0.5, 0.0],
           "response_ids": [7, 8], "prompt_ids": [1, 3], "group_id": "g1"}
    (r,) = validate_scored([row])
    assert r.score == 2.0 and isinstance(r.score, float)
    np.testing.assert_array_equal(r.behaviour_logprobs, np.array([-0.5, 0.0], np.float32))
    assert r.behaviour_logprobs.dtype == np.float32 and r.response_ids.dtype == np.int32
    assert r.group_id == "g1" and r.index == 0


def test_column_mapping():
    rows = validate_scored([{"question": "q", "answer": "a", "reward": 3.0, "prompt": "ignored"}],
                           columns={"prompt": "question", "response": "answer", "score": "reward"})
    assert (rows[0].prompt, rows[0].response, rows[0].score) == ("q", "a", 3.0)
    with pytest.raises(DataError, match="'reward' is not a field of the scored schema"):
        validate_scored([GOOD], columns={"reward": "score"})


@pytest.mark.parametrize("bad,reason", [
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "identical_pair"),
    ({"prompt": "p", "chosen": "x"}, "missing_field"),
    ({"prompt": "p", "chosen": "", "rejected": "y"}, "empty_text"),
    ({"prompt": "p", "chosen": 3, "rejected": "y"}, "not_a_string"),
    ({"prompt": "p", "chosen": "x", "rejected": b"\xc3\x28"}, "invalid_utf8"),
    ({"chosen": "\n\nHuman: hi\n\nAssistant: a", "rejected": "\n\nHuman: ho\n\nAssistant: b"}, "prompt_mismatch"),
    ({"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hi\n\nAssistant: b"}, "no_assistant_turn"),
    ({"chosen": "\n\nHuman: hi\n\nAssistant: a", "rejected": "\n\nHuman: hi\n\nAssistant: a"}, "identical_pair"),
])
def test_each_bad_preference_kind(bad, reason):
    good = {"prompt": "p", "chosen": "yes", "rejected": "no"}
    rep = DataReport()
    rows = validate_preference([good, bad], report=rep)
    assert len(rows) == 1 and rows[0].chosen == "yes"
    assert rep.skipped == {reason: 1}


def test_preference_formats():
    hh_row = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}
    (p,) = validate_preference([hh_row])
    assert (p.prompt, p.chosen, p.rejected) == ("\n\nHuman: hi\n\nAssistant:", " hello", " go away")
    rep = DataReport()
    assert validate_preference([hh_row], preference_format="explicit", report=rep) == []
    assert rep.skipped == {"wrong_preference_format": 1}      # (the prompt is missing: it looks like hh)


def test_no_usable_row_is_an_error_that_says_why():
    rep = DataReport(source="f.jsonl")
    rows = validate_scored([{"prompt": "a", "response": "b", "score": float("nan")}] * 3 + [{"x": 1}], report=rep)
    with pytest.raises(DataError) as e:
        require_rows(rows, rep)
    msg = str(e.value)
    assert "f.jsonl has no usable row" in msg and "all 4 rows" in msg
    assert "3 x non_finite_score" in msg and "1 x missing_field" in msg
    with pytest.raises(DataError, match="has no rows"):
        require_rows([], DataReport(source="empty.jsonl"))


@given(st.lists(st.one_of(st.text(max_size=5), st.none(), st.integers()), min_size=1, max_size=20),
       st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()), min_size=1, max_size=20))
def test_every_row_is_kept_or_counted(prompts, scores):
    records = [{"prompt": p, "response": "r", "score": s} for p, s in zip(prompts, scores)]
    rep = DataReport()
    rows = validate_scored(records, report=rep)
    assert len(rows) + rep.n_skipped == len(records) == rep.rows_seen
    for r in rows:
        assert isinstance(r.prompt, str) and r.prompt.strip() and math.isfinite(r.score)


def test_empty_text_is_allowed_when_token_ids_are_given():
    rep = DataReport()
    rows = validate_scored([{"prompt": "a", "response": "", "score": 1.0, "response_ids": [2]},
                            {"prompt": "a", "response": "", "score": 1.0}], report=rep)
    assert len(rows) == 1 and rows[0].response == "" and rows[0].response_ids.tolist() == [2]
    assert rep.skipped == {"empty_text": 1}


# ------------------------------------------------------------------ the wrong data.preference_format
TRL_EXPLICIT = {"prompt": [{"role": "user", "content": "Name a color"}],
                "chosen": [{"role": "assistant", "content": "Red"}],
                "rejected": [{"role": "assistant", "content": "Soup"}]}
HH_ROW = {"chosen": "\n\nHuman: Name a color\n\nAssistant: Red", "rejected": "\n\nHuman: Name a color\n\nAssistant: Soup"}


@pytest.mark.parametrize("rows, fmt, seen", [
    ([TRL_EXPLICIT] * 3, "hh", "explicit"),                                      # TRL explicit rows read as hh
    ([{"prompt": "Q:", "chosen": " a", "rejected": " b"}] * 2, "hh", "explicit"),  # plain-text explicit rows
    ([HH_ROW] * 2, "explicit", "hh"),                                             # HH-RLHF rows read as explicit
])
def test_the_wrong_preference_format_names_the_format_the_rows_look_like(rows, fmt, seen):
    """It used to say "empty_conversation ... no prompt" (or no_assistant_turn / missing prompt)."""
    from jaxppo.data.validation import require_rows

    rep = DataReport(source="pairs.jsonl")
    out = validate_preference(rows, report=rep, preference_format=fmt)
    assert not out and rep.skipped == {"wrong_preference_format": len(rows)}
    with pytest.raises(DataError, match=rf"pairs.jsonl has no usable row: all {len(rows)} rows were skipped: "
                                        rf"{len(rows)} x wrong_preference_format .*the row looks like .*but "
                                        rf"data.preference_format={fmt}: set data.preference_format={seen} "
                                        r"\(or auto\)"):
        require_rows(out, rep)
    # the same rows read with the right format (or auto) are usable
    assert len(validate_preference(rows, preference_format=seen)) == len(rows)
    assert len(validate_preference(rows)) == len(rows)


def test_a_bad_row_of_the_right_format_keeps_its_own_reason():
    rep = DataReport()
    validate_preference([{"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "no turns"}], report=rep,
                        preference_format="hh")
    assert rep.skipped == {"no_assistant_turn": 1}


@pytest.mark.parametrize("row,columns,needle", [
    # one spare column: named in the fix
    ({"question": "q", "response": "r", "score": 1.0}, {},
     "'prompt' is missing (the row's columns: question, response, score); if the data names it otherwise, "
     "set data.columns.prompt=question"),
    # a mapped column is no candidate
    ({"q": "q", "a": "r", "score": 1.0}, {"prompt": "q"},
     "'response' (or 'completion') is missing (the row's columns: q, a, score); if the data names it otherwise, "
     "set data.columns.response=a"),
    # several spare columns: all offered
    ({"prompt": "p", "answer": "r", "stars": 4}, {},
     "set data.columns.response=<column> (one of answer, stars?)"),
    ({"prompt": "p", "response": "r"}, {}, "'score' (or 'label') is missing (the row's columns: prompt, response); "
                                           "if the data names it otherwise, set data.columns.score=<column>"),
])
def test_a_missing_column_lists_the_columns_and_the_key_to_set(row, columns, needle):
    rep = DataReport()
    assert validate_scored([row], columns=columns, report=rep) == []
    assert rep.skipped == {"missing_field": 1} and needle in rep.examples["missing_field"][0]


def test_a_pairs_file_read_as_scored_rows_points_to_to_scored():
    rep = DataReport()
    validate_scored([{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3, report=rep)
    with pytest.raises(DataError, match="preference pair; turn pairs into scored rows with "
                                        "`python -m jaxppo.reward to-scored`"):
        require_rows([], rep)


@pytest.mark.parametrize("fmt", ["auto", "explicit"])
def test_a_misnamed_prompt_column_is_a_missing_prompt_not_a_broken_dialogue(fmt):
    rep = DataReport()
    rows = [{"question": f"q{i}", "chosen": "good", "rejected": "bad"} for i in range(3)]
    assert validate_preference(rows, report=rep, preference_format=fmt) == []
    assert rep.skipped == {"missing_field": 3}
    assert "set data.columns.prompt=question" in rep.examples["missing_field"][0]
    # with the mapping the rows are read
    assert len(validate_preference(rows, columns={"prompt": "question"}, preference_format=fmt)) == 3


def test_auto_still_reads_dialogues_and_reports_their_own_faults():
    from jaxppo.data.validation import auto_format

    dialogue = "\n\nHuman: hi\n\nAssistant: a"
    assert auto_format({"chosen": dialogue, "rejected": dialogue + "b"}) == "hh"
    assert auto_format({"chosen": dialogue, "rejected": "no turn"}) == "hh"      # one dialogue is enough
    assert auto_format({"chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                        "rejected": "z"}) == "hh"
    assert auto_format({"chosen": "a", "rejected": "b"}) == "explicit"
    assert auto_format({"prompt": "p", "chosen": dialogue, "rejected": dialogue}) == "explicit"
    rep = DataReport()
    validate_preference([{"chosen": dialogue, "rejected": "no turn"}], report=rep)
    assert rep.skipped == {"no_assistant_turn": 1}
