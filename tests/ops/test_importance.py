"""importance_weights: hand cases, reference for every level/mode, properties, detachment, errors."""

from __future__ import annotations

import functools
import itertools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.ops import importance_weights
from jaxppo.ops.importance import LEVELS, MODES
from tests.ops import reference as ref
from tests.ops._data import random_inputs


class ImportanceTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_token_truncate(self):
        # log ratios [ln 0.5, ln 3, ln 1, pad]: truncate at 2 -> [0.5, 2, 1, 0]
        # units: 3 valid tokens; mean = 3.5/3 ; max = 2 ; clipped_frac = 1/3
        # ESS/N = (0.5+2+1)^2 / (3 * (0.25+4+1)) = 12.25 / 15.75 = 0.777778
        tgt = jnp.asarray(np.log([[0.5, 3.0, 1.0, 7.0]]), jnp.float32)
        w, met = self.variant(functools.partial(importance_weights, level="token", mode="truncate",
                                                threshold=2.0))(tgt, jnp.zeros((1, 4)), jnp.array([[1, 1, 1, 0]]))
        np.testing.assert_allclose(w, [[0.5, 2.0, 1.0, 0.0]], rtol=1e-6)
        np.testing.assert_allclose(met["weight_mean"], 3.5 / 3, rtol=1e-6)
        np.testing.assert_allclose(met["weight_max"], 2.0, rtol=1e-6)
        np.testing.assert_allclose(met["clipped_frac"], 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(met["ess"], 12.25 / 15.75, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_sequence_levels_mask_veto_cap(self):
        # row 0 log ratios [ln 2, ln 0.8]: sequence rho = 1.6, geometric rho = sqrt(1.6) = 1.264911
        # row 1 log ratios [ln 1.1, ln 0.05]: sequence rho = 0.055 ; any token < veto 0.1 -> vetoed
        tgt = jnp.asarray(np.log([[2.0, 0.8], [1.1, 0.05]]), jnp.float32)
        beh = jnp.zeros((2, 2))
        mask = jnp.ones((2, 2))
        fn = lambda **kw: self.variant(functools.partial(importance_weights, **kw))(tgt, beh, mask)  # noqa: E731
        w, _ = fn(level="sequence", mode="truncate", threshold=10.0)
        np.testing.assert_allclose(w, [[1.6, 1.6], [0.055, 0.055]], rtol=1e-5)
        # mask mode, [lower=0.5, threshold=1.5]: 1.6 is rejected (0), 0.055 rejected (0)
        w, met = fn(level="sequence", mode="mask", threshold=1.5, lower=0.5)
        np.testing.assert_allclose(w, 0.0)
        np.testing.assert_allclose(met["ess"], 0.0)  # every weight is 0
        # the mask sees the raw ratio: 1.6 is outside [0.5, 1.5] and stays masked even with the cap rule
        w, _ = fn(level="sequence", mode="mask", threshold=1.5, lower=0.5, cap_rule=True)
        np.testing.assert_allclose(w, 0.0)
        # band [0.5, 2]: 1.6 is kept, then capped 1.6 > 1.5 -> 1.2 ; veto removes row 1
        w, met = fn(level="sequence", mode="mask", threshold=2.0, lower=0.5, cap_rule=True, veto=0.1)
        np.testing.assert_allclose(w, [[1.2, 1.2], [0.0, 0.0]], rtol=1e-6)
        np.testing.assert_allclose(met["veto_frac"], 0.5)
        np.testing.assert_allclose(met["clipped_frac"], 1.0)  # capped + vetoed: both units changed
        w, met = fn(level="geometric", mode="truncate", threshold=10.0)
        np.testing.assert_allclose(w[0], [np.sqrt(1.6)] * 2, rtol=1e-5)
        np.testing.assert_allclose(w[1], [np.sqrt(0.055)] * 2, rtol=1e-5)
        # ESS over the 2 sequences: (a+b)^2 / (2 (a^2+b^2)) with a = sqrt(1.6), b = sqrt(0.055)
        a, b = np.sqrt(1.6), np.sqrt(0.055)
        np.testing.assert_allclose(met["ess"], (a + b) ** 2 / (2 * (a * a + b * b)), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mask_decides_on_raw_ratio_before_cap_rule(self):
        # token ratios [0.3, 1.0, 1.8, 3.0], band [0.5, 2]: mask -> [0, 1, 1.8, 0], then cap 1.8 -> 1.2.
        # (cap first would turn 3.0 into 1.2 and keep it: the bug this pins down)
        tgt = jnp.asarray(np.log([[0.3, 1.0, 1.8, 3.0]]), jnp.float32)
        fn = self.variant(functools.partial(importance_weights, level="token", mode="mask", threshold=2.0,
                                            lower=0.5, cap_rule=True))
        w, met = fn(tgt, jnp.zeros((1, 4)), jnp.ones((1, 4)))
        np.testing.assert_allclose(w, [[0.0, 1.0, 1.2, 0.0]], rtol=1e-6)
        np.testing.assert_allclose(met["clipped_frac"], 3 / 4, rtol=1e-6)    # 0.3, 1.8 and 3.0 changed
        # truncation keeps its order: cap (1.8, 3.0 -> 1.2), then min(., threshold=1.1)
        w, _ = self.variant(functools.partial(importance_weights, level="token", mode="truncate",
                                              threshold=1.1, cap_rule=True))(tgt, jnp.zeros((1, 4)), jnp.ones((1, 4)))
        np.testing.assert_allclose(w, [[0.3, 1.0, 1.1, 1.1]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_reference_every_option(self):
        _, m, x = random_inputs(seed=13, b=6, t=7, scale=0.6)
        tgt, beh = x(), x()
        tgt[2, 0] = 40.0  # clamp at +20
        # every level x mode, cycling through the four veto / cap-rule combinations
        flags = itertools.cycle([(None, False), (0.3, True), (0.3, False), (None, True)])
        for (level, mode), (veto, cap) in zip(itertools.product(LEVELS, MODES), flags):
            kw = dict(level=level, mode=mode, threshold=2.0, veto=veto, cap_rule=cap)
            if mode == "mask":
                kw["lower"] = 0.4
            w, met = self.variant(functools.partial(importance_weights, **kw))(tgt, beh, m)
            want_w, want_m = ref.importance_weights(tgt, beh, m, **kw)
            np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-6, err_msg=str(kw))
            for k, v in want_m.items():
                np.testing.assert_allclose(met[k], v, rtol=1e-5, atol=1e-6, err_msg=f"{k} {kw}")

    @chex.variants(with_jit=True, without_jit=True)
    def test_weights_are_detached(self):
        _, m, x = random_inputs(seed=14)
        tgt, beh = x(), x()
        for level in LEVELS:
            fn = functools.partial(importance_weights, level=level, mode="truncate", threshold=5.0)
            g = self.variant(jax.grad(lambda a, f=fn: jnp.sum(f(a, beh, m)[0])))(jnp.asarray(tgt))
            np.testing.assert_allclose(g, 0.0)


_lp = hnp.arrays(np.float32, (3, 5), elements=st.floats(-3, 3, width=32))
_mask = hnp.arrays(np.bool_, (3, 5))


@functools.lru_cache(maxsize=None)
def _weights_fn(level, mode, threshold=2.0):
    return jax.jit(functools.partial(importance_weights, level=level, mode=mode, threshold=threshold))


@given(t=_lp, b=_lp, m=_mask, level=st.sampled_from(LEVELS))
def test_property_truncated_weights_never_exceed_cap(t, b, m, level):
    w, met = _weights_fn(level, "truncate")(t, b, m)
    w = np.asarray(w)
    assert np.all(w <= 2.0) and np.all(w >= 0.0)
    assert np.all(w[~m] == 0.0)
    if m.any():
        assert 0.0 < float(met["ess"]) <= 1.0 + 1e-6


@given(t=_lp, b=_lp, m=_mask, level=st.sampled_from(LEVELS))
def test_property_masked_weights_are_zero_or_the_ratio(t, b, m, level):
    w, _ = _weights_fn(level, "mask")(t, b, m)
    w = np.asarray(w)
    lr = np.clip(t.astype(np.float64) - b, -20, 20) * m
    if level == "token":
        rho = np.exp(lr)
    elif level == "sequence":
        rho = np.broadcast_to(np.exp(np.clip(lr.sum(-1, keepdims=True), -20, 20)), w.shape)
    else:
        rho = np.broadcast_to(np.exp(lr.sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1)), w.shape)
    zero = w == 0.0
    np.testing.assert_allclose(w[~zero], rho[~zero], rtol=1e-5)
    inside = (rho >= 0.5) & (rho <= 2.0) & m
    assert np.all(zero | inside)  # a non-zero weight is a ratio inside [1/C, C]


@given(t=_lp, b=_lp, m=_mask)
def test_property_mask_with_cap_rule_keeps_only_raw_ratios_inside_the_band(t, b, m):
    """mode=mask + cap_rule (token level, band [0.5, 3]): w = 0 outside the band of the RAW ratio, 1.2 for
    1.5 < rho <= 3, rho otherwise (independent numpy reference of the documented order)."""
    fn = jax.jit(functools.partial(importance_weights, level="token", mode="mask", threshold=3.0, lower=0.5,
                                   cap_rule=True))
    w = np.asarray(fn(t, b, m)[0])
    rho = np.exp(np.clip(t.astype(np.float64) - b, -20, 20))
    want = np.where((rho >= 0.5) & (rho <= 3.0), np.where(rho > 1.5, 1.2, rho), 0.0) * m
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-7)


@given(c=st.floats(-3, 3), m=_mask, level=st.sampled_from(LEVELS))
def test_property_ess_is_one_for_equal_weights(c, m, level):
    if not m.any():
        return
    if level == "sequence":  # the same summed log ratio c in every sequence
        t = np.where(m, c / np.maximum(m.sum(-1, keepdims=True), 1), 0.0).astype(np.float32)
    else:  # the same log ratio c on every token (token and geometric level)
        t = np.full((3, 5), c, np.float32)
    _, met = _weights_fn(level, "truncate", 1e6)(t, np.zeros_like(t), m)
    np.testing.assert_allclose(met["ess"], 1.0, rtol=1e-5)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(level="batch", mode="truncate", threshold=2.0), ValueError, "level='batch'"),
    (dict(level="token", mode="clip", threshold=2.0), ValueError, "mode='clip'"),
    (dict(level="token", mode="truncate", threshold=0.0), ValueError, "threshold must be > 0"),
    (dict(level="token", mode="truncate", threshold=2.0, lower=0.5), ValueError, "lower is only used"),
    (dict(level="token", mode="mask", threshold=2.0, lower=3.0), ValueError, "lower=3.0 must be <= threshold"),
    (dict(level="token", mode="mask", threshold=2.0, veto=-1.0), ValueError, "veto must be > 0"),
])
def test_bad_options(kw, exc, match):
    with pytest.raises(exc, match=match):
        importance_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3)), **kw)


def test_shape_mismatch():
    with pytest.raises(ValueError, match="behaviour_logp"):
        importance_weights(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)), level="token", mode="truncate",
                           threshold=2.0)
