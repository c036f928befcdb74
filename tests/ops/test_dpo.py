"""DPO family: hand cases, numpy reference for every loss type, properties, gradients, errors."""

from __future__ import annotations

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo import ops
from jaxppo.ops.dpo import DPO_LOSS_TYPES
from tests.ops import reference as ref

PC, PR = np.array([-3.0, -5.0, -2.0], np.float32), np.array([-4.0, -4.0, -6.0], np.float32)
RC, RR = np.array([-3.5, -5.0, -3.0], np.float32), np.array([-4.0, -4.5, -5.0], np.float32)
NC, NR = np.array([2, 4, 1]), np.array([4, 1, 0])


class DpoTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand(self):
        # pair 0: u_c = 0.5, u_r = 0 -> D = 0.5 ; beta 2: sigmoid = -log sig(1) = log(1 + e^-1) = 0.3132617
        # hinge = relu(1 - 1) = 0 ; rewards/chosen = 1, rejected = 0 ; accuracies 1
        # ipo with n_c = 2, n_r = 4: D_norm = 0.25 -> (0.25 - 1/4)^2 = 0
        args = (PC[:1], PR[:1], RC[:1], RR[:1])
        loss, met = self.variant(functools.partial(ops.dpo_loss, beta=2.0))(*args)
        np.testing.assert_allclose(loss, [np.log1p(np.exp(-1))], rtol=1e-6)
        np.testing.assert_allclose([met["rewards/chosen"], met["rewards/rejected"], met["rewards/accuracies"],
                                    met["rewards/margins"]], [1.0, 0.0, 1.0, 1.0], rtol=1e-6)
        loss, _ = self.variant(functools.partial(ops.dpo_loss, beta=2.0, loss_type="hinge"))(*args)
        np.testing.assert_allclose(loss, [0.0], atol=1e-7)
        ipo = functools.partial(ops.dpo_loss, beta=2.0, loss_type="ipo", chosen_length=NC[:1], rejected_length=NR[:1])
        np.testing.assert_allclose(self.variant(ipo)(*args)[0], [0.0], atol=1e-7)
        # RPO: + 0.5 * (3 / 2)
        rpo = functools.partial(ops.dpo_loss, beta=2.0, rpo_alpha=0.5, chosen_length=NC[:1])
        loss, met = self.variant(rpo)(*args)
        np.testing.assert_allclose(loss, [np.log1p(np.exp(-1)) + 0.75], rtol=1e-6)
        np.testing.assert_allclose(met["nll_loss"], 1.5, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rpo_nll_is_the_token_mean_over_the_batch_as_trl(self):
        # 20 pairs of lengths 1..20; the 1-token answer has NLL 10 per token, every other token NLL 1.
        # TRL (one cross_entropy over all chosen tokens): (10 + sum_{n=2..20} n) / sum_{n=1..20} n = 219 / 210;
        # a mean of per-pair means would give (10 + 19) / 20 = 1.45
        n = np.arange(1, 21)
        pc = -n.astype(np.float32)
        pc[0] = -10.0
        z = np.zeros(20, np.float32)
        f = functools.partial(ops.dpo_loss, beta=0.1, rpo_alpha=2.0, chosen_length=n)
        loss, met = self.variant(f)(pc, z, pc, z)        # ref = policy: D = 0
        np.testing.assert_allclose(met["nll_loss"], 219 / 210, rtol=1e-6)
        np.testing.assert_allclose(loss, np.log(2.0) + 2.0 * 219 / 210, rtol=1e-6)   # D = 0: -log sig(0) = log 2
        np.testing.assert_allclose(self.variant(ops.rpo_nll)(pc, n), 219 / 210, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_every_type(self):
        for loss_type in DPO_LOSS_TYPES:
            for eps in ((0.0, 0.1, 0.3) if loss_type in ("sigmoid", "robust") else (0.0,)):
                for rpo_alpha in (0.0, 0.7):
                    f = functools.partial(ops.dpo_loss, beta=0.3, loss_type=loss_type, label_smoothing=eps,
                                          chosen_length=NC, rejected_length=NR, rpo_alpha=rpo_alpha)
                    loss, met = self.variant(f)(PC, PR, RC, RR)
                    want, want_m = ref.dpo(PC, PR, RC, RR, 0.3, loss_type, eps, NC, NR, rpo_alpha)
                    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6, err_msg=f"{loss_type} {eps}")
                    for k, v in want_m.items():
                        np.testing.assert_allclose(met[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


vals = hnp.arrays(np.float32, (4,), elements=st.floats(-20, 0, width=32))


@given(pc=vals, pr=vals, rc=vals, rr=vals, beta=st.sampled_from([0.05, 0.1, 1.0]),
       eps=st.sampled_from([0.0, 0.2, 0.45]))
def test_properties(pc, pr, rc, rr, beta, eps):
    # sigmoid at D = 0 equals log 2 whatever the smoothing
    loss = ops.dpo_loss(pc, pc, rc, rc, beta=beta, label_smoothing=eps)[0]
    np.testing.assert_allclose(loss, np.log(2), rtol=1e-6)
    # robust with eps = 0 equals sigmoid ; reference agreement for random inputs (jitted)
    np.testing.assert_allclose(ops.dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="robust")[0],
                               ops.dpo_loss(pc, pr, rc, rr, beta=beta)[0], rtol=1e-6)
    f = jax.jit(functools.partial(ops.dpo_loss, beta=beta, loss_type="robust", label_smoothing=eps))
    np.testing.assert_allclose(f(pc, pr, rc, rr)[0], ref.dpo(pc, pr, rc, rr, beta, "robust", eps)[0],
                               rtol=1e-4, atol=1e-5)
    # hinge is non-negative and 0 once beta * D >= 1
    h = np.asarray(ops.dpo_loss(pc, pr, rc, rr, beta=beta, loss_type="hinge")[0])
    d = beta * ((pc.astype(np.float64) - rc) - (pr.astype(np.float64) - rr))
    assert np.all(h >= 0) and np.all(h[d >= 1 + 1e-4] == 0)


def test_gradient_sign():
    # the sigmoid loss pushes the chosen log-prob up and the rejected one down
    g = jax.grad(lambda c, r: ops.dpo_loss(c, r, RC, RR, beta=0.1)[0].mean(), argnums=(0, 1))(PC, PR)
    assert np.all(np.asarray(g[0]) < 0) and np.all(np.asarray(g[1]) > 0)


def test_bad_input():
    with pytest.raises(ValueError, match="pass chosen_length and rejected_length"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="ipo")
    with pytest.raises(ValueError, match="pass chosen_length"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="sigmoid_norm", chosen_length=NC)
    with pytest.raises(ValueError, match="rpo_alpha > 0 needs chosen_length"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, rpo_alpha=1.0)
    with pytest.raises(ValueError, match="loss_type='kto'"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="kto")
    with pytest.raises(ValueError, match="beta must be > 0"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.0)
    with pytest.raises(ValueError, match="label_smoothing must be"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="needs label_smoothing=0"):
        ops.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="hinge", label_smoothing=0.1)
    with pytest.raises(ValueError, match="shape mismatch"):
        ops.dpo_loss(PC, PR[:2], RC, RR, beta=0.1)
    with pytest.raises(ValueError, match="chosen_length must have shape"):
        ops.rpo_nll(PC, NC[:2])


@given(pc=hnp.arrays(np.float32, (8,), elements=st.floats(-30, 0, width=32)),
       n=hnp.arrays(np.int32, (8,), elements=st.integers(0, 20)), k=st.sampled_from([1, 2, 4, 8]))
def test_rpo_micro_batches_average_to_the_batch_nll(pc, n, k):
    """Split into k micro-batches with the whole batch's tokens per pair: the mean of their NLLs is the batch's
    token-mean NLL -sum pc / max(sum n, 1), whatever the split."""
    tpp = max(int(n.sum()), 1) / 8
    parts = [float(ops.rpo_nll(p, m, tpp)) for p, m in zip(np.split(pc, k), np.split(n, k))]
    np.testing.assert_allclose(np.mean(parts), -pc.astype(np.float64).sum() / max(int(n.sum()), 1), rtol=1e-4,
                               atol=1e-5)
