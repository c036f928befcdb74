"""Mesh construction and logical-axis shardings on 8 simulated CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxppo.parallel import mesh as pm


def test_eight_simulated_devices():
    assert len(jax.devices()) == 8, "tests/conftest.py must force 8 host devices"


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (1, 4, 2), (2, 2, 2)])
def test_make_mesh_shapes(shape):
    m = pm.make_mesh(*shape)
    assert m.axis_names == ("data", "fsdp", "tensor")
    assert tuple(m.shape[a] for a in m.axis_names) == shape
    assert pm.batch_divisor(m) == shape[0] * shape[1]


def test_make_mesh_wrong_count_is_clear():
    with pytest.raises(ValueError, match=r"data=3 x fsdp=1 x tensor=1 = 3 devices.*8 are available"):
        pm.make_mesh(3, 1, 1)
    with pytest.raises(ValueError, match="positive integers"):
        pm.make_mesh(0, 8, 1)


def test_make_mesh_on_a_subset_of_devices():
    m = pm.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert m.size == 1


def test_logical_to_spec_default_rules():
    assert pm.logical_to_spec(("batch", "length")) == P(("data", "fsdp"), None)
    assert pm.logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
    assert pm.logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")
    assert pm.logical_to_spec((None, "head_dim")) == P(None, None)


def test_a_mesh_axis_is_used_once_per_array():
    # heads and kv_heads both map to "tensor": the second one is replicated
    assert pm.logical_to_spec(("heads", "kv_heads")) == P("tensor", None)


def test_rule_overrides_and_unknown_axis():
    rules = pm.merged_rules({"embed": None, "mlp": ["fsdp", "tensor"]})
    assert pm.logical_to_spec(("embed", "mlp"), rules) == P(None, ("fsdp", "tensor"))
    with pytest.raises(ValueError, match=r"mesh\.rules\.embed.*unknown mesh axis 'model'"):
        pm.merged_rules({"embed": "model"})


def test_sharded_matmul_equals_single_device():
    m = pm.make_mesh(2, 2, 2)
    x = jax.random.normal(jax.random.key(0), (16, 24))
    w = jax.random.normal(jax.random.key(1), (24, 32))
    xs = jax.device_put(x, pm.named_sharding(m, ("batch", "embed")))
    ws = jax.device_put(w, pm.named_sharding(m, ("embed", "mlp")))
    assert xs.sharding.spec == P(("data", "fsdp"), None)  # fsdp already used by batch → replicated
    y = jax.jit(jnp.dot)(xs, ws)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x @ w), rtol=1e-5, atol=1e-5)


def test_batch_sharding_and_replicated():
    m = pm.make_mesh(4, 2, 1)
    a = jax.device_put(jnp.arange(16.0).reshape(8, 2), pm.batch_sharding(m, 2))
    assert len(a.addressable_shards) == 8 and a.addressable_shards[0].data.shape == (1, 2)
    r = jax.device_put(jnp.ones(3), pm.replicated(m))
    assert all(s.data.shape == (3,) for s in r.addressable_shards)


def test_simulated_devices_flags_replace_only_the_device_count():
    from jaxppo.parallel.mesh import simulated_devices_flags

    assert simulated_devices_flags("", 1) == "--xla_force_host_platform_device_count=1"
    assert (simulated_devices_flags("--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0", 1)
            == "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=1")
    assert (simulated_devices_flags("--a=1  --xla_force_host_platform_device_count=2 --b", 4)
            == "--a=1 --b --xla_force_host_platform_device_count=4")
