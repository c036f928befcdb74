"""Independent numpy reference for the replay tests (float64, written from the formulas, not the code)."""

from __future__ import annotations

import numpy as np


def stored(td, alpha: float, eps: float, prioritization: str = "proportional") -> np.ndarray:
    """Stored priority of ``|δ|``: ``(|δ|+ε)^α`` (proportional) or ``|δ|+ε`` (rank)."""
    raw = np.abs(np.asarray(td, np.float64)) + eps
    return raw ** alpha if prioritization == "proportional" else raw


def probs(stored_p, alpha: float, prioritization: str = "proportional") -> np.ndarray:
    """Exact ``P(i)`` over the filled slots given their stored priorities (0 = never drawn)."""
    p = np.asarray(stored_p, np.float64)
    if prioritization == "proportional":
        return p / p.sum()
    valid = p > 0
    order = np.argsort(-p, kind="stable")                     # rank 1 = largest; ties: lower slot first
    rank = np.empty(len(p))
    rank[order] = np.arange(1, len(p) + 1)
    mass = np.where(valid, rank ** (-alpha), 0.0)
    return mass / mass.sum()


def weights(P_all, indices, beta: float, weight_floor: float) -> np.ndarray:
    """PER weights: Schaul et al.'s ``u_i / max_{j in S} u_j`` with ``u_i = (N·P(i))^(-β)``, the maximum over the set
    ``S`` of valid items (P > 0) whose probability is at least ``κ·P_max``, and capped at 1 for the items outside
    ``S``. ``κ = 0``: ``S`` = every valid item (the classic weights)."""
    P_all = np.asarray(P_all, np.float64)
    valid = P_all > 0
    n = valid.sum()
    u = np.where(valid, (n * np.where(valid, P_all, 1.0)) ** (-beta), 0.0)
    in_s = valid & (P_all >= weight_floor * P_all[valid].max())
    return np.minimum(u[np.asarray(indices)] / u[in_s].max(), 1.0)


def chi_square(counts, expected_p) -> tuple[float, int]:
    """Pearson's statistic over the cells with positive expectation, and its degrees of freedom."""
    counts = np.asarray(counts, np.float64)
    expected = np.asarray(expected_p, np.float64) * counts.sum()
    cells = expected > 0
    stat = float(np.sum((counts[cells] - expected[cells]) ** 2 / expected[cells]))
    return stat, int(cells.sum()) - 1


def chi_square_critical(df: int, alpha: float = 1e-4) -> float:
    """Upper ``alpha`` quantile of χ²(df): scipy when installed, else Wilson–Hilferty (accurate to ~1%)."""
    try:
        from scipy.stats import chi2
        return float(chi2.ppf(1.0 - alpha, df))
    except ImportError:  # pragma: no cover - scipy is installed here
        from statistics import NormalDist
        z = NormalDist().inv_cdf(1.0 - alpha)
        return df * (1.0 - 2.0 / (9 * df) + z * np.sqrt(2.0 / (9 * df))) ** 3


class RefBuffer:
    """The ring buffer semantics in plain numpy: items, stored priorities, running max, ring cursor."""

    def __init__(self, capacity: int, alpha: float, eps: float, prioritization: str = "proportional"):
        self.capacity, self.alpha, self.eps, self.prio = capacity, alpha, eps, prioritization
        self.items = np.zeros(capacity, np.float64)
        self.p = np.zeros(capacity, np.float64)
        self.max_p, self.pos, self.size = 1.0, 0, 0

    def add(self, values, td=None) -> None:
        for j, v in enumerate(values):
            new = self.max_p if td is None else stored(td[j], self.alpha, self.eps, self.prio)
            self.items[self.pos], self.p[self.pos] = v, new
            self.max_p = max(self.max_p, new)
            self.pos = (self.pos + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def update(self, indices, td) -> None:
        new = {}
        for i, t in zip(indices, td):               # duplicates: the largest new value of a slot wins
            new[int(i)] = max(new.get(int(i), -np.inf), stored(t, self.alpha, self.eps, self.prio))
        for i, v in new.items():
            self.p[i] = v
            self.max_p = max(self.max_p, v)

    def probs(self) -> np.ndarray:
        return probs(self.p[:self.size], self.alpha, self.prio)
