"""Scalar heads on the decoder trunk: a per-token value head (critic) and a sequence reward head.

Both read the trunk's final-normed hidden states ``h`` [B, T, D]:
- ``ValueModel``: ``values[b, t] = h[b, t] · w + c`` (float32, [B, T]).
- ``RewardModel``: ``score[b] = h[b, last(b)] · w + c`` with ``last(b)`` the index of the last real
  token (``attention_mask == 1``) of row b, so left and right padding both work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxppo.models.config import LMConfig
from jaxppo.models.layers import make_param
from jaxppo.models.transformer import CausalLM, Transformer


class ScalarHead(nnx.Module):
    """``x · w + c``: [..., D] -> [...] in float32 (``w`` ~ N(0, std²), ``c`` = 0)."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs, std: float = 0.02, dtype="float32"):
        self.kernel = make_param(rngs.params(), (hidden_size, 1), ("embed", None), jnp.dtype(dtype), "normal", std)
        self.bias = make_param(None, (1,), (None,), jnp.dtype(dtype), "zeros")

    def __call__(self, h: jax.Array) -> jax.Array:
        y = jnp.einsum("...d,do->...o", h.astype(jnp.float32), self.kernel[...].astype(jnp.float32))
        return (y + self.bias[...].astype(jnp.float32))[..., 0]


def last_token_index(attention_mask: jax.Array) -> jax.Array:
    """Index [B] of the last position whose mask is 1 (0 when a row has no real token)."""
    m = attention_mask.astype(jnp.int32)
    t = m.shape[-1]
    idx = t - 1 - jnp.argmax(m[:, ::-1], axis=-1)
    return jnp.where(m.sum(-1) > 0, idx, 0)


def _trunk_copy(lm: CausalLM) -> Transformer:
    """A new trunk with copies of ``lm``'s trunk arrays (no buffer shared, so donating one never frees the other)."""
    trunk = nnx.eval_shape(lambda: Transformer(lm.config, rngs=nnx.Rngs(0)))
    nnx.update(trunk, jax.tree.map(lambda a: jnp.array(a, copy=True), nnx.state(lm.model)))
    return trunk


class _TrunkWithHead(nnx.Module):
    """A decoder trunk (``self.model``) plus one fresh :class:`ScalarHead` stored as ``self.<HEAD>``."""

    HEAD = "head"

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs | None = None, trunk: Transformer | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.model = Transformer(config, rngs=rngs) if trunk is None else trunk
        setattr(self, self.HEAD, ScalarHead(config.hidden_size, rngs=rngs, std=config.initializer_range,
                                            dtype=config.param_dtype))

    @classmethod
    def from_lm(cls, lm: CausalLM, *, rngs: nnx.Rngs | None = None):
        """A model whose trunk starts from (a copy of) ``lm``'s trunk weights, with a fresh head."""
        return cls(lm.config, rngs=rngs, trunk=_trunk_copy(lm))


class ValueModel(_TrunkWithHead):
    """Critic: trunk + per-token scalar head. ``model(input_ids, attention_mask) -> values [B, T] float32``."""

    HEAD = "value_head"

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 lora_key: jax.Array | None = None) -> jax.Array:
        """Values [B, T]; ``lora_key``: adapter dropout of the trunk's adapters (training passes only)."""
        return self.value_head(self.model(input_ids, attention_mask, lora_key=lora_key))


class RewardModel(_TrunkWithHead):
    """Reward model: trunk + scalar head at the last real token. ``model(ids, mask) -> scores [B] float32``."""

    HEAD = "score_head"

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        input_ids = jnp.asarray(input_ids)
        mask = jnp.ones(input_ids.shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
        h = self.model(input_ids, mask)
        idx = last_token_index(mask)
        h_last = jnp.take_along_axis(h, idx[:, None, None], axis=1)[:, 0]
        return self.score_head(h_last)

    def packed(self, packed) -> jax.Array:
        """Scores [B] of the sequences that ``packed`` (``jaxppo.models.packing.Packed``) packs: the head at each
        sequence's last real token (``packed.last_index``), equal to ``__call__`` on the padded rows."""
        from jaxppo.models.packing import gather

        h = self.model.packed(packed.ids, packed.segment_ids, packed.positions)
        return self.score_head(gather(h, packed.last_index))
