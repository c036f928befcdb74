"""Random test inputs: masks with a fully masked row, interior zeros, a full row and right padding."""

from __future__ import annotations

import numpy as np


def random_mask(rng: np.random.Generator, b: int, t: int) -> np.ndarray:
    """``[b, t]`` float mask; row 0 fully masked, row 1 full, row 2 right-padded, the rest with interior holes."""
    assert b >= 4 and t >= 4
    m = (rng.random((b, t)) > 0.3).astype(np.float32)
    m[0] = 0
    m[1] = 1
    m[2] = 0
    m[2, : t // 2] = 1
    m[3, 1:-1] = 1
    m[3, t // 2] = 0  # an interior hole
    return m


def random_inputs(seed: int = 0, b: int = 6, t: int = 9, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    x = lambda: (scale * rng.normal(size=(b, t))).astype(np.float32)  # noqa: E731
    return rng, random_mask(rng, b, t), x
