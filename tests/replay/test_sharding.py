"""The same samples, priorities and tree on 1 and 8 (simulated) devices for the same keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import replay
from jaxppo.parallel.mesh import make_mesh

EXAMPLE = {"tok": jnp.zeros((3,), jnp.int32), "s": jnp.zeros((), jnp.float32)}


def run(mesh, capacity, prioritization, n_steps=3, batch=16):
    st = replay.init(capacity, EXAMPLE, mesh=mesh, prioritization=prioritization)
    n = capacity - 8                                     # not full: empty slots live on the last shard
    td = jax.random.exponential(jax.random.key(capacity), (n,))
    st = replay.add(st, {"tok": jnp.arange(3 * n).reshape(n, 3), "s": jnp.arange(n, dtype=jnp.float32)}, td)
    sample = jax.jit(lambda s, k: replay.sample(s, k, batch, beta=0.7))
    update = jax.jit(replay.update_priorities)
    out = []
    for i in range(n_steps):
        s = sample(st, jax.random.key(i))
        st = update(st, s.indices, jnp.abs(s.items["s"] - 40.0) / 10)
        out.append(jax.tree.map(np.asarray, (s.indices, s.probs, s.weights, s.items)))
    return st, out


@pytest.fixture(scope="module")
def meshes():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    return {"none": None, "1": make_mesh(data=1, devices=jax.devices()[:1]), "8": make_mesh(data=8),
            "4x2": make_mesh(data=4, fsdp=2)}


@pytest.mark.parametrize("capacity, prioritization, names", [
    (1000, "proportional", ("1", "8")),                     # 1000 leaves: tree top padded 125 -> 128 on 8
    (64, "rank", ("1", "4x2")),                             # data x fsdp = 4 x 2 batch shards
])
def test_same_samples_on_1_and_8_devices(meshes, capacity, prioritization, names):
    results = {name: run(meshes[name], capacity, prioritization, n_steps=2) for name in names}
    ref_state, ref_out = results["1"]
    for name, (state, out) in results.items():
        for a, b in zip(jax.tree.leaves(ref_out), jax.tree.leaves(out)):
            np.testing.assert_array_equal(a, b, err_msg=f"mesh {name}")
        n = capacity
        np.testing.assert_array_equal(ref_state.priorities[:n], state.priorities[:n], err_msg=name)
        np.testing.assert_array_equal(ref_state.max_priority, state.max_priority, err_msg=name)
        np.testing.assert_array_equal(ref_state.storage["tok"], state.storage["tok"], err_msg=name)


def test_storage_and_priorities_are_sharded(meshes):
    mesh = meshes["8"]
    st, _ = run(mesh, 64, "proportional", n_steps=1)
    def batch_sharded(x):
        want = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (x.ndim - 1))))
        return x.sharding.is_equivalent_to(want, x.ndim) and x.addressable_shards[0].data.shape[0] == x.shape[0] // 8

    for x in (st.storage["tok"], st.storage["s"], st.priorities):
        assert batch_sharded(x), x.sharding
    s = replay.sample(st, jax.random.key(0), 16, beta=1.0)
    assert batch_sharded(s.items["tok"]) and batch_sharded(s.indices)   # minibatch split over the batch axes


def test_capacity_must_divide_over_shards(meshes):
    with pytest.raises(ValueError, match="multiple of the mesh's batch shards"):
        replay.init(100, EXAMPLE, mesh=meshes["8"])
