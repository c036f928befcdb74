"""The end-of-sequence token ids generation stops at, in one place (evaluation, collection, probes, DPO).

``eos_ids(model_config, tokenizer)``: the model config's ``eos_token_ids`` (the HF ``config.json``
``eos_token_id``, an int or a list), else the tokenizer's ``eos_token_id`` when it is an int, else none.
Returned as ``None`` (no EOS: every generation runs to ``max_new_tokens``), a single ``int``, or a tuple of
ints — the forms :func:`jaxppo.models.generate` takes as ``eos_token_id``.
"""

from __future__ import annotations

from typing import Any


def eos_ids(model_config: Any, tokenizer: Any = None) -> int | tuple[int, ...] | None:
    """EOS ids of a model (see module doc). ``model_config``: an ``LMConfig`` or anything with
    ``eos_token_ids``; a model with a ``.config`` is accepted too."""
    cfg = getattr(model_config, "config", model_config)
    ids = tuple(int(i) for i in (getattr(cfg, "eos_token_ids", ()) or ()))
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if not ids and isinstance(tok_eos, int) and not isinstance(tok_eos, bool):
        ids = (tok_eos,)
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def eos_tuple(eos: int | tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
    """Any ``eos_token_id`` form as a tuple of ints (``None`` -> ``()``)."""
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(int(i) for i in eos)


__all__ = ["eos_ids", "eos_tuple"]
