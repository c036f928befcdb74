"""The PPO train-state pytree.

``TrainState`` holds everything a PPO step changes and a resume needs: actor and critic
parameters (``nnx.State``; models are rebuilt inside jitted code with ``nnx.merge``) with their
optax states (``jaxppo.optim``), the replay buffer (storage: one ``batch.BufferItem`` per slot, the data
``Trajectories`` and the ``Prepared`` arrays; priorities), the RNG key, the in-reward KL coefficient
(fixed/adaptive controller state), the LR scale set by the guards, the step/NaN counters and the data cursor.
``share_trunk=True``: ``critic`` holds only a value head that reads the actor's hidden states. With a critic-free
advantage estimator (``algorithm.adv_estimator`` grpo, rloo, reinforce_plus_plus[_baseline]) ``critic`` and
``critic_opt`` are None (empty pytree nodes: nothing is stored, sharded or checkpointed for them).
"""

from __future__ import annotations

import jax
import optax
from flax import nnx, struct

from jaxppo.models import ScalarHead, ValueModel
from jaxppo.replay import ReplayState


@struct.dataclass
class TrainState:
    step: jax.Array            # int32: number of update steps done
    actor: nnx.State           # parameters of the CausalLM
    actor_opt: optax.OptState
    critic: nnx.State | None   # parameters of a ValueModel (a ScalarHead when share_trunk); None: critic-free
    critic_opt: optax.OptState | None   # None without a critic
    replay: ReplayState        # storage: a batch.BufferItem per slot (data + prepared arrays)
    rng: jax.Array             # base key; step keys are fold_in(rng, step)
    kl_coef: jax.Array         # in-reward KL coefficient β (KL-controller state)
    lr_scale: jax.Array        # guard LR multiplier of the actor (1 = as configured)
    nan_total: jax.Array       # int32: updates skipped for a non-finite loss/gradient
    nan_streak: jax.Array      # int32: consecutive skipped updates
    data_cursor: jax.Array     # int32: first dataset row of the current buffer window


def make_critic(actor_model, *, share_trunk: bool, seed: int):
    """A ValueModel with a copy of the actor trunk, or (share_trunk) a bare value head."""
    rngs = nnx.Rngs(seed)
    if share_trunk:
        return ScalarHead(actor_model.config.hidden_size, rngs=rngs, std=actor_model.config.initializer_range,
                          dtype=actor_model.config.param_dtype)
    return ValueModel.from_lm(actor_model, rngs=rngs)
