"""Distinct answers of comparison data, each once, with its prompt group and its tally of comparisons.

Preference pairs (and rankings turned into pairs) mention one answer in every comparison it takes part in. A
scored dataset for PPO wants each distinct ``(prompt, response)`` **once**, so an :class:`AnswerTable` collects the
answers in order of first appearance and counts, per answer, the comparisons it won, lost and tied. Group ids are
per prompt: a dense id of the prompt in order of first appearance (the grouping of
:func:`jaxppo.data.pipeline.prompt_groups`, so a by-group split of the scored rows holds out the same prompts as
the by-prompt split of the pairs).

Without a model score, an answer's score is its **win rate** over its comparisons::

    score = (wins + ½·ties) / (wins + losses + ties)

so an answer that was only ever chosen scores 1, one that was only ever rejected scores 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxppo.data.conversation import Text, to_json


@dataclasses.dataclass
class Answer:
    """One distinct answer: its prompt group, the comparisons it won/lost/tied, the source rows it came from and
    an optional given score (a rating, or a reward model's score)."""

    prompt: Text
    response: Text
    group_id: int
    wins: int = 0
    losses: int = 0
    ties: int = 0
    score: float | None = None
    sources: list[int] = dataclasses.field(default_factory=list)

    @property
    def comparisons(self) -> int:
        return self.wins + self.losses + self.ties

    @property
    def win_rate(self) -> float:
        """``(wins + ties / 2) / comparisons`` (NaN without any comparison)."""
        n = self.comparisons
        return (self.wins + 0.5 * self.ties) / n if n else float("nan")


OUTCOMES = ("win", "loss", "tie", None)


class AnswerTable:
    """Distinct ``(prompt, response)`` answers in order of first appearance (see the module docstring)."""

    def __init__(self) -> None:
        self._answers: dict[tuple[Any, Any], Answer] = {}
        self._groups: dict[Any, int] = {}

    def group_of(self, prompt: Text) -> int:
        """The dense per-prompt group id (first appearance order)."""
        return self._groups.setdefault(prompt, len(self._groups))

    def add(self, prompt: Text, response: Text, source: int, outcome: str | None = None,
            score: float | None = None) -> Answer:
        """Count one appearance of ``response`` to ``prompt`` in source row ``source``: ``outcome`` is ``"win"``,
        ``"loss"``, ``"tie"`` (a comparison) or None (no comparison); a given ``score`` is kept (the first one when
        the answer appears several times)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        key = (prompt, response)
        a = self._answers.get(key)
        if a is None:
            a = self._answers[key] = Answer(prompt, response, self.group_of(prompt))
        if outcome == "win":
            a.wins += 1
        elif outcome == "loss":
            a.losses += 1
        elif outcome == "tie":
            a.ties += 1
        if a.score is None and score is not None:
            a.score = float(score)
        if source not in a.sources:
            a.sources.append(int(source))
        return a

    def add_pair(self, prompt: Text, chosen: Text, rejected: Text, source: int, *, tie: bool = False,
                 score_chosen: float | None = None, score_rejected: float | None = None) -> None:
        """One comparison: ``chosen`` beats ``rejected`` (or, with ``tie``, the two tie)."""
        self.add(prompt, chosen, source, "tie" if tie else "win", score_chosen)
        self.add(prompt, rejected, source, "tie" if tie else "loss", score_rejected)

    @property
    def answers(self) -> list[Answer]:
        return list(self._answers.values())

    def __len__(self) -> int:
        return len(self._answers)

    def records(self, score: str = "given") -> list[dict]:
        """One scored row per distinct answer: ``prompt``, ``response`` (JSON form: strings, or lists of
        ``{"role", "content"}`` messages), ``score``, ``group_id`` (per prompt), ``wins``, ``losses``, ``ties`` and
        ``source_rows``. ``score="given"`` writes each answer's given score, ``"win_rate"`` its win rate."""
        if score not in ("given", "win_rate"):
            raise ValueError(f"score must be 'given' or 'win_rate', got {score!r}")
        out = []
        for a in self._answers.values():
            s = a.win_rate if score == "win_rate" else a.score
            if s is None:
                raise ValueError(f"answer of source row {a.sources[0]} has no given score")
            out.append({"prompt": to_json(a.prompt), "response": to_json(a.response), "score": float(s),
                        "group_id": a.group_id, "wins": a.wins, "losses": a.losses, "ties": a.ties,
                        "source_rows": list(a.sources)})
        return out


__all__ = ["Answer", "AnswerTable"]
