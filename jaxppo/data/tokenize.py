"""Tokenization to fixed shapes: left-padded prompts, right-padded responses with masks.

Layout (shared with the trainer and the behaviour log-probs): the model input of row ``i`` is
``concat(prompt_ids[i], response_ids[i])`` with attention mask ``concat(prompt_mask[i],
response_mask[i])``; prompts are **left**-padded to ``P = data.max_prompt_length`` and responses
**right**-padded to ``R = data.max_response_length``, so the last prompt token always sits at
position ``P - 1`` and response token ``t`` is predicted by the logits at ``P + t - 1``.

Truncation policy ``data.truncation`` for a text longer than its budget:

- ``"left"``: an over-long prompt loses its first tokens (the end, next to the response, is kept);
- ``"right"``: an over-long prompt loses its last tokens;
- in both cases an over-long response keeps its first ``R`` tokens (and its behaviour log-probs
  are cut with it): a response is a continuation of its prompt, so only its end can go;
- ``"skip"``: rows that do not fit are dropped (``prompt_too_long`` / ``response_too_long``);
- ``"error"``: the first row that does not fit raises :class:`DataError`.

Every truncation is counted in the :class:`DataReport` (``truncated`` and ``tokens_dropped``, out of ``fitted``);
a field truncated in more than ``report.TRUNCATION_WARN_SHARE`` of its rows gets a warning naming the key to
raise (:meth:`DataReport.warnings`).

Conversational rows (prompt and responses as chat messages) are rendered by the tokenizer's chat
template first (:func:`jaxppo.data.conversation.render`: prompt with the generation prompt, response
= rendered conversation minus rendered prompt) and the texts are tokenized without added special
tokens; a row that cannot be rendered is skipped with its reason (e.g. ``template_mismatch``).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import numpy as np

from jaxppo.data.conversation import Text, render_prompt, render_rows
from jaxppo.data.report import DataError, DataReport, RowSkip
from jaxppo.data.schemas import PreferencePair, ScoredTrajectory

Truncation = Literal["error", "left", "right", "skip"]

_Skip = RowSkip


def pad_id_of(tokenizer: Any) -> int:
    """The id used for padding: the tokenizer's pad token, else its EOS token, else 0."""
    for name in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, name, None)
        if isinstance(v, int):
            return v
    return 0


def _encode_plain(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]]


def encode_prompts(tokenizer: Any, prompts: Sequence[Text], *, chat_template: bool = False) -> list[list[int]]:
    """Token ids of each prompt: with the tokenizer's special tokens (e.g. BOS), or — with
    ``chat_template`` — the user turn rendered by the tokenizer's chat template plus the
    assistant generation prompt. A conversational prompt (chat messages) is always rendered by the
    chat template with the generation prompt and tokenized without added special tokens."""
    if not prompts:
        return []
    if any(not isinstance(p, str) for p in prompts):
        conv = {i: _encode_plain(tokenizer, [render_prompt(tokenizer, p)])[0]
                for i, p in enumerate(prompts) if not isinstance(p, str)}
        texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        plain = dict(zip(texts, encode_prompts(tokenizer, [prompts[i] for i in texts], chat_template=chat_template)))
        return [conv[i] if i in conv else plain[i] for i in range(len(prompts))]
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("chat_template=true but the tokenizer has no chat template")
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        return [list(x) for x in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]
    return [list(x) for x in tokenizer(list(prompts), add_special_tokens=True, verbose=False)["input_ids"]]


def encode_responses(tokenizer: Any, responses: Sequence[str]) -> list[list[int]]:
    """Token ids of each response, without special tokens."""
    return _encode_plain(tokenizer, responses)


def encode_rows(tokenizer: Any, prompts: Sequence[Text], responses: Sequence[Sequence[Text]], *,
                chat_template: bool = False) -> tuple[list[list[int]], list[list[list[int]]], dict[int, RowSkip]]:
    """Token ids of rows whose fields may be strings or conversations.

    ``responses`` has one sequence per response field (``[responses]`` or ``[chosen, rejected]``).
    Plain-text rows: :func:`encode_prompts` / :func:`encode_responses`. Conversational rows: the
    texts of :func:`jaxppo.data.conversation.render_rows` tokenized without special tokens.
    Returns ``(prompt_ids, response_ids per field, failures)``; a failed row has empty id lists and
    its :class:`RowSkip` in ``failures``.
    """
    p_text, r_text, failures = render_rows(tokenizer, prompts, responses)
    plain = [i for i, p in enumerate(prompts) if isinstance(p, str) and i not in failures]
    conv = [i for i, t in enumerate(p_text) if t is not None and i not in failures]
    p_ids: list[list[int]] = [[] for _ in prompts]
    r_ids: list[list[list[int]]] = [[[] for _ in prompts] for _ in responses]
    for i, ids in zip(plain, encode_prompts(tokenizer, [prompts[i] for i in plain], chat_template=chat_template)):
        p_ids[i] = ids
    for i, ids in zip(conv, _encode_plain(tokenizer, [p_text[i] for i in conv])):
        p_ids[i] = ids
    for f, field in enumerate(responses):
        for i, ids in zip(plain, _encode_plain(tokenizer, [field[i] for i in plain])):
            r_ids[f][i] = ids
        for i, ids in zip(conv, _encode_plain(tokenizer, [r_text[f][i] for i in conv])):
            r_ids[f][i] = ids
    return p_ids, r_ids, failures


def fit_prompt(ids: Sequence[int], max_len: int, truncation: Truncation) -> tuple[list[int], int]:
    """``(ids cut to max_len by the policy, number of tokens cut)``; raises ``_Skip`` for skip/error."""
    ids = list(ids)
    n = len(ids) - max_len
    if n <= 0:
        return ids, 0
    if truncation in ("skip", "error"):
        raise _Skip("prompt_too_long", f"prompt has {len(ids)} tokens > data.max_prompt_length={max_len}")
    return (ids[n:] if truncation == "left" else ids[:max_len]), n


def fit_response(ids: Sequence[int], max_len: int, truncation: Truncation) -> tuple[list[int], int]:
    """``(first max_len ids, number cut)``; raises ``_Skip`` for skip/error."""
    ids = list(ids)
    n = len(ids) - max_len
    if n <= 0:
        return ids, 0
    if truncation in ("skip", "error"):
        raise _Skip("response_too_long", f"response has {len(ids)} tokens > data.max_response_length={max_len}")
    return ids[:max_len], n


def left_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [N, length] int32, mask [N, length] int32)`` with each sequence flush right."""
    ids = np.full((len(seqs), length), pad_id, dtype=np.int32)
    mask = np.zeros((len(seqs), length), dtype=np.int32)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has {len(s)} tokens > {length}")
        if len(s):
            ids[i, length - len(s):] = s
            mask[i, length - len(s):] = 1
    return ids, mask


def right_pad(seqs: Sequence[Sequence[float]], length: int, pad_value: float | int,
              dtype: Any = np.int32) -> tuple[np.ndarray, np.ndarray]:
    """``(values [N, length], mask [N, length] int32)`` with each sequence flush left."""
    vals = np.full((len(seqs), length), pad_value, dtype=dtype)
    mask = np.zeros((len(seqs), length), dtype=np.int32)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has {len(s)} tokens > {length}")
        vals[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return vals, mask


def _handle(skip: _Skip, index: int, truncation: Truncation, report: DataReport) -> None:
    msg = f"row {index}: {skip.message}"
    if truncation == "error":
        raise DataError(f"{msg} (data.truncation=error; use left/right to truncate or skip to drop such rows)")
    report.skip(skip.reason, msg)


def _check_vocab(ids: Sequence[int], name: str, vocab_size: int | None) -> None:
    if vocab_size is not None and len(ids) and max(ids) >= vocab_size:
        raise _Skip("bad_token_ids", f"{name} has token id {max(ids)} >= vocabulary size {vocab_size}")


def group_ids(rows: Sequence[ScoredTrajectory]) -> np.ndarray:
    """Dense int32 group ids: rows with the same ``group_id`` (or, when it is absent, the same
    prompt text) share an id; ids are numbered in order of first appearance."""
    table: dict[tuple[str, Any], int] = {}
    out = np.empty(len(rows), dtype=np.int32)
    for i, r in enumerate(rows):
        key = ("prompt", r.prompt) if r.group_id is None else ("group", r.group_id)
        out[i] = table.setdefault(key, len(table))
    return out


def _encode_scored(rows: Sequence[ScoredTrajectory], tokenizer: Any, logged_rows: list[int],
                   chat_template: bool) -> tuple[dict[int, list[int]], dict[int, list[int]], dict[int, Exception]]:
    """Token ids of the rows that need encoding: ``(prompt tokens, response tokens, failures)`` by row position.
    Rows with both id lists are not encoded; logged rows get the prompt encoding and the answer as plain text."""
    need = [i for i, r in enumerate(rows) if r.logged is None and (r.prompt_ids is None or r.response_ids is None)]
    p_enc, (r_enc,), failed = encode_rows(tokenizer, [rows[i].prompt for i in need], [[rows[i].response for i in need]],
                                          chat_template=chat_template)
    p_tok, r_tok = dict(zip(need, p_enc)), dict(zip(need, r_enc))
    failures = {need[j]: e for j, e in failed.items()}
    for i in logged_rows:
        try:
            p_tok[i] = encode_prompts(tokenizer, [rows[i].prompt], chat_template=chat_template)[0]
            r_tok[i] = _encode_plain(tokenizer, [rows[i].response])[0]
        except RowSkip as e:
            failures[i] = e
    return p_tok, r_tok, failures


def _scored_tokens(r: ScoredTrajectory, p_enc: Any, r_enc: Any, vocab: int | None) -> tuple[list[int], list[int]]:
    """The row's prompt and response tokens (its own ids, else the encoded ones), checked against the vocabulary
    and for emptiness (:class:`_Skip` otherwise)."""
    p = list(r.prompt_ids) if r.prompt_ids is not None else p_enc
    y = list(r.response_ids) if r.response_ids is not None else r_enc
    _check_vocab(p, "prompt_ids", vocab)
    _check_vocab(y, "response_ids", vocab)
    if not p:
        raise _Skip("empty_tokens", "the prompt tokenizes to no tokens")
    if not y:
        raise _Skip("empty_tokens", "the response tokenizes to no tokens")
    return p, y


def _scored_logprobs(tokenizer: Any, r: ScoredTrajectory, y: list[int], logged_mismatch: str,
                     counts: dict[str, int]) -> Any:
    """The row's behaviour log-probs (``None`` without): its own, or a logged row's aligned to ``y``
    (``counts["aligned"]`` / ``counts["recomputed"]`` count the outcomes); one per response token (:class:`_Skip`
    ``logprob_length_mismatch`` otherwise)."""
    from jaxppo.data.logged import align

    lp = r.behaviour_logprobs
    if r.logged is not None:
        lp = align(tokenizer, y, r.logged)
        if lp is None:
            if logged_mismatch == "skip":
                raise _Skip("mismatched_tokens", f"the {len(r.logged)} logged tokens are not our "
                                                 f"{len(y)} tokens of the answer (data.logged_mismatch=skip)")
            counts["recomputed"] += 1
        else:
            counts["aligned"] += 1
    if lp is not None and len(lp) != len(y):
        raise _Skip("logprob_length_mismatch", f"{len(lp)} behaviour_logprobs for {len(y)} response tokens")
    return lp


def tokenize_scored(rows: Sequence[ScoredTrajectory], tokenizer: Any, *, max_prompt_length: int,
                    max_response_length: int, truncation: Truncation = "left", chat_template: bool = False,
                    report: DataReport | None = None, logged_mismatch: str = "recompute") -> dict[str, np.ndarray]:
    """Fixed-shape arrays of scored trajectories.

    Returns ``prompt_ids``/``prompt_mask`` [N, P] (left padded), ``response_ids``/``response_mask``
    [N, R] (right padded), ``behaviour_logprobs`` [N, R] float32 (0 where absent),
    ``has_behaviour`` [N] bool (row came with logged log-probs), ``score`` [N] float32,
    ``group_id`` [N] int32, ``index`` [N] int32 (source row). Rows with ``prompt_ids`` /
    ``response_ids`` use them as they are; the others are tokenized. Behaviour log-probs must have
    one entry per response token (``logprob_length_mismatch`` otherwise).

    Logged rows (chat-completion logs, :mod:`jaxppo.data.logged`): the prompt is encoded like any prompt (a
    conversation rendered with the generation prompt), the answer as plain text; their logged tokens are aligned to
    ours (:func:`jaxppo.data.logged.align`) and give the behaviour log-probs; a row that does not align is kept
    without them (``logged_mismatch="recompute"``, counted in ``notes["mismatched_tokens_recomputed"]``) or skipped
    as ``mismatched_tokens`` (``"skip"``).
    """
    report = report if report is not None else DataReport()
    vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    logged_rows = [i for i, r in enumerate(rows) if r.logged is not None]
    p_tok, r_tok, failures = _encode_scored(rows, tokenizer, logged_rows, chat_template)
    counts = {"aligned": 0, "recomputed": 0}
    kept: list[ScoredTrajectory] = []
    prompts, responses, logprobs = [], [], []
    for i, r in enumerate(rows):
        try:
            if i in failures:
                raise failures[i]
            p, y = _scored_tokens(r, p_tok.get(i), r_tok.get(i), vocab)
            lp = _scored_logprobs(tokenizer, r, y, logged_mismatch, counts)
            p2, cut_p = fit_prompt(p, max_prompt_length, truncation)
            y2, cut_y = fit_response(y, max_response_length, truncation)
        except _Skip as s:
            _handle(s, r.index, "skip" if s.reason not in ("prompt_too_long", "response_too_long") else truncation,
                    report)
            continue
        report.fit("prompt", f"data.max_prompt_length={max_prompt_length}")
        report.fit("response", f"data.max_response_length={max_response_length}")
        if cut_p:
            report.truncate("prompt", cut_p)
        if cut_y:
            report.truncate("response", cut_y)
        kept.append(r)
        prompts.append(p2)
        responses.append(y2)
        logprobs.append(None if lp is None else np.asarray(lp, np.float32)[: len(y2)])
    if logged_rows:
        report.notes["logged_logprobs_aligned"] = counts["aligned"]
        report.notes["mismatched_tokens_recomputed"] = counts["recomputed"]
    pad = pad_id_of(tokenizer)
    prompt_ids, prompt_mask = left_pad(prompts, max_prompt_length, pad)
    response_ids, response_mask = right_pad(responses, max_response_length, pad, np.int32)
    lp_arr, _ = right_pad([x if x is not None else np.zeros(len(y), np.float32) for x, y in zip(logprobs, responses)],
                          max_response_length, 0.0, np.float32)
    report.rows_kept = len(kept)
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "response_ids": response_ids, "response_mask": response_mask,
        "behaviour_logprobs": lp_arr,
        "has_behaviour": np.array([x is not None for x in logprobs], dtype=bool),
        "score": np.array([r.score for r in kept], dtype=np.float32),
        "group_id": group_ids(kept),
        "index": np.array([r.index for r in kept], dtype=np.int32),
    }


def tokenize_preference(pairs: Sequence[PreferencePair], tokenizer: Any, *, max_prompt_length: int,
                        max_response_length: int, truncation: Truncation = "left", chat_template: bool = False,
                        report: DataReport | None = None) -> dict[str, np.ndarray]:
    """Fixed-shape arrays of preference pairs (the input of reward-model and DPO training).

    Returns ``prompt_ids``/``prompt_mask`` [N, P] (left padded, shared by both answers),
    ``chosen_ids``/``chosen_mask`` and ``rejected_ids``/``rejected_mask`` [N, R] (right padded),
    ``index`` [N] int32 (source row). An empty response is allowed (the reward is then read at the
    last prompt token). Pairs whose two answers tokenize to the same tokens are skipped as ``identical_pair``;
    pairs whose answers differ only after their first ``R`` tokens as ``identical_after_truncation`` (the model
    would see one answer twice).
    """
    report = report if report is not None else DataReport()
    p_tok, (c_tok, r_tok), failures = encode_rows(tokenizer, [x.prompt for x in pairs],
                                                  [[x.chosen for x in pairs], [x.rejected for x in pairs]],
                                                  chat_template=chat_template)
    kept, prompts, chosen, rejected = [], [], [], []
    for k, (pair, p, c, r) in enumerate(zip(pairs, p_tok, c_tok, r_tok)):
        try:
            if k in failures:
                raise failures[k]
            if not p:
                raise _Skip("empty_tokens", "the prompt tokenizes to no tokens")
            p2, cut_p = fit_prompt(p, max_prompt_length, truncation)
            c2, cut_c = fit_response(c, max_response_length, truncation)
            r2, cut_r = fit_response(r, max_response_length, truncation)
            if c2 == r2:
                if c != r:
                    raise _Skip("identical_after_truncation",
                                f"chosen and rejected differ only after their first {max_response_length} tokens "
                                f"(data.max_response_length={max_response_length}; raise it to keep the pair)")
                raise _Skip("identical_pair", "chosen and rejected tokenize to the same tokens")
        except _Skip as s:
            _handle(s, pair.row, truncation if s.reason.endswith("_too_long") else "skip", report)
            continue
        for what, n in (("prompt", cut_p), ("chosen", cut_c), ("rejected", cut_r)):
            report.fit(what, f"data.max_prompt_length={max_prompt_length}" if what == "prompt"
                       else f"data.max_response_length={max_response_length}")
            if n:
                report.truncate(what, n)
        kept.append(pair)
        prompts.append(p2)
        chosen.append(c2)
        rejected.append(r2)
    pad = pad_id_of(tokenizer)
    prompt_ids, prompt_mask = left_pad(prompts, max_prompt_length, pad)
    chosen_ids, chosen_mask = right_pad(chosen, max_response_length, pad, np.int32)
    rejected_ids, rejected_mask = right_pad(rejected, max_response_length, pad, np.int32)
    report.rows_kept = len(kept)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "chosen_ids": chosen_ids,
            "chosen_mask": chosen_mask, "rejected_ids": rejected_ids, "rejected_mask": rejected_mask,
            "index": np.array([x.index for x in kept], dtype=np.int32)}
