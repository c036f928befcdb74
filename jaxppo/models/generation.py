"""Batched autoregressive generation with a KV cache: greedy, temperature, top-k and top-p sampling.

Layout: ``prompt_ids`` [B, P] are LEFT-padded (``prompt_mask`` 0s then 1s per row). The cache has
``P + N`` slots (N = ``max_new_tokens``): the prompt fills slots ``0..P-1`` in one prefill pass, the
i-th new token goes to slot ``P + i`` with rotary position ``n_real(b) + i``. One jitted program
(per shapes / static options) runs the prefill and a ``lax.while_loop`` decode loop that stops as
soon as every row has emitted an EOS; nothing is recompiled per token.

Sampling distribution at each step, from the float32 next-token logits ``z`` (in this order, like
transformers' logits warpers):
  1. temperature: ``z / T``;
  2. top-k (k > 0): keep the k largest, the others get probability 0;
  3. top-p (p < 1): sort the remaining probabilities ``π`` in decreasing order and keep the shortest
     prefix whose mass reaches p, i.e. token j (sorted) is kept iff ``Σ_{i<j} π_i < p`` (the most likely
     token is always kept);
  4. renormalise: ``q = softmax(z / T | kept)``; sample ``y ~ q``; the returned log-prob is ``log q(y)``.
``temperature == 0`` is greedy: ``y = argmax z`` and the returned log-prob is the model's own
``log_softmax(z)[y]`` (the point mass of greedy decoding carries no information).

Beside ``log q(y)`` each step returns ``log π(y) = log_softmax(z)[y]``, the model's own log-prob of the token
(float32 logits, no temperature, top-k or top-p): the policy term of a KL estimate on the samples, without a
second forward pass. With temperature 1 and neither top-k nor top-p, ``q = π``.

After a row emits an EOS token (any of ``eos_token_id``) its later tokens are ``pad_token_id``,
with mask 0 and both log-probs 0; the EOS itself has mask 1.

Shared prefill: when the rows come in consecutive blocks of ``r`` identical prompts (``n`` samples of each prompt,
as collection and evaluation lay them out; ``r`` from ``jaxppo.models.shared_prompts.shared_rows``), the prefill
runs on one row per block and its cache and next-token logits are repeated ``r`` times; the decode loop then runs
on every row as before. The sampled tokens and log-probs are those of the row-by-row prefill up to float
summation order (the prefill's matrix products have ``B/r`` rows instead of ``B``).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.models.layers import positions_from_mask
from jaxppo.models.shared_prompts import shared_rows


class GenerationOutput(NamedTuple):
    """``tokens`` [B, N] int32, ``logprobs`` [B, N] float32 (``log q``, the sampling distribution's), ``mask``
    [B, N] int32 (1 through the EOS), ``model_logprobs`` [B, N] float32 (``log π``, the model's own; module doc)."""

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    model_logprobs: jax.Array


def _eos_tuple(eos_token_id) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (int, np.integer)):
        return (int(eos_token_id),)
    out = tuple(int(e) for e in eos_token_id)
    return out


NUCLEUS_CANDIDATES = 1024


def argmax_last(x: jax.Array) -> jax.Array:
    """``argmax(x, axis=-1)`` as int32: the first index of the maximum, a NaN counting as the maximum.

    Computed as ``m = max(x)``, ``min{j : x_j == m or isnan(x_j)}``: two plain reductions. XLA:CPU lowers
    ``jnp.argmax`` to a variadic (value, index) reduction that it does not vectorise; over a 49k vocabulary
    that was ~17% of a sampled decode step at batch 64. Same result as ``jnp.argmax`` (ties -> first index).
    """
    v = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)
    hit = (x == m) | jnp.isnan(x)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(hit, iota, v), axis=-1).astype(jnp.int32)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """A sample of ``softmax(logits)`` per row (last axis), int32: the Gumbel-max trick
    ``argmax(logits + g)``, ``g ~ Gumbel(0, 1)``. Same noise and so the same token as
    ``jax.random.categorical(key, logits)``, with :func:`argmax_last` for the reduction."""
    return argmax_last(logits + jax.random.gumbel(key, logits.shape, logits.dtype))


def token_logprob(z: jax.Array, tok: jax.Array) -> jax.Array:
    """``log_softmax(z)[tok]`` per row = ``(z_tok − m) − log Σ_j exp(z_j − m)`` with ``m = max z``, without
    materialising the ``[B, V]`` log-softmax (same arithmetic as ``jax.nn.log_softmax``)."""
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(z - m), axis=-1))
    return (jnp.take_along_axis(z, tok[:, None], axis=-1)[:, 0] - m[:, 0]) - lse


def _sorted_candidates(z: jax.Array, top_k: int, use_top_p: bool, top_p, candidates: int | None):
    """Candidate logits sorted decreasingly (ties by index) with their token ids, ``[B, C]`` each.

    top-k keeps the k largest (``lax.top_k``). Top-p alone needs the whole sorted vocabulary only when
    the ``candidates`` most likely tokens hold less than ``top_p`` of the mass in some row (the nucleus
    is then not inside them); otherwise their ``lax.top_k`` (a partial sort, ~20x cheaper than a full
    sort of a 50k vocabulary on CPU) padded with ``-inf`` gives the same result exactly.
    """
    v = z.shape[-1]
    if top_k > 0:
        return jax.lax.top_k(z, min(top_k, v))

    def full_sort(_=None):
        idx = jnp.argsort(-z, axis=-1, stable=True)
        return jnp.take_along_axis(z, idx, axis=-1), idx.astype(jnp.int32)

    if not use_top_p or candidates is None or candidates >= v:
        return full_sort()
    vals, idx = jax.lax.top_k(z, candidates)
    mass = jnp.sum(jnp.exp(vals - jax.nn.logsumexp(z, axis=-1, keepdims=True)), axis=-1)

    def padded(_=None):
        pad = ((0, 0), (0, v - candidates))
        return jnp.pad(vals, pad, constant_values=-jnp.inf), jnp.pad(idx.astype(jnp.int32), pad)

    return jax.lax.cond(jnp.all(mass >= top_p), padded, full_sort, None)


def sample_from_logits(logits: jax.Array, key: jax.Array, *, greedy: bool, temperature, top_k: int,
                       use_top_p: bool, top_p, candidates: int | None = NUCLEUS_CANDIDATES
                       ) -> tuple[jax.Array, jax.Array]:
    """One token per row from ``logits`` [B, V] (float32) and its log-prob under the sampling distribution.

    See the module docstring for the distribution. ``greedy``, ``top_k``, ``use_top_p`` and
    ``candidates`` (see ``_sorted_candidates``; None = always sort fully) are static.
    Returns ``(tokens [B] int32, logprobs [B] float32)``.
    """
    logits = logits.astype(jnp.float32)
    if greedy:
        tok = argmax_last(logits)
        return tok, token_logprob(logits, tok)
    z = logits / temperature
    if top_k == 0 and not use_top_p:
        tok = categorical(key, z)
        return tok, token_logprob(z, tok)
    vals, idx = _sorted_candidates(z, top_k, use_top_p, top_p, candidates)
    if use_top_p:
        # probabilities under the (top-k filtered) distribution; the candidates may be a padded prefix
        # of it, so normalise over everything it contains, not over the candidates
        norm = jax.nn.logsumexp(z if top_k == 0 else vals, axis=-1, keepdims=True)
        probs = jnp.exp(vals - norm)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each candidate
        keep = before < top_p
        keep = keep.at[:, 0].set(True)
        vals = jnp.where(keep, vals, -jnp.inf)
    j = categorical(key, vals)
    lp = token_logprob(vals, j)
    tok = jnp.take_along_axis(idx, j[:, None], axis=-1)[:, 0]
    return tok.astype(jnp.int32), lp


TRACE_COUNT = {"generate": 0}  # incremented at trace time; tests use it to check there is no recompilation


@partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy", "top_k", "use_top_p", "eos", "repeats"))
def _generate(graphdef, state, prompt_ids, prompt_mask, key, temperature, top_p, pad_token_id, *,
              max_new_tokens: int, greedy: bool, top_k: int, use_top_p: bool, eos: tuple[int, ...],
              repeats: int = 1):
    """``prompt_ids``/``prompt_mask`` [B/r, P]: one row per block of ``repeats`` identical prompts (module doc)."""
    TRACE_COUNT["generate"] += 1
    model = nnx.merge(graphdef, state)
    trunk = model.model
    b, p = prompt_ids.shape[0] * repeats, prompt_ids.shape[1]
    n = max_new_tokens
    sample = partial(sample_from_logits, greedy=greedy, temperature=temperature, top_k=top_k,
                     use_top_p=use_top_p, top_p=top_p)
    eos_arr = jnp.asarray(eos if eos else (-1,), jnp.int32)

    cache = trunk.init_cache(prompt_ids.shape[0], p + n)
    # unrolled layers: slice the stacked weights once here, so the decode loop reads loop-invariant per-layer
    # arrays instead of copying every layer's weights out of the stack at each token
    layer_params = trunk.layers.layer_params(trunk.compute_dtype) if model.config.unroll_layers else None
    h, cache = trunk.forward_cached(prompt_ids, positions_from_mask(prompt_mask), prompt_mask, cache, 0,
                                    layer_params)
    logits = model.logits_from_hidden(h[:, -1:])[:, 0]
    start_pos = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)  # position of the first new token
    if repeats > 1:   # the shared prefill's outputs, one copy per row of its block
        cache = cache.repeat_rows(repeats)
        logits, start_pos = jnp.repeat(logits, repeats, axis=0), jnp.repeat(start_pos, repeats, axis=0)

    def emit(i, logits, bufs, done):
        tokens, logps, mask, model_logps = bufs
        tok, lp = sample(logits, jax.random.fold_in(key, i))
        own = token_logprob(logits.astype(jnp.float32), tok)
        live = ~done
        tok = jnp.where(live, tok, pad_token_id).astype(jnp.int32)
        lp = jnp.where(live, lp, 0.0)
        own = jnp.where(live, own, 0.0)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, i, 1)
        logps = jax.lax.dynamic_update_index_in_dim(logps, lp, i, 1)
        mask = jax.lax.dynamic_update_index_in_dim(mask, live.astype(jnp.int32), i, 1)
        model_logps = jax.lax.dynamic_update_index_in_dim(model_logps, own, i, 1)
        if eos:
            done = done | (live & jnp.any(tok[:, None] == eos_arr[None, :], axis=-1))
        return tok, (tokens, logps, mask, model_logps), done

    bufs = (jnp.full((b, n), pad_token_id, jnp.int32), jnp.zeros((b, n), jnp.float32), jnp.zeros((b, n), jnp.int32),
            jnp.zeros((b, n), jnp.float32))
    tok, bufs, done = emit(0, logits, bufs, jnp.zeros((b,), bool))

    def cond(carry):
        i, _, _, _, done = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, tok, cache, bufs, done = carry
        slot = p + i - 1  # slot of the previous token
        h, cache = trunk.forward_cached(tok[:, None], (start_pos + i - 1)[:, None], jnp.ones((b, 1), jnp.int32),
                                        cache, slot, layer_params)
        logits = model.logits_from_hidden(h)[:, 0]
        tok, bufs, done = emit(i, logits, bufs, done)
        return i + 1, tok, cache, bufs, done

    _, _, _, bufs, _ = jax.lax.while_loop(cond, body, (jnp.int32(1), tok, cache, bufs, done))
    return GenerationOutput(*bufs)


def _check_prompt(prompt_ids, prompt_mask) -> tuple[np.ndarray, np.ndarray] | None:
    ids = np.asarray(prompt_ids)
    mask = np.asarray(prompt_mask)
    if ids.ndim != 2:
        raise ValueError(f"generate: prompt_ids must be [batch, length], got shape {ids.shape}")
    if mask.shape != ids.shape:
        raise ValueError(f"generate: prompt_mask shape {mask.shape} does not match prompt_ids {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"generate: prompt_ids must be integers, got {ids.dtype}")
    m = mask.astype(np.int64)
    if not np.isin(m, (0, 1)).all():
        raise ValueError("generate: prompt_mask must contain only 0 and 1")
    if (m.sum(-1) == 0).any():
        rows = np.nonzero(m.sum(-1) == 0)[0].tolist()
        raise ValueError(f"generate: prompt row(s) {rows[:8]} have no real token (all-zero prompt_mask)")
    if (np.diff(m, axis=-1) < 0).any():
        rows = np.nonzero((np.diff(m, axis=-1) < 0).any(-1))[0].tolist()
        raise ValueError(f"generate: prompts must be LEFT-padded (mask 0s then 1s); row(s) {rows[:8]} are not")
    return ids, mask


def generate(model, prompt_ids, prompt_mask, key: jax.Array, *, max_new_tokens: int, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, eos_token_id: int | Sequence[int] | None = None,
             pad_token_id: int = 0, share_prefill: bool = True) -> GenerationOutput:
    """Generate ``max_new_tokens`` tokens after each left-padded prompt with a KV cache.

    ``model``: a ``jaxppo.models.CausalLM`` (any param/compute dtype, possibly sharded).
    ``prompt_ids``/``prompt_mask`` [B, P], left-padded; ``key`` a PRNG key (step i uses ``fold_in(key, i)``).
    ``temperature`` 0 = greedy; ``top_k`` 0 = off; ``top_p`` 1 = off; ``eos_token_id`` None = never stop.
    Returns ``GenerationOutput(tokens [B, N] int32, logprobs [B, N] float32, mask [B, N] int32, model_logprobs
    [B, N] float32)``, see
    the module docstring for the sampling distribution and the EOS/mask convention. Shapes, the
    model structure and the static options (greedy or not, ``top_k``, top-p on/off, EOS ids) key the
    compilation cache; temperature, top_p values and the key do not cause recompiles.
    ``share_prefill``: rows in blocks of ``r > 1`` identical prompts prefill once per block (module docstring;
    ``r`` = ``shared_prompts.shared_rows``, which also keys the compilation cache); False prefills every row.
    """
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"generate: top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
    eos = _eos_tuple(eos_token_id)
    vocab = model.config.vocab_size
    bad = [e for e in eos if not 0 <= e < vocab]
    if bad:
        raise ValueError(f"generate: eos_token_id {bad} outside the vocabulary [0, {vocab})")
    ids, mask = _check_prompt(prompt_ids, prompt_mask)
    graphdef, state = nnx.split(model)
    greedy = float(temperature) == 0.0
    r = shared_rows(ids, mask, state, share_prefill)
    return _generate(graphdef, state, jnp.asarray(ids[::r], jnp.int32), jnp.asarray(mask[::r], jnp.int32), key,
                     jnp.float32(temperature if not greedy else 1.0), jnp.float32(top_p), jnp.int32(pad_token_id),
                     max_new_tokens=int(max_new_tokens), greedy=greedy, top_k=int(top_k),
                     use_top_p=float(top_p) < 1.0, eos=eos, repeats=r)
