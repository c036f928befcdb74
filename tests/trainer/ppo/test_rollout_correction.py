"""verl's rollout correction in the trainer (``algorithm.rollout_correction``): IS weights on the PPO loss, the
rejection mask on the loss's response mask, ``rollout_corr/*`` metrics (``log_ratio = prox_logp − μ``)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.config import load_config
from jaxppo.trainer.ppo.hparams import step_hparams
from tests.trainer._batch import as_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

RC = "algorithm.rollout_correction."


def _hp(*overrides):
    return step_hparams(load_config(None, ["actor.ppo_mini_batch_size=4", "replay.capacity=8", *overrides]))


def _batch(seed, b=4, r=8, v=6):
    """Random logits and log-probs with |prox − μ| up to ~1.5, so some token ratios exceed 2 and some fall
    outside [0.5, 2]."""
    rng = np.random.default_rng(seed)
    mask = np.ones((b, r), np.int32)
    mask[2, 5:] = 0
    ids = rng.integers(0, v, size=(b, r)).astype(np.int32)
    prox = rng.normal(scale=0.3, size=(b, r)) - 1.5
    mu = prox - rng.uniform(-1.5, 1.5, size=(b, r))
    items = {"response_ids": ids, "response_mask": mask, "prox_logp": prox * mask, "behaviour_logprobs": mu * mask,
             "ref_logp": (prox + rng.normal(scale=0.2, size=(b, r))) * mask,
             "advantages": rng.normal(size=(b, r)) * mask, "score": rng.normal(size=(b,))}
    items = {k: jnp.asarray(x, jnp.int32 if k.startswith("response_") else jnp.float32) for k, x in items.items()}
    return items, jnp.asarray(rng.normal(size=(b, r, v)), jnp.float32), jnp.asarray(rng.uniform(0.3, 1, b), jnp.float32)


def _loss_and_grad(hp, logits, items, w, jit):
    from jaxppo.trainer.ppo.steps import actor_terms

    fn = jax.value_and_grad(lambda lg, it, ww: actor_terms(hp, lg, it, ww)[0])
    return (jax.jit(fn) if jit else fn)(logits, as_batch(items), w)


@pytest.mark.parametrize("jit", [False, True])
def test_rollout_is_token_equals_importance_token_truncate(jit):
    """rollout_is=token, rollout_is_threshold=2.0 ≡ importance.level=token mode=truncate threshold=2.0: the same
    loss and gradient (and some weights really are truncated)."""
    items, logits, w = _batch(0)
    ratio = np.exp(np.asarray(items["prox_logp"] - items["behaviour_logprobs"]))
    assert ((ratio > 2.0) & (np.asarray(items["response_mask"]) > 0)).any()
    a = _hp("importance.enabled=true", "importance.level=token", "importance.mode=truncate", "importance.threshold=2.0")
    b = _hp("importance.enabled=false", f"{RC}rollout_is=token", f"{RC}rollout_is_threshold=2.0")
    la, ga = _loss_and_grad(a, logits, items, w, jit)
    lb, gb = _loss_and_grad(b, logits, items, w, jit)
    assert float(la) == pytest.approx(float(lb), rel=1e-6)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(gb), rtol=1e-6, atol=1e-9)
    off = _hp("importance.enabled=false")
    assert float(_loss_and_grad(off, logits, items, w, jit)[0]) != pytest.approx(float(la), rel=1e-4)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), cap=st.floats(1.05, 5.0))
def test_property_rollout_is_equals_importance_truncate(seed, cap):
    items, logits, w = _batch(seed)
    a = _hp("importance.enabled=true", f"importance.threshold={cap}")
    b = _hp("importance.enabled=false", f"{RC}rollout_is=token", f"{RC}rollout_is_threshold={cap}")
    la, ga = _loss_and_grad(a, logits, items, w, True)
    lb, gb = _loss_and_grad(b, logits, items, w, True)
    assert float(la) == pytest.approx(float(lb), rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(gb), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("jit", [False, True])
def test_rejection_mask_removes_tokens_from_the_loss(jit):
    """rollout_rs=token_k1 with "0.5_2.0" keeps a token iff 0.5 ≤ μ/π_prox = exp(−(prox − μ)) ≤ 2 (numpy): the
    loss equals the loss on items whose response mask is that keep mask, rejected tokens get zero gradient,
    and rollout_corr/rollout_rs_masked_fraction is the rejected share."""
    items, logits, w = _batch(1)
    m = np.asarray(items["response_mask"]) > 0
    inv = np.exp(-np.asarray(items["prox_logp"] - items["behaviour_logprobs"], np.float64))
    keep = m & (inv >= 0.5) & (inv <= 2.0)
    assert keep.sum() > 3 and (m & ~keep).sum() > 3
    rs = _hp("importance.enabled=false", f"{RC}rollout_rs=token_k1", f"{RC}rollout_rs_threshold=0.5_2.0")
    plain = _hp("importance.enabled=false")
    l_rs, g_rs = _loss_and_grad(rs, logits, items, w, jit)
    masked = dict(items, response_mask=jnp.asarray(keep, jnp.int32))
    l_want, _ = _loss_and_grad(plain, logits, masked, w, jit)
    assert float(l_rs) == pytest.approx(float(l_want), rel=1e-5)
    assert np.abs(np.asarray(g_rs)[~keep]).max() == 0.0 and np.abs(np.asarray(g_rs)[keep]).max() > 0
    from jaxppo.trainer.ppo.steps import actor_terms

    _, aux = actor_terms(rs, logits, as_batch(items), w)
    assert float(aux["rollout_corr/rollout_rs_masked_fraction"]) == pytest.approx((m & ~keep).sum() / m.sum(),
                                                                                  rel=1e-5)


def test_rollout_corr_metrics_hand_values():
    """rollout_corr/kl = E_t[−(prox − μ)], chi2_token = E_t[exp(2(prox − μ))] − 1, rollout_is_mean = E_t[min(ρ, 2)]
    (the applied TIS weights, verl 0.9.1; numpy); no rollout_corr/* without the config keys."""
    from jaxppo.trainer.ppo.steps import actor_terms

    items, logits, w = _batch(2)
    hp = _hp("importance.enabled=false", f"{RC}rollout_is=token", f"{RC}rollout_is_threshold=2.0")
    _, aux = jax.jit(functools.partial(actor_terms, hp))(logits, as_batch(items), w)
    m = np.asarray(items["response_mask"], np.float64)
    lr = np.asarray(items["prox_logp"] - items["behaviour_logprobs"], np.float64)
    mean = lambda x: (x * m).sum() / m.sum()  # noqa: E731
    assert float(aux["rollout_corr/kl"]) == pytest.approx(mean(-lr), rel=1e-4)
    assert float(aux["rollout_corr/chi2_token"]) == pytest.approx(mean(np.exp(2 * lr)) - 1, rel=1e-4)
    assert float(aux["rollout_corr/rollout_is_mean"]) == pytest.approx(mean(np.minimum(np.exp(lr), 2.0)), rel=1e-4)
    _, aux = actor_terms(_hp(), logits, as_batch(items), w)
    assert not [k for k in aux if k.startswith("rollout_corr/")]


def test_trainer_logs_rollout_corr_metrics(make_cfg):
    """A tiny run with sequence-level rollout IS (IcePop band) and a sequence rejection criterion trains and logs
    rollout_corr/* (finite)."""
    import jax as _jax

    from jaxppo.trainer.ppo.build import build_run

    run = build_run(make_cfg("importance.enabled=false", f"{RC}rollout_is=sequence",
                             f"{RC}rollout_is_threshold=0.1_10.0", f"{RC}rollout_rs=seq_mean_k3",
                             f"{RC}rollout_rs_threshold=5.0", "critic.ppo_epochs=1"),
                    devices=_jax.devices()[:1])
    state, met = run.step(run.prepare(run.state))
    met = {k: float(v) for k, v in _jax.device_get(met).items()}
    assert met["train/nan_skipped"] == 0.0
    for k in ("rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/chi2_token",
              "rollout_corr/rollout_rs_masked_fraction"):
        assert k in met and np.isfinite(met[k]), k
