"""Rows that repeat their prompt: ``n`` samples of each prompt in consecutive rows, as collection, evaluation and
grouped data lay them out, run each prompt through the trunk once.

``prompt_repeats(prompt_ids, prompt_mask)`` is the largest ``r`` such that the rows are consecutive blocks of ``r``
identical rows. :func:`shared_rows` is the ``r`` a pass uses: that one, or 1 when sharing is off, ``r`` is 1, or the
``B/r`` prompt rows would not split evenly over the batch axes of the model's mesh (``sharding.batch_multiple``).
With ``r > 1``, :func:`rows_logprobs` computes ``continuation_logprobs`` through ``CausalLM.shared_prefix_logprobs``
(each block laid out as ``prompt, response_1 .. response_r``) and generation prefills one row per block
(``jaxppo.models.generation``). The results are the row-by-row pass's up to float summation order.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from flax import nnx

from jaxppo.models.sharding import batch_multiple


def prompt_repeats(prompt_ids: np.ndarray, prompt_mask: np.ndarray) -> int:
    """The largest ``r`` such that the rows are consecutive blocks of ``r`` identical rows (``prompt_ids`` and
    ``prompt_mask`` both equal): the greatest common divisor of the lengths of the runs of equal rows (1 when
    some row differs from both neighbours)."""
    ids, mask = np.asarray(prompt_ids), np.asarray(prompt_mask)
    if ids.shape[0] < 2:
        return 1
    same = np.all(ids[1:] == ids[:-1], axis=1) & np.all(mask[1:] == mask[:-1], axis=1)
    starts = np.flatnonzero(np.concatenate([[True], ~same, [True]]))
    return int(np.gcd.reduce(np.diff(starts)))


def shared_rows(prompt_ids: np.ndarray, prompt_mask: np.ndarray, state, share: bool = True) -> int:
    """The block size a pass over these rows uses (module docstring): :func:`prompt_repeats`, or 1."""
    if not share:
        return 1
    r = prompt_repeats(prompt_ids, prompt_mask)
    return r if r > 1 and (np.asarray(prompt_ids).shape[0] // r) % batch_multiple(state) == 0 else 1


@partial(jax.jit, static_argnums=0)
def shared_prefix_logprobs(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask) -> jax.Array:
    """Jitted ``nnx.merge(graphdef, state).shared_prefix_logprobs(...)`` [G, n, R] (prompts [G, P], responses
    [G, n, R]; :meth:`jaxppo.models.CausalLM.shared_prefix_logprobs`)."""
    return nnx.merge(graphdef, state).shared_prefix_logprobs(prompt_ids, prompt_mask, response_ids, response_mask)


def rows_logprobs(graphdef, state, prompt_ids: np.ndarray, prompt_mask: np.ndarray, response_ids: np.ndarray,
                  response_mask: np.ndarray, *, share: bool = True) -> jax.Array:
    """``log π(y_t | x, y_<t)`` [B, R] of a causal LM's rows (prompts on the host; 0 where ``response_mask`` is 0): the jitted
    ``continuation_logprobs``, or with :func:`shared_rows` ``r > 1`` the shared-prefix pass of the ``B/r`` blocks,
    returned in row order."""
    from jaxppo.models.transformer import continuation_logprobs

    r = shared_rows(prompt_ids, prompt_mask, state, share)
    if r == 1:
        return continuation_logprobs(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask)
    b, n_resp = response_ids.shape
    blocks = lambda x: x.reshape(b // r, r, n_resp)   # noqa: E731  (host or device arrays)
    lp = shared_prefix_logprobs(graphdef, state, np.asarray(prompt_ids)[::r], np.asarray(prompt_mask)[::r],
                                blocks(response_ids), blocks(response_mask))
    return lp.reshape(b, n_resp)


__all__ = ["prompt_repeats", "rows_logprobs", "shared_prefix_logprobs", "shared_rows"]
