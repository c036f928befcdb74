"""Rankings: k answers per prompt with ratings or pairwise preferences, read as preference pairs.

A ranking row (``data.schema=preference``, ``data.preference_format=ranking``, or ``auto`` on a row with a
``completions`` column) holds one prompt and its k answers::

    {"prompt": "...",
     "completions": [{"response": "...", "score": 4.5}, {"response": "...", "score": 2.0}, ...]}

(UltraFeedback's shape; ``data.columns.response`` / ``data.columns.score`` name other keys inside each completion,
e.g. ``data.columns.score=overall_score``), or answers with pairwise preferences, ties allowed::

    {"prompt": "...", "completions": ["answer 0", "answer 1", "answer 2"],
     "comparisons": [{"a": 0, "b": 1, "preferred": "a"}, {"a": 1, "b": 2, "preferred": "tie"}, ...]}

(a completion may then also be ``{"response": ...}``). With ratings, every two answers of the row make one pair, the
higher rating chosen; equal ratings are a tie. With ``comparisons`` (used whenever present), each comparison is one
pair: ``preferred`` is ``"a"``, ``"b"`` or ``"tie"``.

Ties follow ``data.ties``: ``drop`` (default) leaves them out; ``keep`` turns each tie into **two** pairs, ``a ≻ b``
and ``b ≻ a`` (marked ``tie``): their summed Bradley-Terry / DPO losses are the likelihood of half a win each way,
which pulls the two answers' rewards together. Either way they are counted (``report.notes``).

Each pair is a :class:`~jaxppo.data.schemas.PreferencePair` whose ``index`` is the pair's ordinal and ``source`` the
ranking row; it then goes through the one filter path of every pair
(:func:`jaxppo.data.pipeline.load_preference_arrays`). ``reward to-scored`` turns the kept pairs into scored rows,
each distinct answer once with a per-prompt group id, scored by its rating when the row has ratings, else by its
win rate (:mod:`jaxppo.data.answers`).
"""

from __future__ import annotations

import itertools
import numbers
from typing import Any, Mapping

import numpy as np

from jaxppo.data.conversation import Text
from jaxppo.data.report import DataReport, RowSkip
from jaxppo.data.schemas import PreferencePair

_Bad = RowSkip

PREFERRED = ("a", "b", "tie")


def _completion(item: Any, k: int, columns: Mapping[str, str], check_text, max_text_chars: int
                ) -> tuple[Any, float | None]:
    """``(response, rating or None)`` of completion ``k`` (a string, or a dict with ``response`` and ``score``)."""
    from jaxppo.data.validation import check_score

    name = f"completions[{k}]"
    if isinstance(item, Mapping):
        r_key, s_key = columns.get("response", "response"), columns.get("score", "score")
        if r_key not in item:
            keys = ", ".join(map(str, item)) or "none"
            raise _Bad("missing_field", f"{name} has no {r_key!r} (its keys: {keys}); set data.columns.response="
                                        "<key> when the answer has another name")
        response = check_text(item[r_key], f"{name}.{r_key}", max_text_chars)
        score = None if item.get(s_key) is None else check_score(item[s_key], f"{name}.{s_key}")
        return response, score
    return check_text(item, name, max_text_chars), None


def _index(value: Any, name: str, k: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < k:
        raise _Bad("bad_comparison", f"{name} must be an answer index in 0..{k - 1}, got {value!r:.40}")
    return int(value)


def ranking_comparisons(rec: Mapping[str, Any], k: int, scores: list[float | None]) -> list[tuple[int, int, str]]:
    """``(a, b, preferred)`` of the row: its ``comparisons``, or every two answers compared by their ratings."""
    comps = rec.get("comparisons")
    if comps is not None:
        if not isinstance(comps, (list, tuple, np.ndarray)):
            raise _Bad("bad_comparison", f"'comparisons' must be a list, got {type(comps).__name__}")
        out = []
        for c, item in enumerate(comps):
            if not isinstance(item, Mapping):
                raise _Bad("bad_comparison", f"comparisons[{c}] must be an object with a, b and preferred")
            a, b = _index(item.get("a"), f"comparisons[{c}].a", k), _index(item.get("b"), f"comparisons[{c}].b", k)
            pref = item.get("preferred")
            if pref not in PREFERRED or a == b:
                raise _Bad("bad_comparison", f"comparisons[{c}]: preferred must be one of {PREFERRED} between two "
                                             f"different answers, got a={a}, b={b}, preferred={pref!r:.20}")
            out.append((a, b, pref))
        return out
    if any(s is None for s in scores):
        raise _Bad("missing_field", "a ranking row needs a 'score' in every completion or a 'comparisons' list "
                                    "(data.columns.score=<key> names another rating key)")
    return [(a, b, "a" if scores[a] > scores[b] else "b" if scores[b] > scores[a] else "tie")
            for a, b in itertools.combinations(range(k), 2)]


def ranking_pairs(rec: Mapping[str, Any], row: int, first_index: int, *, columns: Mapping[str, str],
                  max_text_chars: int, ties: str, report: DataReport) -> list[PreferencePair]:
    """The preference pairs of one column-mapped ranking row ``rec`` (source row ``row``), numbered from
    ``first_index``; raises :class:`RowSkip` for a row that cannot be read. Ties are dropped or kept per ``ties``
    and counted in ``report.notes`` (``ties_dropped`` / ``ties_kept``); a comparison of two answers with the same
    text is skipped as ``identical_pair``."""
    from jaxppo.data.validation import _conversational, check_text_or_messages

    prompt: Text = check_text_or_messages(rec.get("prompt"), "prompt", max_text_chars)
    items = rec.get("completions")
    if not isinstance(items, (list, tuple, np.ndarray)) or len(items) < 2:
        raise _Bad("bad_comparison", f"'completions' must be a list of at least two answers, got {items!r:.60}")
    responses, scores = [], []
    for k, item in enumerate(items):
        r, s = _completion(item, k, columns, check_text_or_messages, max_text_chars)
        p, r = _conversational(prompt, r, f"completions[{k}]")
        responses.append(r)
        scores.append(s)
    prompt = p
    out: list[PreferencePair] = []
    for a, b, pref in ranking_comparisons(rec, len(responses), scores):
        if responses[a] == responses[b]:
            report.skip("identical_pair", f"row {row}: completions {a} and {b} are the same text")
            continue
        if pref == "tie":
            if ties == "drop":
                report.notes["ties_dropped"] = int(report.notes.get("ties_dropped", 0)) + 1
                continue
            report.notes["ties_kept"] = int(report.notes.get("ties_kept", 0)) + 1
            orders = [(a, b), (b, a)]
        else:
            orders = [(a, b) if pref == "a" else (b, a)]
        for c, j in orders:
            out.append(PreferencePair(prompt=prompt, chosen=responses[c], rejected=responses[j],
                                      index=first_index + len(out), source=row, tie=pref == "tie",
                                      chosen_score=scores[c], rejected_score=scores[j]))
    return out


__all__ = ["PREFERRED", "ranking_comparisons", "ranking_pairs"]
