import gzip
import json

import pytest

from jaxppo.data.loading import file_format, read_json_strict, read_records
from jaxppo.data.report import DataError, DataReport

ROWS = [{"prompt": "once", "response": "upon a time", "score": 0.5},
        {"prompt": "the cat", "response": "sat", "score": -1.0}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_and_gz_and_array(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", ROWS)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "c.json").write_text(json.dumps(ROWS), encoding="utf-8")
    for p, reader in ((a, "datasets"), (tmp_path / "b.jsonl.gz", "datasets"), (tmp_path / "c.json", "json (one array)")):
        rep = DataReport()
        assert read_records(str(p), cache_dir=str(tmp_path / "cache"), report=rep) == ROWS
        assert rep.notes["reader"] == reader
        assert rep.skipped == {}


@pytest.mark.parametrize("layout", ["jsonl", "array", "parquet", "bad_line_jsonl"])
def test_non_finite_scores_are_non_finite_whatever_the_reader(tmp_path, layout):
    """NaN / Infinity / -Infinity scores reach validation as non-finite floats (``non_finite_score``), never as a
    missing field, through every reader: datasets' JSON lines and parquet readers, the JSON array reader and the
    line-by-line fallback after a bad line."""
    import math

    import datasets

    from jaxppo.data.validation import validate_scored

    rows = [dict(ROWS[0], score=v) for v in (float("nan"), float("inf"), float("-inf"), 0.25)]
    if layout == "parquet":
        p = tmp_path / "d.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(p))
    elif layout == "array":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(rows), encoding="utf-8")        # json.dumps writes NaN / Infinity
    else:
        p = _jsonl(tmp_path / "d.jsonl", rows)
        if layout == "bad_line_jsonl":
            p.write_text(p.read_text() + "{broken\n", encoding="utf-8")
    rep = DataReport()
    got = read_records(str(p), cache_dir=str(tmp_path / "cache"), report=rep)
    assert [math.isnan(r["score"]) or r["score"] for r in got] == [True, math.inf, -math.inf, 0.25]
    kept = validate_scored(got, report=rep)
    assert [t.score for t in kept] == [0.25]
    assert rep.skipped == ({"non_finite_score": 3, "invalid_json": 1} if layout == "bad_line_jsonl"
                           else {"non_finite_score": 3})


def test_a_file_datasets_cannot_parse_logs_nothing_of_datasets(tmp_path, caplog):
    """datasets logs an ERROR record (with the absolute path) when its JSON reader fails; the line-by-line reader
    handles the file, so no record of datasets' loggers is emitted."""
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'\x80\x81{}\n{"prompt": "a", "response": "b", "score": 1}\n')
    rep = DataReport()
    rows = read_records(str(p), cache_dir=str(tmp_path / "cache"), report=rep)
    assert len(rows) == 1 and rep.skipped == {"invalid_utf8": 1}
    assert rep.notes["reader"].startswith("line-by-line")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("datasets")] == []


def test_parquet_arrow_and_save_to_disk(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    assert read_records(str(tmp_path / "d.parquet"), cache_dir=str(tmp_path / "cache")) == ROWS
    assert read_records(str(tmp_path / "saved")) == ROWS
    assert read_records(str(arrow), cache_dir=str(tmp_path / "cache")) == ROWS
    assert file_format(tmp_path / "saved") == "disk"


def test_max_rows(tmp_path):
    p = _jsonl(tmp_path / "a.jsonl", ROWS * 3)
    assert len(read_records(str(p), max_rows=4, cache_dir=str(tmp_path / "cache"))) == 4


def test_bad_lines_are_counted_not_fatal(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"prompt": "a", "response": "b", "score": 1}\n'
                  b'{"prompt": "a\xff\xfe", "response": "b", "score": 1}\n'  # invalid UTF-8 bytes
                  b'{"prompt": "a", "response": \n'  # broken JSON
                  b'[1, 2]\n'  # not an object
                  b'\n'
                  b'{"prompt": "c", "response": "d", "score": 2}\n')
    rep = DataReport()
    rows = read_records(str(p), cache_dir=str(tmp_path / "cache"), report=rep)
    assert [r["prompt"] for r in rows] == ["a", "c"]
    assert rep.skipped == {"invalid_utf8": 1, "invalid_json": 2}
    assert rep.rows_seen == 3  # the bad lines; validators count the good ones
    assert "line 2" in rep.examples["invalid_utf8"][0]
    assert rep.notes["reader"].startswith("line-by-line")


def test_lone_surrogate_escape_is_invalid_json_line(tmp_path):
    p = tmp_path / "sur.jsonl"
    p.write_text('{"prompt": "ok", "response": "x", "score": 1}\n{"prompt": "a\\ud800", "response": "x", "score": 1}\n')
    rep = DataReport()
    rows = read_json_strict(p, rep)
    # the stdlib accepts the escape and yields a lone surrogate; validation flags it (see test_validation)
    assert len(rows) == 2 and rows[1]["prompt"] == "a\ud800"


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="data.path is not set"):
        read_records(None)
    with pytest.raises(DataError, match="not found"):
        read_records(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown data file type"):
        read_records(str(tmp_path / "x.csv"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="save_to_disk"):
        read_records(str(tmp_path / "folder"))
    p = _jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(DataError, match="single split"):
        read_records(str(p), split="test")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="could not read the parquet file"):
        read_records(str(tmp_path / "broken.parquet"), cache_dir=str(tmp_path / "cache"))


def test_hub_name_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="HF hub.*cannot be reached"):
        read_records("someone/surely-not-a-cached-dataset", cache_dir=str(tmp_path / "cache"))


def test_a_json_array_file_counts_only_its_non_object_items(tmp_path):
    from jaxppo.data.loading import read_json_strict
    from jaxppo.data.report import DataReport

    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "a"}, 3, {"prompt": "b"}]', encoding="utf-8")
    rep = DataReport()
    assert read_json_strict(path, rep) == [{"prompt": "a"}, {"prompt": "b"}]
    assert rep.skipped == {"invalid_json": 1} and rep.rows_seen == 1 and "item 1" in rep.examples["invalid_json"][0]
