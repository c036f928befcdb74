"""Label noise on the training scores: ``s~_i = s_i + sd * z_i``, ``z_i ~ N(0, 1)`` i.i.d. per dataset row.

For experiments on noisy rewards (``data.score_noise_sd``): the training rows see the noisy scores, the held-out
evaluation scores fresh samples with the clean reward. ``z_i`` depends only on ``seed`` (the run's
``trainer.seed``) and the row's index in the data file, so two variants of a sweep with the same seed train on the
same noisy labels (a seed-paired comparison), whatever order or subset of the rows they use, and every seed draws
new noise.
"""

from __future__ import annotations

import numpy as np

_STREAM = 0x5C0E  # the random stream of label noise (independent of the trainer's other draws from the seed)


def noisy_scores(scores: np.ndarray, row_index: np.ndarray, sd: float, seed: int) -> np.ndarray:
    """``scores + sd * z[row_index]`` as float32 (module docstring); ``scores`` unchanged (a copy) when ``sd == 0``.

    ``z`` is the first ``max(row_index) + 1`` draws of ``numpy.random.default_rng([seed, 0x5C0E])``'s standard
    normal, so row ``i`` gets the same ``z_i`` in every run with this seed."""
    s = np.asarray(scores, np.float32)
    idx = np.asarray(row_index, np.int64)
    if s.shape != idx.shape:
        raise ValueError(f"noisy_scores: {s.shape} scores but {idx.shape} row indices")
    if sd < 0:
        raise ValueError(f"noisy_scores: sd must be >= 0, got {sd}")
    if sd == 0 or s.size == 0:
        return s.copy()
    if idx.min() < 0:
        raise ValueError("noisy_scores: row indices must be >= 0")
    z = np.random.default_rng([int(seed), _STREAM]).standard_normal(int(idx.max()) + 1)
    return (s + np.float32(sd) * z[idx].astype(np.float32)).astype(np.float32)
