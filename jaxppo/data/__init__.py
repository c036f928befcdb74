"""Offline datasets: loading, validation, HH-RLHF parsing, fixed-shape tokenization, behaviour log-probs.

Typical use::

    loaded = load_rows(cfg.data)                     # validated rows + DataReport
    arrays = tokenize_rows(loaded, tokenizer, cfg.data)  # dict of numpy arrays, fixed shapes
    loaded.report.emit()                             # print + log every skip/truncation counter
"""

from jaxppo.data.behaviour import (compute_behaviour_logprobs, fill_behaviour_logprobs, load_scored_arrays,
                                   response_logprobs)
from jaxppo.data.hh import split_dialogue, split_pair
from jaxppo.data.loading import read_json_strict, read_records
from jaxppo.data.pipeline import LoadedRows, load_rows, rows_from_records, split_by_group, tokenize_rows
from jaxppo.data.report import SKIP_REASONS, DataError, DataReport
from jaxppo.data.schemas import PreferencePair, ScoredTrajectory
from jaxppo.data.tokenize import bucket_lengths, bucketize, tokenize_preference, tokenize_scored
from jaxppo.data.validation import require_rows, validate_preference, validate_scored

__all__ = [
    "SKIP_REASONS", "DataError", "DataReport", "LoadedRows", "PreferencePair", "ScoredTrajectory",
    "bucket_lengths", "compute_behaviour_logprobs", "fill_behaviour_logprobs", "load_scored_arrays",
    "response_logprobs", "bucketize", "load_rows", "read_json_strict", "read_records", "require_rows",
    "rows_from_records", "split_by_group", "split_dialogue", "split_pair", "tokenize_preference",
    "tokenize_rows", "tokenize_scored", "validate_preference", "validate_scored",
]
