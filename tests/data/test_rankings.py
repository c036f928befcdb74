"""Ranking rows (k answers with ratings or pairwise preferences with ties) read as preference pairs, and through
``reward to-scored`` as scored rows (each distinct answer once, per-prompt group ids)."""

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.data.report import DataReport
from jaxppo.data.validation import validate_preference

RATED = {"prompt": "Once upon a time", "completions": [{"response": " a cat", "score": 3},
                                                      {"response": " a dog", "score": 1},
                                                      {"response": " a bird", "score": 3}]}


def _read(rows, **kw):
    rep = DataReport()
    return validate_preference(rows, report=rep, **kw), rep


def test_ratings_by_hand_ties_dropped_or_kept():
    pairs, rep = _read([RATED])   # auto: a 'completions' column is a ranking row
    # (cat 3, dog 1): cat > dog; (cat 3, bird 3): tie, dropped; (dog 1, bird 3): bird > dog
    assert [(p.chosen, p.rejected, p.chosen_score, p.rejected_score) for p in pairs] == [
        (" a cat", " a dog", 3.0, 1.0), (" a bird", " a dog", 3.0, 1.0)]
    assert [p.index for p in pairs] == [0, 1] and {p.source for p in pairs} == {0}
    assert rep.notes["ties_dropped"] == 1 and rep.notes["rankings"] == "1 ranking rows -> 2 pairs (data.ties=drop)"
    assert rep.rows_seen == 2 and rep.rows_kept == 2

    pairs, rep = _read([RATED], ties="keep")
    assert [(p.chosen, p.rejected, p.tie) for p in pairs] == [
        (" a cat", " a dog", False), (" a cat", " a bird", True), (" a bird", " a cat", True),
        (" a bird", " a dog", False)]
    assert rep.notes["ties_kept"] == 1 and rep.rows_kept == 4


def test_pairwise_preferences_with_ties_and_an_inner_score_key():
    row = {"question": "Q", "completions": ["x", {"answer": "y"}, "z"],
           "comparisons": [{"a": 0, "b": 1, "preferred": "b"}, {"a": 1, "b": 2, "preferred": "tie"},
                           {"a": 2, "b": 0, "preferred": "a"}]}
    pairs, rep = _read([row], columns={"prompt": "question", "response": "answer"}, preference_format="ranking")
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("Q", "y", "x"), ("Q", "z", "x")]
    assert rep.notes["ties_dropped"] == 1
    # UltraFeedback names its rating overall_score
    uf = {"prompt": "P", "completions": [{"response": "a", "overall_score": 2.5}, {"response": "b", "overall_score": 7}]}
    pairs, _ = _read([uf], columns={"score": "overall_score"})
    assert [(p.chosen, p.rejected) for p in pairs] == [("b", "a")]


@pytest.mark.parametrize("row,reason,needle", [
    ({"prompt": "p", "completions": ["a"]}, "bad_comparison", "at least two answers"),
    ({"prompt": "p", "completions": ["a", "b"]}, "missing_field", "needs a 'score' in every completion"),
    ({"prompt": "p", "completions": ["a", "b"], "comparisons": [{"a": 0, "b": 2, "preferred": "a"}]},
     "bad_comparison", "comparisons[0].b must be an answer index in 0..1"),
    ({"prompt": "p", "completions": ["a", "b"], "comparisons": [{"a": 0, "b": 1, "preferred": "first"}]},
     "bad_comparison", "preferred must be one of"),
    ({"prompt": "p", "completions": [{"text": "a"}, "b"], "comparisons": []}, "missing_field",
     "completions[0] has no 'response' (its keys: text); set data.columns.response=<key>"),
    ({"prompt": "p", "completions": ["a", ""], "comparisons": []}, "empty_text", "completions[1]"),
    ({"completions": ["a", "b"], "comparisons": []}, "missing_field", "'prompt' is missing"),
])
def test_bad_ranking_rows_are_counted(row, reason, needle):
    pairs, rep = _read([row, RATED])
    assert len(pairs) == 2 and rep.skipped == {reason: 1}
    assert needle in rep.examples[reason][0] and rep.examples[reason][0].startswith("row 0: ")


def test_same_text_twice_is_an_identical_pair_and_mixing_formats_is_an_error():
    from jaxppo.data.report import DataError

    pairs, rep = _read([{"prompt": "p", "completions": [{"response": "a", "score": 1}, {"response": "a", "score": 2},
                                                        {"response": "b", "score": 0}]}])
    assert len(pairs) == 2 and rep.skipped == {"identical_pair": 1}
    with pytest.raises(DataError, match="mixes ranking rows"):
        _read([RATED, {"prompt": "p", "chosen": "a", "rejected": "b"}])


@given(st.lists(st.integers(0, 3), min_size=2, max_size=6), st.sampled_from(["drop", "keep"]))
def test_every_two_rated_answers_make_one_pair_and_ties_are_counted(scores, ties):
    row = {"prompt": "p", "completions": [{"response": f"answer {i}", "score": s} for i, s in enumerate(scores)]}
    pairs, rep = _read([row], ties=ties)
    n_ties = sum(a == b for a, b in itertools.combinations(scores, 2))
    n = math.comb(len(scores), 2)
    assert len(pairs) == (n - n_ties if ties == "drop" else n + n_ties)
    assert rep.notes.get("ties_dropped" if ties == "drop" else "ties_kept", 0) == n_ties
    for p in pairs:
        assert p.chosen_score > p.rejected_score if not p.tie else p.chosen_score == p.rejected_score


@pytest.fixture(scope="module")
def qa_feedback(shared_dir, tmp_path_factory):
    """Two prompts with four answers each and pairwise preferences with ties (the QA-feedback shape)."""
    root = tmp_path_factory.mktemp("rankings")
    rows = [
        {"prompt": "Once upon a time", "completions": [" a cat sat.", " a dog ran.", " a bird sang.", " a fish swam."],
         "comparisons": [{"a": 0, "b": 1, "preferred": "a"}, {"a": 0, "b": 2, "preferred": "a"},
                         {"a": 0, "b": 3, "preferred": "tie"}, {"a": 1, "b": 2, "preferred": "b"},
                         {"a": 1, "b": 3, "preferred": "b"}, {"a": 2, "b": 3, "preferred": "tie"}]},
        {"prompt": "The dog", "completions": [" ran.", " sat.", " ran.", " slept."],
         "comparisons": [{"a": 0, "b": 1, "preferred": "a"}, {"a": 0, "b": 2, "preferred": "tie"},
                         {"a": 1, "b": 3, "preferred": "b"}, {"a": 2, "b": 3, "preferred": "c"}]},
    ]
    data = root / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = root / "cfg.yaml"
    cfg.write_text(f"model: {{path: {shared_dir / 'models' / 'stories260K'}}}\n"
                   f"data: {{path: {data}, schema: preference, max_prompt_length: 8, max_response_length: 8}}\n",
                   encoding="utf-8")
    return cfg


@pytest.mark.parametrize("ties", ["drop", "keep"])
def test_to_scored_on_rankings_writes_each_answer_once_with_win_rates(qa_feedback, ties, tmp_path, capsys):
    from jaxppo.config import load_config
    from jaxppo.hf import load_tokenizer
    from jaxppo.cli.reward import main
    from jaxppo.trainer.dpo.algorithm import load_pairs

    out = tmp_path / "out"
    assert main(["to-scored", "--config", str(qa_feedback), f"data.ties={ties}", f"trainer.output_dir={out}"]) == 0
    console = capsys.readouterr().out
    # row 1 has a bad comparison ('c'): the whole row is skipped and counted; row 1's answers 0 and 2 are one text
    assert "skipped      1 bad_comparison" in console and "preferred must be one of" in console
    assert f"ties_{'dropped' if ties == 'drop' else 'kept'}: 2" in console
    recs = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    got = {r["response"]: (r["score"], r["wins"], r["losses"], r["ties"], r["group_id"]) for r in recs}
    if ties == "drop":   # cat: 2 wins; dog: 3 losses; bird: 1 win 1 loss; fish: 1 win
        assert got == {" a cat sat.": (1.0, 2, 0, 0, 0), " a dog ran.": (0.0, 0, 3, 0, 0),
                       " a bird sang.": (0.5, 1, 1, 0, 0), " a fish swam.": (1.0, 1, 0, 0, 0)}
    else:   # ties count once each: cat 2 wins 1 tie -> 2.5/3; bird 1-1-1 -> 1.5/3; fish 1 win 2 ties -> 2/3
        assert got == {" a cat sat.": (pytest.approx(2.5 / 3), 2, 0, 1, 0), " a dog ran.": (0.0, 0, 3, 0, 0),
                       " a bird sang.": (0.5, 1, 1, 1, 0), " a fish swam.": (pytest.approx(2 / 3), 1, 0, 2, 0)}
    # the pairs DPO reads are the pairs to-scored tallied
    cfg = load_config(str(qa_feedback), [f"data.ties={ties}"])
    arrays, group, report = load_pairs(cfg, load_tokenizer(cfg.model.path))
    assert len(arrays["index"]) == (4 if ties == "drop" else 8) and set(group.tolist()) == {0}


def test_to_scored_on_ratings_keeps_each_answers_rating(qa_feedback, tmp_path, capsys):
    from jaxppo.cli.reward import main

    data = tmp_path / "rated.jsonl"
    rows = [RATED, {"prompt": "The dog", "completions": [{"response": " ran.", "score": -1.5},
                                                         {"response": " sat.", "score": 0.5}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["to-scored", "--config", str(qa_feedback), f"data.path={data}", f"trainer.output_dir={out}"]) == 0
    assert "the rows' ratings as scores" in capsys.readouterr().out
    recs = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["response"], r["score"], r["group_id"]) for r in recs] == [
        ("Once upon a time", " a cat", 3.0, 0), ("Once upon a time", " a dog", 1.0, 0),
        ("Once upon a time", " a bird", 3.0, 0), ("The dog", " sat.", 0.5, 1), ("The dog", " ran.", -1.5, 1)]
    assert json.loads((out / "to_scored_metrics.json").read_text())["score_source"] == "rating"
