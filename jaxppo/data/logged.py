"""Logged inference traffic: chat-completion logs with token log-probs, read as scored rows with behaviour log-probs.

A logged row (``data.schema=scored``; recognised by its ``choices``) is an OpenAI-style chat completion with the
request's messages and a score::

    {"messages": [{"role": "user", "content": "Tell me a story."}],     # or "prompt": "a plain-text prompt"
     "choices": [{"message": {"role": "assistant", "content": " Once upon a time"},
                  "logprobs": {"content": [{"token": " Once", "logprob": -0.9, "bytes": [32, 79, 110, 99, 101]},
                                           {"token": " upon", "logprob": -0.1, "bytes": [32, 117, 112, 111, 110]},
                                           ...]}}],
     "score": 0.7}

(``{"request": {"messages": ...}, "response": {"choices": ...}}`` and a ``"body"`` around the response, the batch
API's shape, are read too; vLLM's OpenAI-compatible server writes the same ``logprobs.content``.) The first choice
is used. ``bytes`` may be absent or null; the token's UTF-8 bytes are then used. The logged tokens must spell the
answer (their bytes joined = the content's UTF-8), else the row is ``bad_logprobs``.

**Alignment.** The response (the assistant content, as plain text: the model continues the rendered prompt with
it) is tokenized by our tokenizer; the bytes of each of our tokens (:func:`token_bytes`) are compared with the
logged tokens' bytes, one by one. When the two tokenizations agree token for token, the logged log-probs become
the row's behaviour log-probs (μ of offline PPO). A leading space that our tokenizer adds to the first token (a
SentencePiece "dummy prefix") is not a difference. When they disagree (another tokenizer, or a sampled
non-canonical split), ``data.logged_mismatch`` decides: ``recompute`` (default) keeps the row without log-probs, so
the reference policy computes them like for any row without logged log-probs; ``skip`` drops it. Either way the row
is counted as ``mismatched_tokens`` (a skip reason, or the note ``mismatched_tokens_recomputed``); aligned rows are
counted in the note ``logged_logprobs_aligned``.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from typing import Any, Mapping, Sequence

import numpy as np

from jaxppo.data.conversation import Text, check_prompt, check_str, parse_messages
from jaxppo.data.report import RowSkip

_Bad = RowSkip

LoggedTokens = tuple[tuple[bytes, float], ...]


def is_logged(rec: Mapping[str, Any]) -> bool:
    """Whether a (column-mapped) row is a chat-completion log (it has ``choices``, at the top or in ``response``
    / ``response.body``)."""
    return _choices(rec) is not None


def _choices(rec: Mapping[str, Any]) -> Any:
    for holder in (rec, rec.get("response"), (rec.get("response") or {}).get("body")
                   if isinstance(rec.get("response"), Mapping) else None):
        if isinstance(holder, Mapping) and holder.get("choices") is not None:
            return holder["choices"]
    return None


def _token_entry(item: Any, t: int) -> tuple[bytes, float]:
    if not isinstance(item, Mapping):
        raise _Bad("bad_logprobs", f"logprobs.content[{t}] must be an object with token, logprob and bytes")
    lp = item.get("logprob")
    if isinstance(lp, bool) or not isinstance(lp, numbers.Real) or not math.isfinite(float(lp)) or float(lp) > 1e-5:
        raise _Bad("bad_logprobs", f"logprobs.content[{t}].logprob must be a finite number <= 0, got {lp!r:.40}")
    raw = item.get("bytes")
    if raw is None:
        token = item.get("token")
        if not isinstance(token, str):
            raise _Bad("bad_logprobs", f"logprobs.content[{t}] has neither bytes nor a string token")
        data = token.encode("utf-8", "surrogatepass")
    else:
        if not isinstance(raw, (list, tuple)) or not all(isinstance(b, int) and 0 <= b < 256 for b in raw):
            raise _Bad("bad_logprobs", f"logprobs.content[{t}].bytes must be a list of byte values 0..255")
        data = bytes(raw)
    return data, min(float(lp), 0.0)


def parse_logged(rec: Mapping[str, Any], max_text_chars: int) -> tuple[Text, str, LoggedTokens]:
    """``(prompt, response content, logged tokens)`` of a chat-completion log row, or :class:`RowSkip`
    (``missing_field``, ``bad_logprobs``, the message/text reasons). The prompt is the request's ``messages``
    (ending with a user turn) or a plain ``prompt`` string."""
    req = rec.get("request") if isinstance(rec.get("request"), Mapping) else rec
    if req.get("messages") is not None:
        prompt: Text = check_prompt(parse_messages(req["messages"], "messages", max_text_chars), "messages")
    elif req.get("prompt") is not None:
        prompt = check_str(req["prompt"], "'prompt'", max_text_chars)
    else:
        raise _Bad("missing_field", "a logged row needs the request's 'messages' (or a 'prompt' string)")
    choices = _choices(rec)
    if not isinstance(choices, (list, tuple)) or not choices or not isinstance(choices[0], Mapping):
        raise _Bad("missing_field", "'choices' must be a non-empty list of completions")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping) or message.get("content") is None:
        raise _Bad("missing_field", "choices[0].message.content is missing")
    content = check_str(message["content"], "'choices[0].message.content'", max_text_chars)
    content_lp = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
    if not isinstance(content_lp, (list, tuple)) or not content_lp:
        raise _Bad("missing_field", "choices[0].logprobs.content is missing or empty (request logprobs=true)")
    tokens = tuple(_token_entry(item, t) for t, item in enumerate(content_lp))
    spelled = b"".join(b for b, _ in tokens)
    if spelled != content.encode("utf-8"):
        raise _Bad("bad_logprobs", f"the logged tokens spell {spelled[:40]!r}..., not the content "
                                   f"{content.encode('utf-8')[:40]!r}...")
    return prompt, content, tokens


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte -> printable-character table of byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel" in str(getattr(backend, "decoder", ""))


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> list[bytes]:
    """The bytes each token id stands for: ``<0xNN>`` byte tokens as that byte; byte-level BPE vocabularies
    (GPT-2 style, ``ByteLevel`` decoder) through the inverse of their byte table; other (SentencePiece) pieces as
    UTF-8 with ``"▁"`` read as a space."""
    pieces = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    table = _unicode_to_byte() if _byte_level(tokenizer) else None
    out = []
    for p in pieces:
        m = _BYTE_TOKEN.fullmatch(p)
        if m:
            out.append(bytes([int(m.group(1), 16)]))
        elif table is not None:
            out.append(b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in p))
        else:
            out.append(p.replace("\u2581", " ").encode("utf-8"))
    return out


def align(tokenizer: Any, ids: Sequence[int], logged: LoggedTokens) -> np.ndarray | None:
    """The logged log-probs as one float32 per token of ``ids`` when our tokens are the logged tokens (same
    count, same bytes each; a leading space our tokenizer adds to the first token is ignored), else None."""
    if len(ids) != len(logged):
        return None
    ours = token_bytes(tokenizer, ids)
    theirs = [b for b, _ in logged]
    if ours and theirs and ours[0] != theirs[0] and ours[0] == b" " + theirs[0]:
        ours[0] = theirs[0]
    if ours != theirs:
        return None
    return np.array([lp for _, lp in logged], np.float32)


__all__ = ["LoggedTokens", "align", "is_logged", "parse_logged", "token_bytes"]
