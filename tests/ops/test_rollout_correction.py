"""verl rollout correction: IS weights (TIS / IcePop band / batch-normalised), rejection masks, diagnostics."""

from __future__ import annotations

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo import ops
from jaxppo.ops.rollout_correction import parse_rejection_criteria
from tests.ops import reference as ref
from tests.ops._data import random_inputs


def _check_metrics(got, want, rtol=1e-4, atol=1e-5):
    assert set(got) == set(want), set(got) ^ set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=rtol, atol=atol, err_msg=k)


class WeightsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_token_tis_and_band(self):
        # ratios [0.5, 3, 1 | pad 7]; TIS C = 2: w = [0.5, 2, 1, 0]. verl 0.9.1: mean/max/min/std/ESS of the
        # applied w: mean 3.5/3 = 7/6 (the raw ratios' mean would be 1.5), max 2 (raw: 3), min 0.5; fractions
        # of the raw ratios: high (rho > 2) 1/3, low (rho < 0.5) 0; no oob ratio for TIS
        # std of w = [0.5, 2, 1]: mean 7/6, E[x^2] = 5.25/3 = 1.75 -> sqrt(1.75 - 49/36)
        # ESS = 1 / mean((x / (7/6))^2) = (7/6)^2 / 1.75
        lr = jnp.asarray(np.log([[0.5, 3.0, 1.0, 7.0]]), jnp.float32)
        m = jnp.array([[1, 1, 1, 0]])
        w, met = self.variant(functools.partial(ops.rollout_correction_weights, threshold=2.0))(lr, m)
        np.testing.assert_allclose(w, [[0.5, 2.0, 1.0, 0.0]], rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_mean"], 7 / 6, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_max"], 2.0, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_min"], 0.5, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_ratio_fraction_high"], 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_seq_mean"], 7 / 6, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_seq_fraction_high"], 0.0)   # raw row mean 1.5 <= 2
        assert "rollout_is_oob_ratio" not in met
        np.testing.assert_allclose(met["rollout_is_std"], np.sqrt(1.75 - 49 / 36), rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_eff_sample_size"], (7 / 6) ** 2 / 1.75, rtol=1e-5)
        # IcePop band [0.6, 2.5]: 0.5 and 3 fall out -> [0, 0, 1, 0]; oob 2/3 ; batch-normalised: mean of
        # [0, 0, 1] over 3 tokens is 1/3 -> weights [0, 0, 3]; metrics before the normalisation: mean 1/3,
        # max 1, min 0 (the zeroed tokens count), std sqrt(1/3 - 1/9), ESS (1/3)^2 / (1/3) = 1/3
        band = functools.partial(ops.rollout_correction_weights, threshold="0.6_2.5", batch_normalize=True)
        w, met = self.variant(band)(lr, m)
        np.testing.assert_allclose(w, [[0.0, 0.0, 3.0, 0.0]], rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_oob_ratio"], 2 / 3, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_is_batch_norm_factor"], 1 / 3, rtol=1e-5)
        np.testing.assert_allclose([met["rollout_is_mean"], met["rollout_is_max"], met["rollout_is_min"]],
                                   [1 / 3, 1.0, 0.0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(met["rollout_is_std"], np.sqrt(1 / 3 - 1 / 9), rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_eff_sample_size"], 1 / 3, rtol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_sequence(self):
        # row 0: log ratios [ln 2, ln 0.8] -> rho = 1.6 ; row 1: [ln 4, ln 2] -> 8 -> TIS at 5 ; row 2 empty
        lr = jnp.asarray(np.log([[2.0, 0.8], [4.0, 2.0], [1.0, 1.0]]), jnp.float32)
        m = jnp.array([[1, 1], [1, 1], [0, 0]])
        f = functools.partial(ops.rollout_correction_weights, level="sequence", threshold=5.0, batch_normalize=True)
        w, met = self.variant(f)(lr, m)
        # truncated [1.6, 5]; batch mean over the 2 valid sequences 3.3 -> [1.6/3.3, 5/3.3]
        np.testing.assert_allclose(w, [[1.6 / 3.3] * 2, [5 / 3.3] * 2, [0, 0]], rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_max"], 8.0, rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_min"], 1.6, rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_ratio_fraction_high"], 0.5)   # the empty row is not a unit
        # applied weights [1.6, 5] (before the normalisation): token mean (3.2 + 10) / 4 = 3.3; the row means
        # are 1.6 and 5, the raw ones 1.6 and 8
        np.testing.assert_allclose(met["rollout_is_mean"], 3.3, rtol=1e-5)
        np.testing.assert_allclose(met["rollout_is_seq_max"], 5.0, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference(self):
        _, m, x = random_inputs(seed=5, b=6, t=7, scale=0.8)
        lr = x()
        lr[1, 0] = 30.0  # beyond the +20 clamp
        for level in ("token", "sequence"):
            for threshold in (2.0, "0.5_1.5", 1.2):
                for bn in (False, True):
                    f = functools.partial(ops.rollout_correction_weights, level=level, threshold=threshold,
                                          batch_normalize=bn)
                    w, met = self.variant(f)(lr, m)
                    want_w, want_m = ref.rollout_is_weights(lr, m, level, threshold, bn)
                    np.testing.assert_allclose(w, want_w, rtol=1e-4, atol=1e-6, err_msg=f"{level} {threshold}")
                    _check_metrics(met, want_m)


@settings(max_examples=25)
@given(lr=hnp.arrays(np.float32, (4, 5), elements=st.floats(-3, 3, width=32)),
       mask=hnp.arrays(np.float32, (4, 5), elements=st.sampled_from([0.0, 1.0])),
       level=st.sampled_from(["token", "sequence"]), c=st.sampled_from([1.5, 2.0, 4.0]))
def test_weight_properties(lr, mask, level, c):
    mask[0, 0] = 1.0
    w = np.asarray(jax.jit(functools.partial(ops.rollout_correction_weights, level=level, threshold=c))(lr, mask)[0])
    assert np.all(w <= c + 1e-6) and np.all(w[mask == 0] == 0)                      # TIS weights <= C
    lo, hi = 0.7, 1.6
    wb = np.asarray(ops.rollout_correction_weights(lr, mask, level=level, threshold=f"{lo}_{hi}")[0])
    assert np.all((wb == 0) | ((wb >= lo * (1 - 1e-6)) & (wb <= hi * (1 + 1e-6))))  # IcePop: 0 or in band
    wn, met = ops.rollout_correction_weights(lr, mask, level=level, threshold=c, batch_normalize=True)
    if float(met["rollout_is_batch_norm_factor"]) != 1.0 or np.any(w != np.asarray(wn)):
        if level == "token":
            np.testing.assert_allclose(np.asarray(wn)[mask == 1].mean(), 1.0, rtol=1e-4)
        else:
            rows = mask.sum(1) > 0
            np.testing.assert_allclose(np.asarray(wn)[rows, mask[rows].argmax(1)].mean(), 1.0, rtol=1e-4)


class RejectionTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # ratios row 0 [0.5, 3, 1], row 1 [1.1, 0.9, pad]. token_k1 "0.4_2.0" keeps -l in [ln .4, ln 2]:
        # row 0: -l = [ln 2, -ln 3, 0] -> [keep, drop, keep]; row 1 all kept.
        # seq_max_k2 0.5: row 0 max 0.5 ln(3)^2 = 0.603 > 0.5 -> whole row dropped ; row 1 kept
        lr = jnp.asarray(np.log([[0.5, 3.0, 1.0], [1.1, 0.9, 1.0]]), jnp.float32)
        m = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
        f = functools.partial(ops.rejection_mask, criteria="token_k1,seq_max_k2", threshold="0.4_2.0,0.5")
        out, met = self.variant(f)(lr, m)
        np.testing.assert_array_equal(out, [[0, 0, 0], [1, 1, 0]])
        np.testing.assert_allclose(met["rollout_rs_token_k1_masked_fraction"], 1 / 5, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_rs_seq_max_k2_masked_fraction"], 3 / 5, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_rs_masked_fraction"], 3 / 5, rtol=1e-6)
        np.testing.assert_allclose(met["rollout_rs_seq_masked_fraction"], 1 / 2)
        np.testing.assert_allclose(met["rollout_rs_seq_max_k2_max"], 0.5 * np.log(3) ** 2, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_every_criterion(self):
        _, m, x = random_inputs(seed=9, b=6, t=7, scale=0.5)
        lr = x()
        specs = {"k1": "0.6_1.5", "k2": "0.1", "k3": "0.15"}
        wide = {"seq_sum_k1": "0.3_3.0", "seq_sum_k2": "0.5", "seq_sum_k3": "0.6", "seq_max_k2": "0.3",
                "seq_max_k3": "0.4", "seq_mean_k1": "0.8_1.05"}
        for name in ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
                     "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3", "token_k3,seq_mean_k1"):
            thr = ",".join(wide.get(c, specs[c[-2:]]) for c in name.split(","))
            out, met = self.variant(functools.partial(ops.rejection_mask, criteria=name, threshold=thr))(lr, m)
            want, want_m = ref.rejection_keep(lr, m, parse_rejection_criteria(name, thr))
            np.testing.assert_array_equal(out, want, err_msg=name)
            _check_metrics(met, want_m)
            assert 0 < float(met["rollout_rs_masked_fraction"]) < 1, name   # the case exercises both sides


def test_rejection_parsing():
    assert parse_rejection_criteria("token_k1", 2.0) == [("token_k1", 0.5, 2.0)]
    assert parse_rejection_criteria(" seq_sum_k2 , token_k1,seq_sum_k2", "3,0.5_4") == [
        ("seq_sum_k2", None, 3.0), ("token_k1", 0.5, 4.0)]
    with pytest.raises(ValueError, match="unknown rejection criterion 'seq_max_k1'"):
        parse_rejection_criteria("seq_max_k1", "0.5_2")
    with pytest.raises(ValueError, match="single upper bound"):
        parse_rejection_criteria("token_k2", "0.5_2")
    with pytest.raises(ValueError, match="2 specs for 3 criteria"):
        parse_rejection_criteria("token_k1,token_k2,token_k3", "1,2")
    with pytest.raises(ValueError, match="is not a number"):
        parse_rejection_criteria("token_k2", "abc")
    with pytest.raises(ValueError, match="positive"):
        parse_rejection_criteria("token_k1", "-1_2")
    with pytest.raises(ValueError, match="non-empty"):
        parse_rejection_criteria("", "1")


def test_weights_bad_input():
    lr, m = np.zeros((2, 3), np.float32), np.ones((2, 3))
    with pytest.raises(ValueError, match="level='geometric'"):
        ops.rollout_correction_weights(lr, m, level="geometric")
    with pytest.raises(ValueError, match="'lo_hi'"):
        ops.rollout_correction_weights(lr, m, threshold="0.5_1_2")
    with pytest.raises(ValueError, match="exceeds upper bound"):
        ops.rollout_correction_weights(lr, m, threshold="3_2")
    with pytest.raises(ValueError, match="positive"):
        ops.rollout_correction_weights(lr, m, threshold=0.0)
    with pytest.raises(ValueError, match="all-zero mask"):
        ops.rollout_correction_weights(lr, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="shape mismatch"):
        ops.rejection_mask(lr, m[:, :2])


class OffpolicyTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # one row, train p = [0.5, 0.25], rollout p = [0.5, 0.5]: l = [0, -ln 2]
        # kl = E(-l) = ln2/2 ; k3 = E(e^l - l - 1) = (0 + 0.5 + ln 2 - 1)/2 ; chi2_token = (1 + 0.25)/2 - 1
        # a = (ln .5 + ln .25)/2 = -1.5 ln 2 ; c = -ln 2 ; d = c - a = 0.5 ln 2 ; ppl_ratio = sqrt 2
        # chi2_seq = exp(2 * -ln 2) - 1 = -0.75 ; training_ppl = 2^1.5
        tl = jnp.asarray(np.log([[0.5, 0.25, 0.9]]), jnp.float32)
        rl = jnp.asarray(np.log([[0.5, 0.5, 0.1]]), jnp.float32)
        met = self.variant(ops.offpolicy_metrics)(tl, rl, jnp.array([[1, 1, 0]]))
        ln2 = np.log(2)
        want = {"kl": ln2 / 2, "k3_kl": (0.5 + ln2 - 1) / 2, "chi2_token": 0.625 - 1, "chi2_seq": -0.75,
                "training_ppl": 2 ** 1.5, "training_log_ppl": 1.5 * ln2, "rollout_ppl": 2.0, "rollout_log_ppl": ln2,
                "log_ppl_diff": 0.5 * ln2, "log_ppl_abs_diff": 0.5 * ln2, "log_ppl_diff_max": 0.5 * ln2,
                "log_ppl_diff_min": 0.5 * ln2, "ppl_ratio": np.sqrt(2)}
        _check_metrics(met, want, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference(self):
        _, m, x = random_inputs(seed=21, b=6, t=7, scale=0.7)
        tl, rl = -np.abs(x()), -np.abs(x())
        _check_metrics(self.variant(ops.offpolicy_metrics)(tl, rl, m), ref.offpolicy(tl, rl, m))
        met = ops.offpolicy_metrics(tl, tl, m)
        for k in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff"):
            np.testing.assert_allclose(met[k], 0.0, atol=1e-6, err_msg=k)   # identical policies
