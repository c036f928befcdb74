"""Read raw records (a list of dicts) from a local file, a ``save_to_disk`` folder or the HF hub.

Local files are read with the ``datasets`` builders of their format:

- ``.json``, ``.jsonl``, ``.json.gz``, ``.jsonl.gz`` -> ``load_dataset("json")``, except a file holding one JSON
  array, read with the standard library (which keeps ``NaN`` / ``Infinity`` scores: they are counted as
  ``non_finite_score``, not lost as nulls);
- ``.parquet`` -> ``load_dataset("parquet")``; ``.arrow`` -> ``load_dataset("arrow")``;
- a folder written by ``Dataset.save_to_disk`` -> ``load_from_disk``;
- anything else that is not a local path is taken as a hub dataset name (needs network; with
  ``HF_DATASETS_OFFLINE=1`` the error says so).

``datasets`` turns one bad line of a JSON file (invalid UTF-8, broken JSON, an invalid escape)
into an error for the whole file. When that happens the file is re-read line by line with the
standard library: each bad line is counted (``invalid_utf8`` / ``invalid_json``) in the
:class:`~jaxppo.data.report.DataReport` and the good lines are kept.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
from pathlib import Path
from typing import Any

from jaxppo.data.report import DataError, DataReport

JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)


def file_format(path: str | Path) -> str:
    """``"json"``, ``"parquet"``, ``"arrow"`` or ``"disk"`` (a save_to_disk folder) for a local path."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_info.json").is_file() or (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return "disk"
        raise DataError(f"{p} is a folder but not one written by datasets' save_to_disk "
                        "(no dataset_info.json / state.json / dataset_dict.json); point data.path at a file")
    name = p.name.lower()
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    raise DataError(f"{p}: unknown data file type; expected one of "
                    f"{', '.join(JSON_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES)} or a save_to_disk folder")


def _local_split(split: str, path: Path) -> str:
    if not split.startswith("train"):
        raise DataError(f"{path}: a local data file has a single split called 'train' "
                        f"(slices like 'train[:80%]' are allowed); got data.split={split!r}")
    return split


def _open_text_lines(path: Path):
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        yield from fh


def read_json_strict(path: str | Path, report: DataReport | None = None) -> list[dict]:
    """Read a JSON-lines (or JSON array) file with the standard library, counting bad lines.

    A line that is not valid UTF-8 is skipped as ``invalid_utf8``; one that is not a JSON object
    (or contains an invalid escape such as a lone surrogate) as ``invalid_json``. A ``.json``
    file holding one array of objects is read whole.
    """
    path = Path(path)
    report = report if report is not None else DataReport(source=str(path))
    first = b""
    for raw in _open_text_lines(path):
        if raw.strip():
            first = raw.lstrip()
            break
    if first.startswith(b"["):  # one JSON array
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as fh:
            blob = fh.read()
        try:
            data = json.loads(blob.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: the JSON array file is not valid UTF-8 ({e})") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        rows = []
        for i, item in enumerate(data):
            if isinstance(item, dict):
                rows.append(item)
            else:
                report.rows_seen += 1
                report.skip("invalid_json", f"{path} item {i}: expected an object, got {type(item).__name__}")
        return rows
    rows: list[dict] = []
    for lineno, raw in enumerate(_open_text_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            report.rows_seen += 1
            report.skip("invalid_utf8", f"{path} line {lineno}: {e}")
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as e:
            report.rows_seen += 1
            report.skip("invalid_json", f"{path} line {lineno}: {e}")
            continue
        if not isinstance(item, dict):
            report.rows_seen += 1
            report.skip("invalid_json", f"{path} line {lineno}: expected an object, got {type(item).__name__}")
            continue
        rows.append(item)
    return rows


def _looks_like_a_path(text: str) -> bool:
    """A string that cannot be a hub name ``name`` / ``owner/name``."""
    return (text.lower().endswith(JSON_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES)
            or text.startswith((".", "/", "~")) or text.count("/") > 1)


def _datasets():
    import datasets

    datasets.disable_progress_bars()
    return datasets


@contextlib.contextmanager
def _datasets_quiet():
    """Hold back the ``datasets`` loggers' records below CRITICAL: a file it cannot parse is logged there as an ERROR
    (with the file's absolute path) before the exception that :func:`read_records` handles (the line-by-line reader
    counts the bad lines, or a one-line ``DataError`` says why)."""
    _datasets()   # imported first: the import sets the level of its loggers
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _is_json_array(path: Path) -> bool:
    """The file's first non-blank byte is ``[`` (one JSON array rather than JSON lines)."""
    for raw in _open_text_lines(path):
        if raw.strip():
            return raw.lstrip().startswith(b"[")
    return False


def read_records(path: str | None, *, split: str = "train", max_rows: int | None = None,
                 cache_dir: str | None = None, report: DataReport | None = None) -> list[dict[str, Any]]:
    """Raw records of a dataset as a list of dicts (see the module docstring for the formats).

    Records are counted in ``report.rows_seen`` by the validators; lines dropped at read time (bad
    JSON lines) are counted here, in ``rows_seen`` and under their skip reason.
    """
    if path is None:
        raise DataError("data.path is not set: give a local json/jsonl(.gz)/parquet/arrow file, a save_to_disk "
                        "folder or a hub dataset name")
    report = report if report is not None else DataReport(source=str(path))
    local = Path(path)
    if local.exists():
        fmt = file_format(local)
        report.notes["format"] = fmt
        if fmt == "disk":
            ds = _datasets().load_from_disk(str(local))
            if hasattr(ds, "keys"):  # DatasetDict
                if split not in ds:
                    raise DataError(f"{local}: no split {split!r}; splits are {sorted(ds.keys())}")
                ds = ds[split]
            rows = ds.to_list()
        elif fmt == "json" and _is_json_array(local):
            # datasets reads a JSON array's NaN/Infinity as null (it would count as a missing field, not as a
            # non-finite score); the standard library keeps them
            report.notes["reader"] = "json (one array)"
            rows = read_json_strict(local, report)
        else:
            sp = _local_split(split, local)
            try:
                with _datasets_quiet():
                    ds = _datasets().load_dataset(fmt, data_files=str(local), split=sp, cache_dir=cache_dir)
                rows = ds.to_list()
                report.notes["reader"] = "datasets"
            except Exception as e:  # noqa: BLE001 - any datasets/arrow failure: fall back or explain
                if fmt != "json":
                    raise DataError(f"{local}: could not read the {fmt} file: {type(e).__name__}: "
                                    f"{' '.join(str(e).split())}") from None
                report.notes["reader"] = f"line-by-line (datasets failed: {type(e).__name__})"
                rows = read_json_strict(local, report)
    elif _looks_like_a_path(str(path)):
        raise DataError(f"data file not found: {path} (relative paths are resolved from {Path.cwd()})")
    else:
        report.notes["format"] = "hub"
        try:
            with _datasets_quiet():
                ds = _datasets().load_dataset(str(path), split=split, cache_dir=cache_dir)
        except Exception as e:  # noqa: BLE001
            offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
            why = " (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set: the hub cannot be reached)" if offline else ""
            raise DataError(f"{path!r} is not a local file and could not be loaded from the HF hub{why}: "
                            f"{type(e).__name__}: {e}") from None
        rows = ds.to_list()
    if max_rows is not None:
        rows = rows[:max_rows]
    return rows
