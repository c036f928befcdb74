"""The packed update step and prepare pass (``data.packing``): the same minibatches, prepared arrays, losses,
metrics and parameters as the padded ones; the host plan's layout; buffer windows; 1 vs 8 devices (2 processes:
tests/faults/test_dead_peer.py runs its preempted and resumed 2-process runs packed)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxppo.models.packing import pack
from jaxppo.trainer.micro import strided_split
from jaxppo.trainer.ppo.build import build_run
from jaxppo.trainer.ppo.packed import HostPlanned as PackedStep
from jaxppo.trainer.ppo.packed import plan_pieces as plan_micro_batches

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# metrics that are not functions of the parameters' update (identical by construction) are compared too
TOL = dict(rel=1e-5, abs=1e-5)


def _steps(run, n):
    state = run.prepare(run.state)
    out = []
    for _ in range(n):
        state, m = run.step(state)
        out.append({k: float(v) for k, v in jax.device_get(m).items()})
    return state, out


def _close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                   rtol=tol.get("rel", 1e-5), atol=tol.get("abs", 1e-5))


def _windows_agree(padded, packed, steps: int = 4):
    """``steps`` steps of both runs, a new buffer window loaded and prepared every 2: after each refresh the prepared
    arrays and priorities agree, and so do every step's metrics and the final parameters."""
    from jaxppo.trainer.ppo.windows import load_window

    s0, s1 = padded.state, packed.state
    for step in range(steps):
        if step % 2 == 0:
            s0, s1 = (r.prepare(load_window(r, s, step // 2)) for r, s in ((padded, s0), (packed, s1)))
            _close(s0.replay.storage.prepared, s1.replay.storage.prepared)
            _close(s0.replay.priorities, s1.replay.priorities)
        s0, m0 = padded.step(s0)
        s1, m1 = packed.step(s1)
        for k, v in jax.device_get(m0).items():
            assert float(m1[k]) == pytest.approx(float(v), **TOL), (step, k)
    _close(s0.actor, s1.actor)


def _fields(b, p, r, rng):
    lp = rng.integers(1, p + 1, b)
    lr = rng.integers(0, r + 1, b)
    pm = (np.arange(p)[None] >= (p - lp)[:, None]).astype(np.int32)
    rm = (np.arange(r)[None] < lr[:, None]).astype(np.int32)
    return {"prompt_ids": rng.integers(3, 50, (b, p)) * pm, "prompt_mask": pm,
            "response_ids": rng.integers(3, 50, (b, r)) * rm, "response_mask": rm}


def test_plan_hands_each_strided_micro_batch_its_own_layout():
    rng = np.random.default_rng(0)
    f = _fields(12, 6, 5, rng)
    plan = plan_micro_batches(f, 3, multiple_of=2)
    assert plan.ids.shape[0] % 3 == 0 and (plan.ids.shape[0] // 3) % 2 == 0
    for j in range(3):
        own = pack(*(f[k][j::3] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")),
                   multiple_of=2)
        assert plan.branch_ids is None and own.branch_ids is None   # one sequence per row: no branches
        got = plan._make(None if a is None else np.asarray(strided_split(np.asarray(a), 3))[j] for a in plan)
        n = own.ids.shape[0]
        np.testing.assert_array_equal(got.ids[:n], own.ids)         # the micro-batch's own rows first ...
        assert not got.segment_ids[n:].any()                         # ... then rows of padding only
        for name in ("response_index", "token_index", "last_index"):
            np.testing.assert_array_equal(getattr(got, name), getattr(own, name))


@pytest.mark.slow
def test_packed_update_equals_padded_for_ten_steps(make_cfg):
    """The smoke-size run: every metric of the first 10 steps agrees (float32, 1e-5), and the final parameters within
    1e-4 (a fifth of one Adam step at the actor's lr 5e-4: Adam scales each element's update to about lr whatever
    its gradient, so an element whose gradient is near 0 carries the two layouts' summation-order differences at
    that scale)."""
    padded = build_run(make_cfg("trainer.total_steps=10"), devices=jax.devices()[:1])
    packed = build_run(make_cfg("trainer.total_steps=10", "data.packing=true"), devices=jax.devices()[:1])
    assert isinstance(packed.step, PackedStep) and not isinstance(padded.step, PackedStep)
    s0, m0 = _steps(padded, 10)
    s1, m1 = _steps(packed, 10)
    for a, b in zip(m0, m1):
        assert set(a) == set(b)
        for k in a:
            assert b[k] == pytest.approx(a[k], **TOL), k
    _close(s0.actor, s1.actor, rel=1e-4, abs=1e-4)
    _close(s0.critic, s1.critic, rel=1e-4, abs=1e-4)
    assert 1 <= len(packed.step.programs) <= 8       # bounded compiled programs (row budgets)


@pytest.mark.slow
def test_packed_prepare_follows_the_buffer_windows(make_cfg):
    """A dataset larger than the buffer: every window's prepared arrays (read after each refresh) and the metrics
    agree with the padded run's; the prepare plan is remade when a window is loaded."""
    extra = ("replay.capacity=48", "replay.refresh_every=2", "trainer.total_steps=4")
    padded = build_run(make_cfg(*extra), devices=jax.devices()[:1])
    packed = build_run(make_cfg(*extra, "data.packing=true"), devices=jax.devices()[:1])
    assert len(packed.windows) > 2
    _windows_agree(padded, packed)


@pytest.mark.slow
def test_packed_update_with_shared_trunk_and_critic_free(make_cfg):
    for extra in (["critic.share_trunk=true"], ["algorithm.adv_estimator=grpo", "replay.group_size=1"]):
        padded = build_run(make_cfg("trainer.total_steps=2", *extra), devices=jax.devices()[:1])
        packed = build_run(make_cfg("trainer.total_steps=2", "data.packing=true", *extra), devices=jax.devices()[:1])
        _, m0 = _steps(padded, 2)
        _, m1 = _steps(packed, 2)
        for a, b in zip(m0, m1):
            for k in a:
                assert b[k] == pytest.approx(a[k], **TOL), (extra, k)


@pytest.mark.slow
def test_packed_update_one_and_eight_devices_agree(make_cfg):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    r1 = build_run(make_cfg("data.packing=true", "mesh.data=1"), devices=jax.devices()[:1])
    r8 = build_run(make_cfg("data.packing=true", "mesh.data=2", "mesh.fsdp=4"), devices=jax.devices()[:8])
    _, m1 = _steps(r1, 2)
    _, m8 = _steps(r8, 2)
    for a, b in zip(m1, m8):
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), k


def test_stack_order_hand_case_and_inverse():
    from jaxppo.trainer.ppo.forward import stack_order

    rows = np.arange(8)               # 2 groups of 4: row g·4 + c
    stacked = np.asarray(stack_order(jax.numpy.asarray(rows), 4))
    np.testing.assert_array_equal(stacked, [0, 4, 1, 5, 2, 6, 3, 7])     # stack row c·2 + g
    np.testing.assert_array_equal(np.asarray(stack_order(jax.numpy.asarray(stacked), 4, inverse=True)), rows)


def test_plan_of_whole_groups_packs_each_micro_batch_groups_with_their_prompt_once():
    """24 rows in 6 groups of 4 (group order), 3 strided pieces: piece j's plan is ``pack_shared`` of groups j, j+3
    (each group's prompt once, its 4 answers after it), with the sequence arrays of its continuation-major stack."""
    from jaxppo.models.packing import pack_shared

    rng = np.random.default_rng(1)
    f = _fields(24, 6, 5, rng)
    for k in ("prompt_ids", "prompt_mask"):          # a group's rows share the prompt
        f[k] = np.repeat(f[k][::4], 4, axis=0)
    plan = plan_micro_batches(f, 3, group_size=4)
    assert plan.branch_ids is not None and plan.ids.shape[1] == 6 + 4 * 5
    for j in range(3):
        groups = [j, j + 3]
        own = pack_shared(f["prompt_ids"][[4 * g for g in groups]], f["prompt_mask"][[4 * g for g in groups]],
                          np.stack([f["response_ids"][4 * g:4 * g + 4] for g in groups]),
                          np.stack([f["response_mask"][4 * g:4 * g + 4] for g in groups]))
        got = plan._make(None if a is None else np.asarray(strided_split(np.asarray(a), 3))[j] for a in plan)
        n = own.ids.shape[0]
        np.testing.assert_array_equal(got.ids[:n], own.ids)
        np.testing.assert_array_equal(got.branch_ids[:n], own.branch_ids)
        for name in ("response_index", "token_index", "last_index"):
            np.testing.assert_array_equal(getattr(got, name), getattr(own, name))
        # the packed tokens are the prompt once, then each answer: fewer slots than 8 rows of prompt + answer
        assert int((got.segment_ids > 0).sum()) == int(f["prompt_mask"][[4 * g for g in groups]].sum()
                                                      + sum(f["response_mask"][4 * g:4 * g + 4].sum() for g in groups))


GROUPS = ("replay.group_size=4", "actor.ppo_micro_batch_size=8")


@pytest.mark.slow
@pytest.mark.parametrize("over", [("algorithm.adv_estimator=grpo", "replay.sampling=prioritized"),
                                  ("algorithm.adv_estimator=gae", "critic.share_trunk=true")])
def test_packed_whole_groups_equal_the_padded_groups(make_cfg, over):
    """GRPO minibatches of whole prompt groups (``replay.group_size=4``, 2 micro-batches), each group packed with its
    prompt once: across buffer windows, the prepared arrays and priorities after every refresh and every metric of
    4 steps equal the padded grouped run's (which runs each prompt once through ``Transformer.shared_prefix``)."""
    extra = (*GROUPS, *over, "replay.capacity=48", "replay.refresh_every=2", "trainer.total_steps=4")
    padded = build_run(make_cfg(*extra), devices=jax.devices()[:1])
    packed = build_run(make_cfg(*extra, "data.packing=true"), devices=jax.devices()[:1])
    assert isinstance(packed.step, PackedStep) and isinstance(packed.prepare, PackedStep)
    assert len(packed.windows) > 1
    _windows_agree(padded, packed)


@pytest.mark.slow
def test_packed_whole_groups_one_and_eight_devices_agree(make_cfg):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    # 8 batch shards of a 32-row micro-batch: one group of 4 per shard
    over = (*GROUPS, "actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=32", "algorithm.adv_estimator=grpo",
            "data.packing=true")
    r1 = build_run(make_cfg(*over, "mesh.data=1"), devices=jax.devices()[:1])
    r8 = build_run(make_cfg(*over, "mesh.data=2", "mesh.fsdp=4"), devices=jax.devices()[:8])
    assert isinstance(r8.step, PackedStep)
    _, m1 = _steps(r1, 2)
    _, m8 = _steps(r8, 2)
    for a, b in zip(m1, m8):
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), k
