"""The train-state fields the run harness (``jaxppo.trainer.harness``) reads and writes, declared once.

Every trainer's state (PPO's ``TrainState``, DPO's ``DPOState``) is a ``flax.struct`` dataclass with at least these
fields; the harness reads nothing else of it:

- ``actor``: the policy's trainable parameters (perplexity checks, evaluation, the finiteness check before a
  checkpoint, the ``hf/`` export);
- ``lr_scale``: the guards' cut of the actor's learning rate (``lower_lr`` writes it);
- ``nan_total`` / ``nan_streak``: the skipped-update counters of the step (``jaxppo.trainer.nan_skip``; a rollback
  zeroes the streak);
- ``data_cursor``: where the data stream stands (logged by a rollback);
- ``replace(**fields)``: a copy with fields replaced (rollback, LR cut).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax


class RunState(Protocol):
    actor: Any
    lr_scale: jax.Array
    nan_total: jax.Array
    nan_streak: jax.Array
    data_cursor: jax.Array

    def replace(self, **fields: Any) -> "RunState": ...


#: the fields of :class:`RunState`
RUN_STATE_FIELDS = ("actor", "lr_scale", "nan_total", "nan_streak", "data_cursor")

__all__ = ["RUN_STATE_FIELDS", "RunState"]
