"""Staleness decay of priorities (``replay.staleness``): hand-computed cases, a numpy model, rate 1 == plain PER,
age rebase, sharding, metrics and bad input."""

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
from jaxppo.parallel.mesh import make_mesh
from jaxppo.replay import staleness
from jaxppo.replay import tree as tree_lib
from tests.replay import _ref

EXAMPLE = {"v": jnp.zeros((), jnp.float32)}


def vals(n, start=0):
    return {"v": np.arange(start, start + n, dtype=np.float32)}


def leaf_probs(st):
    p = np.asarray(st.priorities, np.float64)[: int(st.size)]
    return p / p.sum()


class HandComputedTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_sampled_decay(self):
        """r = 0.5, α = 1, ε = 0: b = [1, 2, 4, 8]; draws [3, 3, 1] -> n = [0, 1, 0, 2] ->
        p = [1, 1, 4, 2], P = p / 8; a fresh |δ| = 16 for slot 3 (n -> 3) -> p_3 = 16 · 0.5^3 = 2;
        set_priorities refreshes: n = 0, p = b."""
        record = self.variant(replay.record_sample)
        st = replay.init(4, EXAMPLE, alpha=1.0, eps=0.0, decay="sampled", decay_rate=0.5)
        st = replay.add(st, vals(4), jnp.array([1.0, 2.0, 4.0, 8.0]))
        np.testing.assert_array_equal(st.priorities, [1, 2, 4, 8])
        st = record(st, jnp.array([3, 3, 1]))
        np.testing.assert_array_equal(st.sample_count, [0, 1, 0, 2])
        np.testing.assert_array_equal(st.base_priorities, [1, 2, 4, 8])
        np.testing.assert_allclose(st.priorities, [1, 1, 4, 2], rtol=1e-6)
        assert int(st.clock) == 1
        np.testing.assert_array_equal(st.tree, tree_lib.build(st.priorities, st.layout))
        s = replay.sample(st, jax.random.key(0), 4, beta=1.0)
        np.testing.assert_allclose(s.probs, np.array([1, 1, 4, 2])[np.asarray(s.indices)] / 8, rtol=1e-6)
        # PER weights correct for the decayed distribution: w = (P_min / P)^β with P_min = 1/8
        np.testing.assert_allclose(s.weights, (1 / 8) / np.asarray(s.probs), rtol=1e-5)
        st = record(st, jnp.array([3]), jnp.array([16.0]))
        np.testing.assert_array_equal(st.sample_count, [0, 1, 0, 3])
        np.testing.assert_allclose(st.priorities, [1, 1, 4, 2], rtol=1e-6)
        np.testing.assert_array_equal(st.base_priorities, [1, 2, 4, 16])
        assert float(st.max_priority) == 16.0 and int(st.clock) == 2
        # update_priorities does not reset the staleness: b_1 = 6 -> p_1 = 6 · 0.5 = 3
        st = replay.update_priorities(st, jnp.array([1]), jnp.array([6.0]))
        np.testing.assert_allclose(st.priorities, [1, 3, 4, 2], rtol=1e-6)
        st = replay.set_priorities(st, jnp.arange(4), jnp.array([1.0, 2.0, 3.0, 4.0]))
        np.testing.assert_array_equal(st.sample_count, [0, 0, 0, 0])
        np.testing.assert_array_equal(st.priorities, [1, 2, 3, 4])
        np.testing.assert_array_equal(st.refresh_step, [2, 2, 2, 2])

    @chex.variants(with_jit=True, without_jit=True)
    def test_age_decay(self):
        """r = 0.5: items 0, 1 refreshed at clock 0, items 2, 3 at clock 2; at clock t the decayed priorities
        are b · 0.5^(t - refresh), so P = [0.25, 0.25, 1, 1] / 2.5 at every t (the common factor cancels),
        across rebases (every 16 ticks for r = 0.5)."""
        record = self.variant(replay.record_sample)
        assert staleness.rebase_period(0.5) == 16
        st = replay.init(4, EXAMPLE, alpha=1.0, eps=0.0, decay="age", decay_rate=0.5)
        st = replay.add(st, vals(2), jnp.array([1.0, 1.0]))
        st = record(st, jnp.array([0]))
        st = record(st, jnp.array([0]))
        st = replay.add(st, vals(2, 2), jnp.array([1.0, 1.0]))
        np.testing.assert_array_equal(st.refresh_step, [0, 0, 2, 2])
        np.testing.assert_allclose(leaf_probs(st), np.array([0.25, 0.25, 1, 1]) / 2.5, rtol=1e-6)
        for t in range(3, 40):
            st = record(st, jnp.array([t % 4]))
            np.testing.assert_allclose(leaf_probs(st), np.array([0.25, 0.25, 1, 1]) / 2.5, rtol=1e-5)
            assert int(st.clock) - int(st.decay_ref) < 16
        assert int(st.clock) == 39 and int(st.decay_ref) == 32            # rebased at clocks 16 and 32
        np.testing.assert_allclose(st.priorities, 1.0 * 0.5 ** (32 - np.array([0, 0, 2, 2])), rtol=1e-6)
        np.testing.assert_array_equal(st.tree, tree_lib.build(st.priorities, st.layout))
        s = replay.sample(st, jax.random.key(1), 4, beta=0.5)
        np.testing.assert_allclose(s.probs, (np.array([0.25, 0.25, 1, 1]) / 2.5)[np.asarray(s.indices)], rtol=1e-5)
        # a fresh |δ| does not reset the age: b_0 = 4 -> P ∝ [1, 0.25, 1, 1]
        st = replay.update_priorities(st, jnp.array([0]), jnp.array([4.0]))
        np.testing.assert_allclose(leaf_probs(st), np.array([1, 0.25, 1, 1]) / 3.25, rtol=1e-5)
        m = replay.staleness_metrics(st)
        np.testing.assert_allclose(float(m["age_mean"]), (39 + 39 + 37 + 37) / 4)

    def test_staleness_metrics_hand_computed(self):
        st = replay.init(8, EXAMPLE, alpha=1.0, eps=0.0, decay="sampled", decay_rate=0.9)
        st = replay.add(st, vals(4), jnp.array([1.0, 1.0, 1.0, 1.0]))
        st = replay.record_sample(st, jnp.array([0, 0, 2]))
        st = replay.set_priorities(st, jnp.array([3]), jnp.array([0.0]))    # switched off: not counted
        m = jax.jit(replay.staleness_metrics)(st)
        np.testing.assert_allclose(float(m["sample_count_mean"]), 3 / 3)
        assert float(m["sample_count_max"]) == 2.0
        np.testing.assert_allclose(float(m["age_mean"]), (1 + 1 + 1) / 3)


# ------------------------------------------------------------------------------------------- numpy model
class RefStale:
    """Numpy model: base priorities, counts, refresh clocks; P from b · r^n or b · r^(clock - refresh)."""

    def __init__(self, capacity, alpha, eps, kind, rate):
        self.buf = _ref.RefBuffer(capacity, alpha, eps)
        self.kind, self.rate = kind, rate
        self.n = np.zeros(capacity, np.int64)
        self.refresh = np.zeros(capacity, np.int64)
        self.clock = 0

    def add(self, v, td):
        pos = [(self.buf.pos + j) % self.buf.capacity for j in range(len(v))]
        self.buf.add(v, td)
        self.n[pos], self.refresh[pos] = 0, self.clock

    def record(self, idx, td=None):
        np.add.at(self.n, idx, 1)
        self.clock += 1
        if td is not None:
            self.buf.update(idx, td)

    def set(self, idx, p):
        for i, v in zip(idx, p):
            self.buf.p[i] = v
        self.n[idx], self.refresh[idx] = 0, self.clock

    def probs(self):
        k = self.buf.size
        if self.kind == "sampled":
            f = self.rate ** self.n[:k]
        else:
            f = self.rate ** (self.clock - self.refresh[:k])
        p = self.buf.p[:k] * f
        return p / p.sum()


OPS = st_.lists(st_.tuples(st_.sampled_from(["add", "record", "record_td", "update", "set"]),
                           st_.integers(1, 12), st_.integers(0, 2 ** 31 - 1)), min_size=1, max_size=12)


def run_ops(st, ops, ref=None):
    """Apply ``ops`` to ``st`` (and the numpy model ``ref``); returns the state and the samples drawn."""
    samples, counter, size = [], 0, 0
    for op, n, seed in ops:
        rng = np.random.default_rng(seed)
        if op == "add" or size == 0:
            n = min(n, st.capacity)
            td = rng.exponential(size=n).astype(np.float32) + 0.1
            st = replay.add(st, vals(n, counter), jnp.asarray(td))
            if ref is not None:
                ref.add(np.arange(counter, counter + n), td)
            counter, size = counter + n, min(size + n, st.capacity)
            continue
        s = replay.sample(st, jax.random.key(seed % 997), min(4, size), beta=0.7)
        samples.append(jax.tree.map(np.asarray, (s.indices, s.probs, s.weights)))
        idx = np.asarray(s.indices)
        td = (rng.exponential(size=len(idx)) + 0.05).astype(np.float32)
        if op == "record":
            st = replay.record_sample(st, jnp.asarray(idx))
            if ref is not None:
                ref.record(idx)
        elif op == "record_td":
            st = replay.record_sample(st, jnp.asarray(idx), jnp.asarray(td))
            if ref is not None:
                ref.record(idx, td)
        elif op == "update":
            st = replay.update_priorities(st, jnp.asarray(idx), jnp.asarray(td))
            if ref is not None:
                ref.buf.update(idx, td)
        else:
            uniq = np.unique(idx)
            st = replay.set_priorities(st, jnp.asarray(uniq), jnp.asarray(td[: len(uniq)]))
            if ref is not None:
                ref.set(uniq, td[: len(uniq)].astype(np.float64))
    return st, samples


@settings(max_examples=5, deadline=None)
@given(kind=st_.sampled_from(["sampled", "age"]), ops=OPS)
def test_rate_one_equals_plain_per(kind, ops):
    """With r = 1 every priority, tree node, sample, probability and weight equals plain PER's exactly."""
    plain, got_plain = run_ops(replay.init(16, EXAMPLE, alpha=0.6, eps=1e-3), ops)
    dec, got_dec = run_ops(replay.init(16, EXAMPLE, alpha=0.6, eps=1e-3, decay=kind, decay_rate=1.0), ops)
    for a, b in zip(jax.tree.leaves(got_plain), jax.tree.leaves(got_dec)):
        np.testing.assert_array_equal(a, b)
    for name in ("priorities", "tree", "max_priority", "base_priorities", "sample_count", "clock"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(dec, name), err_msg=name)


@settings(max_examples=8, deadline=None)
@given(kind=st_.sampled_from(["sampled", "age"]), rate=st_.sampled_from([0.3, 0.8, 0.97]), ops=OPS)
def test_matches_numpy_model(kind, rate, ops):
    """Random add / sample+record / update / set sequences: P(i) equals the model's b·r^n or b·r^age, the
    tree equals a fresh build of the leaves, and the sampled probabilities are the model's."""
    st = replay.init(16, EXAMPLE, alpha=0.6, eps=1e-3, decay=kind, decay_rate=rate)
    ref = RefStale(16, 0.6, 1e-3, kind, rate)
    st, _ = run_ops(st, ops, ref)
    np.testing.assert_allclose(leaf_probs(st), ref.probs(), rtol=2e-5, atol=1e-12)
    np.testing.assert_array_equal(st.tree, tree_lib.build(st.priorities, st.layout))
    np.testing.assert_array_equal(np.asarray(st.sample_count)[: ref.buf.size], ref.n[: ref.buf.size])
    s = replay.sample(st, jax.random.key(3), min(4, ref.buf.size), beta=0.5)
    np.testing.assert_allclose(s.probs, ref.probs()[np.asarray(s.indices)], rtol=3e-5)


def test_sharded_equals_single_device():
    """On 8 simulated devices the new per-slot fields are sharded like the priorities and every value
    equals the single-device run."""
    ops = [("add", 12, 1), ("record_td", 6, 2), ("record", 5, 3), ("update", 4, 4), ("record", 8, 5)]
    for kind in ("sampled", "age"):
        one, _ = run_ops(replay.init(16, EXAMPLE, decay=kind, decay_rate=0.6), ops)
        sh, _ = run_ops(replay.init(16, EXAMPLE, decay=kind, decay_rate=0.6, mesh=make_mesh(data=8)), ops)
        for name in ("priorities", "base_priorities", "sample_count", "refresh_step"):
            a, b = getattr(one, name), getattr(sh, name)
            np.testing.assert_array_equal(a, b, err_msg=name)
            assert b.sharding.is_equivalent_to(sh.priorities.sharding, 1), name
            assert len(b.sharding.device_set) == 8
        np.testing.assert_array_equal(one.tree, sh.tree)


def test_bad_input():
    with pytest.raises(ValueError, match="decay.kind"):
        replay.init(4, EXAMPLE, decay="exp")
    for rate in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="decay.rate"):
            replay.init(4, EXAMPLE, decay="sampled", decay_rate=rate)
    st = replay.add(replay.init(4, EXAMPLE, decay="sampled", decay_rate=0.5), vals(2))
    with pytest.raises(ValueError, match="not filled slots"):
        replay.record_sample(st, jnp.array([0, 3]))
    with pytest.raises(ValueError, match="td_abs has 1"):
        replay.record_sample(st, jnp.array([0, 1]), jnp.array([1.0]))
    with pytest.raises(ValueError, match="NaN or inf"):
        replay.record_sample(st, jnp.array([0]), jnp.array([np.nan]))
