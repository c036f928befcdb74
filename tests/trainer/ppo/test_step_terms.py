"""The PPO step's loss terms: ``algorithm/kl`` is the current policy's KL, ``is/*`` describe the applied weights
(also with importance off), PF-PPO batch-level resampling as counts equals the resampled batch, ``count_weights``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo import ops
from tests.trainer._batch import as_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _cfg(*overrides):
    """The step's hyper-parameter records (``hparams.step_hparams``) of a config with ``overrides``."""
    from jaxppo.config import load_config
    from jaxppo.trainer.ppo.hparams import step_hparams

    return step_hparams(load_config(None, ["actor.ppo_mini_batch_size=4", "replay.capacity=8", *overrides]))


def _items(b=4, r=5, v=7, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, r), np.int32)
    mask[1, 3:] = 0
    mask[2, 1:] = 0
    lp = lambda: np.log(rng.dirichlet(np.ones(v), size=(b, r)))  # noqa: E731
    ids = rng.integers(0, v, size=(b, r)).astype(np.int32)
    pick = lambda x: np.take_along_axis(x, ids[..., None], -1)[..., 0].astype(np.float32) * mask  # noqa: E731
    items = {"response_ids": ids, "response_mask": mask, "prox_logp": pick(lp()), "ref_logp": pick(lp()),
             "behaviour_logprobs": pick(lp()), "advantages": rng.normal(size=(b, r)).astype(np.float32) * mask,
             "score": rng.normal(size=(b,)).astype(np.float32)}
    logits = rng.normal(size=(b, r, v)).astype(np.float32)
    return {k: jnp.asarray(x) for k, x in items.items()}, jnp.asarray(logits)


@pytest.mark.parametrize("jit", [False, True])
def test_algorithm_kl_is_the_current_policy_kl(jit):
    """``algorithm/kl`` = masked mean of kl(π_θ, ref) from the logits (numpy), not kl(prox, ref)."""
    from jaxppo.trainer.ppo.steps import actor_terms

    cfg = _cfg("algorithm.kl_penalty=kl")
    items, logits = _items()
    items["prox_logp"] = items["ref_logp"]            # the old metric would be exactly 0
    fn = functools.partial(actor_terms, cfg)
    fn = jax.jit(fn) if jit else fn
    _, aux = fn(logits, as_batch(items), jnp.ones(4))
    lg = np.asarray(logits, np.float64)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    logp = np.take_along_axis(logp, np.asarray(items["response_ids"])[..., None], -1)[..., 0]
    m = np.asarray(items["response_mask"], np.float64)
    want = np.sum((logp - np.asarray(items["ref_logp"])) * m) / m.sum()
    assert abs(want) > 0.1
    np.testing.assert_allclose(float(aux["algorithm/kl"]), want, rtol=1e-5)


@pytest.mark.parametrize("enabled", [True, False])
def test_is_metrics_describe_the_applied_weights(enabled):
    from jaxppo.trainer.ppo.steps import actor_terms

    cfg = _cfg(f"importance.enabled={str(enabled).lower()}", "importance.threshold=1.5")
    items, logits = _items(seed=1)
    _, aux = jax.jit(functools.partial(actor_terms, cfg))(logits, as_batch(items), jnp.ones(4))
    would, met = ops.importance_weights(items["prox_logp"], items["behaviour_logprobs"], items["response_mask"],
                                        level="token", mode="truncate", threshold=1.5)
    assert float(met["clipped_frac"]) > 0 and float(met["weight_mean"]) != pytest.approx(1.0)
    if enabled:
        assert not any(k.startswith("is_diag/") for k in aux)
        for k in ("ess", "weight_mean", "weight_max", "clipped_frac"):
            assert float(aux[f"is/{k}"]) == pytest.approx(float(met[k]), rel=1e-6)
    else:
        assert {k: float(aux[f"is/{k}"]) for k in ("ess", "weight_mean", "weight_max", "clipped_frac")} == \
            {"ess": 1.0, "weight_mean": 1.0, "weight_max": 1.0, "clipped_frac": 0.0}
        for k in ("ess", "weight_mean", "weight_max", "clipped_frac"):
            assert float(aux[f"is_diag/{k}"]) == pytest.approx(float(met[k]), rel=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("jit", [False, True])
def test_resample_counts_equal_the_resampled_batch(agg, jit):
    """The batch-level PF resample as counts: actor and critic losses (and gradients) on the distinct rows
    with their resample ``counts`` equal those on the gathered resampled batch."""
    from jaxppo.trainer.ppo.steps import actor_terms, critic_terms

    cfg = _cfg(f"actor.loss_agg_mode={agg}", f"critic.loss_agg_mode={agg}", "actor.entropy_coeff=0.01")
    items, logits = _items(seed=2)
    rng = np.random.default_rng(0)
    items["values"] = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) * items["response_mask"]
    items["returns"] = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) * items["response_mask"]
    items["token_rewards"] = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) * items["response_mask"]
    values = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    w = jnp.asarray([0.3, 1.0, 0.7, 0.5], jnp.float32)
    sel = np.array([2, 0, 2, 2])                         # row 1 and 3 dropped, row 2 three times
    gathered = as_batch({k: x[sel] for k, x in items.items()})
    distinct = as_batch(items)
    counts = jnp.asarray(np.bincount(sel, minlength=4), jnp.float32)

    def actor(lg, it, ww, c=None):
        return actor_terms(cfg, lg, it, ww, c)[0]

    def critic(vv, it, ww, c=None):
        return critic_terms(cfg, vv, it, ww, c)[0]

    grad = (lambda f: jax.jit(jax.value_and_grad(f))) if jit else jax.value_and_grad
    la, ga = grad(actor)(logits[sel], gathered, w[sel])
    lb, gb = grad(actor)(logits, distinct, w, counts)
    assert float(la) == pytest.approx(float(lb), rel=1e-5)
    for i in range(4):      # gradient wrt a row's logits = its count × the gathered copies' gradient
        want = np.asarray(ga)[sel == i].sum(0) if (sel == i).any() else np.zeros_like(np.asarray(gb)[i])
        np.testing.assert_allclose(np.asarray(gb)[i], want, rtol=1e-4, atol=1e-7)
    lc, _ = grad(critic)(values[sel], gathered, w[sel])
    ld, _ = grad(critic)(values, distinct, w, counts)
    assert float(lc) == pytest.approx(float(ld), rel=1e-5)


def test_count_weights_hand_case():
    """counts [0, 1, 3], lengths [2, 4, 1]: token-mean Z = 7 / (4 + 3) = 1; seq-mean Z = 3 / 4."""
    from jaxppo.trainer.ppo.steps import count_weights

    mask = jnp.asarray([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    c = jnp.asarray([0.0, 1.0, 3.0])
    np.testing.assert_allclose(count_weights(c, mask, "token-mean")[:, 0], [0.0, 1.0, 3.0])
    np.testing.assert_allclose(count_weights(c, mask, "seq-mean-token-mean")[:, 0], [0.0, 0.75, 2.25])
    np.testing.assert_allclose(count_weights(None, mask, "token-mean"), np.ones((3, 1)))


@pytest.mark.parametrize("jit", [False, True])
def test_zero_entropy_coeff_keeps_loss_gradient_and_logged_entropy(jit):
    """With ``entropy_coeff=0`` the entropy leaves the gradient path (logged through the no-gradient form): the
    loss and its gradient equal the differentiable formula's ``pg − 0·H``, ``actor/entropy`` equals ``H``."""
    from jaxppo.trainer.ppo.steps import actor_terms

    items, logits = _items(seed=3)
    batch = as_batch(items)

    def loss_of(cfg, old_formula):
        def f(z, batch):
            total, aux = actor_terms(cfg, z, batch, jnp.ones(4))
            if old_formula:       # the pre-change loss: pg − c_H·H + c_KL·kl with the differentiable entropy
                a = cfg.actor
                m = batch.data.response_mask.astype(jnp.float32)
                h = ops.aggregate(ops.entropy_from_logits(z) * m, m, a.agg)
                total = aux["actor/pg_loss"] - a.entropy_coeff * h
                if a.use_kl_loss:
                    total = total + a.kl_loss_coef * aux["actor/kl_loss"]
            return total, aux
        g = jax.value_and_grad(f, has_aux=True)
        return jax.jit(g) if jit else g

    cfg0 = _cfg("actor.entropy_coeff=0.0")
    (l_new, aux), g_new = loss_of(cfg0, False)(logits, batch)
    (l_old, _), g_old = loss_of(cfg0, True)(logits, batch)
    assert float(l_new) == float(l_old)
    np.testing.assert_array_equal(np.asarray(g_new), np.asarray(g_old))
    assert float(jnp.max(jnp.abs(g_new))) > 0
    m = np.asarray(items["response_mask"], np.float64)
    lg = np.asarray(logits, np.float64)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    h = -(p * np.log(p)).sum(-1)
    np.testing.assert_allclose(float(aux["actor/entropy"]), (h * m).sum() / m.sum(), rtol=1e-5)
    # a non-zero coefficient still differentiates the entropy: its gradient is that of pg − c_H·H
    cfg1 = _cfg("actor.entropy_coeff=0.01")
    (l1, _), g1 = loss_of(cfg1, False)(logits, batch)
    (l1_old, _), g1_old = loss_of(cfg1, True)(logits, batch)
    np.testing.assert_allclose(float(l1), float(l1_old), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g1_old), rtol=1e-5, atol=1e-8)
    assert float(jnp.max(jnp.abs(g1 - g_new))) > 1e-6
