"""Hyper-parameter records (``jaxppo.trainer.ppo.hparams``), the policy-loss registry, config Literals vs the ops
constants, and ``actor_terms`` / ``critic_terms`` on synthetic arrays (random logits and values, no model)
against numpy, jitted and not."""

from __future__ import annotations

import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.config import ConfigError, load_config
from jaxppo.trainer.ppo.hparams import step_hparams
from tests.trainer._batch import as_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _hp(*overrides):
    return step_hparams(load_config(None, ["actor.ppo_mini_batch_size=4", "replay.capacity=8", *overrides]))


# ------------------------------------------------------------------------------------------- config rules
def test_config_literals_agree_with_the_ops_constants():
    from jaxppo.config import schema
    from jaxppo.ops import importance, kl, losses, rollout_correction

    def lit(cls, name):
        """The Literal values of a field (through ``X | None``)."""
        out = set()
        for a in typing.get_args(typing.get_type_hints(cls)[name]) or ():
            out |= set(typing.get_args(a)) if typing.get_origin(a) is typing.Literal else {a}
        return out - {type(None)}

    assert set(typing.get_args(schema.KLKind)) == set(kl.KL_KINDS)
    assert set(typing.get_args(schema.AggMode)) == set(losses.AGG_MODES)
    assert lit(schema.ImportanceConfig, "level") == set(importance.LEVELS)
    assert lit(schema.ImportanceConfig, "mode") == set(importance.MODES)
    assert lit(schema.RolloutCorrectionConfig, "rollout_is") == set(rollout_correction.IS_LEVELS)
    # registry names (estimator, priority, policy loss, PF-PPO filter/reweight, reward) are plain strings in the
    # schema, checked against the registries by jaxppo.config_names (tests/config/test_config_names.py)
    for section, key in ((schema.ReplayConfig, "priority"), (schema.PFPPOConfig, "filter"),
                         (schema.PFPPOConfig, "reweight_method"), (schema.AlgorithmConfig, "adv_estimator")):
        hint = typing.get_type_hints(section)[key]
        assert typing.Literal not in {typing.get_origin(a) for a in (hint, *typing.get_args(hint))}, key


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.adv_estimator=grpo", "replay.priority=td_error"], "replay.priority=td_error needs a critic"),
    (["importance.enabled=true", "algorithm.rollout_correction.rollout_is=token"], "choose one"),
    (["algorithm.rollout_correction.rollout_rs=token_k1"], "rollout_rs_threshold"),
    (["algorithm.rollout_correction.rollout_is_threshold=5.0_0.5"], "rollout_is_threshold"),
])
def test_inconsistent_settings_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _hp(*overrides)


def test_records_from_config():
    hp = _hp()
    assert hp.critic is not None and hp.replay.priority == "td_error" and hp.advantage.estimator == "gae"
    hp = _hp("algorithm.adv_estimator=rloo", "algorithm.norm_adv_by_std_in_grpo=false", "actor.clip_ratio_high=0.3")
    assert hp.critic is None and hp.replay.priority == "abs_advantage" and not hp.advantage.params.norm_by_std
    assert hp.actor.clip_high == 0.3 and hp.actor.clip_low == 0.2
    assert _hp("algorithm.adv_estimator=grpo", "replay.priority=group_variance").replay.priority == "group_variance"
    hash(hp)          # static (jit-hashable) records


def test_policy_loss_registry():
    from jaxppo.trainer.ppo.policy_losses import POLICY_LOSSES

    assert "ppo" in POLICY_LOSSES
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("ppo")(lambda *a: None)
    with pytest.raises(ValueError, match="unknown policy loss 'nope'; known: ppo"):
        POLICY_LOSSES.get("nope")


# ------------------------------------------------------------------------------------- numpy references
def _batch(seed, b=4, r=6, v=5):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, r), np.int32)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    ids = rng.integers(0, v, size=(b, r)).astype(np.int32)
    lp = lambda: rng.normal(scale=0.5, size=(b, r)).astype(np.float32) - 1.5  # noqa: E731
    items = {"response_ids": ids, "response_mask": mask, "prox_logp": lp() * mask, "ref_logp": lp() * mask,
             "behaviour_logprobs": lp() * mask, "advantages": rng.normal(size=(b, r)).astype(np.float32) * mask,
             "score": rng.normal(size=(b,)).astype(np.float32),
             "values": rng.normal(size=(b, r)).astype(np.float32) * mask,
             "returns": rng.normal(size=(b, r)).astype(np.float32) * mask,
             "token_rewards": rng.normal(size=(b, r)).astype(np.float32) * mask}
    logits = rng.normal(size=(b, r, v)).astype(np.float32)
    w = rng.uniform(0.2, 1.0, size=(b,)).astype(np.float32)
    return {k: jnp.asarray(x) for k, x in items.items()}, jnp.asarray(logits), jnp.asarray(w)


def _np_actor(logits, it, w, *, clip=0.2, clip_c=3.0, ent_coef=0.0, kl_coef=0.001, is_cap=2.0):
    """Token-mean PPO loss by hand: ρ = min(exp(prox − μ), C), pg = Σ m·w·ρ·max(−A r, −A clip(r)) (dual clip for
    A < 0) / Σ m, H = Σ m·H_t / Σ m, kl = k1+ (k1 value, k2 gradient: forward value = logp − ref)."""
    lg = np.asarray(logits, np.float64)
    logz = np.log(np.exp(lg).sum(-1, keepdims=True))
    logpa = lg - logz
    ids = np.asarray(it["response_ids"])
    m = np.asarray(it["response_mask"], np.float64)
    logp = np.take_along_axis(logpa, ids[..., None], -1)[..., 0]
    ent = -(np.exp(logpa) * logpa).sum(-1)
    prox, mu, adv = (np.asarray(it[k], np.float64) for k in ("prox_logp", "behaviour_logprobs", "advantages"))
    rho = np.minimum(np.exp(prox - mu), is_cap)
    r = np.exp(logp - prox)
    l1, l2 = -adv * r, -adv * np.clip(r, 1 - clip, 1 + clip)
    lo = np.maximum(l1, l2)
    lo = np.where(adv < 0, np.minimum(lo, -adv * clip_c), lo)
    wt = np.asarray(w, np.float64)[:, None] * rho
    pg = (lo * wt * m).sum() / m.sum()
    h = (ent * m).sum() / m.sum()
    kl = ((logp - np.asarray(it["ref_logp"])) * m).sum() / m.sum()
    return pg - ent_coef * h + kl_coef * kl, pg, h


@pytest.mark.parametrize("jit", [False, True])
def test_actor_terms_match_numpy(jit):
    from jaxppo.trainer.ppo.steps import actor_terms

    hp = _hp("actor.entropy_coeff=0.01", "actor.kl_loss_coef=0.05")
    items, logits, w = _batch(0)
    fn = functools.partial(actor_terms, hp)
    fn = jax.jit(fn) if jit else fn
    total, aux = fn(logits, as_batch(items), w)
    want, pg, h = _np_actor(logits, items, w, ent_coef=0.01, kl_coef=0.05)
    np.testing.assert_allclose(float(aux["actor/pg_loss"]), pg, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(aux["actor/entropy"]), h, rtol=1e-5)
    np.testing.assert_allclose(float(total), want, rtol=1e-5, atol=1e-6)
    assert "critic/score/mean" in aux          # with a critic the data metrics keep verl's names


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), clip=st.floats(0.05, 0.5))
def test_property_actor_terms_match_numpy(seed, clip):
    from jaxppo.trainer.ppo.steps import actor_terms

    hp = _hp(f"actor.clip_ratio={clip}", "actor.kl_loss_coef=0.0")
    items, logits, w = _batch(seed)
    total, _ = jax.jit(functools.partial(actor_terms, hp))(logits, as_batch(items), w)
    want, _, _ = _np_actor(logits, items, w, clip=clip, kl_coef=0.0)
    np.testing.assert_allclose(float(total), want, rtol=2e-5, atol=1e-6)


def test_actor_terms_hand_case():
    """One token, A = 1, prox = μ = log 0.5 (ρ = 1), two-token vocabulary with equal logits (π = 0.5, r = 1):
    pg = −1, entropy log 2; with entropy_coeff 0.1 and no KL loss the total is −1 − 0.1·log 2."""
    from jaxppo.trainer.ppo.steps import actor_terms

    hp = _hp("actor.entropy_coeff=0.1", "actor.use_kl_loss=false")
    h = jnp.log(0.5)
    items = {"response_ids": jnp.zeros((1, 1), jnp.int32), "response_mask": jnp.ones((1, 1), jnp.int32),
             "prox_logp": jnp.full((1, 1), h), "behaviour_logprobs": jnp.full((1, 1), h),
             "ref_logp": jnp.full((1, 1), h), "advantages": jnp.ones((1, 1)), "score": jnp.ones((1,))}
    total, aux = actor_terms(hp, jnp.zeros((1, 1, 2)), as_batch(items), jnp.ones(1))
    assert float(aux["actor/pg_loss"]) == pytest.approx(-1.0, abs=1e-6)
    assert float(total) == pytest.approx(-1.0 - 0.1 * np.log(2), abs=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_critic_terms_match_numpy(jit):
    """vf = ½·Σ m·w·max((V−G)², (clip(V, V_old±c)−G)²)/Σ m; priority = mean_m |δ| with δ = r + γ V' − V."""
    from jaxppo.trainer.ppo.steps import critic_terms

    hp = _hp("critic.cliprange_value=0.3", "algorithm.gamma=0.9")
    items, _, w = _batch(1)
    values = jnp.asarray(np.random.default_rng(5).normal(size=(4, 6)), jnp.float32)
    fn = functools.partial(critic_terms, hp)
    fn = jax.jit(fn) if jit else fn
    vf, aux, prio = fn(values, as_batch(items), w)
    m = np.asarray(items["response_mask"], np.float64)
    v = np.asarray(values, np.float64) * m
    old, ret, rew = (np.asarray(items[k], np.float64) for k in ("values", "returns", "token_rewards"))
    per = np.maximum((v - ret) ** 2, (np.clip(v, old - 0.3, old + 0.3) - ret) ** 2)
    want = 0.5 * (per * np.asarray(w)[:, None] * m).sum() / m.sum()
    np.testing.assert_allclose(float(vf), want, rtol=1e-5)
    nxt = np.concatenate([v[:, 1:], np.zeros((4, 1))], 1)
    delta = (rew + 0.9 * nxt - v) * m
    np.testing.assert_allclose(np.asarray(prio), np.abs(delta).sum(-1) / m.sum(-1), rtol=1e-5)


def test_critic_free_metrics_have_no_critic_prefix():
    from jaxppo.trainer.ppo.steps import actor_terms

    items, logits, w = _batch(2)
    _, aux = actor_terms(_hp("algorithm.adv_estimator=grpo"), logits, as_batch(items), w)
    assert not [k for k in aux if k.startswith("critic/")]
    assert float(aux["data/score/mean"]) == pytest.approx(float(jnp.mean(items["score"])))
