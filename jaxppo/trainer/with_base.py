"""Jitting a donated-state step function that also reads the frozen base of models with adapters.

Models with LoRA adapters (``jaxppo.models.adapters``) keep their trainable part in the train state and their
frozen base outside it: the base is the last argument of the jitted function, never donated (so it outlives every
step and is shared by the reference, the policy and a critic on the same base) and never checkpointed.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxppo.optim import shardings_of

_NO_BATCH = object()


def jit_step(fn, state_shardings, mesh, base, *, out_scalars: bool, batch_shardings=_NO_BATCH):
    """``jax.jit(fn, donate_argnums=0)`` with explicit shardings on a mesh: ``fn(state)`` — or with
    ``batch_shardings`` given, ``fn(state, batch)`` with the batch placed by them — returns ``(state, metrics)``
    (``out_scalars``, metrics replicated) or ``state``. With ``base`` (adapters), ``fn`` takes ``base`` as a last
    argument, jitted not donated and bound by :class:`WithBase`; ``state_shardings`` None: no explicit shardings."""
    rep = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    kw = {}
    if state_shardings is not None:
        ins = (state_shardings,) + (() if batch_shardings is _NO_BATCH else (batch_shardings,))
        if base is not None:
            ins += (shardings_of(base),)
        kw = dict(in_shardings=ins, out_shardings=(state_shardings, rep) if out_scalars else state_shardings)
    jitted = jax.jit(fn, donate_argnums=0, **kw)
    return jitted if base is None else WithBase(jitted, base)


class WithBase:
    """A jitted ``fn(*args, base)`` with ``base`` bound: ``self(*args) = fn(*args, base)``, ``lower(*args)`` too.
    ``base`` (the frozen weights every role shares) is an argument, never donated: it outlives every step."""

    def __init__(self, fn, base):
        self.fn, self.base = fn, base

    def __call__(self, *args):
        return self.fn(*args, self.base)

    def lower(self, *args):
        return self.fn.lower(*args, self.base)


__all__ = ["WithBase", "jit_step"]
