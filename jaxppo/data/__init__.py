"""Offline datasets: loading, validation, HH-RLHF parsing, fixed-shape tokenization, behaviour log-probs.

Typical use::

    loaded = load_rows(cfg.data)                     # validated rows + DataReport
    arrays = tokenize_rows(loaded, tokenizer, cfg.data)  # dict of numpy arrays, fixed shapes
    loaded.report.emit()                             # print + log every skip/truncation counter

Scored trajectories with behaviour log-probs (logged, or computed once by the reference model and
cached)::

    arrays, report = load_scored_arrays(cfg.data, tokenizer, reference_path=path, reference=model)

Held-out prompts (for evaluation, perplexity guards, reward-model accuracy): split **by group** so
that no prompt group is on both sides. ``group_id`` is the data's group column, or the prompt text
when there is none (a collected dataset's ``group_id`` is the prompt's number), so all N responses
to one prompt land on the same side::

    train_rows, eval_rows = split_by_group(arrays["group_id"].tolist(), cfg.data.eval_fraction, cfg.data.seed)
    train = {k: v[train_rows] for k, v in arrays.items()}
    heldout = {k: v[eval_rows] for k, v in arrays.items()}

For preference pairs, split by the prompt text (``[pair.prompt for pair in loaded.rows]`` mapped
through ``arrays["index"]``), as ``jaxppo.rewards.model_training`` does. The split is deterministic
in ``(keys, eval_fraction, seed)``.

Text fields may be strings or chat messages (TRL's conversational forms), rendered by the tokenizer's
chat template (or ``data.chat_template_file``); see :mod:`jaxppo.data.conversation`.
"""

from jaxppo.data.behaviour import (compute_behaviour_logprobs, fill_behaviour_logprobs, load_scored_arrays,
                                   response_logprobs)
from jaxppo.data.conversation import Conversation, Message, apply_chat_template_file, render, render_prompt
from jaxppo.data.hh import split_dialogue, split_pair
from jaxppo.data.loading import read_json_strict, read_records
from jaxppo.data.pipeline import LoadedRows, load_rows, prompt_groups, rows_from_records, split_by_group, tokenize_rows
from jaxppo.data.report import SKIP_REASONS, DataError, DataReport, RowSkip
from jaxppo.data.schemas import PreferencePair, ScoredTrajectory
from jaxppo.data.tokenize import tokenize_preference, tokenize_scored
from jaxppo.data.validation import require_rows, validate_preference, validate_scored

__all__ = [
    "SKIP_REASONS", "Conversation", "DataError", "DataReport", "LoadedRows", "Message", "PreferencePair", "RowSkip",
    "ScoredTrajectory", "apply_chat_template_file", "render", "render_prompt",
    "compute_behaviour_logprobs", "fill_behaviour_logprobs", "load_scored_arrays",
    "response_logprobs", "load_rows", "read_json_strict", "read_records", "require_rows",
    "prompt_groups", "rows_from_records", "split_by_group", "split_dialogue", "split_pair", "tokenize_preference",
    "tokenize_rows", "tokenize_scored", "validate_preference", "validate_scored",
]
