"""The buffer stores ANY pytree (nested ``flax.struct`` dataclasses, tuples, dicts, ``None`` nodes, a bare array):
``add`` / ``sample`` / priorities behave exactly as with a flat dict of the same leaves, on 1 and 8 devices, and
through an Orbax save/restore; a structure mismatch in ``add`` is an error naming the differing paths."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl.testing import parameterized
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st_
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo import replay
from jaxppo.parallel.mesh import make_mesh


@struct.dataclass
class Extra:
    score: jax.Array                 # float32 []
    logp: jax.Array                  # float32 [2]


@struct.dataclass
class Row:
    tokens: jax.Array                # int32 [3]
    extra: tuple                     # (Extra, int32 [] flag)
    note: jax.Array | None = None    # None: stores nothing


def example():
    return Row(tokens=jnp.zeros((3,), jnp.int32),
               extra=(Extra(score=jnp.zeros((), jnp.float32), logp=jnp.zeros((2,), jnp.float32)),
                      jax.ShapeDtypeStruct((), jnp.int32)))


def rows(values) -> Row:
    v = np.asarray(values, np.float32)
    return Row(tokens=np.stack([v, v + 1, v + 2], 1).astype(np.int32),
               extra=(Extra(score=v, logp=np.stack([-v, -2 * v], 1)), (v % 2).astype(np.int32)))


def as_dict(r: Row) -> dict:
    """The same leaves as a flat dict (the reference layout)."""
    return {"tokens": r.tokens, "score": r.extra[0].score, "logp": r.extra[0].logp, "flag": r.extra[1]}


DICT_EXAMPLE = {"tokens": jnp.zeros((3,), jnp.int32), "score": jnp.zeros((), jnp.float32),
                "logp": jnp.zeros((2,), jnp.float32), "flag": jnp.zeros((), jnp.int32)}


def test_storage_has_the_example_structure_with_a_slot_axis():
    st = replay.init(8, example())
    assert isinstance(st.storage, Row) and st.storage.note is None
    assert jax.tree.structure(st.storage) == jax.tree.structure(
        jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example()))
    got = {jax.tree_util.keystr(p): (x.shape, x.dtype) for p, x in jax.tree_util.tree_leaves_with_path(st.storage)}
    assert got == {".tokens": ((8, 3), jnp.int32), ".extra[0].score": ((8,), jnp.float32),
                   ".extra[0].logp": ((8, 2), jnp.float32), ".extra[1]": ((8,), jnp.int32)}


def test_bare_array_item():
    st = replay.add(replay.init(4, jnp.zeros((2,), jnp.float32)), np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(st.storage, [[0, 1], [2, 3], [4, 5], [0, 0]])
    s = replay.sample(st, jax.random.key(0), 3, beta=0.5)
    np.testing.assert_array_equal(s.items, np.asarray(st.storage)[np.asarray(s.indices)])


class PytreeBufferTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_add_wraps_and_casts_every_leaf(self):
        add = self.variant(replay.add)
        st = add(replay.init(4, example()), rows([10, 11, 12]))
        st = add(st, rows([13, 14]))                         # slots 3, 0 (ring wrap)
        s = st.storage
        np.testing.assert_array_equal(s.extra[0].score, [14, 11, 12, 13])          # hand-computed
        np.testing.assert_array_equal(s.tokens[:, 2], [16, 13, 14, 15])
        np.testing.assert_array_equal(s.extra[0].logp[:, 1], [-28, -22, -24, -26])
        np.testing.assert_array_equal(s.extra[1], [0, 1, 0, 1])
        assert s.extra[1].dtype == jnp.int32 and s.extra[0].logp.dtype == jnp.float32
        assert int(st.size) == 4 and int(st.insert_pos) == 1

    @chex.variants(with_jit=True, without_jit=True)
    def test_same_as_flat_dict_buffer(self):
        """Samples (indices, probs, weights, items), priorities and tree of the struct buffer equal those of a dict
        buffer holding the same leaves, step by step, with priority updates from the sampled items."""
        sample = self.variant(lambda s, k: replay.sample(s, k, 8, beta=0.6))
        update = self.variant(replay.update_priorities)
        td = jnp.linspace(0.1, 3.0, 12)
        a = replay.add(replay.init(16, example(), alpha=0.7), rows(np.arange(12)), td)
        b = replay.add(replay.init(16, DICT_EXAMPLE, alpha=0.7), as_dict(rows(np.arange(12))), td)
        for i in range(3):
            sa, sb = sample(a, jax.random.key(i)), sample(b, jax.random.key(i))
            for x, y in [(sa.indices, sb.indices), (sa.probs, sb.probs), (sa.weights, sb.weights)]:
                np.testing.assert_array_equal(x, y)
            for k, v in as_dict(sa.items).items():
                np.testing.assert_array_equal(v, sb.items[k], err_msg=k)
                # numpy reference: the sampled rows are the stored rows at the sampled slots
                np.testing.assert_array_equal(v, np.asarray(as_dict(a.storage)[k])[np.asarray(sa.indices)])
            a = update(a, sa.indices, jnp.abs(sa.items.extra[0].score - 5.0))
            b = update(b, sb.indices, jnp.abs(sb.items["score"] - 5.0))
            np.testing.assert_array_equal(a.priorities, b.priorities)
            np.testing.assert_array_equal(a.tree, b.tree)

    def test_set_priorities_switches_items_off(self):
        st = replay.add(replay.init(8, example()), rows(np.arange(8)))
        st = replay.set_priorities(st, jnp.arange(8), jnp.array([0, 0, 0, 0, 0, 1.0, 0, 0]))
        s = replay.sample(st, jax.random.key(3), 4, beta=1.0)
        np.testing.assert_array_equal(s.indices, [5, 5, 5, 5])
        np.testing.assert_array_equal(s.items.extra[0].score, [5, 5, 5, 5])


def test_structure_mismatch_names_the_paths():
    st = replay.init(8, example())
    good = rows([1, 2])
    with pytest.raises(ValueError, match=r"missing \['extra.1'\], unexpected \[\]"):
        replay.add(st, good.replace(extra=(good.extra[0],)))
    with pytest.raises(ValueError, match=r"missing \['extra.0.logp'\], unexpected \['extra.0.logq'\]"):
        replay.add(st, good.replace(extra=({"score": good.extra[0].score, "logq": good.extra[0].logp},
                                           good.extra[1])))
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['note'\]"):
        replay.add(st, good.replace(note=good.tokens))
    with pytest.raises(ValueError, match="same leaf paths, other containers"):
        replay.add(st, good.replace(extra=list(good.extra)))           # list where the buffer has a tuple
    with pytest.raises(ValueError, match="structure differs"):
        replay.add(st, as_dict(good))
    with pytest.raises(ValueError, match=r"item 'extra.0.logp' has per-item shape \(3,\)"):
        replay.add(st, good.replace(extra=(good.extra[0].replace(logp=np.zeros((2, 3), np.float32)), good.extra[1])))
    with pytest.raises(ValueError, match=r"item 'extra.1' has dtype float32"):
        replay.add(st, good.replace(extra=(good.extra[0], np.zeros(2, np.float32))))
    with pytest.raises(ValueError, match="same leading batch size"):
        replay.add(st, good.replace(tokens=np.zeros((3, 3), np.int32)))


@settings(max_examples=15, deadline=None)
@given(shapes=st_.lists(st_.lists(st_.integers(1, 3), max_size=2), min_size=1, max_size=4),
       nest=st_.booleans(), n=st_.integers(1, 8), seed=st_.integers(0, 2 ** 16))
def test_property_sampled_items_are_stored_rows(shapes, nest, n, seed):
    """For any pytree of leaves (tuple, or nested dict/tuple), the storage keeps the structure, every added row
    is stored at its ring slot, and every sampled leaf is ``storage_leaf[indices]``."""
    rng = np.random.default_rng(seed)
    leaves = [np.zeros(tuple(s), np.float32 if i % 2 else np.int32) for i, s in enumerate(shapes)]
    ex = {"a": tuple(leaves[:1]), "b": {"c": tuple(leaves[1:])}} if nest else tuple(leaves)
    batch = jax.tree.map(lambda x: rng.integers(-50, 50, (n, *x.shape)).astype(x.dtype), ex)
    st = replay.add(replay.init(8, ex), batch)
    assert jax.tree.structure(st.storage) == jax.tree.structure(ex)
    for got, want in zip(jax.tree.leaves(st.storage), jax.tree.leaves(batch)):
        np.testing.assert_array_equal(np.asarray(got)[:n], want)
    s = replay.sample(st, jax.random.key(seed), n, beta=0.5)
    idx = np.asarray(s.indices)
    assert (idx < n).all()
    for got, stored in zip(jax.tree.leaves(s.items), jax.tree.leaves(st.storage)):
        np.testing.assert_array_equal(got, np.asarray(stored)[idx])


# -------------------------------------------------------------------------------------- 8 devices, Orbax
def _run(mesh, n_steps=2, batch=16):
    st = replay.init(64, example(), mesh=mesh)
    st = replay.add(st, rows(np.arange(56)), jax.random.exponential(jax.random.key(1), (56,)))
    sample = jax.jit(lambda s, k: replay.sample(s, k, batch, beta=0.7))
    out = []
    for i in range(n_steps):
        s = sample(st, jax.random.key(i))
        st = replay.update_priorities(st, s.indices, jnp.abs(s.items.extra[0].score - 40.0) / 10)
        out.append(jax.tree.map(np.asarray, (s.indices, s.probs, s.weights, s.items)))
    return st, out


@pytest.fixture(scope="module")
def mesh8():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    return make_mesh(data=8)


def test_struct_storage_sharded_on_8_devices_same_samples(mesh8):
    ref_state, ref_out = _run(make_mesh(data=1, devices=jax.devices()[:1]))
    state, out = _run(mesh8)
    for a, b in zip(jax.tree.leaves(ref_out), jax.tree.leaves(out)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ref_state.priorities, state.priorities)

    def batch_sharded(x):
        want = NamedSharding(mesh8, PartitionSpec(("data", "fsdp"), *([None] * (x.ndim - 1))))
        return x.sharding.is_equivalent_to(want, x.ndim) and x.addressable_shards[0].data.shape[0] == x.shape[0] // 8

    assert all(batch_sharded(leaf) for leaf in jax.tree.leaves(state.storage))
    s = replay.sample(state, jax.random.key(0), 16, beta=1.0)
    assert all(batch_sharded(leaf) for leaf in jax.tree.leaves(s.items))   # minibatch split over the batch axes


def test_struct_storage_orbax_round_trip(tmp_path, mesh8):
    state, _ = _run(mesh8)
    with ocp.StandardCheckpointer() as c:
        c.save(tmp_path / "ckpt", state)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    with ocp.StandardCheckpointer() as c:
        back = c.restore(tmp_path / "ckpt", like)
    assert isinstance(back.storage, Row) and back.storage.note is None
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)
        assert b.sharding == a.sharding
