"""KTO (TRL's KTOTrainer loss): hand cases, the reference point, properties, gradients, errors."""

from __future__ import annotations

import functools
import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo import ops


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


class KtoTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # rows: desirable u = 2, undesirable u = -1, undesirable u = 3 ; z0 = 0.5, beta = 0.5
        # desirable: 1 - sig(0.5 (2 - 0.5)) = 1 - sig(0.75); undesirable: 1 - sig(0.5 (0.5 + 1)) = 1 - sig(0.75),
        # 1 - sig(0.5 (0.5 - 3)) = 1 - sig(-1.25); weights lambda_D = 2, lambda_U = 1; mean over the 3 rows
        logp = np.array([-1.0, -6.0, -2.0], np.float32)
        ref = np.array([-3.0, -5.0, -5.0], np.float32)
        good = np.array([True, False, False])
        f = functools.partial(ops.kto_loss, beta=0.5, desirable_weight=2.0, undesirable_weight=1.0)
        loss, m = self.variant(f)(logp, ref, good, 0.5)
        want = (2 * (1 - _sig(0.75)) + (1 - _sig(0.75)) + (1 - _sig(-1.25))) / 3
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose([m["rewards/chosen"], m["rewards/rejected"], m["rewards/margins"], m["kl"],
                                    m["logps/chosen"], m["logps/rejected"], m["count/chosen"], m["count/rejected"]],
                                   [1.0, 0.5, 0.5, 0.5, -1.0, -4.0, 1, 2], rtol=1e-6)
        # a padding row (weight 0) changes nothing
        loss_w, _ = self.variant(f)(np.append(logp, -9.0), np.append(ref, 0.0), np.append(good, True), 0.5,
                                    weights=np.array([1, 1, 1, 0], np.float32))
        np.testing.assert_allclose(loss_w, want, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_reference_point_by_hand(self):
        # mismatched log-ratios 1, -3, 0.5: mean -0.5 -> clamped to 0 ; 1, 2 -> 1.5
        z = self.variant(ops.kto_reference_point)(np.array([0.0, -4.0, 0.5], np.float32),
                                                  np.array([-1.0, -1.0, 0.0], np.float32))
        np.testing.assert_allclose(z, 0.0)
        z = self.variant(ops.kto_reference_point)(np.array([0.0, 0.0], np.float32),
                                                  np.array([-1.0, -2.0], np.float32))
        np.testing.assert_allclose(z, 1.5)


def test_mismatched_order_pairs_each_prompt_with_the_previous_answer():
    np.testing.assert_array_equal(ops.kto_mismatched_order(4), [3, 0, 1, 2])
    np.testing.assert_array_equal(ops.kto_mismatched_order(1), [0])


vals = hnp.arrays(np.float32, (6,), elements=st.floats(-20, 0, width=32))


@given(pi=vals, rf=vals, good=hnp.arrays(np.bool_, (6,)), z0=st.floats(0, 5), beta=st.sampled_from([0.05, 0.1, 1.0]))
def test_properties(pi, rf, good, z0, beta):
    loss, _ = ops.kto_loss(pi, rf, good, z0, beta=beta)
    # each row's loss lies in (0, 1); a desirable row's loss falls as its log-ratio rises, an undesirable one's rises
    assert 0.0 <= float(loss) <= 1.0
    up = ops.kto_loss(pi + 1.0, rf, good, z0, beta=beta)[0]
    if good.all():
        assert float(up) <= float(loss) + 1e-6
    if (~good).all():
        assert float(up) >= float(loss) - 1e-6
    # at u = z0 every row's loss is 1 - sig(0) = 1/2 times its weight
    flat = ops.kto_loss(rf + np.float32(z0), rf, good, z0, beta=beta, desirable_weight=1.0, undesirable_weight=1.0)[0]
    np.testing.assert_allclose(flat, 0.5, rtol=1e-5)


def test_gradient_signs_and_no_gradient_through_z0():
    pi = np.array([-2.0, -3.0], np.float32)
    rf = np.array([-2.5, -2.5], np.float32)
    good = np.array([True, False])
    g = jax.grad(lambda p: ops.kto_loss(p, rf, good, 0.2, beta=0.1)[0])(pi)
    assert g[0] < 0 and g[1] > 0   # push the desirable answer up, the undesirable one down

    def through_z0(p):
        z0 = ops.kto_reference_point(p, rf)
        return ops.kto_loss(rf, rf, good, z0, beta=0.1)[0]

    np.testing.assert_array_equal(jax.grad(through_z0)(pi), [0.0, 0.0])


def test_bad_input():
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="beta must be > 0"):
        ops.kto_loss(x, x, np.ones(3, bool), 0.0, beta=0.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        ops.kto_loss(x, x[:2], np.ones(3, bool), 0.0, beta=0.1)
    with pytest.raises(ValueError, match="undesirable_weight must be >= 0"):
        ops.kto_loss(x, x, np.ones(3, bool), 0.0, beta=0.1, undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        ops.kto_mismatched_order(0)


def test_pair_layout_loss_is_the_reference_point_of_the_second_slot_then_kto():
    # judged answers u = 1 (desirable), -2 (undesirable); mismatched slot log-ratios 2 and 0 -> z0 = 1
    logp, ref = np.array([-1.0, -4.0], np.float32), np.array([-2.0, -2.0], np.float32)
    kl_logp, ref_kl = np.array([-1.0, -3.0], np.float32), np.array([-3.0, -3.0], np.float32)
    good = np.array([True, False])
    loss, m = ops.kto_pair_loss(logp, kl_logp, ref, ref_kl, good, beta=1.0)
    want = ((1 - _sig(1.0 - 1.0)) + (1 - _sig(1.0 + 2.0))) / 2
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(m["kl"], 1.0)


def test_kto_layout_of_unpaired_rows():
    from jaxppo.data.schemas import ScoredTrajectory
    from jaxppo.data.tokenize import tokenize_scored
    from jaxppo.data.unpaired import kto_layout
    from jaxppo.data.validation import validate_scored

    class Chars:   # one token per letter, id = ord - 94 (a = 3)
        pad_token_id, eos_token_id, chat_template = 0, 2, None

        def __len__(self):
            return 30

        def __call__(self, texts, add_special_tokens=True, verbose=True):
            return {"input_ids": [[ord(c) - 94 for c in t if "a" <= c <= "z"] for t in texts]}

    rows = validate_scored([{"prompt": "p", "completion": "ab", "label": True},
                            {"prompt": "q", "completion": "c", "label": False},
                            {"prompt": "r", "completion": "de", "label": True}])
    assert all(isinstance(r, ScoredTrajectory) for r in rows)
    out = kto_layout(tokenize_scored(rows, Chars(), max_prompt_length=2, max_response_length=2))
    np.testing.assert_array_equal(out["chosen_ids"], [[3, 4], [5, 0], [6, 7]])
    np.testing.assert_array_equal(out["rejected_ids"], [[6, 7], [3, 4], [5, 0]])   # the previous row's answer
    np.testing.assert_array_equal(out["desirable"], [True, False, True])
    np.testing.assert_array_equal(out["prompt_ids"][:, -1], [ord("p") - 94, ord("q") - 94, ord("r") - 94])
