"""jaxppo.parallel.host on one process (8 simulated devices): every transfer equals its numpy/device_put form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxppo.parallel import from_host, host_scalar, is_main_process, make_mesh, process_index, to_host, tree_from_host


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(2, 4, 1)


SPECS = [P(), P(("data", "fsdp")), P("data", "fsdp"), P(None, "fsdp"), P("fsdp", None)]


@pytest.mark.parametrize("spec", SPECS)
def test_to_host_equals_asarray(mesh, spec):
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12) * 0.5 - 3.0
    g = jax.device_put(x, NamedSharding(mesh, spec))
    out = to_host(g)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.asarray(g))
    np.testing.assert_array_equal(out, x)


def test_to_host_tree_and_passthrough(mesh):
    tree = {"a": jnp.ones((8,), jnp.int32), "b": [jnp.float32(2.5), 3, "s"], "c": np.zeros(2), "d": None}
    out = to_host(tree)
    assert isinstance(out["a"], np.ndarray) and out["a"].dtype == np.int32
    assert out["b"][0].shape == () and float(out["b"][0]) == 2.5
    assert out["b"][1] == 3 and out["b"][2] == "s" and out["d"] is None
    np.testing.assert_array_equal(out["c"], np.zeros(2))


def test_to_host_under_jit_output(mesh):
    sh = NamedSharding(mesh, P(("data", "fsdp")))
    f = jax.jit(lambda v: v * 2.0, out_shardings=sh)
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    np.testing.assert_array_equal(to_host(f(x)), x * 2.0)


@pytest.mark.parametrize("spec", SPECS)
def test_from_host_equals_device_put(mesh, spec):
    x = np.arange(8 * 12, dtype=np.int32).reshape(8, 12)
    sh = NamedSharding(mesh, spec)
    g = from_host(x, sh)
    ref = jax.device_put(x, sh)
    assert g.sharding == sh and g.shape == x.shape and g.dtype == x.dtype
    for a, b in zip(g.addressable_shards, ref.addressable_shards):
        assert a.device == b.device and a.index == b.index
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    np.testing.assert_array_equal(to_host(g), x)


def test_tree_from_host(mesh):
    sh = NamedSharding(mesh, P(("data", "fsdp")))
    tree = {"x": np.arange(8.0), "y": np.ones((8, 3), np.int32)}
    out = tree_from_host(tree, sh)
    assert all(v.sharding == sh for v in out.values())
    np.testing.assert_array_equal(to_host(out["y"]), tree["y"])
    out2 = tree_from_host(tree, {"x": sh, "y": NamedSharding(mesh, P())})
    assert out2["y"].sharding.spec == P()


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=8, max_size=8),
       st.sampled_from(SPECS[:2]))
def test_roundtrip_property(values, spec):
    m = make_mesh(2, 4, 1)
    x = np.asarray(values, np.float32)
    sh = NamedSharding(m, spec)
    np.testing.assert_array_equal(to_host(from_host(x, sh)), x)


def test_host_scalar(mesh):
    assert host_scalar(jax.device_put(jnp.float32(1.5), NamedSharding(mesh, P()))) == 1.5
    assert host_scalar(np.array([2.0])) == 2.0
    with pytest.raises(ValueError, match=r"expected a scalar.*\(3,\)"):
        host_scalar(jnp.ones(3))


def test_single_process_identity():
    assert process_index() == 0 and is_main_process()


def test_decisions_on_one_process():
    from jaxppo.parallel import all_processes, broadcast_from_main

    assert all_processes(True) is True and all_processes(False) is False
    tree = {"step": np.int32(7), "ok": np.bool_(True)}
    assert broadcast_from_main(tree) is tree


@given(st.lists(st.integers(0, 2**31 - 1), max_size=12), st.floats(allow_nan=False))
def test_steps_and_float_from_main_on_one_process(steps, x):
    """One process: the broadcast helpers return their input (as ints / the same float, bit for bit); the
    2-process behaviour is tests/multihost/test_decisions.py."""
    from jaxppo.parallel import float_from_main, steps_from_main

    assert steps_from_main(steps) == steps and all(type(s) is int for s in steps_from_main(steps))
    assert float_from_main(x) == x and isinstance(float_from_main(x), float)
