"""Family-wise verdicts of a sweep: one pre-declared primary test, Holm's correction over the rest.

A sweep compares each of its ``K`` variants with one baseline, and each comparison computes five tests on the
same seed-paired differences (:func:`jaxppo.sweeps.results.compare_arms`):

========================  ==============================================================  ==================
test                      statistic                                                       p-value
========================  ==============================================================  ==================
``final``                 difference of the final held-out value                          paired t-test
``at25`` / ``at50``       difference of the value at 25% / 50% of the budget              paired t-test
``auc``                   difference of the normalized area under the curve               paired t-test
``first_passage``         grid index at which each arm first reaches half the pooled gain  exact sign-flip
========================  ==============================================================  ==================

Reading any one of them as a finding raises the chance of a false finding with the number of tests read
(about 8-12% for "any of final / AUC / samples-to-target" on A/A sweeps, more with the checkpoints). So:

- the sweep file declares its **primary** test (``primary:``, default ``final``); the verdict word of each variant
  (``higher`` / ``lower``, ``earlier`` / ``later`` for ``first_passage``, else ``no difference measured``) comes
  from the primary test alone, its p-values **Holm-adjusted over the K variants** (:func:`jaxppo.sweeps.stats.holm`);
- the other four tests of every variant form the **secondary** family (``4 K`` p-values), Holm-adjusted together;
  a secondary test is reported with its adjusted p and is never a verdict.

Holm's step-down procedure keeps the family-wise error rate of each family at 5% under any dependence, so a sweep
makes a false primary claim in at most 5% of A/A sweeps and a false secondary one in at most 5%
(``python -m jaxppo.sweeps.calibrate`` measures both). With one variant the primary adjustment is the identity, and
for a t-based primary the word agrees with the 95% t-interval (``p < 0.05`` exactly when it excludes 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jaxppo.sweeps import stats

# test name -> (column of its mean difference, column of its p-value); None: the test has no mean difference
TESTS: dict[str, tuple[str | None, str]] = {
    "final": ("final_diff", "final_diff_t_p"),
    "at25": ("at25_diff", "at25_diff_t_p"),
    "at50": ("at50_diff", "at50_diff_t_p"),
    "auc": ("auc_diff", "auc_diff_t_p"),
    "first_passage": (None, "passage_p"),
}
PRIMARY_DEFAULT = "final"
COLUMNS = ("primary", "verdict", *(f"{t}_p_holm" for t in TESTS))
NAMES = {"final": "final value", "at25": "value at 25% of the budget", "at50": "value at 50% of the budget",
         "auc": "AUC", "first_passage": "first passage to half the pooled gain"}


def _num(row: dict, key: str | None) -> float:
    if key is None:
        return math.nan
    v = row.get(key)
    return math.nan if v is None or v == "" else float(v)


def check_primary(primary: str) -> str:
    """``primary`` when it names a test of :data:`TESTS`, else ``ValueError`` listing them."""
    if primary not in TESTS:
        raise ValueError(f"primary test {primary!r} is not one of {', '.join(TESTS)}")
    return primary


def word(row: dict, primary: str, alpha: float = stats.ALPHA) -> str:
    """The verdict word of one variant's row (which holds ``<primary>_p_holm``): ``not measurable`` with fewer than
    2 pairs or no p-value; ``higher``/``lower`` (``earlier``/``later`` for ``first_passage``) when the adjusted p
    is below ``alpha``, by the sign of the difference; else ``no difference measured``."""
    p = _num(row, f"{primary}_p_holm")
    n = _num(row, "n_pairs")
    if not (n >= 2) or math.isnan(p):
        return "not measurable"
    if p >= alpha:
        return "no difference measured"
    if primary == "first_passage":
        return "earlier" if _num(row, "earlier") > _num(row, "later") else "later"
    return "higher" if _num(row, TESTS[primary][0]) > 0 else "lower"


def apply(rows: Sequence[dict], baseline: str, primary: str = PRIMARY_DEFAULT) -> list[dict]:
    """``rows`` (one per variant, with the paired columns of ``compare_arms``) with :data:`COLUMNS` added: the
    primary family adjusted over the non-baseline variants, the secondary family over every other test of every
    non-baseline variant (module docstring). The baseline's row gets the primary's name and empty cells."""
    check_primary(primary)
    out = [dict(r) for r in rows]
    others = [r for r in out if str(r["variant"]) != baseline]
    prim = stats.holm([_num(r, TESTS[primary][1]) for r in others])
    sec_keys = [(i, t) for i in range(len(others)) for t in TESTS if t != primary]
    sec = stats.holm([_num(others[i], TESTS[t][1]) for i, t in sec_keys])
    for r in out:
        r["primary"] = primary
        r["verdict"] = ""
        for t in TESTS:
            r[f"{t}_p_holm"] = math.nan
    for r, p in zip(others, prim):
        r[f"{primary}_p_holm"] = p
    for (i, t), p in zip(sec_keys, sec):
        others[i][f"{t}_p_holm"] = p
    for r in others:
        r["verdict"] = word(r, primary)
    return out


def any_claim(rows: Sequence[dict], baseline: str, tests: Sequence[str], *, adjusted: bool,
              alpha: float = stats.ALPHA) -> bool:
    """Whether any non-baseline row claims a difference on any of ``tests``: its Holm-adjusted p (``adjusted``)
    or its raw p below ``alpha``. Used by the calibration to measure family-wise error rates."""
    for r in rows:
        if str(r["variant"]) == baseline:
            continue
        for t in tests:
            p = _num(r, f"{t}_p_holm" if adjusted else TESTS[t][1])
            if p < alpha:
                return True
    return False
