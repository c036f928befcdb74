"""The data examples of docs/usage.md are read as the text says, and its reward command lines fit together."""

import json
import re
import shlex
from pathlib import Path

import numpy as np

from jaxppo.data.report import DataReport
from jaxppo.data.tokenize import tokenize_scored
from jaxppo.data.validation import validate_preference, validate_scored
from tests.data.conftest import CharTokenizer

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def _jsonl_blocks() -> list[list[dict]]:
    text = USAGE.read_text(encoding="utf-8")
    return [[json.loads(line) for line in block.strip().splitlines()]
            for block in re.findall(r"```jsonl\n(.*?)```", text, flags=re.S)]


def test_the_rankings_example_makes_the_pairs_the_text_says():
    rankings, _, _ = _jsonl_blocks()
    rep = DataReport()
    pairs = validate_preference(rankings, report=rep)
    # ratings 4, 1, 4: cat > rock, dog > rock, cat = dog (dropped); comparisons: one tie dropped
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [
        ("Name a pet.", " A cat.", " A rock."), ("Name a pet.", " A dog.", " A rock."),
        ("Say hello.", " Hello!", " Go away."), ("Say hello.", " Hi there.", " Go away.")]
    assert rep.skipped == {} and rep.notes["ties_dropped"] == 2
    assert len(validate_preference(rankings, ties="keep")) == 8


def test_the_logged_example_is_read_and_recomputed_with_stories260k(stories_tokenizer):
    _, logged, _ = _jsonl_blocks()
    rep = DataReport()
    rows = validate_scored(logged, report=rep)
    assert len(rows) == 1 and rep.skipped == {} and len(rows[0].logged) == 4
    arrays = tokenize_scored(rows, stories_tokenizer, max_prompt_length=8, max_response_length=8, report=rep)
    assert rep.notes["mismatched_tokens_recomputed"] == 1 and not arrays["has_behaviour"].any()


def test_the_reward_score_line_scores_the_model_the_train_line_writes():
    text = USAGE.read_text(encoding="utf-8")
    lines = {m.group(1): shlex.split(m.group(0)) for m in re.finditer(r"python -m jaxppo\.reward (train|score) .*", text)}
    train_out = next(a.split("=", 1)[1] for a in lines["train"] if a.startswith("trainer.output_dir="))
    assert f"reward.model_path={train_out}" in lines["score"]


def test_the_kto_example_is_unpaired_rows_with_labels():
    from jaxppo.data.unpaired import kto_layout

    _, _, feedback = _jsonl_blocks()
    rep = DataReport()
    rows = validate_scored(feedback, report=rep)
    assert rep.skipped == {} and [r.score for r in rows] == [1.0, 0.0]
    assert all(r.prompt == "Once upon a time" for r in rows)
    out = kto_layout(tokenize_scored(rows, CharTokenizer(), max_prompt_length=20, max_response_length=30))
    assert out["desirable"].tolist() == [True, False]
    np.testing.assert_array_equal(out["rejected_ids"], out["chosen_ids"][::-1])   # each with the other's answer
