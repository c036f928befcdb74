"""Ring buffer: add / overwrite, running max, update rules (duplicates), tree consistency, bad input."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st_

from jaxppo import replay
from jaxppo.replay import tree as tree_lib
from tests.replay import _ref

EXAMPLE = {"tokens": jnp.zeros((3,), jnp.int32), "score": jnp.zeros((), jnp.float32)}


def items(values):
    v = np.asarray(values, np.float32)
    return {"tokens": np.stack([v, v + 1, v + 2], 1).astype(np.int32), "score": v}


class AddUpdateTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_ring_overwrite_resets_priority_to_running_max(self):
        add, update = self.variant(replay.add), self.variant(replay.update_priorities)
        st = replay.init(4, EXAMPLE, alpha=1.0, eps=0.0)
        st = add(st, items([10, 11, 12]))
        np.testing.assert_array_equal(st.priorities[:4], [1, 1, 1, 0])       # running max starts at 1
        st = update(st, jnp.array([0, 1, 2]), jnp.array([0.5, 3.0, 0.25]))    # max -> 3
        np.testing.assert_array_equal(st.priorities[:4], [0.5, 3.0, 0.25, 0])
        assert float(st.max_priority) == 3.0
        st = add(st, items([13, 14, 15]))                                    # slots 3, 0, 1
        np.testing.assert_array_equal(st.priorities[:4], [3.0, 3.0, 0.25, 3.0])
        np.testing.assert_array_equal(st.storage["score"], [14, 15, 12, 13])
        np.testing.assert_array_equal(st.storage["tokens"][:, 2], [16, 17, 14, 15])
        assert int(st.size) == 4 and int(st.insert_pos) == 2
        # the overwritten slot 1 had the max; a low update there does NOT lower the running max
        st = update(st, jnp.array([1]), jnp.array([0.1]))
        assert float(st.max_priority) == 3.0

    @chex.variants(with_jit=True, without_jit=True)
    def test_duplicate_indices_largest_wins(self):
        """Documented rule: a slot named several times in one update keeps the LARGEST new priority,
        whatever the order in the batch (it replaces the old value even when smaller)."""
        update = self.variant(replay.update_priorities)
        st = replay.add(replay.init(8, EXAMPLE, alpha=1.0, eps=0.0), items(range(5)))
        st = replay.update_priorities(st, jnp.array([1, 3]), jnp.array([20.0, 20.0]))
        idx, td = np.array([1, 3, 1, 3, 1, 4]), np.array([0.5, 0.5, 2.0, 7.0, 0.25, 3.0])
        out = update(st, jnp.asarray(idx), jnp.asarray(td))
        np.testing.assert_array_equal(out.priorities[:5], [1.0, 2.0, 1.0, 7.0, 3.0])
        assert float(out.max_priority) == 20.0
        perm = np.random.default_rng(0).permutation(6)
        again = update(st, jnp.asarray(idx[perm]), jnp.asarray(td[perm]))
        np.testing.assert_array_equal(again.priorities, out.priorities)
        np.testing.assert_array_equal(again.tree, out.tree)
        assert float(update(st, jnp.array([0, 0]), jnp.array([9.0, 4.0])).max_priority) == 20.0

    @chex.variants(with_jit=True, without_jit=True)
    def test_add_with_priorities_and_stored_formula(self):
        add = self.variant(replay.add)
        st = replay.init(8, EXAMPLE, alpha=0.6, eps=0.01)
        td = np.array([0.0, -2.0, 0.5])                                     # |δ| is taken
        st = add(st, items([1, 2, 3]), jnp.asarray(td, jnp.float32))
        np.testing.assert_allclose(st.priorities[:3], _ref.stored(td, 0.6, 0.01), rtol=1e-6)
        np.testing.assert_allclose(float(st.max_priority), 2.01 ** 0.6, rtol=1e-6)
        rank = replay.add(replay.init(8, EXAMPLE, alpha=0.6, eps=0.01, prioritization="rank"),
                          items([1, 2, 3]), jnp.asarray(td, jnp.float32))
        np.testing.assert_allclose(rank.priorities[:3], [0.01, 2.01, 0.51], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_set_priorities_writes_stored_values(self):
        set_p = self.variant(replay.set_priorities)
        st = replay.add(replay.init(8, EXAMPLE), items(range(4)))
        st = set_p(st, jnp.array([0, 2]), jnp.array([0.0, 5.0]))
        np.testing.assert_array_equal(st.priorities[:4], [0.0, 1.0, 5.0, 1.0])
        assert float(st.max_priority) == 5.0

    def test_nonfinite_td_under_jit_gets_running_max_and_bad_indices_are_ignored(self):
        st = replay.add(replay.init(8, EXAMPLE, alpha=1.0, eps=0.0), items(range(4)))
        st = replay.update_priorities(st, jnp.array([0]), jnp.array([4.0]))
        out = jax.jit(replay.update_priorities)(st, jnp.array([1, 6, -1]), jnp.array([jnp.nan, 2.0, 2.0]))
        np.testing.assert_array_equal(out.priorities, [4.0, 4.0, 1.0, 1.0, 0, 0, 0, 0])
        np.testing.assert_array_equal(out.tree, tree_lib.build(out.priorities, out.layout))


@settings(max_examples=8)
@given(capacity=st_.sampled_from([1, 8, 50]), prioritization=st_.sampled_from(["proportional", "rank"]),
       ops=st_.lists(st_.tuples(st_.booleans(), st_.sampled_from([1, 8, 50]), st_.integers(0, 2 ** 31 - 1)),
                     min_size=1, max_size=6))
def test_matches_numpy_reference(capacity, prioritization, ops):
    """Random sequences of add / update_priorities agree with a numpy model of the buffer, the tree
    equals a fresh build of the leaves (no drift), and sampled probs equal the reference P(i)."""
    alpha, eps = 0.6, 1e-3
    st = replay.init(capacity, {"v": jnp.zeros((), jnp.float32)}, alpha=alpha, eps=eps,
                     prioritization=prioritization)
    ref = _ref.RefBuffer(capacity, alpha, eps, prioritization)
    counter = 0
    for is_add, n, seed in ops:
        rng = np.random.default_rng(seed)
        if is_add or ref.size == 0:
            n = min(n, capacity)
            vals = np.arange(counter, counter + n, dtype=np.float32)
            counter += n
            td = None if rng.random() < 0.5 else rng.exponential(size=n).astype(np.float32) * 3
            st = replay.add(st, {"v": vals}, None if td is None else jnp.asarray(td))
            ref.add(vals, td)
        else:
            idx = rng.integers(0, ref.size, size=n).astype(np.int32)
            td = (rng.exponential(size=n) * rng.choice([0.1, 1.0, 10.0])).astype(np.float32)
            st = replay.update_priorities(st, jnp.asarray(idx), jnp.asarray(td))
            ref.update(idx, td)
    assert int(st.size) == ref.size and int(st.insert_pos) == ref.pos
    np.testing.assert_allclose(st.priorities[:capacity], ref.p, rtol=1e-5)
    np.testing.assert_allclose(float(st.max_priority), ref.max_p, rtol=1e-5)
    np.testing.assert_array_equal(st.storage["v"][:ref.size], ref.items[:ref.size])
    np.testing.assert_array_equal(st.tree, tree_lib.build(st.priorities, st.layout))
    s = replay.sample(st, jax.random.key(ops[0][2] % 1000), 1, beta=0.5)
    np.testing.assert_allclose(s.probs, ref.probs()[np.asarray(s.indices)], rtol=3e-5)


@pytest.mark.parametrize("capacity", [1, 1000, 50_000])
def test_capacities(capacity):
    st = replay.init(capacity, EXAMPLE)
    n = min(capacity, 300)
    st = replay.add(st, items(np.arange(n)))
    s = replay.sample(st, jax.random.key(0), min(n, 64), beta=0.4)
    assert s.indices.shape == (min(n, 64),) and s.items["tokens"].shape == (min(n, 64), 3)
    assert np.all(np.asarray(s.indices) < n)
    np.testing.assert_allclose(s.probs, 1.0 / n, rtol=1e-5)                 # all at the running max


def test_one_million_capacity():
    cap = 1 << 20
    st = replay.init(cap, {"s": jnp.zeros((), jnp.float32)})
    vals = jnp.arange(cap, dtype=jnp.float32)
    td = jnp.where(jnp.arange(cap) % 1000 == 0, 1e4, 0.0)                   # 1049 heavy items
    st = replay.add(st, {"s": vals}, td)
    s = replay.sample(st, jax.random.key(0), 256, beta=1.0)
    idx = np.asarray(s.indices)
    assert s.items["s"].shape == (256,)
    np.testing.assert_array_equal(s.items["s"], idx.astype(np.float32))
    # heavy items hold 1049·1e4^0.6 / (1049·1e4^0.6 + 1047527·1e-6^0.6) ≈ 99.9 % of the mass
    assert np.mean(idx % 1000 == 0) > 0.98
    st = replay.update_priorities(st, s.indices, jnp.zeros(256))
    assert int(st.size) == cap


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("capacity, match", [(0, "capacity"), (-3, "capacity"), (2.5, "capacity"),
                                             (True, "capacity")])
def test_bad_capacity(capacity, match):
    with pytest.raises(ValueError, match=match):
        replay.init(capacity, EXAMPLE)


def test_bad_init_arguments():
    with pytest.raises(ValueError, match="example_item must be a non-empty pytree"):
        replay.init(8, {})
    with pytest.raises(ValueError, match="example_item must be a non-empty pytree"):
        replay.init(8, ({"a": None}, ()))
    with pytest.raises(ValueError, match="leaf 'meta.name' must be an array"):
        replay.init(8, {"x": jnp.zeros(3), "meta": {"name": "text"}})
    with pytest.raises(ValueError, match="leaf '0' has dtype object"):
        replay.init(8, (np.array([None, 1], dtype=object),))
    with pytest.raises(ValueError, match="alpha"):
        replay.init(8, EXAMPLE, alpha=-1.0)
    with pytest.raises(ValueError, match="eps"):
        replay.init(8, EXAMPLE, eps=float("nan"))
    with pytest.raises(ValueError, match="prioritization"):
        replay.init(8, EXAMPLE, prioritization="ranked")
    with pytest.raises(ValueError, match="leaf_fanout"):
        replay.init(8, EXAMPLE, leaf_fanout=3)


def test_bad_items():
    st = replay.init(8, EXAMPLE)
    good = items([1, 2])
    with pytest.raises(ValueError, match="missing \\['score'\\]"):
        replay.add(st, {"tokens": good["tokens"]})
    with pytest.raises(ValueError, match="unexpected \\['extra'\\]"):
        replay.add(st, {**good, "extra": good["score"]})
    with pytest.raises(ValueError, match="'tokens' has per-item shape \\(4,\\)"):
        replay.add(st, {**good, "tokens": np.zeros((2, 4), np.int32)})
    with pytest.raises(ValueError, match="'tokens' has dtype float32"):
        replay.add(st, {**good, "tokens": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="same leading batch size"):
        replay.add(st, {**good, "score": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="must be 1..capacity"):
        replay.add(st, items(np.arange(9)))
    with pytest.raises(ValueError, match="priorities"):
        replay.add(st, good, jnp.array([1.0, jnp.nan]))
    with pytest.raises(ValueError, match="structure differs"):
        replay.add(st, [good])


def test_bad_sample_and_update_arguments():
    st = replay.init(8, EXAMPLE)
    with pytest.raises(ValueError, match="no item with a positive priority"):
        replay.sample(st, jax.random.key(0), 2, beta=0.4)
    st = replay.add(st, items(range(4)))
    with pytest.raises(ValueError, match="batch_size=5 exceeds the number of filled slots \\(size=4\\)"):
        replay.sample(st, jax.random.key(0), 5, beta=0.4)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        replay.sample(st, jax.random.key(0), 0, beta=0.4)
    with pytest.raises(ValueError, match="beta must be in \\[0, 1\\]"):
        replay.sample(st, jax.random.key(0), 2, beta=1.5)
    with pytest.raises(ValueError, match="td_abs contains NaN"):
        replay.update_priorities(st, jnp.array([0, 1]), jnp.array([1.0, jnp.nan]))
    with pytest.raises(ValueError, match="not filled slots"):
        replay.update_priorities(st, jnp.array([0, 5]), jnp.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="indices must be integers"):
        replay.update_priorities(st, jnp.array([0.0, 1.0]), jnp.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="indices has 2 entries but td_abs has 3"):
        replay.update_priorities(st, jnp.array([0, 1]), jnp.ones(3))
    with pytest.raises(ValueError, match="must be 1-D"):
        replay.update_priorities(st, jnp.array([[0, 1]]), jnp.ones((1, 2)))
    with pytest.raises(ValueError, match=">= 0"):
        replay.set_priorities(st, jnp.array([0]), jnp.array([-1.0]))


def test_metrics_hand_computed():
    st = replay.add(replay.init(8, EXAMPLE, alpha=1.0, eps=0.0), items(range(4)),
                    jnp.array([1.0, 2.0, 0.0, 5.0]))
    s = replay.sample(st, jax.random.key(0), 4, beta=1.0)
    m = jax.jit(lambda st, s: replay.metrics(st, s, beta=0.7, efficiency_threshold=0.3))(st, s)
    assert float(m["priority_mean"]) == pytest.approx(8.0 / 3)           # slot 2 (priority 0) not valid
    assert float(m["priority_max"]) == 5.0 and float(m["size"]) == 4 and float(m["valid"]) == 3
    # weights (P_min / P_i)^1 with P_min = 1/8: items 0, 1, 3 -> 1, 1/2, 1/5
    w = {0: 1.0, 1: 0.5, 3: 0.2}
    want = np.array([w[int(i)] for i in np.asarray(s.indices)])
    assert float(m["weight_mean"]) == pytest.approx(want.mean(), rel=1e-5)
    assert 3 in np.asarray(s.indices)                                    # strata [4, 6) and [6, 8)
    assert float(m["sample_efficiency"]) == pytest.approx(np.mean(want >= 0.3))
    assert float(m["sample_efficiency"]) < 1.0
    assert float(m["beta"]) == pytest.approx(0.7)
    # lowering the largest priority lowers priority_max (what is held), not the running max
    m = replay.metrics(replay.set_priorities(st, jnp.array([3]), jnp.array([0.5])))
    assert float(m["priority_max"]) == 2.0 and float(m["priority_running_max"]) == 5.0


@pytest.mark.parametrize("capacity", [3000, 70_000])
def test_refresh_of_large_levels_equals_a_fresh_build(capacity):
    """Above ``REBUILD_BELOW`` children a level is refreshed per touched ancestor (gather, reduce,
    scatter), below it rebuilt whole: after many updates with duplicates and zeros, jitted, the tree
    equals a fresh build of the leaves bit for bit."""
    layout = replay.init(capacity, EXAMPLE).layout
    assert layout.sizes[0] > tree_lib.REBUILD_BELOW          # the per-ancestor path is exercised
    rng = np.random.default_rng(capacity)
    st = replay.add(replay.init(capacity, EXAMPLE, alpha=0.6, eps=0.0), items(range(capacity)),
                    priorities=jnp.asarray(rng.exponential(size=capacity).astype(np.float32)))
    upd = jax.jit(replay.update_priorities)
    for _ in range(5):
        idx = rng.integers(0, capacity, size=256)
        idx[:32] = idx[32:64]                                         # duplicates
        td = rng.exponential(size=256).astype(np.float32) * (rng.random(256) > 0.2)   # some zeros
        st = upd(st, jnp.asarray(idx, jnp.int32), jnp.asarray(td))
    np.testing.assert_array_equal(st.tree, tree_lib.build(st.priorities, st.layout))
