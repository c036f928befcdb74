"""Held-out evaluation: reward/KL of fresh generations, perplexity, bootstrap interval of the gain.

* ``bootstrap_mean_ci(x)`` — percentile bootstrap of a mean ``x̄ = mean_i x_i`` over prompts: draw ``n_boot``
  resamples of the prompt indices with replacement, take ``x̄*`` of each, return the ``(1−level)/2`` and
  ``(1+level)/2`` quantiles of the ``x̄*`` (``numpy.quantile`` with linear interpolation).
* ``bootstrap_ci(before, after)`` — the paired per-prompt version: ``bootstrap_mean_ci(after − before)``, the
  interval of the mean gain ``d̄ = mean_i(after_i − before_i)``.
* ``heldout_perplexity(model, arrays)`` — ``exp(−Σ_{b,t} m_bt · log π(y_bt | x_b, y_b,<t) / Σ m_bt)``
  over the response tokens (mask ``m`` = ``response_mask``) given the prompts, sequence layout of
  ``jaxppo.data.behaviour`` (jitted, batched, one compiled shape).
* ``evaluate_policy(...)`` — sample one response per prompt with ``jaxppo.models.generate``, score
  it with ``reward_fn(prompts, responses)``, and measure the KL of the policy to the reference on
  those responses with the k1 estimate ``Σ m_bt (log π − log π_ref) / Σ m_bt`` (log-probs at
  temperature 1, not the sampling distribution).
* ``HeldoutEval`` / ``heldout_eval(cfg, heldout, tokenizer, eos)`` — THE evaluation of a run (PPO trainer, DPO
  trainer and ``python -m jaxppo.evaluate`` all use it): one prompt per held-out group (at most
  ``trainer.eval_prompts``, each ``trainer.eval_samples`` times), sampling with ``rollout.temperature/top_k/top_p``
  and ``min(rollout.max_new_tokens, data.max_response_length)`` new tokens, key
  ``fold_in(PRNGKey(trainer.seed), 10007)``, reward ``reward.*``. ``step_metrics(result)`` gives the metrics logged
  at an evaluation step: ``eval/reward_mean`` (mean of the per-prompt mean rewards ``r̄_i``), ``eval/reward_ci_lo``
  / ``eval/reward_ci_hi`` (95% percentile bootstrap of that mean over prompts, ``bootstrap_mean_ci``, seed
  ``trainer.seed``), ``eval/kl`` and ``eval/response_length``. ``compare(before, after)`` gives the before/after
  numbers (per-prompt means, gain and its paired bootstrap interval); ``final_summary`` /
  ``write_eval_samples`` the trainers' summary keys and ``eval_samples.jsonl``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.data.behaviour import compute_behaviour_logprobs, response_logprobs
from jaxppo.parallel.host import is_main_process, to_host

_BOOT_CHUNK = 256  # resamples drawn at a time (bounded memory; the result does not depend on it)


def _check_level(fn: str, n_boot: int, level: float) -> None:
    if not (isinstance(n_boot, int) and n_boot >= 1):
        raise ValueError(f"{fn}: n_boot must be a positive int, got {n_boot!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"{fn}: level must be in (0, 1), got {level}")


def bootstrap_mean_ci(values: Sequence[float] | np.ndarray, *, n_boot: int = 2000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(values)`` over its entries (prompts; see module doc)."""
    d = np.asarray(values, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"bootstrap_mean_ci: values must be a 1-D per-prompt array, got shape {d.shape}")
    if d.size == 0:
        raise ValueError("bootstrap_mean_ci: no prompts (empty values)")
    if not np.isfinite(d).all():
        raise ValueError("bootstrap_mean_ci: values contain NaN or inf rewards")
    _check_level("bootstrap_mean_ci", n_boot, level)
    n = d.size
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot, np.float64)
    for start in range(0, n_boot, _BOOT_CHUNK):
        m = min(_BOOT_CHUNK, n_boot - start)
        idx = rng.integers(0, n, size=(m, n))
        means[start:start + m] = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def bootstrap_ci(before: Sequence[float] | np.ndarray, after: Sequence[float] | np.ndarray, *, n_boot: int = 2000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(after − before)`` over paired prompts (see module doc)."""
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    if b.ndim != 1 or a.ndim != 1:
        raise ValueError(f"bootstrap_ci: before/after must be 1-D per-prompt arrays, got shapes {b.shape}, {a.shape}")
    if b.shape != a.shape:
        raise ValueError(f"bootstrap_ci: before and after must be paired (same length), got {b.size} and {a.size}")
    if b.size == 0:
        raise ValueError("bootstrap_ci: no prompts (empty before/after)")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("bootstrap_ci: before/after contain NaN or inf rewards")
    _check_level("bootstrap_ci", n_boot, level)
    return bootstrap_mean_ci(a - b, n_boot=n_boot, seed=seed, level=level)


def heldout_eval_prompts(heldout: Mapping[str, np.ndarray], n_max: int,
                         samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Prompt ids/mask of the evaluation: one prompt per held-out group (its first row), at most ``n_max``,
    each repeated ``samples`` times in a row (``[n·samples, P]``)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if heldout["prompt_ids"].shape[0] == 0:
        return heldout["prompt_ids"], heldout["prompt_mask"]
    _, first = np.unique(heldout["group_id"], return_index=True)
    first = np.repeat(np.sort(first)[:n_max], samples)
    return heldout["prompt_ids"][first], heldout["prompt_mask"][first]


def prompt_means(values: Sequence[float] | np.ndarray, samples: int) -> np.ndarray:
    """Per-prompt mean of ``values`` laid out as ``samples`` consecutive entries per prompt (see
    :func:`heldout_eval_prompts`): ``[n·samples] -> [n]``. The bootstrap then resamples prompts, not samples."""
    v = np.asarray(values, np.float64)
    if v.ndim != 1 or v.size % samples:
        raise ValueError(f"expected a flat array whose length is a multiple of samples={samples}, got shape {v.shape}")
    return v.reshape(-1, samples).mean(axis=1)


def heldout_perplexity(model: nnx.Module, arrays: Mapping[str, np.ndarray], batch_size: int = 32,
                       packing: bool = False) -> float:
    """Perplexity of the response tokens of ``arrays`` (prompt_ids/prompt_mask/response_ids/response_mask);
    ``packing``: packed rows (``jaxppo.data.behaviour.compute_behaviour_logprobs``)."""
    for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask"):
        if k not in arrays:
            raise KeyError(f"heldout_perplexity: arrays has no {k!r} (have {sorted(arrays)})")
    if batch_size < 1:
        raise ValueError(f"heldout_perplexity: batch_size must be >= 1, got {batch_size}")
    mask = np.asarray(arrays["response_mask"], np.float64)
    ntok = mask.sum()
    if ntok <= 0:
        raise ValueError("heldout_perplexity: no response tokens (response_mask is all zero)")
    lp = compute_behaviour_logprobs(model, arrays, batch_size=batch_size, packing=packing).astype(np.float64)
    return float(np.exp(-(lp * mask).sum() / ntok))


def even_batch(n: int, batch_size: int, unit: int = 1) -> int:
    """The batch size ``b`` that runs ``n`` rows in the fewest batches of at most ``batch_size`` rows, each a whole
    number of ``unit``-row blocks, as evenly as possible: with ``u = ceil(n / unit)`` blocks and
    ``k = ceil(u / floor(batch_size / unit))`` batches, ``b = unit · ceil(u / k)``; the last batch is padded with
    ``k·b − n < k·unit`` rows (a fixed ``b = batch_size`` pads up to ``batch_size − 1``). ``unit > batch_size``
    gives ``min(batch_size, n)``."""
    if n < 1 or batch_size < 1 or unit < 1:
        raise ValueError(f"even_batch: n, batch_size and unit must be >= 1, got {n}, {batch_size}, {unit}")
    if unit > batch_size:
        return min(batch_size, n)
    blocks = -(-n // unit)
    k = -(-blocks // (batch_size // unit))
    return unit * -(-blocks // k)


def generation_batch(prompt_ids: np.ndarray, prompt_mask: np.ndarray, state, batch_size: int) -> int:
    """:func:`even_batch` of the held-out rows, in blocks of ``r`` rows of one prompt
    (``shared_prompts.prompt_repeats``) times the mesh's batch axes (``sharding.batch_multiple``), so each batch
    keeps its prompts' samples together and splits over the devices; blocks of ``batch_multiple`` rows, then of one
    row, when that block is larger than ``batch_size``."""
    from jaxppo.models.sharding import batch_multiple
    from jaxppo.models.shared_prompts import prompt_repeats

    n, m = prompt_ids.shape[0], batch_multiple(state)
    unit = next((u for u in (prompt_repeats(prompt_ids, prompt_mask) * m, m) if u <= batch_size), 1)
    return even_batch(n, batch_size, unit)


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    return x if x.shape[0] == rows else np.concatenate([x, np.repeat(x[:1], rows - x.shape[0], axis=0)])


@functools.partial(jax.jit, static_argnums=0)
def _generic_logprobs(graphdef, state, prompt_ids, prompt_mask, response_ids, response_mask):
    return response_logprobs(nnx.merge(graphdef, state), prompt_ids, prompt_mask, response_ids, response_mask)


def _logprobs(model: nnx.Module, graphdef, state, *arrays):
    """Response log-probs of ``model`` (split as ``graphdef, state``) on host rows; a causal LM uses the passes
    shared with the reference/perplexity passes (``jaxppo.models.shared_prompts.rows_logprobs``: LM head on the
    response positions only, each prompt's samples with the prompt run once)."""
    from jaxppo.models.shared_prompts import rows_logprobs

    fn = rows_logprobs if hasattr(model, "shared_prefix_logprobs") else _generic_logprobs
    return fn(graphdef, state, *arrays)


def _packed_logprobs(model: nnx.Module, graphdef, state, *arrays):
    """:func:`_logprobs` through packed rows (host arrays in; ``jaxppo.data.behaviour.packed_chunk_logprobs``)."""
    from jaxppo.data.behaviour import packed_chunk_logprobs
    from jaxppo.models.sharding import batch_multiple

    return packed_chunk_logprobs(graphdef, state, list(arrays), arrays[0].shape[0], batch_multiple(state))


def same_arrays(a, b) -> bool:
    """True when two pytrees have one structure and the very same leaf objects (``is``): equal values without
    comparing them (jax arrays are immutable), e.g. the reference evaluated against itself."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


@jax.jit
def _kl_sums(pol_lp, ref_lp, mask):
    m = mask.astype(jnp.float32)
    return jnp.sum((pol_lp - ref_lp) * m, axis=1), jnp.sum(m, axis=1)


def evaluate_policy(model: nnx.Module, ref_model: nnx.Module, tokenizer: Any, prompt_ids: np.ndarray,
                    prompt_mask: np.ndarray, reward_fn: Callable[[list[str], list[str]], np.ndarray],
                    key: jax.Array, *, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                    batch_size: int = 32, packing: bool = False) -> dict[str, Any]:
    """Generate, score and measure KL on held-out prompts (left-padded ``prompt_ids`` [N, P]).

    The rows run in batches of :func:`generation_batch` rows (at most ``batch_size``, as even as whole blocks of
    one prompt's samples allow); batch ``j`` samples with ``jax.random.fold_in(key, j)``; the last batch is padded
    with copies of its first row (one compiled shape) and cut. Returns ``rewards`` (np.float32 [N]), ``kl`` (float,
    k1 over all generated tokens), ``response_length`` (mean generated tokens, EOS included),
    ``responses`` (decoded with ``skip_special_tokens=True``), ``prompts`` (decoded prompts) and the
    generated ``response_ids``/``response_mask`` (np.int32 [N, max_new_tokens]). The KL's policy term is the
    generator's ``model_logprobs`` (``log π`` of each sampled token, computed while sampling); the reference's
    log-probs take one pass over the samples (none when ``ref_model`` is ``model`` itself: the KL is then 0).
    ``packing``: that pass runs on packed rows (``jaxppo.data.behaviour.packed_chunk_logprobs``; the same log-probs
    up to float32 summation order).
    """
    from jaxppo.models import generate  # the decode loop (KV cache, jitted)

    prompt_ids = np.asarray(prompt_ids)
    prompt_mask = np.asarray(prompt_mask)
    if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(f"evaluate_policy: prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} "
                         "must be the same [N, P] shape")
    n = prompt_ids.shape[0]
    if n == 0:
        raise ValueError("evaluate_policy: no prompts")
    if batch_size < 1:
        raise ValueError(f"evaluate_policy: batch_size must be >= 1, got {batch_size}")
    pol_gd, pol_state = nnx.split(model)
    ref_gd, ref_state = nnx.split(ref_model)
    bs = generation_batch(prompt_ids, prompt_mask, pol_state, batch_size)
    same = pol_gd == ref_gd and same_arrays(pol_state, ref_state)
    tokens, masks, kl_num, kl_den = [], [], [], []
    for j, start in enumerate(range(0, n, bs)):
        p_ids = _pad_rows(prompt_ids[start:start + bs], bs).astype(np.int32)
        p_mask = _pad_rows(prompt_mask[start:start + bs], bs).astype(np.int32)
        m = min(bs, n - start)
        out = generate(model, jnp.asarray(p_ids), jnp.asarray(p_mask), jax.random.fold_in(key, j),
                       max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        r_ids, r_mask = out.tokens, out.mask
        pol_lp = out.model_logprobs
        if same:   # the policy is the reference itself (the "before" evaluation): KL exactly 0, no pass
            ref_lp = pol_lp
        elif packing and hasattr(ref_model, "packed_logprobs"):   # planned on the host: fetch the samples once
            r_ids, r_mask = to_host(r_ids).astype(np.int32), to_host(r_mask).astype(np.int32)
            ref_lp = _packed_logprobs(ref_model, ref_gd, ref_state, p_ids, p_mask, r_ids, r_mask)
        else:
            ref_lp = _logprobs(ref_model, ref_gd, ref_state, p_ids, p_mask, r_ids, r_mask)
        num, den = _kl_sums(pol_lp, ref_lp, r_mask)
        tokens.append(to_host(r_ids)[:m])
        masks.append(to_host(r_mask)[:m])
        kl_num.append(to_host(num).astype(np.float64)[:m])
        kl_den.append(to_host(den).astype(np.float64)[:m])
    tokens_np = np.concatenate(tokens)
    masks_np = np.concatenate(masks)
    lengths = masks_np.sum(axis=1)
    responses = [tokenizer.decode(t[:int(k)].tolist(), skip_special_tokens=True) for t, k in zip(tokens_np, lengths)]
    prompts = [tokenizer.decode(ids[msk.astype(bool)].tolist(), skip_special_tokens=True)
               for ids, msk in zip(prompt_ids, prompt_mask)]
    rewards = np.asarray(reward_fn(prompts, responses), dtype=np.float32)
    if rewards.shape != (n,):
        raise ValueError(f"evaluate_policy: reward_fn returned shape {rewards.shape}, expected ({n},)")
    if not np.isfinite(rewards).all():
        raise ValueError(f"evaluate_policy: reward_fn returned {int((~np.isfinite(rewards)).sum())} NaN/inf rewards")
    den_total = float(np.concatenate(kl_den).sum())
    kl = float(np.concatenate(kl_num).sum() / den_total) if den_total > 0 else 0.0
    return {"rewards": rewards, "kl": kl, "response_length": float(lengths.mean()), "responses": responses,
            "prompts": prompts, "response_ids": tokens_np, "response_mask": masks_np}


def generated_length(model: nnx.Module, prompt_ids: np.ndarray, prompt_mask: np.ndarray, *, max_new_tokens: int,
                     eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                     batch_size: int = 32) -> float:
    """The policy's mean greedy generation length ``(1/N) Σ_i Σ_t m_it`` (EOS included) on ``prompt_ids`` [N, P].

    Greedy decoding (temperature 0), so the probe depends only on the parameters; batches of
    :func:`generation_batch` rows, the last padded with copies of its first row (one compiled shape) and cut. The
    length guard's probe.
    """
    from jaxppo.models import generate

    prompt_ids, prompt_mask = np.asarray(prompt_ids), np.asarray(prompt_mask)
    if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape or prompt_ids.shape[0] == 0:
        raise ValueError(f"generated_length: prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} "
                         "must be the same non-empty [N, P] shape")
    if batch_size < 1:
        raise ValueError(f"generated_length: batch_size must be >= 1, got {batch_size}")
    n = prompt_ids.shape[0]
    bs = generation_batch(prompt_ids, prompt_mask, nnx.state(model), batch_size)
    total = 0.0
    for start in range(0, n, bs):
        m = min(bs, n - start)
        p_ids = _pad_rows(prompt_ids[start:start + bs], bs).astype(np.int32)
        p_mask = _pad_rows(prompt_mask[start:start + bs], bs).astype(np.int32)
        out = generate(model, jnp.asarray(p_ids), jnp.asarray(p_mask), jax.random.PRNGKey(0),
                       max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=eos_token_id,
                       pad_token_id=pad_token_id)
        total += float(to_host(out.mask)[:m].sum())
    return total / n


EVAL_KEY_SALT = 10_007  # the evaluation key of every run: fold_in(PRNGKey(trainer.seed), 10007)


@dataclasses.dataclass(frozen=True, eq=False)
class HeldoutEval:
    """The held-out evaluation of a run (module doc): prompts ``[n·samples, P]``, the reward, the sampling
    arguments of :func:`evaluate_policy` (``gen``) and its key. Build it with :func:`heldout_eval`."""

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    samples: int
    reward_fn: Callable[[list[str], list[str]], np.ndarray]
    tokenizer: Any
    key: jax.Array
    seed: int
    gen: Mapping[str, Any]

    @property
    def available(self) -> bool:
        """False when there are no held-out prompts (``data.eval_fraction=0``)."""
        return self.prompt_ids.shape[0] > 0

    def __call__(self, model: nnx.Module, reference: nnx.Module) -> dict[str, Any]:
        """:func:`evaluate_policy` of ``model`` (KL measured against ``reference``) on the held-out prompts."""
        if not self.available:
            raise ValueError("no held-out prompts to evaluate on (data.eval_fraction=0 or a single prompt group)")
        return evaluate_policy(model, reference, self.tokenizer, self.prompt_ids, self.prompt_mask, self.reward_fn,
                               self.key, **self.gen)

    def step_metrics(self, result: Mapping[str, Any]) -> dict[str, float]:
        """``eval/reward_mean``, ``eval/reward_ci_lo``, ``eval/reward_ci_hi`` (bootstrap over prompts),
        ``eval/kl`` and ``eval/response_length`` of an evaluation ``result`` (module doc)."""
        per_prompt = prompt_means(result["rewards"], self.samples)
        lo, hi = bootstrap_mean_ci(per_prompt, seed=self.seed)
        return {"eval/reward_mean": float(per_prompt.mean()), "eval/reward_ci_lo": lo, "eval/reward_ci_hi": hi,
                "eval/kl": float(result["kl"]), "eval/response_length": float(result["response_length"])}


def heldout_eval(cfg: Any, heldout: Mapping[str, np.ndarray], tokenizer: Any,
                 eos_token_id: int | Sequence[int] | None, *, reward_fn: Callable | None = None) -> HeldoutEval:
    """The :class:`HeldoutEval` of config ``cfg`` on the held-out rows ``heldout`` (``reward_fn`` defaults to
    ``reward_fn_from_config(cfg.reward)``; ``eos_token_id`` from :func:`jaxppo.models.eos.eos_ids`)."""
    from jaxppo.data.tokenize import pad_id_of
    from jaxppo.rewards import reward_fn_from_config

    tc, ro = cfg.trainer, cfg.rollout
    prompt_ids, prompt_mask = heldout_eval_prompts(heldout, tc.eval_prompts, tc.eval_samples)
    gen = dict(max_new_tokens=min(ro.max_new_tokens, cfg.data.max_response_length), temperature=ro.temperature,
               top_k=ro.top_k, top_p=ro.top_p, eos_token_id=eos_token_id, pad_token_id=pad_id_of(tokenizer),
               batch_size=ro.batch_size, packing=cfg.data.packing)
    return HeldoutEval(prompt_ids=prompt_ids, prompt_mask=prompt_mask, samples=tc.eval_samples,
                       reward_fn=reward_fn_from_config(cfg.reward) if reward_fn is None else reward_fn,
                       tokenizer=tokenizer, key=jax.random.fold_in(jax.random.PRNGKey(tc.seed), EVAL_KEY_SALT),
                       seed=tc.seed, gen=gen)


def compare(before: Mapping[str, Any], after: Mapping[str, Any], samples: int, *, seed: int = 0) -> dict[str, Any]:
    """Before/after numbers of two evaluations on the same prompts: per-prompt mean rewards ``before``/``after``
    (``[n]``), their means, the gain ``mean(after) − mean(before)`` and its paired bootstrap interval
    ``gain_ci95`` (:func:`bootstrap_ci`, seed ``seed``), ``n_prompts``."""
    rb, ra = prompt_means(before["rewards"], samples), prompt_means(after["rewards"], samples)
    if rb.shape != ra.shape:
        raise ValueError(f"compare: the two evaluations have {rb.size} and {ra.size} prompts; expected the same ones")
    lo, hi = bootstrap_ci(rb, ra, seed=seed)
    return {"before": rb, "after": ra, "reward_before": float(rb.mean()), "reward_after": float(ra.mean()),
            "gain": float(ra.mean() - rb.mean()), "gain_ci95": [float(lo), float(hi)], "n_prompts": int(rb.size)}


def final_summary(ev: HeldoutEval, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The trainers' ``summary.json`` evaluation keys: ``eval/n_prompts``, ``eval/samples_per_prompt``,
    ``eval/reward_before|after``, ``eval/reward_gain``, ``eval/reward_gain_ci95``, ``eval/kl`` (of the trained
    policy) and ``eval/response_length_before|after``."""
    c = compare(before, after, ev.samples, seed=ev.seed)
    return {"eval/n_prompts": c["n_prompts"], "eval/samples_per_prompt": ev.samples,
            "eval/reward_before": c["reward_before"], "eval/reward_after": c["reward_after"],
            "eval/reward_gain": c["gain"], "eval/reward_gain_ci95": c["gain_ci95"], "eval/kl": float(after["kl"]),
            "eval/response_length_before": float(before["response_length"]),
            "eval/response_length_after": float(after["response_length"])}


def write_eval_samples(path: str | Path, before: Mapping[str, Any], after: Mapping[str, Any], *,
                       names: tuple[str, str] = ("before", "after"), response_prefix: str = "") -> None:
    """``eval_samples.jsonl``: one line a sample, ``prompt``, the two responses and their rewards. Keys are
    ``{response_prefix}{name}`` and ``reward_{name}`` for ``name`` in ``names`` (the trainers: ``before``/
    ``after``; ``jaxppo.evaluate``: ``response_policy``/``response_reference``)."""
    if not is_main_process():
        return
    rb, ra = np.asarray(before["rewards"], np.float64), np.asarray(after["rewards"], np.float64)
    nb, na = names
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(ra.size):
            fh.write(json.dumps({"prompt": after["prompts"][i], f"{response_prefix}{nb}": before["responses"][i],
                                 f"{response_prefix}{na}": after["responses"][i], f"reward_{nb}": float(rb[i]),
                                 f"reward_{na}": float(ra[i])}, ensure_ascii=False) + "\n")


def before_after(ev: HeldoutEval, out: str | Path, before: Callable[[], Mapping[str, Any]],
                 after: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """The trainers' final evaluation on the held-out prompts: ``before()`` (the reference's result) then
    ``after()`` (the trained policy's, both from ``ev``), ``eval_samples.jsonl`` written under ``out`` and the
    :func:`final_summary` keys returned. Without held-out prompts: a logged warning and ``{}``."""
    if not ev.available:
        logging.getLogger("jaxppo.trainer").warning(
            "no held-out prompts (data.eval_fraction=0?): skipping the before/after evaluation")
        return {}
    b = before()
    a = after()
    write_eval_samples(Path(out) / "eval_samples.jsonl", b, a)
    return final_summary(ev, b, a)


__all__ = ["EVAL_KEY_SALT", "HeldoutEval", "before_after", "bootstrap_ci", "bootstrap_mean_ci", "compare",
           "evaluate_policy", "even_batch", "final_summary", "generated_length", "generation_batch", "heldout_eval",
           "heldout_eval_prompts", "heldout_perplexity", "prompt_means", "same_arrays", "write_eval_samples"]
