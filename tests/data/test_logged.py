"""Chat-completion logs with token log-probs: logs written from stories260K's own log-probs round-trip to the
behaviour log-probs; a different tokenization is counted as mismatched_tokens (recomputed or skipped)."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config.schema import DataConfig
from jaxppo.data.logged import align, token_bytes
from jaxppo.data.report import DataReport
from jaxppo.data.validation import validate_scored

ROWS = [("Once upon a time", " there was a little cat."), ("The dog", " ran to the park and played."),
        ("Lily had a ball", "She liked to play with it every day.")]
P, R = 8, 12


@pytest.fixture(scope="module")
def stories(stories_model):
    from jaxppo.hf import load_pretrained, load_tokenizer

    return load_tokenizer(stories_model), load_pretrained(stories_model)


def _log_row(prompt, content, tokens, score):
    """An OpenAI chat-completion log row whose logprobs.content holds ``tokens`` = [(bytes, logprob)]."""
    return {"prompt": prompt, "score": score,
            "choices": [{"message": {"role": "assistant", "content": content},
                         "logprobs": {"content": [{"token": b.decode("utf-8", "replace"), "logprob": lp,
                                                   "bytes": list(b)} for b, lp in tokens]}}]}


@pytest.fixture(scope="module")
def own_logs(stories, tmp_path_factory):
    """Logs of stories260K's own answers: its tokens of each answer and their log-probs under the model."""
    from jaxppo.data.behaviour import compute_behaviour_logprobs
    from jaxppo.data.schemas import ScoredTrajectory
    from jaxppo.data.tokenize import tokenize_scored

    tok, model = stories
    plain = tokenize_scored([ScoredTrajectory(p, r, 0.0, i) for i, (p, r) in enumerate(ROWS)], tok,
                            max_prompt_length=P, max_response_length=64)
    lp = compute_behaviour_logprobs(model, plain)
    rows = []
    for i, (prompt, content) in enumerate(ROWS):
        ids = plain["response_ids"][i][plain["response_mask"][i] == 1].tolist()
        pieces = token_bytes(tok, ids)
        if not content.startswith(" "):
            pieces[0] = pieces[0][1:]   # the logged bytes spell the content exactly (no SentencePiece prefix)
        assert b"".join(pieces) == content.encode()
        rows.append(_log_row(prompt, content, [(b, float(x)) for b, x in zip(pieces, lp[i][:len(ids)])], float(i)))
    path = tmp_path_factory.mktemp("logged") / "own.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, rows


def test_logs_of_our_own_model_round_trip_their_logprobs(stories, own_logs):
    from jaxppo.data import load_scored_arrays
    from jaxppo.data.behaviour import compute_behaviour_logprobs

    tok, model = stories
    path, rows = own_logs
    arrays, report = load_scored_arrays(DataConfig(path=str(path), max_prompt_length=P, max_response_length=R), tok)
    assert arrays["has_behaviour"].all() and report.notes["logged_logprobs_aligned"] == 3
    assert report.notes["mismatched_tokens_recomputed"] == 0
    mask = arrays["response_mask"].astype(bool)
    for i, row in enumerate(rows):   # the logged values, cut to R tokens
        logged = [t["logprob"] for t in row["choices"][0]["logprobs"]["content"]][:R]
        np.testing.assert_allclose(arrays["behaviour_logprobs"][i][mask[i]], logged, rtol=0, atol=1e-6)
    # ... and they are the model's own log-probs of the tokenized rows (truncated to R)
    np.testing.assert_allclose(arrays["behaviour_logprobs"], compute_behaviour_logprobs(model, arrays), atol=1e-5)
    assert arrays["score"].tolist() == [0.0, 1.0, 2.0]


def test_another_tokenization_is_counted_and_recomputed_or_skipped(stories, own_logs, tmp_path):
    from jaxppo.data import load_scored_arrays

    tok, model = stories
    _, own = own_logs
    # one character a token (another tokenizer): same text, other token boundaries, arbitrary log-probs
    rows = [_log_row(p, c, [(ch.encode(), -1.0) for ch in c], 0.5) for p, c in ROWS[:2]] + own[2:]
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = DataConfig(path=str(path), max_prompt_length=P, max_response_length=R, cache_dir=str(tmp_path / "cache"))
    arrays, report = load_scored_arrays(cfg, tok)
    assert arrays["has_behaviour"].tolist() == [False, False, True]
    assert report.notes["mismatched_tokens_recomputed"] == 2 and report.notes["logged_logprobs_aligned"] == 1
    assert "mismatched_tokens_recomputed: 2" in report.summary()
    # recompute: the reference fills them like any row without logged log-probs
    from jaxppo.data.behaviour import compute_behaviour_logprobs

    filled, _ = load_scored_arrays(cfg, tok, reference_path=str(tmp_path), reference=model)
    np.testing.assert_allclose(filled["behaviour_logprobs"][:2], compute_behaviour_logprobs(model, filled)[:2],
                               atol=1e-5)
    # skip: dropped and counted
    arrays, report = load_scored_arrays(DataConfig(path=str(path), max_prompt_length=P, max_response_length=R,
                                                   logged_mismatch="skip"), tok)
    assert len(arrays["index"]) == 1 and report.skipped == {"mismatched_tokens": 2}


@pytest.mark.parametrize("mutate,reason,needle", [
    (lambda r: r["choices"][0]["logprobs"]["content"].pop(), "bad_logprobs", "the logged tokens spell"),
    (lambda r: r["choices"][0]["logprobs"]["content"][0].update(logprob=0.5), "bad_logprobs", "finite number <= 0"),
    (lambda r: r["choices"][0].pop("logprobs"), "missing_field", "request logprobs=true"),
    (lambda r: r.pop("prompt"), "missing_field", "needs the request's 'messages'"),
    (lambda r: r.pop("score"), "missing_field", "'score' is missing"),
    (lambda r: r.update(messages=[{"role": "assistant", "content": "x"}]), "prompt_not_user_last", "messages"),
])
def test_bad_log_rows_are_counted(own_logs, mutate, reason, needle):
    import copy

    _, own = own_logs
    bad = copy.deepcopy(own[0])
    mutate(bad)
    rep = DataReport()
    kept = validate_scored([own[1], bad], report=rep)
    assert len(kept) == 1 and rep.skipped == {reason: 1} and needle in rep.examples[reason][0]


def test_request_response_nesting_and_messages_are_read(own_logs):
    _, own = own_logs
    r = own[0]
    nested = {"request": {"messages": [{"role": "user", "content": "Tell me a story."}]},
              "response": {"body": {"choices": r["choices"]}}, "score": 1.0}
    (row,) = validate_scored([nested])
    assert row.prompt[-1].content == "Tell me a story." and row.response == ROWS[0][1] and len(row.logged) > 0


@given(st.text(alphabet="ab z\n\u00fc\u20ac", min_size=1, max_size=20))
def test_our_token_bytes_spell_the_text(stories_tok_session, text):
    tok = stories_tok_session
    ids = tok([text], add_special_tokens=False)["input_ids"][0]
    spelled = b"".join(token_bytes(tok, ids))
    assert spelled in (text.encode(), b" " + text.encode())


def test_align_by_hand(stories_tok_session):
    tok = stories_tok_session
    ids = tok(["a cat"], add_special_tokens=False)["input_ids"][0]   # '▁a', '▁c', 'at'
    assert align(tok, ids, ((b"a", -0.5), (b" c", -1.0), (b"at", -0.25))).tolist() == [-0.5, -1.0, -0.25]
    assert align(tok, ids, ((b" a", -0.5), (b" c", -1.0), (b"at", -0.25))) is not None
    assert align(tok, ids, ((b"a", -0.5), (b" ca", -1.0), (b"t", -0.25))) is None
    assert align(tok, ids, ((b"a cat", -0.5),)) is None


@pytest.fixture(scope="module")
def stories_tok_session(stories_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(stories_model))
