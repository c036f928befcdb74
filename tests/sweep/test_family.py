"""jaxppo.sweeps.family: the primary verdict and Holm's adjustment over a sweep's tests, by hand."""

from __future__ import annotations

import math

import pytest

from jaxppo.sweeps import family

NAN = float("nan")


def _row(variant, final, p_final, p25, p50, pauc, ppass, n=10, earlier=0, later=0):
    return {"variant": variant, "n_pairs": n, "final_diff": final, "final_diff_t_p": p_final, "at25_diff": 0.01,
            "at25_diff_t_p": p25, "at50_diff": -0.01, "at50_diff_t_p": p50, "auc_diff": 0.02, "auc_diff_t_p": pauc,
            "passage_p": ppass, "earlier": earlier, "later": later}


ROWS = [{"variant": "base", "n_pairs": 0},
        _row("a", 0.10, 0.01, 0.30, 0.20, 0.004, 0.5),
        _row("b", -0.05, 0.03, 0.90, 0.02, 0.60, 0.01, earlier=1, later=7),
        _row("c", 0.02, 0.04, 0.80, 0.70, 0.50, 1.0)]


def test_primary_final_is_adjusted_over_the_variants_by_hand():
    out = {r["variant"]: r for r in family.apply(ROWS, "base", "final")}
    # primary p: .01 .03 .04 -> 3 x .01 = .03; max(.03, 2 x .03) = .06; max(.06, .04) = .06
    assert [out[v]["final_p_holm"] for v in "abc"] == pytest.approx([0.03, 0.06, 0.06])
    assert [out[v]["verdict"] for v in "abc"] == ["higher", "no difference measured", "no difference measured"]
    # b's and c's raw t-tests (.03, .04) would each read as a finding without the correction
    assert out["base"]["verdict"] == "" and out["base"]["primary"] == "final"
    assert math.isnan(out["base"]["final_p_holm"])


def test_secondary_family_is_every_other_test_of_every_variant_by_hand():
    out = {r["variant"]: r for r in family.apply(ROWS, "base", "final")}
    # 12 secondary p-values; the smallest, a's AUC .004, is multiplied by 12 = .048 (< .05, a secondary finding
    # would survive); the next, b's at50 .02 and b's passage .01: sorted .004 .01 .02 ... -> 12 x .004 = .048,
    # max(.048, 11 x .01) = .11, max(.11, 10 x .02) = .2
    assert out["a"]["auc_p_holm"] == pytest.approx(0.048)
    assert out["b"]["first_passage_p_holm"] == pytest.approx(0.11)
    assert out["b"]["at50_p_holm"] == pytest.approx(0.2)
    assert family.any_claim(list(out.values()), "base", ["at25", "at50", "auc", "first_passage"], adjusted=True)
    assert family.any_claim(list(out.values()), "base", ["final"], adjusted=False)


def test_first_passage_as_primary_gives_earlier_or_later():
    out = {r["variant"]: r for r in family.apply(ROWS, "base", "first_passage")}
    # primary p: .5 .01 1.0 -> b: 3 x .01 = .03 < .05, and b got there later in 7 of 8 seeds
    assert out["b"]["first_passage_p_holm"] == pytest.approx(0.03) and out["b"]["verdict"] == "later"
    assert out["a"]["verdict"] == out["c"]["verdict"] == "no difference measured"
    # the final test is now secondary: adjusted with the other 11
    assert out["a"]["final_p_holm"] > out["a"]["final_diff_t_p"]


def test_not_measurable_and_bad_primary():
    rows = [{"variant": "base", "n_pairs": 0}, _row("a", 0.1, NAN, NAN, NAN, NAN, NAN, n=1)]
    assert family.apply(rows, "base")[1]["verdict"] == "not measurable"
    with pytest.raises(ValueError, match="primary test 'reward'"):
        family.apply(ROWS, "base", "reward")
