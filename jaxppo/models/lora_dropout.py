"""Adapter (LoRA) dropout as PEFT defines it: only the adapter branch reads a dropped-out copy of the input::

    y = x·W + s · (drop(x)·A)·B        drop(x) = x ⊙ ξ / (1 − p),   ξ ~ Bernoulli(1 − p) i.i.d. per element

(inverted dropout: kept entries are scaled by ``1/(1 − p)``). ``E_ξ[drop(x)] = x`` and the branch is linear in its
input, so the expected adapter output over masks is the no-dropout output ``s · (x·A)·B``; the base product ``x·W``
never sees the mask.

Randomness is explicit: a model called with ``lora_key`` (``CausalLM.__call__`` / ``hidden_states`` /
``continuation_logprobs``, ``ValueModel.__call__``) and ``LoraSpec.dropout > 0`` gives layer ``l`` the key
``split(lora_key, L)[l]`` and target ``t`` of that layer ``fold_in(layer key, DROPOUT_TARGETS.index(t))``, so q, k
and v draw independent masks of the same input (PEFT: one dropout module per adapted linear). Without a key
(every evaluation, reference / behaviour log-prob pass, prepare pass, export) there is no dropout and no random
operation at all. The trainers pass a key only in the training update's loss (``trainer/ppo/steps.py``,
``trainer/dpo/steps.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# fold-in constant that separates the trainers' adapter-dropout keys from their other streams ("LoRA" in ASCII)
DROPOUT_STREAM = 0x4C6F5241

# = jaxppo.models.lora.TARGETS (a test checks it): the fold-in index of each target's mask
DROPOUT_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")


class Drop(NamedTuple):
    """The dropout of one layer's adapters: its key and the rate ``p`` (0 < p < 1)."""

    key: jax.Array
    rate: float


def adapter_dropout(x: jax.Array, key: jax.Array, rate: float) -> jax.Array:
    """``x ⊙ ξ / (1 − p)`` with ``ξ ~ Bernoulli(1 − p)`` per element (``key``), in ``x``'s dtype; ``p = 0``: ``x``."""
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"adapter dropout rate must be in [0, 1), got {rate!r}")
    if rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


def target_input(x: jax.Array, drop: Drop | None, name: str) -> jax.Array:
    """The adapter input of target ``name``: ``x`` itself without ``drop``, else ``adapter_dropout`` with the key
    ``fold_in(drop.key, DROPOUT_TARGETS.index(name))``."""
    if drop is None:
        return x
    return adapter_dropout(x, jax.random.fold_in(drop.key, DROPOUT_TARGETS.index(name)), drop.rate)


def layer_keys(lora_key: jax.Array | None, spec, n_layers: int) -> jax.Array | None:
    """``split(lora_key, n_layers)`` when the model has adapters with ``dropout > 0`` and a key was given, else None
    (no random operation is traced)."""
    if lora_key is None or spec is None or spec.dropout == 0.0:
        return None
    return jax.random.split(lora_key, n_layers)


__all__ = ["DROPOUT_STREAM", "DROPOUT_TARGETS", "Drop", "adapter_dropout", "layer_keys", "target_input"]
