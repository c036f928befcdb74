"""Accounting of every row read, kept, skipped or truncated on the way from a file to arrays.

Nothing is dropped silently: each skip goes through :meth:`DataReport.skip` with a named reason
(one of :data:`SKIP_REASONS`) and a message naming the row, each truncation through
:meth:`DataReport.truncate`. The report prints a summary and logs it (``logging``), and
``to_dict()`` gives a JSON-safe view for ``metrics.json`` / ``metadata.json``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from jaxppo.console import PRINTED

logger = logging.getLogger("jaxppo.data")

# reason -> what it means (used in messages and the docs of the validators)
SKIP_REASONS: dict[str, str] = {
    "invalid_json": "a line of a JSON-lines file is not valid JSON or not an object",
    "missing_field": "a required column is missing or null",
    "not_a_string": "a text field is neither a string nor a list of chat messages",
    "empty_text": "a text field is empty or only whitespace",
    "invalid_utf8": "a text field is not valid UTF-8",
    "text_too_long": "a text field is longer than data.max_text_chars characters",
    "identical_pair": "chosen and rejected are the same text",
    "identical_after_truncation": "chosen and rejected differ only after their first data.max_response_length "
                                  "tokens, so the model sees the same answer twice",
    "no_assistant_turn": "an HH-RLHF dialogue has no '\\n\\nAssistant:' turn",
    "prompt_mismatch": "the chosen and rejected dialogues of an HH-RLHF pair have different prompts",
    "bad_score": "the score is not a number",
    "non_finite_score": "the score is NaN or infinite",
    "bad_logprobs": "behaviour log-probs are not a list of finite numbers <= 0",
    "logprob_length_mismatch": "the number of behaviour log-probs differs from the number of response tokens",
    "bad_token_ids": "prompt_ids/response_ids are not a list of token ids inside the vocabulary",
    "bad_group_id": "group_id is not an integer or a string",
    "empty_tokens": "a text tokenizes to no tokens",
    "prompt_too_long": "the prompt has more than data.max_prompt_length tokens (data.truncation=skip)",
    "response_too_long": "the response has more than data.max_response_length tokens (data.truncation=skip)",
    # conversational rows (lists of {"role", "content"} messages, see jaxppo.data.conversation)
    "bad_message": "a chat message is not an object with string 'role' and 'content'",
    "unknown_role": "a chat message's role is not 'system', 'user' or 'assistant'",
    "empty_conversation": "a list of chat messages is empty",
    "prompt_not_user_last": "a conversational prompt does not end with a user turn",
    "response_not_assistant": "a conversational response (response/completion/chosen/rejected) has a turn that is "
                              "not an assistant message",
    "conversation_mismatch": "implicit-prompt chosen/rejected conversations differ before their last assistant turn",
    "mixed_text_and_messages": "a row mixes a plain-text prompt with chat-message responses",
    "template_mismatch": "the chat template's rendering of the prompt is not a prefix of its rendering of the "
                         "whole conversation",
    "mismatched_tokens": "a logged row's tokens are not our tokenizer's tokens of its answer "
                         "(data.logged_mismatch=skip; recompute keeps the row with reference log-probs)",
    "bad_comparison": "a ranking row's completions or comparisons are malformed (fewer than two answers, an answer "
                      "index out of range, preferred not a/b/tie)",
    "wrong_preference_format": "the row looks like the other data.preference_format (explicit prompt/chosen/"
                               "rejected vs implicit-prompt hh dialogues or conversations)",
}

_MAX_EXAMPLES = 3

# a field truncated in more than this share of its rows gets a warning in the summary, with the key to change
TRUNCATION_WARN_SHARE = 0.1


class DataError(ValueError):
    """Input data that cannot be used; the message says which file/row/field and why."""


class RowSkip(Exception):
    """One unusable row: ``reason`` (a key of :data:`SKIP_REASONS`) and a message naming the field."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass
class DataReport:
    """Counters of a data pipeline run.

    ``rows_seen`` rows were read, ``rows_kept`` survived; ``skipped[reason]`` counts dropped
    rows by reason, ``truncated[what]`` counts truncated fields and ``tokens_dropped[what]`` the
    tokens cut away, out of ``fitted[what]`` fields of that kind that were fitted to their budget, whose
    config key and value ``limits[what]`` names (e.g. ``"data.max_response_length=64"``).
    ``examples[reason]`` keeps the first few messages of each reason.
    """

    source: str = ""
    rows_seen: int = 0
    rows_kept: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    truncated: dict[str, int] = dataclasses.field(default_factory=dict)
    tokens_dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    notes: dict[str, int | float | str] = dataclasses.field(default_factory=dict)
    fitted: dict[str, int] = dataclasses.field(default_factory=dict)
    limits: dict[str, str] = dataclasses.field(default_factory=dict)

    def skip(self, reason: str, message: str) -> None:
        """Count one dropped row under ``reason`` (must be a known reason) with a message."""
        if reason not in SKIP_REASONS:
            raise KeyError(f"unknown skip reason {reason!r}; known: {sorted(SKIP_REASONS)}")
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < _MAX_EXAMPLES:
            ex.append(message)

    def truncate(self, what: str, n_tokens: int) -> None:
        """Count one truncation of field ``what`` that cut ``n_tokens`` tokens."""
        self.truncated[what] = self.truncated.get(what, 0) + 1
        self.tokens_dropped[what] = self.tokens_dropped.get(what, 0) + int(n_tokens)

    def fit(self, what: str, limit: str) -> None:
        """Count one field ``what`` fitted to its token budget, the config ``limit`` (``"key=value"``)."""
        self.fitted[what] = self.fitted.get(what, 0) + 1
        self.limits[what] = limit

    def warnings(self) -> list[str]:
        """One line per field truncated in more than :data:`TRUNCATION_WARN_SHARE` of its fitted rows: the
        counts, the tokens cut and the config key to raise."""
        out = []
        for what, n in sorted(self.truncated.items()):
            total = self.fitted.get(what, 0)
            if total and n / total > TRUNCATION_WARN_SHARE:
                limit = self.limits.get(what, "")
                key = limit.split("=")[0] if limit else "the length limit"
                out.append(f"warning: {n} of {total} {what} texts ({100 * n / total:.0f}% > "
                           f"{100 * TRUNCATION_WARN_SHARE:.0f}%) were truncated to {limit or 'their budget'} "
                           f"({self.tokens_dropped.get(what, 0)} tokens cut): raise {key} to keep them whole")
        return out

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        """JSON-safe dict of all counters (``skipped/<reason>`` style keys are left to callers)."""
        return {
            "source": self.source,
            "rows_seen": self.rows_seen,
            "rows_kept": self.rows_kept,
            "rows_skipped": self.n_skipped,
            "skipped": dict(sorted(self.skipped.items())),
            "truncated": dict(sorted(self.truncated.items())),
            "tokens_dropped": dict(sorted(self.tokens_dropped.items())),
            "examples": {k: list(v) for k, v in sorted(self.examples.items())},
            "notes": dict(self.notes),
            "fitted": dict(sorted(self.fitted.items())),
            "limits": dict(sorted(self.limits.items())),
            "warnings": self.warnings(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "DataReport":
        """The report of a :meth:`to_dict` form (as written to metrics files)."""
        return cls(source=d.get("source", ""), rows_seen=d.get("rows_seen", 0), rows_kept=d.get("rows_kept", 0),
                   skipped=dict(d.get("skipped", {})), truncated=dict(d.get("truncated", {})),
                   tokens_dropped=dict(d.get("tokens_dropped", {})),
                   examples={k: list(v) for k, v in d.get("examples", {}).items()}, notes=dict(d.get("notes", {})),
                   fitted=dict(d.get("fitted", {})), limits=dict(d.get("limits", {})))

    def flat_metrics(self, prefix: str = "data/") -> dict[str, int]:
        """Flat ``{prefix + 'skipped/<reason>': n, ...}`` counters for metric logs."""
        out = {f"{prefix}rows_seen": self.rows_seen, f"{prefix}rows_kept": self.rows_kept,
               f"{prefix}rows_skipped": self.n_skipped}
        out.update({f"{prefix}skipped/{k}": v for k, v in sorted(self.skipped.items())})
        out.update({f"{prefix}truncated/{k}": v for k, v in sorted(self.truncated.items())})
        return out

    def summary(self) -> str:
        """A few human-readable lines: kept/seen, each skip reason with an example, truncations."""
        lines = [f"data {self.source or '<memory>'}: kept {self.rows_kept} of {self.rows_seen} rows, "
                 f"skipped {self.n_skipped}"]
        for reason, n in sorted(self.skipped.items()):
            example = self.examples.get(reason, [""])[0]
            lines.append(f"  skipped {n:6d} {reason}: {SKIP_REASONS[reason]} (e.g. {example})")
        for what, n in sorted(self.truncated.items()):
            of = f" of {self.fitted[what]}" if what in self.fitted else ""
            lines.append(f"  truncated {n:6d}{of} {what} ({self.tokens_dropped.get(what, 0)} tokens cut)")
        for k, v in self.notes.items():
            lines.append(f"  {k}: {v}")
        lines.extend(self.warnings())
        return "\n".join(lines)

    def emit(self, print_fn: Callable[[str], None] | None = print) -> None:
        """Print the summary (unless ``print_fn`` is None) and log it at INFO level, its warnings at WARNING level
        marked :data:`jaxppo.console.PRINTED`: every command prints the summary, here or later from the
        ``data_report`` of its metrics (:func:`data_summary`)."""
        text = self.summary()
        if print_fn is not None:
            print_fn(text)
        logger.info(text)
        for line in self.warnings():
            logger.warning(line, extra=PRINTED)

    def merge(self, other: "DataReport") -> None:
        """Add ``other``'s skip/truncation counters into this report (rows counters untouched)."""
        for k, v in other.skipped.items():
            self.skipped[k] = self.skipped.get(k, 0) + v
            ex = self.examples.setdefault(k, [])
            ex.extend(other.examples.get(k, [])[: max(0, _MAX_EXAMPLES - len(ex))])
        for k, v in other.truncated.items():
            self.truncated[k] = self.truncated.get(k, 0) + v
        for k, v in other.tokens_dropped.items():
            self.tokens_dropped[k] = self.tokens_dropped.get(k, 0) + v
        for k, v in other.fitted.items():
            self.fitted[k] = self.fitted.get(k, 0) + v
        self.limits.update(other.limits)



def data_summary(report: dict) -> str:
    """:meth:`DataReport.summary` of a report's :meth:`DataReport.to_dict` form (as written to metrics files)."""
    return DataReport.from_dict(report).summary()
