"""Rule-based reward functions: ``fn(prompts, responses) -> np.ndarray float32 [N]``.

- :func:`vader_reward`: VADER compound sentiment of the response text, in [-1, 1]
  (the ``vaderSentiment`` lexicon; deterministic);
- :func:`length_reward`: ``-|n_words - target| / target`` (0 at the target length, -1 at 0 or
  twice the target), ``n_words`` = whitespace-separated words of the response;
- :func:`format_reward`: 1 when the stripped response fully matches a regular expression, else 0
  (default: starts with a capital letter and ends with ``.``, ``!`` or ``?``).
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

import numpy as np


def _check(prompts: Sequence[str], responses: Sequence[str]) -> None:
    if len(prompts) != len(responses):
        raise ValueError(f"reward function got {len(prompts)} prompts and {len(responses)} responses")
    for i, r in enumerate(responses):
        if not isinstance(r, str):
            raise TypeError(f"response {i} must be a string, got {type(r).__name__}")


@functools.lru_cache(maxsize=1)
def _vader():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_reward(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
    """VADER compound score of each response (the prompt is ignored), float32 [N] in [-1, 1]."""
    _check(prompts, responses)
    sia = _vader()
    return np.array([sia.polarity_scores(r)["compound"] for r in responses], dtype=np.float32)


def length_reward(prompts: Sequence[str], responses: Sequence[str], *, target_length: int = 32) -> np.ndarray:
    """``-|n_words - target_length| / target_length`` per response, float32 [N]."""
    _check(prompts, responses)
    if target_length < 1:
        raise ValueError(f"target_length must be >= 1, got {target_length}")
    n = np.array([len(r.split()) for r in responses], dtype=np.float32)
    return (-np.abs(n - target_length) / np.float32(target_length)).astype(np.float32)


def format_reward(prompts: Sequence[str], responses: Sequence[str], *, pattern: str = r"[A-Z].*[.!?]") -> np.ndarray:
    """1.0 where ``re.fullmatch(pattern, response.strip(), re.DOTALL)`` matches, else 0.0; float32 [N]."""
    _check(prompts, responses)
    try:
        rx = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ValueError(f"reward.format_pattern {pattern!r} is not a valid regular expression: {e}") from None
    return np.array([1.0 if rx.fullmatch(r.strip()) else 0.0 for r in responses], dtype=np.float32)
