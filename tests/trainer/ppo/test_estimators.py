"""Critic-free advantage estimators in the trainer (``algorithm.adv_estimator``), replay priorities named in the
config, DAPO dynamic sampling as a PF-PPO filter, the staleness decay in the step, uniform sampling.

Every run uses the tiny trainer config (``conftest.TINY``) on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.trainer.ppo.hparams import step_hparams
from jaxppo.trainer.ppo.build import build_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CRITIC_FREE = ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def _copy(tree):
    return jax.tree.map(lambda x: np.asarray(x).copy(), tree)


def _numpy_grpo(score, gid, mask, eps=1e-6):
    """GRPO by hand: (s − mean_g) / (std_g + eps) with the unbiased std (a group of one: s / (1 + eps))."""
    adv = np.zeros_like(score, dtype=np.float64)
    for g in np.unique(gid):
        sel = gid == g
        s = score[sel].astype(np.float64)
        adv[sel] = s / (1 + eps) if len(s) == 1 else (s - s.mean()) / (s.std(ddof=1) + eps)
    return adv[:, None] * mask


@pytest.mark.parametrize("estimator", CRITIC_FREE)
def test_critic_free_estimator_trains_without_a_critic(make_cfg, tmp_path, estimator):
    """No critic in the state or the checkpoint, no critic/* metrics, the actor moves, losses finite; the
    buffer's advantages are the estimator's on the whole buffer with the rows' group ids (GRPO: numpy);
    priorities are abs_advantage (the critic-free default)."""
    from jaxppo.trainer.checkpoint import Checkpointer, tree_signature

    run = build_run(make_cfg(f"algorithm.adv_estimator={estimator}"), devices=jax.devices()[:1])
    assert run.state.critic is None and run.state.critic_opt is None and run.critic_gd is None
    assert run.state.replay.storage.prepared.values is None
    assert step_hparams(run.cfg).replay.priority == "abs_advantage"
    state = run.prepare(run.state)
    st = jax.device_get(state.replay.storage)
    d, adv = st.data, st.prepared.advantages
    m = d.response_mask.astype(np.float64)
    valid = d.filter_w > 0
    if estimator == "grpo":
        want = _numpy_grpo(d.score[valid], d.group_id[valid], m[valid])
        np.testing.assert_allclose(adv[valid], want, rtol=1e-4, atol=1e-5)
    p_abs = np.abs(adv).sum(-1) / np.maximum(m.sum(-1), 1)
    rc = run.cfg.replay
    prio = np.asarray(state.replay.priorities)[:run.capacity]
    np.testing.assert_allclose(prio[valid], (p_abs[valid] + rc.eps) ** rc.alpha,
                               rtol=1e-4)
    actor0 = _copy(state.actor)
    for _ in range(3):
        state, met = run.step(state)
        met = {k: float(v) for k, v in jax.device_get(met).items()}
        assert not [k for k in met if k.startswith("critic/")], sorted(met)
        assert met["train/nan_skipped"] == 0.0 and np.isfinite(met["actor/pg_loss"]) and np.isfinite(met["train/loss"])
        assert "data/score/mean" in met and "actor/advantages/mean" in met
    moved = [float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(state.actor),
                                                                       jax.tree.leaves(actor0))]
    assert max(moved) > 1e-4
    ck = Checkpointer(tmp_path / "ck", keep_last=1, async_save=False)
    ck.save(3, state, {})
    sig = tree_signature(jax.device_get(state))
    assert sig and not [p for p in sig if "critic" in p]
    restored, _ = ck.restore(3, state)
    assert restored.critic is None
    ck.close()


def _mean_logp(run, params, rows):
    """Per-row mean response log-prob of the training rows ``rows`` under ``params``."""
    from jaxppo.trainer.ppo.buffer_types import Tokens
    from jaxppo.trainer.ppo.forward import logp_entropy, response_logits

    tok = Tokens(**{k: jnp.asarray(run.train[k][rows]) for k in ("prompt_ids", "prompt_mask", "response_ids",
                                                                  "response_mask")})
    logp, _ = logp_entropy(response_logits(run.actor_gd, params, tok), tok.response_ids, tok.response_mask)
    m = np.asarray(tok.response_mask, np.float64)
    return np.asarray(logp, np.float64).sum(-1) / np.maximum(m.sum(-1), 1)


def test_grpo_raises_the_likelihood_of_better_responses(make_cfg):
    """GRPO learns the training signal: after 15 steps the mean log-prob of responses scored above their group's
    mean rises relative to those scored below it (a deterministic, learnable signal at tiny size)."""
    run = build_run(make_cfg("algorithm.adv_estimator=grpo", "actor.use_kl_loss=false"), devices=jax.devices()[:1])
    score, gid = run.train["score"], run.train["group_id"]
    gmean = np.array([score[gid == g].mean() for g in gid])
    rows = np.flatnonzero(np.abs(score - gmean) > 1e-3)[:128]
    hi, lo = score[rows] > gmean[rows], score[rows] < gmean[rows]
    assert hi.sum() > 10 and lo.sum() > 10
    before = _mean_logp(run, run.state.actor, rows)
    state = run.prepare(run.state)
    for i in range(15):
        if i and i % run.cfg.replay.refresh_every == 0:
            state = run.prepare(state)
        state, met = run.step(state)
        assert float(met["train/nan_skipped"]) == 0.0
    d = _mean_logp(run, state.actor, rows) - before
    gap = d[hi].mean() - d[lo].mean()
    assert gap > 0.02, (d[hi].mean(), d[lo].mean())


def test_uniform_sampling_changes_the_actor(make_cfg):
    """Regression: replay.sampling=uniform trains (the actor moves; someone once saw it not change)."""
    run = build_run(make_cfg("replay.sampling=uniform"), devices=jax.devices()[:1])
    state = run.prepare(run.state)
    actor0 = _copy(state.actor)
    for _ in range(3):
        state, met = run.step(state)
    assert float(met["train/nan_skipped"]) == 0.0 and float(met["replay/beta"]) == 0.0
    diff = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(jax.tree.leaves(state.actor),
                                                                         jax.tree.leaves(actor0)))
    assert diff > 1e-4


def test_staleness_decay_in_the_step(make_cfg, monkeypatch):
    """replay.decay.kind=none: the step is bit-identical to the step without ``record_sample`` (the same
    priorities, tree, parameters and metrics); decay.kind=sampled (rate 0.5): after one step every drawn item's
    sampling probability fell, its leaf is ``f·(p+ε)^α · 0.5^n`` with ``n`` its draw count, undrawn ones kept."""
    from jaxppo import replay as replay_lib
    from jaxppo.trainer.ppo import steps as steps_mod

    cfg = make_cfg("critic.ppo_epochs=1")
    run = build_run(cfg, devices=jax.devices()[:1])
    s_new, m_new = run.step(run.prepare(run.state))
    with monkeypatch.context() as mp:
        mp.setattr(steps_mod.replay_lib, "record_sample", lambda rs, idx: rs)
        old = build_run(cfg, devices=jax.devices()[:1])
    s_old, m_old = old.step(old.prepare(old.state))
    for a, b in zip(jax.tree.leaves((s_new.actor, s_new.critic, s_new.replay.priorities, s_new.replay.tree)),
                    jax.tree.leaves((s_old.actor, s_old.critic, s_old.replay.priorities, s_old.replay.tree))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert {k: float(v) for k, v in m_new.items()} == {k: float(v) for k, v in m_old.items()}
    assert int(np.asarray(s_new.replay.sample_count).sum()) == cfg.actor.ppo_mini_batch_size

    run = build_run(make_cfg("critic.ppo_epochs=1", "replay.decay.kind=sampled", "replay.decay.rate=0.5"),
                    devices=jax.devices()[:1])
    state = run.prepare(run.state)
    key = jax.random.fold_in(state.rng, state.step)
    idx = np.asarray(replay_lib.sample(state.replay, jax.random.split(key)[0], cfg.actor.ppo_mini_batch_size,
                                       beta=jnp.float32(cfg.replay.beta0)).indices)
    p0 = np.asarray(state.replay.priorities)[:run.capacity].copy()
    state, met = run.step(state)
    counts = np.bincount(idx, minlength=p0.shape[0])
    np.testing.assert_array_equal(np.asarray(state.replay.sample_count)[:run.capacity], counts)
    base = np.asarray(state.replay.base_priorities)[:run.capacity]
    p1 = np.asarray(state.replay.priorities)[:run.capacity]
    drawn = counts > 0
    np.testing.assert_allclose(p1[drawn], base[drawn] * 0.5 ** counts[drawn], rtol=1e-6)
    np.testing.assert_array_equal(p1[~drawn], p0[~drawn])
    prob0, prob1 = p0 / p0.sum(), p1 / p1.sum()
    assert (prob1[drawn] < prob0[drawn]).all() and (prob1[~drawn & (p0 > 0)] > prob0[~drawn & (p0 > 0)]).all()
    assert float(met["replay/sample_count_max"]) == counts.max()


def test_dynamic_sampling_filter_drops_constant_groups(make_cfg):
    """pf_ppo.filter=dynamic_sampling: rows of groups whose scores are all equal get filter weight 0 (never
    sampled), the others 1; the count is run.pf_stats['pf_ppo/dropped_groups'] (numpy reference)."""
    run = build_run(make_cfg("algorithm.adv_estimator=grpo", "pf_ppo.enabled=true", "pf_ppo.filter=dynamic_sampling"),
                    devices=jax.devices()[:1])
    score, gid, fw = run.train["score"], run.train["group_id"], run.train["filter_w"]
    const = {g for g in np.unique(gid) if (gid == g).sum() > 1 and np.ptp(score[gid == g]) <= 1e-6}
    want = np.array([0.0 if g in const else 1.0 for g in gid], np.float32)
    np.testing.assert_array_equal(fw, want)
    assert run.pf_stats == {"pf_ppo/dropped_groups": len(const)}
    state, met = run.step(run.prepare(run.state))
    assert float(met["train/nan_skipped"]) == 0.0


def test_pf_filter_dynamic_sampling_hand_case():
    """Groups 1 (scores 1, 1) and 3 (0.5, 0.5, 0.5) are constant, group 2 is not, group 4 has one row (kept,
    as DAPO): weights [0 0 1 1 0 0 0 1], 2 dropped groups; the filter off gives all 1 and 0 dropped."""
    from jaxppo.config import load_config
    from jaxppo.trainer.ppo.prepare import pf_filter

    score = np.array([1.0, 1.0, 0.2, 0.9, 0.5, 0.5, 0.5, 0.3], np.float32)
    gid = np.array([1, 1, 2, 2, 3, 3, 3, 4])
    cfg = load_config(None, ["pf_ppo.enabled=true", "pf_ppo.filter=dynamic_sampling"])
    w, stats = pf_filter(step_hparams(cfg).pf, score, gid, 0)
    np.testing.assert_array_equal(w, [0, 0, 1, 1, 0, 0, 0, 1])
    assert stats == {"pf_ppo/dropped_groups": 2}
    w, stats = pf_filter(step_hparams(load_config(None, [])).pf, score, gid, 0)
    np.testing.assert_array_equal(w, np.ones(8))
    assert stats == {"pf_ppo/dropped_groups": 0}
    with pytest.raises(ValueError, match="every trajectory weight 0"):
        pf_filter(step_hparams(cfg).pf, np.ones(4, np.float32), np.array([0, 0, 1, 1]), 0)
