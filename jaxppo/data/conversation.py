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

Rendering (:func:`render`), with the tokenizer's chat template ``apply(messages)``, as TRL's
``apply_chat_template``::

    full_k        = apply(prompt + response_k)                  (one per response: chosen and rejected)
    prompt_text   = common prefix of apply(prompt, add_generation_prompt=True) and every full_k
    response_k    = full_k[len(prompt_text):]

The common prefix serves templates whose generation prompt adds text that a rendered assistant turn does not
start with (DeepSeek-R1 opens the generation with ``"<think>\n"``); for the others it is the generation prompt
itself. The prefix must still contain the whole rendered prompt ``apply(prompt)`` (``template_mismatch``
otherwise: the template renders the prompt differently inside the conversation).

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


def _content(value: Any, where: str, max_chars: int, allow_empty: bool = False) -> str:
    return check_str(value, f"{where} content", max_chars, type_reason="bad_message", show_value=False,
                     allow_empty=allow_empty)


def parse_messages(value: Any, name: str, max_chars: int = 100_000) -> Conversation:
    """A list of ``{"role", "content"}`` mappings as a :data:`Conversation`, or :class:`RowSkip`.

    Reasons: ``empty_conversation``, ``bad_message`` (not a mapping, no string role/content),
    ``unknown_role``, ``empty_text`` / ``text_too_long`` / ``invalid_utf8`` (of a content). A system message
    may be empty (chat templates render it, as TRL does); a user or assistant message may not.
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
        out.append(Message(role, _content(m["content"], where, max_chars, allow_empty=role == "system")))
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


def _common_prefix(a: str, b: str) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:k]


def render(tokenizer: Any, prompt: Conversation, *responses: Conversation) -> tuple[str, ...]:
    """``(prompt_text, response_text, ...)``, one response text per response (see the module docstring);
    ``RowSkip('template_mismatch')`` when a rendered conversation does not start with the rendered prompt."""
    gen_prompt = render_prompt(tokenizer, prompt)
    base = _apply(tokenizer, prompt, False)
    fulls = [_apply(tokenizer, prompt + r, False) for r in responses]
    prompt_text = gen_prompt
    for full in fulls:
        if not full.startswith(base):
            k = len(_common_prefix(base, full))
            raise RowSkip("template_mismatch", f"the rendered prompt is not a prefix of the rendered conversation "
                                               f"(they differ from character {k}: {base[k:k + 30]!r} vs "
                                               f"{full[k:k + 30]!r})")
        prompt_text = _common_prefix(prompt_text, full)
    if len(prompt_text) < len(base):
        k = len(prompt_text)
        raise RowSkip("template_mismatch", f"the generation prompt changes the rendered prompt (from character {k}: "
                                           f"{gen_prompt[k:k + 30]!r} vs {base[k:k + 30]!r})")
    eos = getattr(tokenizer, "eos_token", None)
    texts = []
    for full in fulls:
        response_text = full[len(prompt_text):]
        if isinstance(eos, str) and eos and response_text.rstrip().endswith(eos):
            response_text = response_text.rstrip()
        if not response_text.strip():
            raise RowSkip("empty_text", "the chat template renders the response to no text")
        texts.append(response_text)
    return (prompt_text, *texts)


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
        try:   # one prompt text for all the row's responses (the common prefix of all their renderings)
            p_out[i], *texts = render(tokenizer, p, *(as_response(field[i], "response") for field in responses))
            for f, text in enumerate(texts):
                r_out[f][i] = text
        except RowSkip as e:
            failures[i] = e
    return p_out, r_out, failures
