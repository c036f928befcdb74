"""Unpaired binary feedback (TRL's ``prompt``, ``completion``, boolean ``label``) laid out for KTO.

The rows are read and tokenized by the scored-row path (``data.schema=scored``: ``label`` True -> score 1, False ->
score 0; every bad row counted), then :func:`kto_layout` puts them in the two-answer layout of the preference
trainers: row ``i``'s prompt with its own answer in the first slot (``chosen_*``, the judged answer) and, in the
second slot (``rejected_*``), the answer of row ``order[i] = (i − 1) mod N``
(:func:`jaxppo.ops.kto_mismatched_order`, TRL's shift of the answers by one): the mismatched pair of the KL
reference point ``z0``. ``desirable`` [N] bool is the label: score > ½ (a label gives 1 or 0; the win-rate scores
of ``reward to-scored`` without a reward model also lie in [0, 1], so HH pairs become KTO rows: only-chosen answers
desirable, only-rejected ones not). Scores outside [0, 1] (a reward model's) are a :class:`DataError`.
"""

from __future__ import annotations

import numpy as np

from jaxppo.data.report import DataError
from jaxppo.ops.kto import kto_mismatched_order


def kto_layout(scored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The KTO layout (module docstring) of tokenized scored rows (:func:`jaxppo.data.tokenize.tokenize_scored`):
    ``prompt_ids``/``prompt_mask``, ``chosen_ids``/``chosen_mask`` (the row's answer), ``rejected_ids``/
    ``rejected_mask`` (the mismatched answer), ``desirable``, ``group_id``, ``index``."""
    n = scored["prompt_ids"].shape[0]
    if n == 0:
        raise ValueError("kto_layout: no rows")
    score = np.asarray(scored["score"])
    bad = np.flatnonzero((score < 0) | (score > 1))
    if bad.size:
        raise DataError(f"dpo.loss_type=kto reads binary feedback: a boolean label, or a score in [0, 1] (desirable "
                        f"above 1/2, e.g. the win rate of `reward to-scored` without a reward model); {bad.size} rows "
                        f"have other scores (source row {int(scored['index'][bad[0]])}: {float(score[bad[0]])})")
    order = kto_mismatched_order(n)
    return {"prompt_ids": scored["prompt_ids"], "prompt_mask": scored["prompt_mask"],
            "chosen_ids": scored["response_ids"], "chosen_mask": scored["response_mask"],
            "rejected_ids": scored["response_ids"][order], "rejected_mask": scored["response_mask"][order],
            "desirable": np.asarray(scored["score"]) > 0.5, "group_id": scored["group_id"], "index": scored["index"]}


def load_kto_arrays(cfg, tokenizer, model_path: str | None = None):
    """``(arrays, report)``: the unpaired rows of ``cfg`` (a ``DataConfig`` with ``schema=scored``) read and
    tokenized by the scored path (:func:`jaxppo.data.pipeline.check_context`, ``load_rows``, ``tokenize_rows``)
    in the :func:`kto_layout`."""
    from jaxppo.data.pipeline import check_context, load_rows, tokenize_rows

    if model_path is not None:
        check_context(cfg, model_path)
    loaded = load_rows(cfg)
    return kto_layout(tokenize_rows(loaded, tokenizer, cfg)), loaded.report


__all__ = ["kto_layout", "load_kto_arrays"]
