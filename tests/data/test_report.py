import json
import logging

import pytest

from jaxppo.data.report import DataReport


def test_counters_dict_and_summary(capsys, caplog):
    rep = DataReport(source="x.jsonl", rows_seen=5, rows_kept=2)
    rep.skip("missing_field", "row 1: 'score' is missing or null")
    rep.skip("missing_field", "row 3: 'prompt' is missing or null")
    rep.skip("non_finite_score", "row 4: 'score' is nan")
    rep.truncate("prompt", 7)
    rep.truncate("prompt", 3)
    d = rep.to_dict()
    json.dumps(d)  # JSON-safe
    assert d["rows_skipped"] == 3 and d["skipped"] == {"missing_field": 2, "non_finite_score": 1}
    assert d["truncated"] == {"prompt": 2} and d["tokens_dropped"] == {"prompt": 10}
    assert rep.flat_metrics()["data/skipped/missing_field"] == 2
    with caplog.at_level(logging.INFO, logger="jaxppo.data"):
        rep.emit()
    printed = capsys.readouterr().out
    assert "kept 2 of 5 rows, skipped 3" in printed and "row 1: 'score' is missing" in printed
    assert "truncated      2 prompt (10 tokens cut)" in printed
    assert "kept 2 of 5 rows" in caplog.text


def test_unknown_reason_and_merge():
    rep = DataReport()
    with pytest.raises(KeyError, match="unknown skip reason 'oops'"):
        rep.skip("oops", "x")
    other = DataReport()
    other.skip("empty_text", "row 0")
    other.truncate("response", 4)
    rep.merge(other)
    rep.merge(other)
    assert rep.skipped == {"empty_text": 2} and rep.tokens_dropped == {"response": 8}
