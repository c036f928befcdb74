"""docs/extending.md works as written: executing its code blocks registers one entry in each registry, the
config check accepts exactly those names, and each entry computes what the document says (jit and no-jit)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo import ops, replay
from jaxppo.config import ConfigError, load_config
from jaxppo.config_names import NAMED_KEYS, check_config_names
from jaxppo.rewards import REWARDS, reward_fn_from_config
from jaxppo.trainer.ppo.policy_losses import POLICY_LOSSES

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "extending.md"
ADDED = {  # registry -> the name its docs block registers
    "algorithm.adv_estimator": "score_minus_batch_mean", "replay.priority": "abs_score",
    "actor.policy_loss": "unclipped", "pf_ppo.filter": "above_median", "pf_ppo.reweight_method": "exp",
    "reward.kind": "exclamations"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.fixture
def ns():
    """The document's Python blocks executed in one namespace; the entries are removed afterwards."""
    namespace: dict = {}
    before = {key: set(reg.names()) for key, (reg, _, _) in NAMED_KEYS.items()}
    try:
        for block in _blocks("python"):
            exec(compile(block, str(DOC), "exec"), namespace)   # noqa: S102 - our own documentation
        yield namespace
    finally:
        for key, (reg, _, _) in NAMED_KEYS.items():
            for name in set(reg.names()) - before[key]:
                reg.unregister(name)


def test_every_kind_is_documented_once(ns):
    for key, (reg, _, _) in NAMED_KEYS.items():
        assert ADDED[key] in reg, key
    assert len(_blocks("python")) == 5


def test_the_config_check_accepts_the_new_names_and_only_registered_ones(ns):
    cfg = load_config(None, [f"{k}={v}" for k, v in ADDED.items()] + ["pf_ppo.enabled=true"])
    check_config_names(cfg)
    for key in ADDED:
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}: unknown .* 'nope'; known: .*{ADDED[key]}"):
            check_config_names(load_config(None, [f"{key}=nope"]))


def test_the_documented_commands_name_registered_entries(ns):
    for cmd in _blocks("bash"):
        config, *overrides = re.search(r"--config (\S+)(.*)", cmd).group(1, 2)
        check_config_names(load_config(str(REPO / config), overrides[0].split()))


@pytest.mark.parametrize("jit", [False, True])
def test_estimator_hand_case(ns, jit):
    est = ops.ADVANTAGE_ESTIMATORS.get("score_minus_batch_mean")
    assert not est.needs_critic and not est.needs_groups
    r = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    m = jnp.array([[1, 1, 0], [1, 1, 1]], jnp.float32)
    f = (lambda r, m: est(r, None, m, None, ops.AdvantageHParams()))
    adv, ret = (jax.jit(f) if jit else f)(r, m)
    # scores [1, 3], batch mean 2 -> [-1, +1] on the response tokens, 0 on padding
    np.testing.assert_allclose(adv, [[-1, -1, 0], [1, 1, 1]])
    np.testing.assert_allclose(ret, adv)


@pytest.mark.parametrize("jit", [False, True])
def test_priority_hand_case(ns, jit):
    prio = ops.PRIORITIES.get("abs_score")
    f = lambda s: prio(delta=None, advantages=jnp.zeros((3, 2)), mask=jnp.ones((3, 2)), score=s,  # noqa: E731
                       group_id=jnp.zeros(3, jnp.int32))
    np.testing.assert_allclose((jax.jit(f) if jit else f)(jnp.array([-2.0, 0.5, 0.0])), [2.0, 0.5, 0.0])


@pytest.mark.parametrize("jit", [False, True])
def test_policy_loss_hand_case(ns, jit):
    from jaxppo.trainer.ppo.hparams import ActorHP

    hp = ActorHP(clip_low=0.2, clip_high=0.2, clip_c=3.0, agg="token-mean", entropy_coeff=0.0, use_kl_loss=False,
                 kl_loss_coef=0.0, kl_loss_type="k1", kl_penalty="kl", policy_loss="unclipped")
    logp = jnp.log(jnp.array([[2.0, 1.0], [1.0, 1.0]]))
    old = jnp.zeros((2, 2))
    adv = jnp.array([[1.0, 1.0], [-1.0, 5.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    f = lambda lp: POLICY_LOSSES.get("unclipped")(lp, old, adv, mask, hp, jnp.ones((2, 2)))  # noqa: E731
    loss, metrics = (jax.jit(f) if jit else f)(logp)
    # token mean of -A·r over the 3 valid tokens: (-2 - 1 + 1) / 3; ppo_kl = mean(old - logp) = -log 2 / 3
    np.testing.assert_allclose(loss, -2.0 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["ppo_kl"], -np.log(2.0) / 3.0, rtol=1e-6)
    assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"} <= set(metrics)


def test_pf_filter_and_reweight_hand_cases(ns):
    s = jnp.array([1.0, 3.0, 2.0, 0.0])
    np.testing.assert_array_equal(replay.filter_weights("above_median", s, jnp.zeros(4, jnp.int32), 1),
                                  [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(replay.batch_reweight(s, "exp", 1.0), np.exp([-2.0, 0.0, -1.0, -3.0]) + 1e-8,
                               rtol=1e-6)
    np.testing.assert_allclose(jax.jit(replay.batch_reweight, static_argnums=(1, 2))(s, "exp", 1.0),
                               np.exp([-2.0, 0.0, -1.0, -3.0]) + 1e-8, rtol=1e-6)


def test_reward_from_config(ns):
    cfg = load_config(None, ["reward.kind=exclamations"])
    np.testing.assert_array_equal(reward_fn_from_config(cfg.reward)(["p", "q"], ["a!!", "b"]), [2.0, 0.0])
    assert REWARDS.get("exclamations").options == {}
