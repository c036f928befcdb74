"""Checkpointer: round trip, never a non-finite state, incomplete (temporary) checkpoints ignored."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.trainer.checkpoint import Checkpointer
from jaxppo.trainer.state import TrainState


def _state(w) -> TrainState:
    z = jnp.zeros((), jnp.int32)
    return TrainState(step=z, actor={"w": jnp.asarray(w, jnp.float32)}, actor_opt={"m": jnp.ones(3)},
                      critic={"v": jnp.arange(4.0)}, critic_opt={"m": jnp.zeros(4)}, replay={"p": jnp.ones(5)},
                      rng=jax.random.PRNGKey(3), kl_coef=jnp.float32(0.1), lr_scale=jnp.float32(1.0),
                      nan_total=z, nan_streak=z, data_cursor=z)


def test_round_trip_and_latest(tmp_path):
    ck = Checkpointer(tmp_path / "c", keep_last=2)
    for step in (1, 2, 3):
        assert ck.save(step, _state([step, 2.0, 3.0]), {"guards": {"n": step}})
    ck.wait()
    assert ck.all_steps() == [2, 3] and ck.latest_step() == 3
    state, meta = ck.restore(3, _state([0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(state.actor["w"]), [3.0, 2.0, 3.0])
    assert meta == {"guards": {"n": 3}, "step": 3}
    ck.close()


def test_non_finite_params_are_not_saved(tmp_path):
    ck = Checkpointer(tmp_path / "c", keep_last=2)
    assert ck.save(1, _state([1.0, 2.0, 3.0]), {})
    assert not ck.save(2, _state([1.0, np.nan, 3.0]), {})
    ck.wait()
    assert ck.all_steps() == [1]
    ck.close()


def test_incomplete_checkpoint_is_ignored(tmp_path):
    ck = Checkpointer(tmp_path / "c", keep_last=3)
    ck.save(1, _state([1.0, 2.0, 3.0]), {})
    ck.close()
    # what a process killed in the middle of writing step 2 leaves behind
    tmp = tmp_path / "c" / "2.orbax-checkpoint-tmp-1234"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "partial").write_bytes(b"\0" * 10)
    ck2 = Checkpointer(tmp_path / "c", keep_last=3)
    assert ck2.latest_step() == 1
    state, _ = ck2.restore(1, _state([0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(state.actor["w"]), [1.0, 2.0, 3.0])
    ck2.close()
