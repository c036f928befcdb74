"""Seed-paired comparisons of two arms of a sweep (pure NumPy/SciPy functions; no I/O, no JAX).

Pairing. Seed ``k`` of every variant runs with ``trainer.seed = k``, and in the trainer that one number fixes the
evaluation key (``fold_in(PRNGKey(trainer.seed), 10007)``, ``jaxppo.trainer.evaluation``), hence the reference
evaluation at step 0 (identical in both arms of a pair), and the replay / training key (``TrainState.rng =
PRNGKey(trainer.seed)``, ``fold_in(rng, step)`` per step). So the variant-minus-baseline difference of seed ``k``,
``d_k = v_k - b_k``, cancels the noise the two arms share, and the ``d_k`` of different seeds are independent.

Everything here works on those ``d_k`` (``n`` seeds present in both arms):

- :func:`t_interval`: ``dbar -+ t_{0.975, n-1} s_d / sqrt(n)`` (``s_d`` with ddof 1);
- :func:`sign_flip_pvalue`: the exact two-sided sign-flip permutation p-value
  ``p = #{e in {-1, 1}^n : |sum_k e_k d_k| >= |sum_k d_k|} / 2^n`` (valid when each ``d_k`` is symmetric about 0
  under the null, which an A/A pair is: the two arms are exchangeable). Its smallest value is ``2 / 2^n``, so with
  ``n <= 5`` seeds it can never fall below 0.05;
- :func:`value_at`: a curve's value at a sample count on its grid, linear between the two grid points around it,
  never outside ``[x_0, x_m]``;
- :func:`samples_to_target`: the first evaluation at which one seed's curve reaches a target, with censoring
  (``"below_first_eval"``: reached at the first evaluation after step 0 or already at step 0, so the crossing
  lies somewhere in ``[0, x_1]`` and nothing was measured there; ``"beyond_budget"``: not reached by ``x_m``).
  No interpolation and no extrapolation: the value is the grid point ``x_i`` where the curve is first
  ``>= target`` (the crossing lies in ``(x_{i-1}, x_i]``). Rule for non-monotone curves: first passage counts (a
  curve that reaches the target and falls back has reached it);
- :func:`paired_first_passage`: the data-efficiency comparison — per seed, the grid index at which each arm first
  reaches a target that is symmetric in the two arms (see :func:`symmetric_target`), censored values as
  ``m + 1`` ("beyond the budget"); ``d_k = i_b - i_v`` (> 0: the variant got there earlier) with the sign-flip
  test. Because the target does not depend on which arm is called the baseline, an A/A pair is exchangeable and
  the test keeps its level (measured by ``python -m jaxppo.sweeps.calibrate``);
- :func:`normalized_auc`: ``(1 / (x_m - x_0)) sum_i (x_{i+1} - x_i)(y_i + y_{i+1}) / 2`` (trapezoid rule, the
  average reward over the grid);
- :func:`paired_t_pvalue`: the two-sided paired t-test ``p = 2 P(T_{n-1} >= |dbar| sqrt(n) / s_d)``, the test whose
  95% interval is :func:`t_interval` (``p < 0.05`` exactly when the interval excludes 0);
- :func:`holm`: Holm's step-down adjustment of ``m`` p-values, ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``
  over the sorted ``p_(1) <= ... <= p_(m)``; rejecting ``p~ < alpha`` keeps the family-wise error rate at ``alpha``
  under any dependence between the tests;
- :func:`clopper_pearson`: the exact binomial interval of ``k`` events in ``n`` trials,
  ``[B(a/2; k, n - k + 1), B(1 - a/2; k + 1, n - k)]`` with ``B(q; a, b)`` the Beta quantile.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT_MAX_N = 30          # 2^30 sign vectors, counted as two halves of 2^15; above this the p-value is refused
ALPHA = 0.05
CENSOR_BELOW = "below_first_eval"
CENSOR_BEYOND = "beyond_budget"
REACHED = "reached"
NOT_MEASURED = "not_measured"   # the curve has a missing (NaN) evaluation before it reaches the target


def _vec(values, name: str) -> np.ndarray:
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name}: needs a non-empty 1-D sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: values must be finite (drop missing seeds first), got {x.tolist()}")
    return x


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df >= 1`` degrees of freedom."""
    from scipy.stats import t

    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    return float(t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` with ``mean -+ t_{0.975, n-1} s / sqrt(n)``, ``s`` the sample sd (ddof 1); NaN bounds
    when ``n < 2``. All values equal: ``lo = hi = mean``."""
    x = _vec(values, "t_interval")
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = t_quantile_975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


def sign_flip_pvalue(d: Sequence[float]) -> float:
    """Exact two-sided sign-flip p-value of the paired differences ``d`` (module docstring).

    Ties count as "at least as extreme" (``>=`` with a relative tolerance of 1e-12), so ``d = 0`` gives 1. The
    ``2^n`` signed sums are counted exactly by meeting in the middle: the sums of the first ``n // 2`` and of the
    last ``n - n // 2`` differences are enumerated separately (``2^(n/2)`` each), and for every sum ``a`` of the
    first half the sums ``b`` of the second half with ``a + b >= t`` or ``a + b <= -t`` (``t`` the observed
    ``|sum d|`` less the tolerance) are counted in the sorted second half.
    """
    x = _vec(d, "sign_flip_pvalue")
    n = x.size
    if n > EXACT_MAX_N:
        raise ValueError(f"sign_flip_pvalue: n={n} > {EXACT_MAX_N} seeds; the exact enumeration is too large")
    obs = abs(float(x.sum()))
    t = obs - 1e-12 * max(1.0, float(np.abs(x).sum()))
    if t <= 0:
        return 1.0
    h = n // 2
    a = _signs(h) @ x[:h] if h else np.zeros(1)
    b = np.sort(_signs(n - h) @ x[h:])
    upper = b.size - np.searchsorted(b, t - a, side="left")      # b >= t - a
    lower = np.searchsorted(b, -t - a, side="right")             # b <= -t - a
    return float((upper.sum() + lower.sum()) / 2.0 ** n)


@functools.cache
def _signs(n: int) -> np.ndarray:
    """Every sign vector of length ``n``, ``[2^n, n]`` (read-only, cached)."""
    out = np.asarray(list(itertools.product((-1.0, 1.0), repeat=n)))
    out.setflags(write=False)
    return out


def paired_t_pvalue(d: Sequence[float]) -> float:
    """Two-sided paired t-test p-value of the differences ``d`` (module docstring); NaN when ``n < 2``. All
    differences equal: 1 when they are 0, else 0 (a zero sd with a non-zero mean)."""
    from scipy.stats import t

    x = _vec(d, "paired_t_pvalue")
    if x.size < 2:
        return math.nan
    m, s = float(x.mean()), float(x.std(ddof=1))
    if s == 0.0:
        return 1.0 if m == 0.0 else 0.0
    return float(2.0 * t.sf(abs(m) * math.sqrt(x.size) / s, x.size - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values in the input order (module docstring); NaN entries stay NaN and are not counted in
    the family size ``m``."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[i] = running
    return out.tolist()


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Exact ``conf`` interval of a binomial rate with ``k`` events in ``n`` trials (module docstring): 0 as the
    lower end when ``k = 0``, 1 as the upper end when ``k = n``."""
    from scipy.stats import beta

    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"clopper_pearson: needs 0 <= k <= n, n >= 1; got k={k}, n={n}")
    a = 1.0 - conf
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def min_sign_flip_p(n: int) -> float:
    """The smallest p-value the exact two-sided sign-flip test can give with ``n`` pairs: ``2 / 2^n``."""
    if n < 1:
        raise ValueError(f"min_sign_flip_p: n must be >= 1, got {n}")
    return min(1.0, 2.0 / 2.0 ** n)


@dataclass(frozen=True)
class Paired:
    """A paired comparison: mean difference (variant - baseline) with its 95% t-interval, the sign-flip p-value,
    the number of pairs and the paired t-test's p-value (``p_t``, the test of the interval)."""

    mean: float
    lo: float
    hi: float
    p: float
    n: int
    p_t: float = math.nan

    @property
    def word(self) -> str:
        """``higher`` / ``lower`` when the 95% t-interval of the difference excludes 0, ``no difference measured``
        when it contains 0, ``not measurable`` with fewer than 2 pairs."""
        if self.n < 2 or not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return "not measurable"
        if self.lo > 0:
            return "higher"
        if self.hi < 0:
            return "lower"
        return "no difference measured"


def paired(variant: Sequence[float], baseline: Sequence[float]) -> Paired:
    """:class:`Paired` of ``d_k = variant_k - baseline_k`` (same seed order)."""
    v, b = _vec(variant, "paired variant"), _vec(baseline, "paired baseline")
    if v.shape != b.shape:
        raise ValueError(f"paired: {v.size} variant values vs {b.size} baseline values (pair them by seed)")
    d = v - b
    m, lo, hi = t_interval(d)
    return Paired(m, lo, hi, sign_flip_pvalue(d), int(d.size), paired_t_pvalue(d))


def _grid(x, y=None) -> tuple[np.ndarray, np.ndarray | None]:
    xa = np.asarray(x, np.float64)
    if xa.ndim != 1 or xa.size < 1:
        raise ValueError(f"grid: x must be a non-empty 1-D array, got shape {xa.shape}")
    if np.any(np.diff(xa) <= 0):
        raise ValueError(f"grid: x must be strictly increasing, got {xa.tolist()}")
    if y is None:
        return xa, None
    ya = np.asarray(y, np.float64)
    if ya.shape != xa.shape:
        raise ValueError(f"grid: x has {xa.size} points, y has shape {ya.shape}")
    return xa, ya


def value_at(x: Sequence[float], y: Sequence[float], at: float) -> float:
    """``y`` at ``at`` on the piecewise-linear curve through ``(x_i, y_i)``: ``y_i`` on a grid point, else
    ``y_i + (at - x_i)(y_{i+1} - y_i)/(x_{i+1} - x_i)`` for ``x_i < at < x_{i+1}``. ``ValueError`` outside
    ``[x_0, x_m]`` (no extrapolation)."""
    xa, ya = _grid(x, y)
    if not (xa[0] <= at <= xa[-1]):
        raise ValueError(f"value_at: {at:g} is outside the evaluation grid [{xa[0]:g}, {xa[-1]:g}]")
    return float(np.interp(at, xa, ya))


def normalized_auc(x: Sequence[float], y: Sequence[float]) -> float:
    """``(1 / (x_m - x_0)) sum_i (x_{i+1} - x_i)(y_i + y_{i+1}) / 2`` (trapezoid rule; needs >= 2 points)."""
    xa, ya = _grid(x, y)
    if xa.size < 2:
        raise ValueError("normalized_auc: needs at least 2 grid points")
    return float(np.sum(np.diff(xa) * (ya[1:] + ya[:-1]) / 2.0) / (xa[-1] - xa[0]))


@dataclass(frozen=True)
class Passage:
    """Where one curve first reaches a target: grid ``index`` (``len(x)`` when never), the grid ``samples`` there
    (NaN when never), and ``status`` (``reached``, ``below_first_eval``, ``beyond_budget``, ``not_measured``)."""

    index: int
    samples: float
    status: str


def samples_to_target(x: Sequence[float], y: Sequence[float], target: float) -> Passage:
    """First passage of one curve to ``target`` on the grid (module docstring). ``y`` may hold NaN (a missing
    evaluation): a NaN before the first point ``>= target`` makes the result ``not_measured``."""
    xa, ya = _grid(x, y)
    if not math.isfinite(target):
        raise ValueError(f"samples_to_target: target must be finite, got {target}")
    for i, yi in enumerate(ya):
        if math.isnan(yi):
            return Passage(xa.size, math.nan, NOT_MEASURED)
        if yi >= target:
            first_eval = 1 if xa[0] == 0 else 0
            return Passage(i, float(xa[i]), CENSOR_BELOW if i <= first_eval else REACHED)
    return Passage(xa.size, math.nan, CENSOR_BEYOND)


def symmetric_target(y_variant: np.ndarray, y_baseline: np.ndarray, fraction: float = 0.5) -> float:
    """The data-efficiency target, the same whichever arm is called the baseline:
    ``R* = ybar_0 + fraction (ybar_m - ybar_0)`` with ``ybar_0`` / ``ybar_m`` the mean over both arms and all seeds
    of the first / last grid point (``fraction = 0.5``: half the pooled gain). Arrays ``[n_seeds, n_points]``."""
    yv, yb = np.asarray(y_variant, np.float64), np.asarray(y_baseline, np.float64)
    if yv.ndim != 2 or yb.ndim != 2 or yv.shape[1] != yb.shape[1] or yv.shape[1] < 2:
        raise ValueError(f"symmetric_target: curves [seeds, points] with the same points, got {yv.shape}, {yb.shape}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"symmetric_target: fraction must be in (0, 1], got {fraction}")
    both = np.concatenate([yv, yb])
    y0, ym = float(np.nanmean(both[:, 0])), float(np.nanmean(both[:, -1]))
    return y0 + fraction * (ym - y0)


@dataclass(frozen=True)
class FirstPassageComparison:
    """Per-seed first-passage comparison: the target, how often the variant got there earlier / later / at the
    same evaluation, each arm's censoring counts, the median grid samples per arm (NaN when more than half
    never reach), and the sign-flip p-value of the grid-index differences (NaN when fewer than 2 pairs)."""

    target: float
    earlier: int
    later: int
    ties: int
    variant_status: dict
    baseline_status: dict
    variant_median: float
    baseline_median: float
    p: float
    n: int

    @property
    def word(self) -> str:
        if self.n < 2 or math.isnan(self.p):
            return "not measurable"
        if self.p < ALPHA:
            return "earlier" if self.earlier > self.later else "later"
        return "no difference measured"


def _median_samples(x: np.ndarray, passages: list[Passage]) -> float:
    idx = sorted(p.index for p in passages)
    med = idx[(len(idx) - 1) // 2] if len(idx) % 2 else None
    if med is None:   # even count: both middle indices must be on the grid
        a, b = idx[len(idx) // 2 - 1], idx[len(idx) // 2]
        if b >= x.size:
            return math.nan
        return float((x[a] + x[b]) / 2.0)
    return float(x[med]) if med < x.size else math.nan


def paired_first_passage(x: Sequence[float], y_variant: np.ndarray, y_baseline: np.ndarray,
                         fraction: float = 0.5) -> FirstPassageComparison:
    """Compare when the two arms first reach :func:`symmetric_target`, seed by seed (rows of the two
    ``[n_seeds, n_points]`` arrays are paired). Pairs where either arm is ``not_measured`` are dropped.

    ``d_k = i_b - i_v`` with ``i`` the first-passage grid index (``len(x)`` when never reached, so "beyond the
    budget" ranks after every reached index); ``p = sign_flip_pvalue(d)``. The grid index, not the interpolated
    sample count, is compared: nothing between two evaluations was measured."""
    xa, _ = _grid(x)
    yv, yb = np.asarray(y_variant, np.float64), np.asarray(y_baseline, np.float64)
    if yv.shape != yb.shape or yv.ndim != 2 or yv.shape[1] != xa.size:
        raise ValueError(f"paired_first_passage: curves {yv.shape} / {yb.shape} do not match the grid {xa.size}")
    target = symmetric_target(yv, yb, fraction)
    pv = [samples_to_target(xa, row, target) for row in yv]
    pb = [samples_to_target(xa, row, target) for row in yb]
    keep = [k for k in range(len(pv)) if NOT_MEASURED not in (pv[k].status, pb[k].status)]
    d = np.asarray([pb[k].index - pv[k].index for k in keep], np.float64)

    def counts(ps):
        out = {s: 0 for s in (REACHED, CENSOR_BELOW, CENSOR_BEYOND, NOT_MEASURED)}
        for p in ps:
            out[p.status] += 1
        return out

    p = sign_flip_pvalue(d) if d.size >= 2 else math.nan
    return FirstPassageComparison(
        target=target, earlier=int(np.sum(d > 0)), later=int(np.sum(d < 0)), ties=int(np.sum(d == 0)),
        variant_status=counts(pv), baseline_status=counts(pb),
        variant_median=_median_samples(xa, [pv[k] for k in keep]) if keep else math.nan,
        baseline_median=_median_samples(xa, [pb[k] for k in keep]) if keep else math.nan, p=p, n=int(d.size))


def t_power(effect: float, sd_d: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` pairs whose differences have sd ``sd_d``
    and mean ``effect``: ``P(|T| > t_{1-alpha/2, n-1})`` with ``T`` noncentral t, ``df = n - 1``,
    noncentrality ``effect sqrt(n) / sd_d``."""
    from scipy.stats import nct, t

    if n < 2 or not sd_d > 0:
        raise ValueError(f"t_power: needs n >= 2 and sd_d > 0, got n={n}, sd_d={sd_d}")
    crit = t.ppf(1 - alpha / 2, n - 1)
    nc = effect * math.sqrt(n) / sd_d
    return float(nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc))


def min_detectable_effect(sd_d: float, n: int, power: float = 0.8, alpha: float = ALPHA) -> float:
    """The smallest mean difference the paired t-test (two-sided, level ``alpha``) detects with probability
    ``power``: the root ``delta`` of ``t_power(delta, sd_d, n) = power`` (bisection on ``[0, 100 sd_d]``).
    Roughly ``(t_{1-alpha/2} + t_{power}) sd_d / sqrt(n)``."""
    if not 0 < power < 1:
        raise ValueError(f"min_detectable_effect: power must be in (0, 1), got {power}")
    lo, hi = 0.0, 100.0 * sd_d
    if t_power(hi, sd_d, n, alpha) < power:
        return math.inf
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_power(mid, sd_d, n, alpha) < power else (lo, mid)
    return hi
