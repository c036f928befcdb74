"""Jitting a donated-state function that also reads the frozen base of models with adapters.

Models with LoRA adapters (``jaxppo.models.adapters``) keep their trainable part in the train state and their
frozen base outside it: the base is a second argument of the jitted function, never donated (so it outlives every
step and is shared by the reference, the policy and a critic on the same base) and never checkpointed.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.optim import shardings_of


def jit_step(fn, state_shardings, mesh, base, *, out_scalars: bool):
    """``jax.jit(fn, donate_argnums=0)`` with explicit shardings on a mesh: ``fn(state)`` returns ``(state,
    metrics)`` (``out_scalars``, metrics replicated) or ``state``. With ``base`` (adapters), ``fn(state, base)`` is
    jitted with ``base`` not donated and bound by :class:`WithBase`."""
    rep = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    outs = None if state_shardings is None else ((state_shardings, rep) if out_scalars else state_shardings)
    if base is None:
        if state_shardings is None:
            return jax.jit(fn, donate_argnums=0)
        return jax.jit(fn, donate_argnums=0, in_shardings=(state_shardings,), out_shardings=outs)
    if state_shardings is None:
        return WithBase(jax.jit(fn, donate_argnums=0), base)
    return WithBase(jax.jit(fn, donate_argnums=0, in_shardings=(state_shardings, shardings_of(base)),
                            out_shardings=outs), base)


class WithBase:
    """A jitted ``fn(state, base)`` with ``base`` bound: ``self(state) = fn(state, base)``, ``lower(state)`` too.
    ``base`` (the frozen weights every role shares) is an argument, never donated: it outlives every step."""

    def __init__(self, fn, base):
        self.fn, self.base = fn, base

    def __call__(self, state):
        return self.fn(state, self.base)

    def lower(self, state):
        return self.fn.lower(state, self.base)


__all__ = ["WithBase", "jit_step"]
