"""Row validation: every bad-input kind has a named counter (see ``report.SKIP_REASONS``).

Each validator returns the usable rows as schema objects and records every dropped row in the
:class:`~jaxppo.data.report.DataReport` with its reason and a message naming the row and field.
:func:`require_rows` turns "nothing usable" into a :class:`DataError` that says why.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from jaxppo.data import hh
from jaxppo.data.conversation import Text, as_response, check_prompt, check_str, parse_messages, split_implicit
from jaxppo.data.report import SKIP_REASONS, DataError, DataReport, RowSkip
from jaxppo.data.logged import is_logged, parse_logged
from jaxppo.data.rankings import ranking_pairs
from jaxppo.data.schemas import (PREFERENCE_FIELDS, RANKING_FIELDS, SCORED_FIELDS, PreferencePair, ScoredTrajectory,
                                 check_columns, map_columns)

LOGPROB_TOLERANCE = 1e-5  # log-probs may exceed 0 by float rounding, not more

_Bad = RowSkip


def check_text(value: Any, name: str, max_chars: int, *, allow_empty: bool = False) -> str:
    """``value`` as a usable text, or raise ``_Bad`` with the reason.

    Reasons: ``missing_field`` (None), ``invalid_utf8`` (bytes that do not decode, or a str with
    lone surrogates), ``not_a_string``, ``empty_text`` (empty/whitespace), ``text_too_long``.
    """
    if value is None:
        raise _Bad("missing_field", f"{name!r} is missing or null")
    return check_str(value, f"{name!r}", max_chars, allow_empty=allow_empty)


def check_text_or_messages(value: Any, name: str, max_chars: int, *, allow_empty: bool = False) -> Text:
    """A string field as a string (:func:`check_text`), a list of ``{"role", "content"}`` messages as a
    :data:`~jaxppo.data.conversation.Conversation` (:func:`~jaxppo.data.conversation.parse_messages`);
    anything else is ``not_a_string``."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return parse_messages(value, name, max_chars)
    if value is not None and not isinstance(value, (str, bytes, bytearray)):
        raise _Bad("not_a_string", f"{name!r} must be a string or a list of chat messages, "
                                   f"got {type(value).__name__} {value!r:.40}")
    return check_text(value, name, max_chars, allow_empty=allow_empty)


def check_label(value: Any, name: str = "label") -> float:
    """TRL's unpaired boolean ``label`` as a score: True -> 1.0, False -> 0.0 (``bad_score`` otherwise)."""
    if isinstance(value, (bool, np.bool_)):
        return 1.0 if value else 0.0
    raise _Bad("bad_score", f"{name!r} must be a boolean (True -> score 1, False -> score 0), "
                            f"got {type(value).__name__} {value!r:.40}")


def check_score(value: Any, name: str = "score") -> float:
    """A finite float, or ``_Bad`` (``missing_field`` / ``bad_score`` / ``non_finite_score``)."""
    if value is None:
        raise _Bad("missing_field", f"{name!r} is missing or null")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Bad("bad_score", f"{name!r} must be a number, got {type(value).__name__} {value!r:.40}")
    v = float(value)
    if not math.isfinite(v):
        raise _Bad("non_finite_score", f"{name!r} is {v}")
    return v


def _as_list(value: Any, name: str, reason: str) -> list:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise _Bad(reason, f"{name!r} must be a flat list, got an array of shape {value.shape}")
        return value.tolist()
    if not isinstance(value, (list, tuple)):
        raise _Bad(reason, f"{name!r} must be a list, got {type(value).__name__}")
    return list(value)


def check_logprobs(value: Any, name: str = "behaviour_logprobs") -> np.ndarray:
    """Finite numbers <= 0 as float32 [T], or ``_Bad('bad_logprobs')``."""
    items = _as_list(value, name, "bad_logprobs")
    for t, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise _Bad("bad_logprobs", f"{name!r}[{t}] is not a number: {x!r:.40}")
        if not math.isfinite(float(x)):
            raise _Bad("bad_logprobs", f"{name!r}[{t}] is {float(x)}")
        if float(x) > LOGPROB_TOLERANCE:
            raise _Bad("bad_logprobs", f"{name!r}[{t}] = {float(x)} is a log-probability above 0")
    return np.asarray(items, dtype=np.float32)


def check_token_ids(value: Any, name: str) -> np.ndarray:
    """Non-negative integers as int32 [T] (the vocabulary bound is checked at tokenization)."""
    items = _as_list(value, name, "bad_token_ids")
    for t, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < 0 or int(x) >= 2**31:
            raise _Bad("bad_token_ids", f"{name!r}[{t}] is not a token id: {x!r:.40}")
    if not items:
        raise _Bad("empty_tokens", f"{name!r} is an empty list")
    return np.asarray(items, dtype=np.int32)


def check_group_id(value: Any) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise _Bad("bad_group_id", f"'group_id' must be an integer or a string, got {type(value).__name__}")
    return int(value) if isinstance(value, numbers.Integral) else value


def require_fields(raw: Mapping[str, Any], rec: Mapping[str, Any], required: Sequence[Sequence[str]],
                   columns: Mapping[str, str], known: Sequence[str]) -> None:
    """``missing_field`` for the first required field (or group of alternatives, e.g. ``response``/``completion``)
    that is absent from the column-mapped row ``rec``: the message lists the columns the row has and suggests
    ``data.columns.<field>=<column>`` with the row's columns that are no field of the schema (a null value is left
    to the field's own check). A scored row that holds ``chosen``/``rejected`` instead of a response is a preference
    pair: the message points to ``python -m jaxppo.reward to-scored``."""
    for names in required:
        if any(n in rec for n in names):
            continue
        name = names[0]
        alt = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
        found = ", ".join(map(str, raw)) or "none"
        if name in ("response", "completion") and "chosen" in rec and "rejected" in rec:
            raise _Bad("missing_field", f"{name!r}{alt} is missing: the row has 'chosen' and 'rejected', a preference "
                                        "pair; turn pairs into scored rows with `python -m jaxppo.reward to-scored` "
                                        "(or train on them with `python -m jaxppo.dpo`, data.schema=preference)")
        spare = [c for c in raw if isinstance(c, str) and c not in known and c not in columns.values()]
        hint = (f"set data.columns.{name}={spare[0]}" if len(spare) == 1 else
                f"set data.columns.{name}=<column> (one of {', '.join(spare)}?)" if spare else
                f"set data.columns.{name}=<column>")
        raise _Bad("missing_field", f"{name!r}{alt} is missing (the row's columns: {found}); if the data names it "
                                    f"otherwise, {hint}")


SCORED_REQUIRED = (("prompt",), ("response", "completion"), ("score", "label"))


def validate_scored(records: Iterable[Mapping[str, Any]], *, columns: Mapping[str, str] | None = None,
                    max_text_chars: int = 100_000, report: DataReport | None = None) -> list[ScoredTrajectory]:
    """Usable scored trajectories of ``records``; every other row is counted in ``report``. A chat-completion log
    row (``choices`` with ``logprobs.content``) is read by :func:`jaxppo.data.logged.parse_logged`."""
    columns = dict(columns or {})
    check_columns(columns, "scored")
    report = report if report is not None else DataReport()
    out = []
    for i, raw in enumerate(records):
        report.rows_seen += 1
        rec = map_columns(raw, columns)
        if is_logged(rec):
            try:
                prompt, content, logged = parse_logged(rec, max_text_chars)
                score = check_label(rec["label"]) if rec.get("score") is None and rec.get("label") is not None \
                    else check_score(rec.get("score"))
                gid = check_group_id(rec.get("group_id"))
            except _Bad as bad:
                report.skip(bad.reason, f"row {i}: {bad.message}")
                continue
            out.append(ScoredTrajectory(prompt=prompt, response=content, score=score, index=i, group_id=gid,
                                        logged=logged))
            continue
        try:
            require_fields(raw, rec, SCORED_REQUIRED, columns, SCORED_FIELDS)
            # a text may be empty when its token ids are given (e.g. a sampled response that is only EOS)
            prompt = check_text_or_messages(rec.get("prompt"), "prompt", max_text_chars,
                                            allow_empty=rec.get("prompt_ids") is not None)
            r_name = "completion" if rec.get("response") is None and rec.get("completion") is not None else "response"
            response = check_text_or_messages(rec.get(r_name), r_name, max_text_chars,
                                              allow_empty=rec.get("response_ids") is not None)
            prompt, response = _conversational(prompt, response, r_name)
            if rec.get("score") is None and rec.get("label") is not None:
                score = check_label(rec.get("label"))
            else:
                score = check_score(rec.get("score"))
            lp = rec.get("behaviour_logprobs")
            lp = None if lp is None else check_logprobs(lp)
            pids = rec.get("prompt_ids")
            pids = None if pids is None else check_token_ids(pids, "prompt_ids")
            rids = rec.get("response_ids")
            rids = None if rids is None else check_token_ids(rids, "response_ids")
            if lp is not None and rids is not None and len(lp) != len(rids):
                raise _Bad("logprob_length_mismatch",
                           f"{len(lp)} behaviour_logprobs for {len(rids)} response_ids")
            gid = check_group_id(rec.get("group_id"))
        except _Bad as bad:
            report.skip(bad.reason, f"row {i}: {bad.message}")
            continue
        out.append(ScoredTrajectory(prompt=prompt, response=response, score=score, index=i,
                                    behaviour_logprobs=lp, group_id=gid, prompt_ids=pids, response_ids=rids))
    report.rows_kept = len(out)
    return out


def _conversational(prompt: Text, response: Text, name: str) -> tuple[Text, Text]:
    """Checks of a (prompt, response) whose prompt or response is a conversation: the prompt ends with a
    user turn, the response holds assistant turns only (a string after a conversational prompt becomes
    one assistant message); a plain-text prompt with a conversational response is ``mixed_text_and_messages``."""
    if isinstance(prompt, str):
        if not isinstance(response, str):
            raise _Bad("mixed_text_and_messages", f"'prompt' is a string but {name!r} is a list of messages")
        return prompt, response
    return check_prompt(prompt), as_response(response, name)


PreferenceFormat = Literal["auto", "explicit", "hh", "ranking"]


def looks_like(rec: Mapping[str, Any]) -> str | None:
    """The preference format a (column-mapped) row looks like: ``"explicit"`` with a ``prompt`` value and
    chosen/rejected answers, ``"hh"`` without a prompt and with HH-RLHF dialogues (an ``"\\n\\nAssistant:"``
    turn) or conversations of more than one message; None when neither fits."""
    chosen, rejected = rec.get("chosen"), rec.get("rejected")
    if chosen is None or rejected is None:
        return None
    if rec.get("prompt") is not None:
        return "explicit"
    texts = (chosen, rejected)
    if all(isinstance(t, str) and hh.ASSISTANT in t for t in texts):
        return "hh"
    if all(isinstance(t, (list, tuple, np.ndarray)) and len(t) > 1 for t in texts):
        return "hh"
    return None


def auto_format(rec: Mapping[str, Any]) -> str:
    """The reading of ``data.preference_format=auto`` for a (column-mapped) row: ``"ranking"`` when it has
    ``completions`` and no ``chosen`` (:mod:`jaxppo.data.rankings`); ``"explicit"`` when it has a ``prompt``;
    ``"hh"`` when ``chosen`` or ``rejected`` is an HH-RLHF dialogue (holds ``"\\n\\nAssistant:"``) or a list of
    chat messages (TRL's implicit-prompt conversational form); ``"explicit"`` otherwise (plain answers), so that a
    row whose prompt column is only misnamed is reported as a missing ``prompt`` (with the columns it has), not as
    a broken dialogue."""
    if rec.get("completions") is not None and rec.get("chosen") is None:
        return "ranking"
    if rec.get("prompt") is not None:
        return "explicit"
    for t in (rec.get("chosen"), rec.get("rejected")):
        if isinstance(t, str) and hh.ASSISTANT in t:
            return "hh"
        if isinstance(t, (list, tuple, np.ndarray)):
            return "hh"
    return "explicit"


_FORMAT_NAMES = {"explicit": "explicit prompt/chosen/rejected rows (TRL's explicit-prompt form)",
                 "hh": "implicit-prompt rows (HH-RLHF dialogues or whole conversations in chosen/rejected)"}


def validate_preference(records: Iterable[Mapping[str, Any]], *, columns: Mapping[str, str] | None = None,
                        max_text_chars: int = 100_000, report: DataReport | None = None,
                        preference_format: PreferenceFormat = "auto", ties: str = "drop") -> list[PreferencePair]:
    """Usable preference pairs of ``records``; every other row is counted in ``report``.

    ``preference_format``: ``"explicit"`` rows have ``prompt``/``chosen``/``rejected`` (responses);
    ``"hh"`` (implicit prompt) rows have only ``chosen``/``rejected``: HH-RLHF dialogue strings split by
    :func:`hh.split_pair`, or two conversations split by
    :func:`~jaxppo.data.conversation.split_implicit`; ``"auto"`` reads each row as :func:`auto_format` says
    (implicit only when the answers are dialogues or multi-message conversations). A missing column is
    ``missing_field`` with the row's columns and the ``data.columns.<field>=<column>`` to set
    (:func:`require_fields`). Any text field may be a string or a list of chat
    messages (see :mod:`jaxppo.data.conversation`).
    """
    columns = dict(columns or {})
    check_columns(columns, "preference")
    report = report if report is not None else DataReport()
    out: list[PreferencePair] = []
    n_rank_rows = 0
    for i, raw in enumerate(records):
        report.rows_seen += 1
        rec = map_columns(raw, columns)
        fmt = auto_format(rec) if preference_format == "auto" else preference_format
        if fmt == "ranking":
            try:
                require_fields(raw, rec, (("prompt",), ("completions",)), columns, PREFERENCE_FIELDS + RANKING_FIELDS)
                made = ranking_pairs(rec, i, len(out), columns=columns, max_text_chars=max_text_chars, ties=ties,
                                     report=report)
            except _Bad as bad:
                report.skip(bad.reason, f"row {i}: {bad.message}")
                continue
            n_rank_rows += 1
            report.rows_seen += len(made) - 1
            out.extend(made)
            continue
        try:
            require_fields(raw, rec, (("chosen",), ("rejected",)) + ((("prompt",),) if fmt == "explicit" else ()),
                           columns, PREFERENCE_FIELDS)
            chosen = check_text_or_messages(rec.get("chosen"), "chosen", max_text_chars)
            rejected = check_text_or_messages(rec.get("rejected"), "rejected", max_text_chars)
            if fmt == "explicit":
                prompt = check_text_or_messages(rec.get("prompt"), "prompt", max_text_chars)
                prompt, chosen = _conversational(prompt, chosen, "chosen")
                prompt, rejected = _conversational(prompt, rejected, "rejected")
            elif isinstance(chosen, str) and isinstance(rejected, str):
                split = hh.split_pair(chosen, rejected)
                if len(split) == 2:
                    raise _Bad(*split)
                prompt, chosen, rejected = split
            elif isinstance(chosen, str) or isinstance(rejected, str):
                raise _Bad("mixed_text_and_messages", "one of chosen/rejected is a string, the other a list of "
                                                      "messages (implicit-prompt rows need two conversations)")
            else:
                prompt, chosen, rejected = split_implicit(chosen, rejected)
            if chosen == rejected:
                raise _Bad("identical_pair", "chosen and rejected are the same text")
        except _Bad as bad:
            seen = looks_like(rec) if preference_format != "auto" else None
            if seen is not None and seen != fmt:
                bad = _Bad("wrong_preference_format", f"{bad.message}; the row looks like {_FORMAT_NAMES[seen]}, but "
                                                      f"data.preference_format={preference_format}: set "
                                                      f"data.preference_format={seen} (or auto)")
            report.skip(bad.reason, f"row {i}: {bad.message}")
            continue
        out.append(PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, index=i))
    if n_rank_rows:
        n_made = sum(1 for p in out if p.source is not None)
        if n_made < len(out):
            raise DataError(f"dataset {report.source or '<memory>'} mixes ranking rows (completions) with "
                            "chosen/rejected rows: give one format per file (data.preference_format)")
        report.notes["rankings"] = f"{n_rank_rows} ranking rows -> {n_made} pairs (data.ties={ties})"
    report.rows_kept = len(out)
    return out


def require_rows(rows: list, report: DataReport) -> list:
    """``rows`` unchanged, or DataError explaining why no row of the dataset is usable."""
    if rows:
        return rows
    if report.rows_seen == 0 and not report.skipped:
        raise DataError(f"dataset {report.source or '<memory>'} has no rows")
    reasons = "; ".join(f"{n} x {r} ({SKIP_REASONS[r]}; e.g. {report.examples.get(r, [''])[0]})"
                        for r, n in sorted(report.skipped.items(), key=lambda kv: -kv[1]))
    raise DataError(f"dataset {report.source or '<memory>'} has no usable row: all {report.rows_seen} rows "
                    f"were skipped: {reasons}")
