"""The data-efficiency ratio the sweeps once reported, kept only so that
``python -m jaxppo.sweeps.calibrate`` can show its miscalibration. Nothing prints it.

``ratio = budget / s`` with ``s`` the first ``x`` at which the seed-mean variant curve reaches the baseline's
mean final reward (linear interpolation between grid points, also between ``x_0 = 0`` and the first evaluation,
where nothing was measured), and a 95% percentile seed bootstrap: each draw resamples the baseline's seeds (the
target) and the variant's seeds (the curve) with replacement; the interval is the 2.5% order statistic rounded
down and the 97.5% one rounded up. Both the point ratio and the interval are biased upward: the noisy curve meets
a noisy target early more often than late.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def first_crossing(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """First ``x`` where the piecewise-linear curve reaches ``target`` (``x_0`` if ``y_0 >= target``, else
    ``x_{i-1} + (target - y_{i-1})(x_i - x_{i-1})/(y_i - y_{i-1})`` for the first ``y_i >= target``; NaN if none)."""
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not math.isfinite(target):
        return math.nan
    hit = np.nonzero(ya >= target)[0]
    if hit.size == 0:
        return math.nan
    i = int(hit[0])
    if i == 0:
        return float(xa[0])
    x0, x1, y0, y1 = xa[i - 1], xa[i], ya[i - 1], ya[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def efficiency_ratio(budget: float, samples: float) -> float:
    """``budget / samples``; 0 when never reached (NaN), inf at 0 samples."""
    if math.isnan(samples):
        return 0.0
    return math.inf if samples == 0 else float(budget / samples)


def efficiency_ci(x, base_final, curves, budget: float, *, resamples: int = 2000,
                  rng: np.random.Generator) -> tuple[float, float, float]:
    """``(ratio, lo, hi)`` of the old statistic (module docstring); ``curves``: ``[n_seeds, len(x)]``."""
    bf, cv = np.asarray(base_final, np.float64), np.asarray(curves, np.float64)
    ratio = efficiency_ratio(budget, first_crossing(x, cv.mean(axis=0), float(bf.mean())))
    draws = np.empty(resamples)
    for i in range(resamples):
        b = rng.integers(0, bf.size, bf.size)
        v = rng.integers(0, cv.shape[0], cv.shape[0])
        draws[i] = efficiency_ratio(budget, first_crossing(x, cv[v].mean(axis=0), float(bf[b].mean())))
    return (ratio, float(np.percentile(draws, 2.5, method="lower")),
            float(np.percentile(draws, 97.5, method="higher")))
