"""Adapter dropout (model.lora.dropout > 0) in the PPO step on stories260K: it acts in the update's losses only (the
prepare pass is that of p = 0 exactly), changes the training vs p = 0, is deterministic, is the same on 1 and 8
devices, and with p = 0 the step has no random operation beyond the replay sampling of a full-weight run."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.models.test_lora_dropout import count_random_ops

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PREPARED = ("prox_logp", "values", "advantages", "returns", "token_rewards")


def _copy(tree):
    return jax.tree.map(lambda x: x.copy(), tree)


def _two_steps(run, state):
    s1, m1 = run.step(_copy(state))
    _, m2 = run.step(s1)
    return [{k: float(v) for k, v in m.items()} for m in (m1, m2)]


@pytest.mark.slow
def test_lora_dropout_in_the_update_only_deterministic_and_mesh_independent(make_cfg):
    from jaxppo.trainer.ppo.build import build_run

    # no LR warmup: step 1 already moves B, so step 2's loss reads the masked adapters (not only other samples)
    o = ("model.lora.rank=4", "data.eval_fraction=0", "critic.ppo_epochs=2", "actor.optim.warmup_steps=0")
    r0 = build_run(make_cfg(*o), devices=jax.devices()[:1])
    rp = build_run(make_cfg(*o, "model.lora.dropout=0.3"), devices=jax.devices()[:1])
    s0, sp = r0.prepare(r0.state), rp.prepare(rp.state)
    # the prepare pass (old/proximal log-probs, values, GAE) and the reference run without dropout
    for k in PREPARED:
        np.testing.assert_array_equal(np.asarray(getattr(sp.replay.storage.prepared, k)),
                                      np.asarray(getattr(s0.replay.storage.prepared, k)), err_msg=k)
    ids, mask = r0.train["prompt_ids"][:2], r0.train["prompt_mask"][:2]
    np.testing.assert_array_equal(np.asarray(rp.reference()(ids, mask)), np.asarray(r0.reference()(ids, mask)))
    np.testing.assert_array_equal(np.asarray(rp.policy(sp.actor)(ids, mask)), np.asarray(r0.policy(s0.actor)(ids, mask)))

    m0, mp = _two_steps(r0, s0), _two_steps(rp, sp)
    assert _two_steps(rp, sp) == mp                                      # same seed, same masks, same metrics
    # step 1: B = 0, so the adapters add nothing to the loss yet, but the gradients of B read the dropped input
    assert mp[0]["actor/pg_loss"] == pytest.approx(m0[0]["actor/pg_loss"], rel=1e-6, abs=1e-7)
    for k in ("actor/grad_norm", "critic/grad_norm"):
        assert abs(mp[0][k] - m0[0][k]) > 1e-3 * abs(m0[0][k]), k
    # step 2: the adapters moved differently, and the training loss sees masked adapters
    assert mp[1]["actor/pg_loss"] != pytest.approx(m0[1]["actor/pg_loss"], rel=1e-4)
    assert mp[1]["critic/vf_loss"] != pytest.approx(m0[1]["critic/vf_loss"], rel=1e-4)

    # the same masks on a mesh of 8 devices (partitionable threefry): the metrics of 1 device, up to float sums
    rp8 = build_run(make_cfg(*o, "model.lora.dropout=0.3", "mesh.fsdp=8"), devices=jax.devices()[:8])
    m8 = _two_steps(rp8, rp8.prepare(rp8.state))
    for a, b in zip(mp, m8):
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), k

    # p = 0 adds no random operation: the LoRA step has as many as the full-weight step (the replay sampling)
    rf = build_run(make_cfg(*o[1:]), devices=jax.devices()[:1])
    n_full = count_random_ops(rf.step, rf.state)
    assert n_full > 0
    assert count_random_ops(r0.step.fn, s0, r0.base) == n_full
    assert count_random_ops(rp.step.fn, sp, rp.base) > n_full
