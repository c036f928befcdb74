"""The typed buffer rows (``jaxppo.trainer.ppo.buffer_types``): the abstract example, the numpy conversion from the data layer's
dict, and a replay buffer of ``BufferItem`` (add, sample, Orbax round trip, ``values`` None without a critic)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxppo import replay
from jaxppo.trainer.ppo.buffer_types import (
    TRAJECTORY_DTYPES,
    BufferItem,
    Prepared,
    Trajectories,
    example_item,
    trajectories_from_arrays,
    zero_prepared,
)

P, R = 3, 5


def _arrays(n: int, seed: int = 0) -> dict:
    """The data layer's dict (int64 / float64 as numpy makes them: the conversion must cast)."""
    rng = np.random.default_rng(seed)
    return {"prompt_ids": rng.integers(0, 50, (n, P)), "prompt_mask": np.ones((n, P), np.int64),
            "response_ids": rng.integers(0, 50, (n, R)), "response_mask": (rng.random((n, R)) > 0.3).astype(np.int64),
            "behaviour_logprobs": rng.normal(size=(n, R)), "score": rng.normal(size=n),
            "group_id": np.arange(n) // 2, "row": np.arange(n), "ref_logp": rng.normal(size=(n, R)),
            "filter_w": np.ones(n), "extra_column": np.zeros(n)}


def test_example_item_shapes_and_dtypes():
    ex = example_item(P, R, critic=True)
    got = {jax.tree_util.keystr(p, simple=True, separator="."): (x.shape, np.dtype(x.dtype))
           for p, x in jax.tree_util.tree_leaves_with_path(ex)}
    i32, f32 = np.dtype(np.int32), np.dtype(np.float32)
    assert got == {
        "data.prompt_ids": ((P,), i32), "data.prompt_mask": ((P,), i32), "data.response_ids": ((R,), i32),
        "data.response_mask": ((R,), i32), "data.behaviour_logprobs": ((R,), f32), "data.score": ((), f32),
        "data.group_id": ((), i32), "data.row": ((), i32), "data.ref_logp": ((R,), f32), "data.filter_w": ((), f32),
        "prepared.prox_logp": ((R,), f32), "prepared.token_rewards": ((R,), f32), "prepared.advantages": ((R,), f32),
        "prepared.returns": ((R,), f32), "prepared.values": ((R,), f32)}
    assert example_item(P, R, critic=False).prepared.values is None


def test_trajectories_from_arrays_selects_rows_and_casts():
    a = _arrays(6)
    rows = np.array([4, 0, 0])
    t = trajectories_from_arrays(a, rows)
    assert isinstance(t, Trajectories)
    for k, dt in TRAJECTORY_DTYPES.items():
        x = getattr(t, k)
        assert x.dtype == dt, k
        np.testing.assert_array_equal(x, a[k][rows].astype(dt), err_msg=k)
    assert trajectories_from_arrays(a).score.shape == (6,)
    with pytest.raises(KeyError, match=r"lack the fields \['ref_logp', 'filter_w'\]"):
        trajectories_from_arrays({k: v for k, v in a.items() if k not in ("ref_logp", "filter_w")})


@pytest.mark.parametrize("critic", [True, False])
def test_buffer_of_buffer_items_add_sample_checkpoint(tmp_path, critic):
    n = 8
    st = replay.init(n, example_item(P, R, critic=critic))
    assert isinstance(st.storage, BufferItem) and (st.storage.prepared.values is None) == (not critic)
    item = BufferItem(data=trajectories_from_arrays(_arrays(n)), prepared=zero_prepared(n, R, critic=critic))
    st = replay.add(st, item)
    np.testing.assert_array_equal(st.storage.data.row, np.arange(n))
    s = jax.jit(lambda s, k: replay.sample(s, k, 4, beta=0.5))(st, jax.random.key(0))
    assert isinstance(s.items, BufferItem) and s.items.prepared.advantages.shape == (4, R)
    np.testing.assert_array_equal(s.items.data.response_ids, np.asarray(st.storage.data.response_ids)[s.indices])
    # the prepare pass swaps in new Prepared arrays: same structure, so the jitted functions see one pytree type
    new = Prepared(prox_logp=jnp.ones((n, R)), token_rewards=jnp.ones((n, R)), advantages=jnp.full((n, R), 2.0),
                   returns=jnp.ones((n, R)), values=jnp.ones((n, R)) if critic else None)
    st = st.replace(storage=st.storage.replace(prepared=new))
    with ocp.StandardCheckpointer() as c:
        c.save(tmp_path / "ckpt", st)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), st)
    with ocp.StandardCheckpointer() as c:
        back = c.restore(tmp_path / "ckpt", like)
    assert jax.tree.structure(back) == jax.tree.structure(st)
    assert (back.storage.prepared.values is None) == (not critic)
    for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)
