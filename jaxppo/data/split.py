"""The training / held-out split every run uses (training, ``jaxppo evaluate``, the plan)."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxppo.data.behaviour import load_scored_arrays
from jaxppo.data.label_noise import noisy_scores
from jaxppo.data.pipeline import split_by_group


def split_data(cfg: Any, tokenizer: Any, *, reference_path: str | None = None,
               reference: Any = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Any]:
    """``(train, heldout, report)``: the rows of ``cfg.data`` tokenized and split by prompt group with
    ``split_by_group(group_id, data.eval_fraction, data.seed)`` — the split of every run (training and
    ``jaxppo.evaluate``). With a reference (path and model) the rows without logged behaviour log-probs get
    them from it (training needs them); without, they stay 0 — the rows and the split do not depend on it.
    With ``data.score_noise_sd > 0`` the training rows' scores get label noise
    (:func:`jaxppo.data.label_noise.noisy_scores` with ``trainer.seed``); the held-out rows keep theirs.
    """
    arrays, report = load_scored_arrays(cfg.data, tokenizer, reference_path=reference_path, reference=reference)
    train_rows, eval_rows = split_by_group(arrays["group_id"].tolist(), cfg.data.eval_fraction, cfg.data.seed)
    train = {k: np.asarray(v)[train_rows] for k, v in arrays.items()}
    heldout = {k: np.asarray(v)[eval_rows] for k, v in arrays.items()}
    if cfg.data.score_noise_sd > 0:
        train["score"] = noisy_scores(train["score"], train["index"], cfg.data.score_noise_sd, cfg.trainer.seed)
    return train, heldout, report
