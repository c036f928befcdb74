"""The two row schemas and the column mapping from a dataset's names to ours.

- **preference** pairs: ``prompt``, ``chosen``, ``rejected`` (responses), or Anthropic HH-RLHF
  rows with only ``chosen`` / ``rejected`` full dialogues (split by :mod:`jaxppo.data.hh`);
- **scored** trajectories: ``prompt``, ``response`` (or TRL's ``completion``), ``score`` (or TRL's
  boolean ``label``: True -> 1.0, False -> 0.0, used when there is no ``score``) and optionally
  ``behaviour_logprobs`` (one per response token), ``group_id``, ``prompt_ids``, ``response_ids``.

Any text field may be a string or a list of chat messages (TRL's conversational forms); parsed
messages are kept as a :data:`~jaxppo.data.conversation.Conversation` and rendered with the
tokenizer's chat template at tokenization (see :mod:`jaxppo.data.conversation`).

``data.columns`` maps *our* field name to the dataset's column name, e.g.
``{"prompt": "question", "response": "answer", "score": "reward"}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from jaxppo.data.conversation import Text
from jaxppo.data.report import DataError

PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")
# ranking rows (jaxppo.data.rankings): k answers with ratings or pairwise comparisons, read as preference pairs
RANKING_FIELDS = ("completions", "comparisons", "response", "score")
SCORED_FIELDS = ("prompt", "response", "score", "behaviour_logprobs", "group_id", "prompt_ids", "response_ids",
                 "completion", "label")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """One human preference: ``chosen`` is preferred over ``rejected`` as an answer to ``prompt``."""

    prompt: Text  # a string, or chat messages ending with a user turn
    chosen: Text  # a string, or assistant message(s) (a conversation when ``prompt`` is one)
    rejected: Text
    index: int  # row number in the source (a pair of a ranking row: the pair's ordinal, the row is ``source``)
    source: int | None = None  # the source row when one row gives several pairs (rankings)
    tie: bool = False  # one of the two orders of a kept tie (data.ties=keep)
    chosen_score: float | None = None  # the answers' ratings, when the ranking row has them
    rejected_score: float | None = None

    @property
    def row(self) -> int:
        """The source row of the pair."""
        return self.index if self.source is None else self.source


@dataclasses.dataclass(frozen=True)
class ScoredTrajectory:
    """One response with its sequence score; token-level fields are optional."""

    prompt: Text  # a string, or chat messages ending with a user turn
    response: Text  # a string, or assistant message(s) (a conversation when ``prompt`` is one)
    score: float
    index: int  # row number in the source
    behaviour_logprobs: np.ndarray | None = None  # float32 [T_response]
    group_id: int | str | None = None
    prompt_ids: np.ndarray | None = None  # int32
    response_ids: np.ndarray | None = None  # int32
    # a chat-completion log's tokens: (bytes, log-prob) each, aligned to our tokens at tokenization
    # (jaxppo.data.logged); the response is then the plain assistant text after the rendered prompt
    logged: tuple[tuple[bytes, float], ...] | None = None


def check_columns(columns: Mapping[str, str], schema: str) -> None:
    """Raise DataError when ``data.columns`` names a field that ``schema`` does not have."""
    known = PREFERENCE_FIELDS + RANKING_FIELDS if schema == "preference" else SCORED_FIELDS
    for ours, theirs in columns.items():
        if ours not in known:
            raise DataError(f"data.columns: {ours!r} is not a field of the {schema} schema "
                            f"(fields: {', '.join(known)}); keys are our names, values the dataset's columns")
        if not isinstance(theirs, str) or not theirs:
            raise DataError(f"data.columns.{ours}: expected a column name, got {theirs!r}")


def map_columns(record: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """``record`` with the dataset's column names replaced by ours (unmapped keys kept as they are)."""
    if not columns:
        return dict(record)
    theirs_to_ours = {v: k for k, v in columns.items()}
    out = {}
    for k, v in record.items():
        if k in theirs_to_ours:
            out[theirs_to_ours[k]] = v
        elif k not in columns:  # a same-named column that is not the mapped one stays out of the way
            out[k] = v
    return out
