"""Activation shardings inside the model (``sharding.mesh_of`` / ``constrain_batch`` / ``vocab_parallel_axes``).

On an FSDP mesh the layers keep their activations batch-split (each layer gathers its weight shards) and the LM
head is vocab-parallel. Without that, XLA split the activations over the contracted hidden dimension and
all-reduced full-size partial sums: [all rows of a data group, V] logits and [rows, F] MLP outputs per device
(the TPU v5e-32 example's 17.8 GiB of temporaries; see launch/README.md). Values must not change.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.models import shard_model
from jaxppo.models.sharding import constrain_batch, mesh_of, vocab_parallel_axes
from jaxppo.parallel import BATCH_AXES, batch_sharding, make_mesh
from tests.models.tiny_lm import tiny_lm

COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)(-start)?\(")
SHAPE = re.compile(r"[a-z]+[0-9]*\[([0-9,]*)\]")


def collective_shapes(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(op, result shape)`` of every collective of a compiled (per-device) HLO module."""
    out = []
    for line in hlo.splitlines():
        m = COLLECTIVE.search(line)
        if m:
            out += [(m.group(2), tuple(int(d) for d in s.split(",") if d)) for s in SHAPE.findall(m.group(1))]
    return out


def test_mesh_of_and_constrain_batch_noops():
    mesh = make_mesh(2, 4, 1)
    x = jnp.arange(24.0).reshape(8, 3)
    assert mesh_of(x) is None                                   # uncommitted single-device array
    assert constrain_batch(x, None) is x
    xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp")))
    m = mesh_of(xs)
    assert dict(m.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    y6 = x[:6]
    assert constrain_batch(y6, m) is y6                          # 6 rows do not split 8 ways: returned unchanged
    one = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert constrain_batch(x, one) is x                          # batch axes of size 1


@pytest.mark.parametrize("jit", [False, True])
def test_constrain_batch_splits_rows_and_keeps_values(jit):
    mesh = make_mesh(2, 4, 1)
    x = jax.device_put(np.arange(16 * 3, dtype=np.float32).reshape(16, 3), NamedSharding(mesh, PartitionSpec()))
    fn = (lambda a: constrain_batch(a * 2.0, mesh_of(a)))
    y = (jax.jit(fn) if jit else fn)(x)
    np.testing.assert_array_equal(np.asarray(y), 2.0 * np.arange(48, dtype=np.float32).reshape(16, 3))
    assert tuple(y.sharding.spec)[:1] == (BATCH_AXES,) and all(s is None for s in tuple(y.sharding.spec)[1:])
    assert y.addressable_shards[0].data.shape == (2, 3)


def test_vocab_parallel_axes_hand_cases():
    assert vocab_parallel_axes(None, 8, 512) is None
    assert vocab_parallel_axes(make_mesh(2, 4, 1), 8, 512) == ("data", ("fsdp",))
    assert vocab_parallel_axes(make_mesh(1, 8, 1), 8, 512) == (None, ("fsdp",))
    assert vocab_parallel_axes(make_mesh(2, 2, 2), 8, 512) == ("data", ("fsdp", "tensor"))
    assert vocab_parallel_axes(make_mesh(2, 4, 1), 7, 512) == (None, ("fsdp",))   # 7 rows: not split over data
    assert vocab_parallel_axes(make_mesh(2, 4, 1), 8, 61) is None                  # 61 % 4 != 0
    assert vocab_parallel_axes(make_mesh(8, 1, 1), 8, 512) is None                 # pure data parallel


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from([(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1),
                              (4, 1, 2), (4, 2, 1), (8, 1, 1)]),
       rows=st.integers(1, 64), vocab=st.integers(1, 600))
def test_vocab_parallel_axes_property(shape, rows, vocab):
    mesh = make_mesh(*shape)
    data, fsdp, tensor = shape
    got = vocab_parallel_axes(mesh, rows, vocab)
    n = fsdp * tensor
    if n == 1 or vocab % n:
        assert got is None
        return
    row, axes = got
    assert axes == tuple(a for a, s in (("fsdp", fsdp), ("tensor", tensor)) if s > 1)
    assert row == ("data" if data > 1 and rows % data == 0 else None)


def _loss(model, ids, mask):
    lp = jax.nn.log_softmax(model(ids, mask))
    return -jnp.mean(jnp.take_along_axis(lp[:, :-1], ids[:, 1:, None], -1))


def _ids(vocab, rows=8, width=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (rows, width)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[::3, :5] = 0   # left padding on some rows
    return ids, mask


@pytest.mark.parametrize("family,mesh_shape", [("qwen2", (2, 4, 1)), ("smollm2", (2, 4, 1)), ("llama", (1, 4, 2))])
@pytest.mark.parametrize("jit", [False, True])
def test_sharded_loss_and_grads_match_single_device(family, mesh_shape, jit):
    """Same loss and gradients on one device and on the mesh (tied and untied heads, vocab over fsdp / fsdp x
    tensor); the forward un-jitted too."""
    mesh = make_mesh(*mesh_shape)
    kw = dict(vocab_size=64, scan_layers=True, remat=True)
    single = tiny_lm(family, seed=3, **kw)
    sharded = shard_model(tiny_lm(family, seed=3, **kw), mesh)
    ids, mask = _ids(64)
    vg = nnx.value_and_grad(_loss)
    if jit:
        vg = nnx.jit(vg)
    l0, g0 = vg(single, jnp.asarray(ids), jnp.asarray(mask))
    ids_s = jax.device_put(ids, batch_sharding(mesh, 2))
    mask_s = jax.device_put(mask, batch_sharding(mesh, 2))
    l1, g1 = vg(sharded, ids_s, mask_s)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    flat0, flat1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(flat0) == len(flat1) > 5
    for a, b in zip(flat0, flat1):
        # float32 sums in another order: the gap depends on the CPU's kernels (about 1.6e-6 on an AMD EPYC);
        # a wrong sharding is off by orders of magnitude more
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=5e-6, rtol=1e-4)
    logits = sharded(ids_s, mask_s)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(single(jnp.asarray(ids), jnp.asarray(mask))),
                               atol=1e-4, rtol=1e-4)  # eager: op-by-op float32 sums in another order
    assert logits.sharding.spec[0] == BATCH_AXES     # returned batch-split, whole vocab per row


@pytest.mark.parametrize("family", ["qwen2", "smollm2"])
def test_no_activation_partial_sums_are_all_reduced(family):
    """The compiled forward+backward on data=2 x fsdp=4 all-reduces no [rows, V] logits or [rows, F] MLP
    partial sums (only weight gradients and the vocab-parallel head's [rows, D] input gradient), and no
    collective is larger than the largest weight or the batch-split logits. (Before the constraints XLA
    all-reduced [256, V] logits and [256, F] MLP partial sums.)"""
    mesh = make_mesh(2, 4, 1)
    d, f, v, rows, t = 32, 64, 384, 8, 64
    model = shard_model(tiny_lm(family, vocab_size=v, hidden_size=d, intermediate_size=f, scan_layers=True,
                                remat=True), mesh)
    ids = jax.device_put(jnp.ones((rows, t), jnp.int32), batch_sharding(mesh, 2))
    step = nnx.jit(nnx.grad(lambda m, x: jnp.mean(jax.nn.log_softmax(m(x)))))
    colls = collective_shapes(step.lower(model, ids).compile().as_text())
    assert colls, "expected collectives on an 8-device mesh"
    group_rows = rows * t // 2
    partial = [(op, s) for op, s in colls
               if op == "all-reduce" and len(s) > 1 and s[0] in (group_rows, rows * t) and s[-1] in (v, f)]
    assert not partial, partial
    bound = max(v * d, rows * t * v // 8, rows * t * d // 2)
    too_big = [(op, s) for op, s in colls if int(np.prod(s)) > bound]
    assert not too_big, too_big
