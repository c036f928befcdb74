"""Orbax save -> restore is bit-exact and the next samples equal those of the uninterrupted state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxppo import replay
from jaxppo.parallel.mesh import make_mesh

EXAMPLE = {"tok": jnp.zeros((4,), jnp.int32), "logp": jnp.zeros((4,), jnp.float32)}


def trained_state(mesh, prioritization):
    st = replay.init(64, EXAMPLE, mesh=mesh, prioritization=prioritization)
    for n in (48, 32):                                                 # wraps around the ring once
        st = replay.add(st, {"tok": jnp.arange(4 * n).reshape(n, 4) % 64, "logp": -jnp.ones((n, 4)) * n})
    for i in range(3):
        s = replay.sample(st, jax.random.key(i), 16, beta=0.5)
        st = replay.update_priorities(st, s.indices, jax.random.exponential(jax.random.key(100 + i), (16,)))
    return st


def next_samples(st, n=3):
    out = []
    for i in range(n):
        s = replay.sample(st, jax.random.key(50 + i), 16, beta=0.8)
        st = replay.update_priorities(st, s.indices, jnp.abs(s.items["logp"][:, 0]) + i)
        out.append(jax.tree.map(np.asarray, (s.indices, s.probs, s.weights, s.items)))
    return out, st


@pytest.mark.parametrize("prioritization, sharded", [("rank", False),
                                                     ("proportional", True)])
def test_save_restore_bit_exact(tmp_path, prioritization, sharded):
    mesh = make_mesh(data=8) if sharded else None
    st = trained_state(mesh, prioritization)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(7, args=ocp.args.StandardSave(st))
        mngr.wait_until_finished()
    # restore into a fresh process-like target: an abstract state of the same static configuration
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                          replay.init(64, EXAMPLE, mesh=mesh, prioritization=prioritization))
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        assert mngr.latest_step() == 7
        restored = mngr.restore(7, args=ocp.args.StandardRestore(target))
    assert isinstance(restored, replay.ReplayState)
    for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        if sharded:
            assert b.sharding.is_equivalent_to(a.sharding, a.ndim)
    assert float(restored.max_priority) == float(st.max_priority)
    assert int(restored.insert_pos) == 80 % 64 and int(restored.size) == 64
    want, want_state = next_samples(st)
    got, got_state = next_samples(restored)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(want_state.priorities, got_state.priorities)


@pytest.mark.parametrize("decay, sharded", [("sampled", True), ("age", False)])
def test_staleness_fields_survive_save_restore(tmp_path, decay, sharded):
    """The staleness decay's leaves (base priorities, sample counts, refresh steps, clock, age reference) are
    checkpointed: restored bit-exact (and sharded like the priorities), and the next draws continue equally."""
    mesh = make_mesh(data=8) if sharded else None
    st = replay.add(replay.init(64, EXAMPLE, mesh=mesh, decay=decay, decay_rate=0.5),
                    {"tok": jnp.zeros((40, 4), jnp.int32), "logp": -jnp.ones((40, 4))})
    for i in range(20):                                  # past an "age" rebase (every 16 ticks at r = 0.5)
        s = replay.sample(st, jax.random.key(i), 8, beta=0.5)
        st = replay.record_sample(st, s.indices, jax.random.exponential(jax.random.key(100 + i), (8,)))
    assert int(np.max(st.sample_count)) > 1 and int(st.clock) == 20
    if decay == "age":
        assert int(st.decay_ref) == 16
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(3, args=ocp.args.StandardSave(st))
        mngr.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                          replay.init(64, EXAMPLE, mesh=mesh, decay=decay, decay_rate=0.5))
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        restored = mngr.restore(3, args=ocp.args.StandardRestore(target))
    for name in ("base_priorities", "sample_count", "refresh_step", "clock", "decay_ref", "priorities", "tree"):
        a, b = getattr(st, name), getattr(restored, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
        if sharded and name not in ("clock", "decay_ref", "tree"):          # per-slot fields
            assert b.sharding.is_equivalent_to(st.priorities.sharding, 1), name
    for i in range(3):
        sa = replay.sample(st, jax.random.key(70 + i), 8, beta=0.8)
        sb = replay.sample(restored, jax.random.key(70 + i), 8, beta=0.8)
        np.testing.assert_array_equal(sa.indices, sb.indices)
        np.testing.assert_array_equal(sa.weights, sb.weights)
        st, restored = replay.record_sample(st, sa.indices), replay.record_sample(restored, sb.indices)
    np.testing.assert_array_equal(st.priorities, restored.priorities)
