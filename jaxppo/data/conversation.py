"""Conversational text fields (TRL's "conversational" dataset forms) and their rendering by a chat template.

A text field (``prompt``, ``response`` / ``completion``, ``chosen``, ``rejected``) is either a string
or a list of messages ``{"role": "system" | "user" | "assistant", "content": str}`` (other keys of a
message are ignored). Parsed messages are :class:`Message` tuples (:data:`Conversation`), hashable, so
a conversational prompt can key prompt groups and by-prompt splits like a string.

Row forms:

- scored: ``prompt`` messages ending with a user turn + ``response`` (or TRL's ``completion``): one or
  more assistant messages (a plain string response after a conversational prompt is one assistant message);
- preference, explicit prompt: ``prompt`` messages + ``chosen`` / ``rejected`` assistant messages;
- preference, implicit prompt: ``chosen`` / ``rejected`` full conversations; the prompt is everything but
  their last message, which must be an assistant turn in both, and the rest must be identical.

Rendering (:func:`render`), with the tokenizer's chat template ``apply(messages)``::

    prompt_text   = apply(prompt, add_generation_prompt=True)
    full_text     = apply(prompt + response)
    response_text = full_text[len(prompt_text):]          (prompt_text must be a prefix of full_text)

and whitespace after a final end-of-sequence token is cut from ``response_text`` (ChatML's
``"<|im_end|>\\n"`` -> ``"<|im_end|>"`` when ``<|im_end|>`` is the tokenizer's EOS), so a human response
ends like a sampled one: with the EOS token. Rendered texts are tokenized without added special tokens
(the template writes any BOS itself). A tokenizer without a chat template is a :class:`DataError` naming
the fixes (a model whose tokenizer has one, or ``data.chat_template_file``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from jaxppo.data.report import DataError, RowSkip

ROLES = ("system", "user", "assistant")


class Message(NamedTuple):
    """One chat message."""

    role: str
    content: str


Conversation = tuple[Message, ...]
Text = str | Conversation


def is_conversation(value: Any) -> bool:
    """True for a parsed conversation (a tuple of :class:`Message`)."""
    return isinstance(value, tuple) and all(isinstance(m, Message) for m in value)


def check_str(value: Any, label: str, max_chars: int, *, allow_empty: bool = False,
              type_reason: str = "not_a_string", show_value: bool = True) -> str:
    """``value`` (a str, or UTF-8 bytes) as a usable text, or :class:`RowSkip` whose message starts with ``label``.

    Reasons: ``invalid_utf8`` (bytes that do not decode, or a str with lone surrogates), ``type_reason``
    (not a string; the message shows the value's start when ``show_value``), ``empty_text`` (empty or
    whitespace, unless ``allow_empty``), ``text_too_long`` (more than ``max_chars`` characters).
    """
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RowSkip("invalid_utf8", f"{label} is not valid UTF-8 ({e})") from None
    if not isinstance(value, str):
        shown = f" {value!r:.40}" if show_value else ""
        raise RowSkip(type_reason, f"{label} must be a string, got {type(value).__name__}{shown}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RowSkip("invalid_utf8", f"{label} is not valid UTF-8 ({e.reason} at {e.start})") from None
    if not value.strip() and not allow_empty:
        raise RowSkip("empty_text", f"{label} is empty")
    if len(value) > max_chars:
        raise RowSkip("text_too_long", f"{label} has {len(value)} characters > data.max_text_chars={max_chars}")
    return value


def _content(value: Any, where: str, max_chars: int) -> str:
    return check_str(value, f"{where} content", max_chars, type_reason="bad_message", show_value=False)


def parse_messages(value: Any, name: str, max_chars: int = 100_000) -> Conversation:
    """A list of ``{"role", "content"}`` mappings as a :data:`Conversation`, or :class:`RowSkip`.

    Reasons: ``empty_conversation``, ``bad_message`` (not a mapping, no string role/content),
    ``unknown_role``, ``empty_text`` / ``text_too_long`` / ``invalid_utf8`` (of a content).
    """
    items = value.tolist() if isinstance(value, np.ndarray) else list(value)
    if not items:
        raise RowSkip("empty_conversation", f"{name!r} is an empty list of messages")
    out = []
    for k, m in enumerate(items):
        where = f"{name!r}[{k}]"
        if not isinstance(m, Mapping):
            raise RowSkip("bad_message", f"{where} is a {type(m).__name__}, not a {{'role', 'content'}} message")
        if "role" not in m or "content" not in m or m["role"] is None or m["content"] is None:
            raise RowSkip("bad_message", f"{where} has no {'role' if m.get('role') is None else 'content'}")
        role = m["role"]
        if role not in ROLES:
            raise RowSkip("unknown_role", f"{where} has role {role!r:.40}; expected one of {', '.join(ROLES)}")
        out.append(Message(role, _content(m["content"], where, max_chars)))
    return tuple(out)


def check_prompt(conv: Conversation, name: str = "prompt") -> Conversation:
    """``conv`` if its last turn is a user turn, else ``RowSkip('prompt_not_user_last')``."""
    if conv[-1].role != "user":
        raise RowSkip("prompt_not_user_last", f"{name!r} ends with a {conv[-1].role!r} turn, not a 'user' turn")
    return conv


def as_response(value: Text, name: str) -> Conversation:
    """``value`` as assistant message(s): a string becomes one assistant message; a conversation must
    hold only assistant turns (``RowSkip('response_not_assistant')``)."""
    if isinstance(value, str):
        return (Message("assistant", value),)
    for k, m in enumerate(value):
        if m.role != "assistant":
            raise RowSkip("response_not_assistant", f"{name!r}[{k}] is a {m.role!r} turn; a response holds "
                                                    "assistant turns only")
    return value


def split_implicit(chosen: Conversation, rejected: Conversation) -> tuple[Conversation, Conversation, Conversation]:
    """``(prompt, chosen_response, rejected_response)`` of an implicit-prompt preference row.

    Both conversations must end with an assistant turn (``response_not_assistant``) and be identical
    before it (``conversation_mismatch``); the shared prefix must end with a user turn.
    """
    for name, conv in (("chosen", chosen), ("rejected", rejected)):
        if conv[-1].role != "assistant":
            raise RowSkip("response_not_assistant", f"the last turn of {name!r} is a {conv[-1].role!r} turn, "
                                                    "not an assistant turn")
    if chosen[:-1] != rejected[:-1]:
        k = next((i for i, (a, b) in enumerate(zip(chosen[:-1], rejected[:-1])) if a != b),
                 min(len(chosen), len(rejected)) - 1)
        raise RowSkip("conversation_mismatch", f"chosen ({len(chosen)} turns) and rejected ({len(rejected)} turns) "
                                               f"differ at turn {k}, before their last assistant turn")
    if len(chosen) < 2:
        raise RowSkip("empty_conversation", "chosen/rejected hold only the assistant turn: no prompt")
    return check_prompt(chosen[:-1], "prompt (shared prefix of chosen and rejected)"), chosen[-1:], rejected[-1:]


def to_json(value: Text) -> str | list[dict[str, str]]:
    """A JSON-ready form: strings as they are, conversations as lists of ``{"role", "content"}``."""
    if isinstance(value, str):
        return value
    return [{"role": m.role, "content": m.content} for m in value]


def require_chat_template(tokenizer: Any) -> None:
    """DataError naming the fixes when ``tokenizer`` has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the data holds chat messages but the tokenizer has no chat template: use a model whose "
                        "tokenizer has one (e.g. model.path=smollm2), or set data.chat_template_file=<a Jinja "
                        "template file> (model.tokenizer_path can also point at another tokenizer)")


def apply_chat_template_file(tokenizer: Any, path: str | None) -> Any:
    """Set ``tokenizer.chat_template`` to the text of the Jinja file ``path`` (no-op for None); returns it."""
    if path is None:
        return tokenizer
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"data.chat_template_file {path} is not a file")
    text = p.read_text(encoding="utf-8")
    if not text.strip():
        raise DataError(f"data.chat_template_file {path} is empty")
    tokenizer.chat_template = text
    return tokenizer


def _apply(tokenizer: Any, conv: Conversation, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in conv], tokenize=False,
                                         add_generation_prompt=generation_prompt)


def render_prompt(tokenizer: Any, prompt: Conversation) -> str:
    """The chat template applied to ``prompt`` with the assistant generation prompt."""
    require_chat_template(tokenizer)
    return _apply(tokenizer, prompt, True)


def render(tokenizer: Any, prompt: Conversation, response: Conversation) -> tuple[str, str]:
    """``(prompt_text, response_text)`` (see the module docstring); ``RowSkip('template_mismatch')``
    when the rendered prompt is not a prefix of the rendered conversation."""
    prompt_text = render_prompt(tokenizer, prompt)
    full = _apply(tokenizer, prompt + response, False)
    if not full.startswith(prompt_text):
        k = next((i for i, (a, b) in enumerate(zip(prompt_text, full)) if a != b), min(len(full), len(prompt_text)))
        raise RowSkip("template_mismatch", f"the rendered prompt is not a prefix of the rendered conversation "
                                           f"(they differ from character {k}: {prompt_text[k:k + 30]!r} vs "
                                           f"{full[k:k + 30]!r})")
    response_text = full[len(prompt_text):]
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos and response_text.rstrip().endswith(eos):
        response_text = response_text.rstrip()
    if not response_text.strip():
        raise RowSkip("empty_text", "the chat template renders the response to no text")
    return prompt_text, response_text


def render_rows(tokenizer: Any, prompts: Sequence[Text], responses: Sequence[Sequence[Text]]
                ) -> tuple[list[str | None], list[list[str | None]], dict[int, RowSkip]]:
    """Render the conversational rows of a batch.

    ``responses`` holds one sequence per response field (``[responses]`` for scored rows, ``[chosen,
    rejected]`` for pairs). Returns ``(prompt_texts, response_texts, failures)``: for a row whose prompt is
    a conversation the rendered texts, for a plain-text row ``None`` (it is encoded as before), and
    ``failures[i]`` the :class:`RowSkip` of each row that could not be rendered.
    """
    p_out: list[str | None] = [None] * len(prompts)
    r_out: list[list[str | None]] = [[None] * len(prompts) for _ in responses]
    failures: dict[int, RowSkip] = {}
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if any(not isinstance(field[i], str) for field in responses):
                failures[i] = RowSkip("mixed_text_and_messages", "a plain-text prompt with chat-message responses")
            continue
        try:
            for f, field in enumerate(responses):
                p_out[i], r_out[f][i] = render(tokenizer, p, as_response(field[i], "response"))
        except RowSkip as e:
            failures[i] = e
    return p_out, r_out, failures
