"""The jitted update step: no recompilation, NaN skip in-graph, determinism, 1 vs 8 devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.trainer.ppo.build import build_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# every trace of a function for compilation, process-wide (jax.monitoring): a retraced step is a recompiled one.
# (The jitted function's own ``_cache_size()`` counts the C++ fast-path cache only, which reads 0 after a full
# suite has run even when nothing recompiles.)
_TRACES: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, _secs, **_kw: _TRACES.append(name) if name == "/jax/core/compile/jaxpr_trace_duration" else None)


def _leaves_equal(a, b) -> bool:
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _run_steps(run, n):
    """``(state, metrics per step, traces after the first step)``."""
    state = run.prepare(run.state)
    out = []
    for i in range(n):
        state, m = run.step(state)
        out.append({k: float(v) for k, v in jax.device_get(m).items()})
        if i == 0:
            traced = len(_TRACES)
    return state, out, len(_TRACES) - traced


def test_no_recompilation_and_determinism(make_cfg):
    run = build_run(make_cfg(), devices=jax.devices()[:1])
    state, m1, retraced = _run_steps(run, 4)
    assert retraced == 0, "the update step recompiled after the first step"
    assert int(state.step) == 4
    # same config + seed → the same metrics (a fresh run of the same jitted functions)
    run2 = build_run(make_cfg(), devices=jax.devices()[:1])
    _, m2, _ = _run_steps(run2, 4)
    assert m1 == m2
    # the update moved the policy; PER weights are in (0, 1]; beta anneals from beta0
    assert 0 < m1[0]["replay/per_weight_mean"] <= 1
    assert m1[0]["replay/beta"] == pytest.approx(0.4)
    assert m1[3]["replay/beta"] == pytest.approx(0.4 + 0.6 * 3 / 20)
    assert m1[0]["train/nan_skipped"] == 0.0


def test_nan_update_is_skipped_in_graph(make_cfg):
    run = build_run(make_cfg(), devices=jax.devices()[:1])
    state = run.prepare(run.state)
    st = state.replay.storage
    st = st.replace(prepared=st.prepared.replace(advantages=jnp.full_like(st.prepared.advantages, jnp.nan)))
    state = state.replace(replay=state.replay.replace(storage=st))
    before = jax.tree.map(lambda x: np.asarray(x).copy(), (state.actor, state.critic, state.actor_opt,
                                                           state.replay.priorities))
    state, m = run.step(state)
    assert m["train/nan_skipped"] == 1.0 and int(state.nan_total) == 1 and int(state.nan_streak) == 1
    after = (state.actor, state.critic, state.actor_opt, state.replay.priorities)
    assert _leaves_equal(before, after), "a NaN step changed parameters, optimizer state or priorities"
    assert int(state.step) == 1


def test_one_and_eight_devices_agree(make_cfg):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    r1 = build_run(make_cfg("mesh.data=1"), devices=jax.devices()[:1])
    _, m1, _ = _run_steps(r1, 3)
    # data parallel x FSDP on 8 devices: batch split over (data, fsdp), parameters sharded over fsdp
    r8 = build_run(make_cfg("mesh.data=2", "mesh.fsdp=4"), devices=jax.devices()[:8])
    assert r8.state.replay.storage.data.response_ids.sharding.spec[0] == ("data", "fsdp")
    _, m8, _ = _run_steps(r8, 3)
    for a, b in zip(m1, m8):
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), (a["train/loss"], k)


def test_ablation_switches_run_and_behave(make_cfg):
    """Shared trunk, uniform sampling, IS off, PF-PPO best-of-n + batch reweighting, adaptive KL in reward."""
    cfg = make_cfg("critic.share_trunk=true", "replay.sampling=uniform", "importance.enabled=false",
                   "importance.level=sequence", "importance.mode=mask", "pf_ppo.enabled=true",
                   "pf_ppo.filter=best_of_n", "pf_ppo.reweight_method=pow", "pf_ppo.weight_pow=1.0",
                   "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                   "algorithm.kl_ctrl.kl_coef=0.05", "algorithm.norm_adv=false")
    run = build_run(cfg, devices=jax.devices()[:1])
    # best-of-n keeps one trajectory per prompt group: the others never get sampled
    fw = np.asarray(run.state.replay.storage.data.filter_w)
    groups = run.train["group_id"]
    assert fw[: len(groups)].sum() == len(np.unique(groups))
    state, ms, _ = _run_steps(run, 3)
    for m in ms:
        assert m["replay/beta"] == 0.0 and m["replay/per_weight_mean"] == 1.0   # uniform: no PER weights
        assert m["is/ess"] > 0 and m["train/nan_skipped"] == 0.0
    assert ms[-1]["algorithm/kl_coef"] != pytest.approx(0.05, abs=0)          # the adaptive controller moved
    assert float(state.step) == 3
    # uniform sampling never writes priorities: they are still the filter weights
    np.testing.assert_array_equal(np.asarray(state.replay.priorities)[: fw.size], fw)


def test_ppo_epochs_equal_repeated_updates_on_one_minibatch(make_cfg):
    """actor.ppo_epochs=2, critic.ppo_epochs=3 in one step == the 1-epoch step called 3 times on the same
    minibatch (step counter and replay state reset before each call, so the same sample is drawn): actor
    and its optimizer after call 2, critic, its optimizer and the written priorities (|δ| of the last
    critic epoch) after call 3; metrics are the means over each model's epochs."""
    from jaxppo.optim import shardings_of

    # no warm-up: every epoch of a step uses lr_schedule(state.step), and the step is reset to 0 below
    nowarm = ("actor.optim.warmup_steps=0", "critic.optim.warmup_steps=0")
    ref = build_run(make_cfg("actor.ppo_epochs=1", "critic.ppo_epochs=1", *nowarm), devices=jax.devices()[:1])
    s = ref.prepare(ref.state)
    host0, sh0 = jax.device_get(s), shardings_of(s)
    after, ms = [], []
    for _ in range(3):
        s, m = ref.step(s)
        after.append(jax.device_get(s))
        ms.append({k: float(v) for k, v in jax.device_get(m).items()})
        s = jax.tree.map(jax.device_put, after[-1].replace(step=host0.step, replay=host0.replay), sh0)
    assert not _leaves_equal(after[0].actor, after[1].actor)     # a second update on the batch moves the actor

    run = build_run(make_cfg("actor.ppo_epochs=2", "critic.ppo_epochs=3", *nowarm), devices=jax.devices()[:1])
    s2, m2 = run.step(run.prepare(run.state))
    s2 = jax.device_get(s2)
    close = dict(rtol=1e-5, atol=1e-6)
    for got, want in [((s2.actor, s2.actor_opt), (after[1].actor, after[1].actor_opt)),
                      ((s2.critic, s2.critic_opt, s2.replay.priorities),
                       (after[2].critic, after[2].critic_opt, after[2].replay.priorities))]:
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), **close)
    assert int(s2.step) == 1 and float(m2["train/nan_skipped"]) == 0.0
    for key, n in [("actor/pg_loss", 2), ("actor/grad_norm", 2), ("actor/ppo_kl", 2),
                   ("critic/vf_loss", 3), ("critic/grad_norm", 3)]:
        assert float(m2[key]) == pytest.approx(np.mean([x[key] for x in ms[:n]]), rel=1e-4, abs=1e-6), key


def test_dataset_larger_than_buffer_moves_window_by_window(make_cfg):
    """replay.capacity below the training rows: the rows are cut into windows of WHOLE prompt groups (each at
    most 50 rows; the data has 4 responses per prompt, so a window holds 12 groups = 48 rows); window k
    holds its rows with their data and reference log-probs, the slots past it are invalid (filter weight 0,
    a group id of their own); after prepare the step runs on it without recompiling; windows cycle."""
    from jaxppo.trainer.ppo.windows import load_window

    run = build_run(make_cfg("replay.capacity=50", "critic.ppo_epochs=1"), devices=jax.devices()[:1])
    n_rows = run.train["prompt_ids"].shape[0]
    gid = run.train["group_id"]
    assert n_rows > 2 * 50 and run.n_use == 50 and run.capacity == 56
    ws = run.windows
    np.testing.assert_array_equal(np.concatenate(ws), np.arange(n_rows))       # a partition, in order
    for w in ws:
        assert len(w) <= 50
        assert not set(gid[w]) & set(np.delete(gid, w)), "a prompt group is split between windows"
    assert len(ws[0]) == 48
    np.testing.assert_array_equal(np.asarray(run.state.replay.storage.data.row)[:48], np.arange(48))
    state = run.prepare(run.state)
    state, _ = run.step(state)
    for k in (1, 2, len(ws)):      # window len(ws) is window 0 again
        state = run.prepare(load_window(run, state, k))
        rows = ws[k % len(ws)]
        n = len(rows)
        st = jax.device_get(state.replay.storage.data)
        assert int(state.data_cursor) == rows[0]
        np.testing.assert_array_equal(st.row[:n], rows)
        np.testing.assert_array_equal(st.response_ids[:n], run.train["response_ids"][rows])
        np.testing.assert_array_equal(st.ref_logp[:n], run.train["ref_logp"][rows])
        assert (st.filter_w[n:] == 0).all() and (np.asarray(state.replay.priorities)[n:] == 0).all()
        assert len(set(st.group_id[n:])) == run.capacity - n and (st.group_id[n:] < gid.min()).all()
        assert (np.asarray(state.replay.priorities)[:n] > 0).all()
        state, m = run.step(state)
        assert m["train/nan_skipped"] == 0.0
        if k == 1:   # the first window load ran its eager ops once; from here on nothing may trace again
            traced = len(_TRACES)
    assert len(_TRACES) == traced, "prepare or the step recompiled for a later window"


def test_group_windows_keep_groups_whole():
    """Hand cases of group_order / group_windows / window_slots, and the ConfigError for a group that does
    not fit a window."""
    from jaxppo.config import ConfigError
    from jaxppo.trainer.ppo.windows import group_order, group_windows, window_slots

    gid = np.array([7, 3, 7, 3, 5, 5, 5, 9])
    order = group_order(gid)
    np.testing.assert_array_equal(order, [0, 2, 1, 3, 4, 5, 6, 7])              # first appearance, stable
    np.testing.assert_array_equal(group_order(np.array([1, 1, 2, 2])), [0, 1, 2, 3])   # already contiguous
    g = gid[order]                                                                  # 7 7 3 3 5 5 5 9
    assert [w.tolist() for w in group_windows(g, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [w.tolist() for w in group_windows(g, 5)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [w.tolist() for w in group_windows(g, 3)] == [[0, 1], [2, 3], [4, 5, 6], [7]]
    assert [w.tolist() for w in group_windows(g, 8)] == [list(range(8))]
    with pytest.raises(ConfigError, match="replay.capacity"):
        group_windows(g, 2)
    with pytest.raises(ValueError, match="contiguous"):
        group_windows(gid, 4)
    rows, valid = window_slots(np.array([4, 5, 6]), 5)
    np.testing.assert_array_equal(rows, [4, 5, 6, 6, 6])
    np.testing.assert_array_equal(valid, [True, True, True, False, False])


def test_lr_follows_the_train_step_not_the_update_count(make_cfg):
    """critic.optim.warmup_steps=4 with critic.ppo_epochs=4: the critic LR applied at steps 0..5 is the
    schedule at 0..5 (before the fix optax's count advanced 4x per step: the critic moved at step 0, where
    the warm-up LR is 0); actor/lr and critic/lr log exactly the applied LR; a NaN-skipped step keeps the
    old optimizer state and the schedule still follows state.step (skipped steps count)."""
    from jaxppo.optim import learning_rate_of, lr_schedule

    cfg = make_cfg("critic.optim.warmup_steps=4", "critic.ppo_epochs=4", "critic.optim.schedule=linear",
                   "actor.optim.schedule=cosine")
    run = build_run(cfg, devices=jax.devices()[:1])
    a_lr = lr_schedule(cfg.actor.optim, cfg.trainer.total_steps)
    c_lr = lr_schedule(cfg.critic.optim, cfg.trainer.total_steps)
    state = run.prepare(run.state)
    critic0 = jax.tree.map(lambda x: np.asarray(x).copy(), state.critic)
    kls = []
    for s in range(6):
        state, m = run.step(state)
        if s == 0:       # warm-up LR 0 in all four epochs of step 0: the critic did not move
            assert float(c_lr(0)) == 0.0 and _leaves_equal(critic0, state.critic)
        assert float(m["critic/lr"]) == pytest.approx(float(c_lr(s)), rel=1e-6, abs=0)
        assert float(m["actor/lr"]) == pytest.approx(float(a_lr(s)), rel=1e-6, abs=0)
        assert float(learning_rate_of(state.critic_opt)) == pytest.approx(float(c_lr(s)), rel=1e-6, abs=0)
        assert float(learning_rate_of(state.actor_opt)) == pytest.approx(float(a_lr(s)), rel=1e-6, abs=0)
        kls.append(float(m["algorithm/kl"]))
    # algorithm/kl is the current policy's KL to the reference (no refresh in between): ~0 while the policy
    # is still the reference (actor warm-up: LR 0 at step 0), then it grows as the policy moves
    assert abs(kls[0]) < 1e-5 and abs(kls[5]) > 10 * max(abs(kls[0]), 1e-7) and kls[5] != kls[4]

    def with_advantages(state, a):
        st = state.replay.storage
        return state.replace(replay=state.replay.replace(storage=st.replace(prepared=st.prepared.replace(
            advantages=a))))

    adv = state.replay.storage.prepared.advantages
    good, sharding = np.asarray(adv).copy(), adv.sharding
    opt_before = jax.tree.map(lambda x: np.asarray(x).copy(), state.critic_opt)
    state, m = run.step(with_advantages(state, jnp.full_like(adv, jnp.nan)))
    assert m["train/nan_skipped"] == 1.0 and int(state.step) == 7
    assert _leaves_equal(opt_before, state.critic_opt)              # old LR and moments kept
    state, m = run.step(with_advantages(state, jax.device_put(good, sharding)))   # (the step donates its input)
    assert m["train/nan_skipped"] == 0.0
    assert float(learning_rate_of(state.critic_opt)) == pytest.approx(float(c_lr(7)), rel=1e-6)
    assert float(m["critic/lr"]) == pytest.approx(float(c_lr(7)), rel=1e-6)


def test_pf_weights_and_every_sampled_priority_are_fresh(make_cfg):
    """PF-PPO pow filter under prioritized replay + verl's batch-level resample: the step's PER weights are
    ``filtered_weights`` of its draw (the priority part only), and after the step EVERY sampled slot (also
    those the resample dropped) holds the fresh ``f·(agg|δ| + ε)^α`` of the critic's values (numpy δ)."""
    from jaxppo import replay as replay_lib
    from jaxppo.replay.filtered import filtered_weights
    from jaxppo.trainer.ppo.forward import response_values

    cfg = make_cfg("pf_ppo.enabled=true", "pf_ppo.filter=pow", "pf_ppo.weight_pow=1.0",
                   "pf_ppo.reweight_method=max_min", "critic.ppo_epochs=1")
    run = build_run(cfg, devices=jax.devices()[:1])
    state = run.prepare(run.state)
    fw = np.asarray(state.replay.storage.data.filter_w)
    assert len(np.unique(fw[fw > 0])) > 3                         # a real pow weighting
    state, _ = run.step(state)                                     # move the critic away from prepare's values
    host = jax.device_get(state)
    rc, B = cfg.replay, cfg.actor.ppo_mini_batch_size
    key = jax.random.fold_in(host.rng, host.step)
    k_sample, k_pf = jax.random.split(key)
    beta = replay_lib.linear_beta(host.step, rc.beta0, cfg.trainer.total_steps)
    smp = replay_lib.sample(state.replay, k_sample, B, beta=beta)
    idx = np.asarray(smp.indices)
    sel = np.asarray(replay_lib.resample_indices(k_pf, replay_lib.batch_reweight(smp.items.data.score, "max_min", 1.0)))
    assert set(idx.tolist()) - set(idx[sel].tolist()), "the resample dropped no slot: the test would be vacuous"
    w = np.asarray(filtered_weights(state.replay, smp, state.replay.storage.data.filter_w, beta))
    assert not np.allclose(w, np.asarray(smp.weights))            # the filter factor is not corrected away
    values = np.asarray(response_values(run.critic_gd, state.critic, smp.items.data), np.float64)
    it = jax.device_get(smp.items)
    m = it.data.response_mask.astype(np.float64)
    v = values * m
    nxt = np.concatenate([v[:, 1:], np.zeros((B, 1))], axis=1)
    delta = (it.prepared.token_rewards + cfg.algorithm.gamma * nxt - v) * m
    p = np.abs(delta).sum(-1) / np.maximum(m.sum(-1), 1)
    want = it.data.filter_w * (p + rc.eps) ** rc.alpha
    old = np.asarray(state.replay.priorities)[idx]

    state, met = run.step(state)
    assert met["train/nan_skipped"] == 0.0
    assert float(met["replay/per_weight_mean"]) == pytest.approx(float(w.mean()), rel=1e-5)
    got = np.asarray(state.replay.priorities)[idx]
    np.testing.assert_allclose(got, want, rtol=2e-4)
    assert not np.allclose(old, want, rtol=2e-4)                  # the values really changed
