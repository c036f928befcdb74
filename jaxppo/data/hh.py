"""Anthropic HH-RLHF dialogues -> (prompt, response) pairs.

An HH-RLHF row holds two full dialogues, ``chosen`` and ``rejected``, made of
``"\\n\\nHuman: ..."`` and ``"\\n\\nAssistant: ..."`` turns that share everything up to the final
Assistant turn. Each dialogue is split at its **last** ``"\\n\\nAssistant:"``: the prompt is
everything up to and including that marker, the response is the rest (kept verbatim, leading space
included, so ``prompt + response`` is the original dialogue). A pair whose two prompts differ is
malformed (the shared harmless-base test file has 5 such among 2,312 rows) and is skipped with
reason ``prompt_mismatch``; a dialogue without an Assistant turn is skipped as ``no_assistant_turn``.
"""

from __future__ import annotations

ASSISTANT = "\n\nAssistant:"


def split_dialogue(text: str) -> tuple[str, str] | None:
    """``(prompt, response)`` split at the last ``"\\n\\nAssistant:"``; None if there is none."""
    i = text.rfind(ASSISTANT)
    if i < 0:
        return None
    cut = i + len(ASSISTANT)
    return text[:cut], text[cut:]


def split_pair(chosen: str, rejected: str) -> tuple[str, str, str] | tuple[str, str]:
    """Split an HH-RLHF pair into ``(prompt, chosen_response, rejected_response)``.

    On failure returns ``(reason, message)`` with reason ``"no_assistant_turn"`` or
    ``"prompt_mismatch"`` (the message shows where the two prompts first differ).
    """
    c = split_dialogue(chosen)
    r = split_dialogue(rejected)
    if c is None or r is None:
        which = "chosen" if c is None else "rejected"
        return "no_assistant_turn", f"the {which} dialogue has no {ASSISTANT!r} turn"
    if c[0] != r[0]:
        k = next((i for i, (a, b) in enumerate(zip(c[0], r[0])) if a != b), min(len(c[0]), len(r[0])))
        return "prompt_mismatch", (f"chosen and rejected prompts differ from character {k}: "
                                   f"{c[0][k:k + 40]!r} vs {r[0][k:k + 40]!r}")
    return c[0], c[1], r[1]
