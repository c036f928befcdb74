"""Bradley-Terry reward-model training on preference pairs.

Model: ``jaxppo.models.RewardModel`` (the LM trunk plus a scalar head read at the last real token)
scores ``r = RM(concat(prompt, response))``. For a pair (chosen ``c``, rejected ``j``)::

    P(c ≻ j) = σ(r_c − r_j),   loss = mean_i w_i · (−log σ(r_c,i − r_j,i)) / mean_i w_i

(``−log σ(d) = softplus(−d)``), with ``w_i`` = 0 for padding rows of the last batch. Accuracy is
the share of pairs with ``r_c > r_j``; its 95% interval is a bootstrap over held-out **prompts**
(:func:`grouped_bootstrap_accuracy`), printed beside the accuracies of "pick the shorter answer" and "pick the
longer answer", with a warning under :data:`MIN_EVAL_PROMPTS` held-out prompts. The split into train and held-out pairs is **by prompt**
(no prompt on both sides), the optimizer optax AdamW with gradient clipping.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxppo.data.pipeline import load_preference_arrays, split_by_group
from jaxppo.data.report import DataReport
from jaxppo.models.packing import ProgramLog
from jaxppo.parallel.host import host_scalar, is_main_process
from jaxppo.rewards.model_io import save_reward_model

logger = logging.getLogger("jaxppo.rewards")


def bradley_terry_loss(r_chosen: jax.Array, r_rejected: jax.Array,
                       weights: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``Σ w·softplus(r_j − r_c) / Σ w`` and metrics ``accuracy`` (share with ``r_c > r_j``), ``margin``
    (mean ``r_c − r_j``), all weighted by ``weights`` [B] (default 1)."""
    d = (r_chosen - r_rejected).astype(jnp.float32)
    w = jnp.ones_like(d) if weights is None else weights.astype(jnp.float32)
    denom = jnp.maximum(w.sum(), 1e-12)
    loss = (w * jax.nn.softplus(-d)).sum() / denom
    return loss, {"loss": loss, "accuracy": (w * (d > 0)).sum() / denom, "margin": (w * d).sum() / denom}


def pair_inputs(batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(input_ids, attention_mask)`` [2B, P+R]: the B chosen sequences, then the B rejected ones."""
    ids = jnp.concatenate([
        jnp.concatenate([batch["prompt_ids"], batch["chosen_ids"]], 1),
        jnp.concatenate([batch["prompt_ids"], batch["rejected_ids"]], 1)], 0)
    mask = jnp.concatenate([
        jnp.concatenate([batch["prompt_mask"], batch["chosen_mask"]], 1),
        jnp.concatenate([batch["prompt_mask"], batch["rejected_mask"]], 1)], 0)
    return ids, mask


def pair_scores(model: Callable, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(r_chosen [B], r_rejected [B])`` in one forward pass: of the ``[2B, P+R]`` stack (:func:`pair_inputs`),
    or of its packed rows when ``batch`` has ``"packed"`` (:func:`pack_pairs`; ``RewardModel.packed``)."""
    b = batch["prompt_ids"].shape[0]
    if "packed" in batch:
        r = model.packed(batch["packed"])
        return r[:b], r[b:]
    ids, mask = pair_inputs(batch)
    r = model(ids, mask)
    return r[:b], r[b:]


def pack_pairs(batch: dict[str, np.ndarray], multiple_of: int = 1):
    """The packed layout (``jaxppo.models.packing.pack``) of a host batch's ``[2B]`` stack, chosen then rejected
    (the sequences of :func:`pair_inputs`)."""
    from jaxppo.models.packing import pack

    cat = lambda a, b: np.concatenate([np.asarray(batch[a]), np.asarray(batch[b])])  # noqa: E731
    return pack(cat("prompt_ids", "prompt_ids"), cat("prompt_mask", "prompt_mask"), cat("chosen_ids", "rejected_ids"),
                cat("chosen_mask", "rejected_mask"), multiple_of=multiple_of)


def reward_optim(reward_cfg: Any, total_steps: int) -> Any:
    """The ``OptimConfig`` of ``reward.*`` for the trainers' optimizer factory (``jaxppo.optim``): AdamW
    (``reward.lr``, ``reward.weight_decay``, default betas/eps) after global-norm clipping (``reward.grad_clip``),
    linear warmup over ``reward.warmup_steps`` (at most ``total_steps - 1``) then constant, or cosine decay to 0 at
    ``total_steps``."""
    from jaxppo.config.schema import OptimConfig

    warm = min(reward_cfg.warmup_steps, max(total_steps - 1, 0))
    return OptimConfig(lr=reward_cfg.lr, weight_decay=reward_cfg.weight_decay, warmup_steps=warm,
                       schedule=reward_cfg.schedule, min_lr_ratio=0.0, grad_clip=reward_cfg.grad_clip)


def make_optimizer(reward_cfg: Any, total_steps: int, params=None) -> optax.GradientTransformation:
    """``jaxppo.optim.make_optimizer`` of :func:`reward_optim` (its learning rate is set per step by the
    train step of :func:`make_train_step`; 16-bit ``params``: a float32 master copy)."""
    from jaxppo.optim import make_optimizer as shared_optimizer

    return shared_optimizer(reward_optim(reward_cfg, total_steps), total_steps, params)


def make_train_step(graphdef: Any, tx: optax.GradientTransformation, schedule: optax.Schedule):
    """Jitted ``(params, opt_state, batch, step) -> (params, opt_state, metrics)`` (params/opt_state donated); the
    update's learning rate is ``schedule(step)`` (``jaxppo.optim.lr_schedule``, 0-based step)."""
    from jaxppo.optim import set_learning_rate

    def loss_fn(params, batch):
        rc, rj = pair_scores(nnx.merge(graphdef, params), batch)
        return bradley_terry_loss(rc, rj, batch["weight"])

    def step(params, opt_state, batch, i):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        opt_state = set_learning_rate(opt_state, schedule(i))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.global_norm(grads)
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1))


def iterate_batches(arrays: dict[str, np.ndarray], rows: np.ndarray, batch_size: int, packing: bool = False,
                    programs=None):
    """Batches of ``batch_size`` rows (the last one padded with weight-0 copies of row ``rows[0]``); ``packing``:
    each with its packed pairs under ``"packed"`` (:func:`pack_pairs`; ``programs``, a ``packing.ProgramLog``,
    records their shapes)."""
    keys = ("prompt_ids", "prompt_mask", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")
    for s in range(0, len(rows), batch_size):
        idx = rows[s:s + batch_size]
        n = len(idx)
        pad = np.concatenate([idx, np.full(batch_size - n, rows[0], dtype=idx.dtype)])
        batch = {k: arrays[k][pad] for k in keys}
        batch["weight"] = (np.arange(batch_size) < n).astype(np.float32)
        if packing:
            batch["packed"] = pack_pairs(batch)
            if programs is not None:
                programs.add(batch["packed"])
        yield batch


def make_eval_step(graphdef: Any):
    """Jitted ``(params, batch) -> (weighted metric sums, weight sum)`` for :func:`evaluate` (compiled once)."""

    @jax.jit
    def sums(params, batch):
        rc, rj = pair_scores(nnx.merge(graphdef, params), batch)
        _, m = bradley_terry_loss(rc, rj, batch["weight"])
        w = batch["weight"].sum()
        return {k: v * w for k, v in m.items()}, w

    return sums


def evaluate(eval_step: Callable, params: Any, arrays: dict[str, np.ndarray], rows: np.ndarray,
             batch_size: int, packing: bool = False) -> dict[str, float]:
    """Held-out ``loss``, ``accuracy`` and ``margin`` over ``rows`` (each pair counted once);
    ``eval_step`` from :func:`make_eval_step`; ``packing``: packed batches (:func:`iterate_batches`)."""
    if len(rows) == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "margin": float("nan")}
    tot, n = {}, 0.0
    for batch in iterate_batches(arrays, rows, min(batch_size, len(rows)), packing):
        s, w = eval_step(params, batch)
        for k, v in s.items():
            tot[k] = tot.get(k, 0.0) + host_scalar(v)
        n += host_scalar(w)
    return {k: v / n for k, v in tot.items()}


def length_baseline_accuracy(arrays: dict[str, np.ndarray], rows: np.ndarray, *, longer: bool = False) -> float:
    """Share of ``rows`` where the chosen response has fewer tokens (``longer``: more tokens), ties counting ½: the
    accuracy of the trivial "pick the shorter (longer) answer" rules; the two add up to 1."""
    lc = arrays["chosen_mask"][rows].sum(1)
    lr = arrays["rejected_mask"][rows].sum(1)
    wins = (lc > lr) if longer else (lc < lr)
    return float(np.mean(wins + 0.5 * (lc == lr))) if len(rows) else float("nan")


# fewer held-out prompts than this: the accuracy is printed with a warning that it is a small sample
MIN_EVAL_PROMPTS = 30


def grouped_bootstrap_accuracy(correct: np.ndarray, groups: np.ndarray, *, n_boot: int = 2000, seed: int = 0,
                               level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the pair accuracy ``Σ correct / n`` resampling **prompts** (``groups``),
    not pairs: each resample draws the distinct groups with replacement and takes ``Σ_g c_g / Σ_g n_g`` over the
    drawn groups (``c_g`` correct pairs of ``n_g`` in group ``g``), so pairs of one prompt stay together. ``correct``
    may hold ½ for ties. One group gives the point ``(acc, acc)``."""
    correct = np.asarray(correct, np.float64)
    groups = np.asarray(groups)
    if correct.ndim != 1 or correct.shape != groups.shape or correct.size == 0:
        raise ValueError(f"correct and groups must be non-empty 1-D arrays of one length, got shapes "
                         f"{correct.shape}, {groups.shape}")
    if not 0.0 < level < 1.0 or n_boot < 1:
        raise ValueError(f"level must be in (0, 1) and n_boot >= 1, got {level}, {n_boot}")
    _, inv = np.unique(groups, return_inverse=True)
    c = np.bincount(inv, weights=correct)
    n = np.bincount(inv).astype(np.float64)
    idx = np.random.default_rng(seed).integers(0, len(n), size=(n_boot, len(n)))
    acc = c[idx].sum(1) / n[idx].sum(1)
    lo, hi = np.quantile(acc, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def make_margin_step(graphdef: Any):
    """Jitted ``(params, batch) -> r_chosen − r_rejected`` [B] of one batch."""

    @jax.jit
    def margins(params, batch):
        rc, rj = pair_scores(nnx.merge(graphdef, params), batch)
        return rc - rj

    return margins


def pair_margins(margin_step: Callable, params: Any, arrays: dict[str, np.ndarray], rows: np.ndarray,
                 batch_size: int) -> np.ndarray:
    """``r_chosen − r_rejected`` [len(rows)] float32 of each pair of ``rows`` (``margin_step`` from
    :func:`make_margin_step`)."""
    if len(rows) == 0:
        return np.zeros(0, np.float32)
    out = []
    for batch in iterate_batches(arrays, rows, min(batch_size, len(rows))):
        m = np.asarray(jax.device_get(margin_step(params, batch)), np.float32)
        out.append(m[batch["weight"] > 0])
    return np.concatenate(out)


@dataclasses.dataclass
class TrainResult:
    metrics: dict[str, Any]
    model: Any
    report: DataReport


def train_reward_model(cfg: Any, *, out_dir: str | Path | None = None, progress: bool = False,
                       resolve_path: Callable[[str], str] = str) -> TrainResult:
    """Train a Bradley-Terry reward model as configured by ``cfg`` (a ``jaxppo.config.Config``).

    Uses ``cfg.model.path`` (trunk), ``cfg.data`` (preference pairs, lengths, ``eval_fraction``
    held out by prompt, ``seed``), ``cfg.reward`` (lr, epochs, batch size, ...) and
    ``cfg.trainer.seed``. With ``out_dir`` writes the reward-model folder (see
    :mod:`jaxppo.rewards.model_io`) and ``metrics.json`` there.
    """
    from jaxppo.hf import load_pretrained, load_tokenizer
    from jaxppo.models import RewardModel

    t0 = time.perf_counter()
    if cfg.data.schema != "preference":
        raise ValueError(f"reward-model training needs data.schema=preference, got {cfg.data.schema!r}")
    model_path = resolve_path(cfg.model.path)
    tok_path = resolve_path(cfg.model.tokenizer_path) if cfg.model.tokenizer_path else model_path
    tokenizer = load_tokenizer(tok_path)
    got = load_preference_arrays(cfg.data, tokenizer, model_path)   # the filters of dpo and to-scored
    arrays, report, groups = got.arrays, got.report, got.prompt_group
    train_rows, eval_rows = split_by_group(groups.tolist(), cfg.data.eval_fraction, cfg.data.seed)  # as DPO
    if len(train_rows) == 0:
        raise ValueError("no training pairs left after the by-prompt split; lower data.eval_fraction")
    report.emit(print if progress else None)

    lm = load_pretrained(model_path)
    model = RewardModel.from_lm(lm, rngs=nnx.Rngs(cfg.trainer.seed))
    del lm
    graphdef, params = nnx.split(model)
    bs = min(cfg.reward.batch_size, len(train_rows))
    steps_per_epoch = -(-len(train_rows) // bs)
    from jaxppo.optim import lr_schedule

    total_steps = steps_per_epoch * cfg.reward.epochs
    tx = make_optimizer(cfg.reward, total_steps, params)   # 16-bit parameters: a float32 master copy
    opt_state = tx.init(params)
    step = make_train_step(graphdef, tx, lr_schedule(reward_optim(cfg.reward, total_steps), total_steps))
    ev_bs = cfg.reward.eval_batch_size
    eval_step = make_eval_step(graphdef)

    packing = cfg.data.packing
    programs = ProgramLog()
    init_eval = evaluate(eval_step, params, arrays, eval_rows, ev_bs, packing)
    history = []
    rng = np.random.default_rng(cfg.trainer.seed)
    t_train = time.perf_counter()
    n_steps = 0
    for epoch in range(cfg.reward.epochs):
        order = rng.permutation(train_rows)
        ep = {"loss": 0.0, "accuracy": 0.0}
        for batch in iterate_batches(arrays, order, bs, packing, programs):
            params, opt_state, m = step(params, opt_state, batch, np.int32(n_steps))
            n_steps += 1
            w = float(batch["weight"].sum())
            ep["loss"] += host_scalar(m["loss"]) * w
            ep["accuracy"] += host_scalar(m["accuracy"]) * w
        ev = evaluate(eval_step, params, arrays, eval_rows, ev_bs, packing)
        rec = {"epoch": epoch + 1, "train/loss": ep["loss"] / len(train_rows),
               "train/accuracy": ep["accuracy"] / len(train_rows),
               **{f"eval/{k}": v for k, v in ev.items()}}
        history.append(rec)
        msg = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items())
        logger.info(msg)
        if progress:
            print(msg, flush=True)
    train_s = time.perf_counter() - t_train
    if packing:
        programs.log("reward-model training")
    model = nnx.merge(graphdef, params)
    last = history[-1]
    n_eval_prompts = len(set(groups[eval_rows].tolist()))
    ci = [float("nan"), float("nan")]
    if len(eval_rows):
        margins = pair_margins(make_margin_step(graphdef), params, arrays, eval_rows, ev_bs)
        ci = list(grouped_bootstrap_accuracy((margins > 0).astype(np.float64), groups[eval_rows],
                                             seed=cfg.data.seed))
    warnings = []
    if n_eval_prompts < MIN_EVAL_PROMPTS:
        warnings.append(f"warning: the held-out accuracy comes from {len(eval_rows)} pairs of {n_eval_prompts} "
                        f"prompts (< {MIN_EVAL_PROMPTS}): a small sample, read its interval; more prompts with a "
                        "larger data.eval_fraction or more data")
    for w in warnings:
        logger.warning(w)
    metrics: dict[str, Any] = {
        "eval/accuracy": last["eval/accuracy"], "eval/loss": last["eval/loss"], "eval/margin": last["eval/margin"],
        "eval/accuracy_ci95": ci,
        "eval/accuracy_init": init_eval["accuracy"],
        "eval/length_baseline_accuracy": length_baseline_accuracy(arrays, eval_rows),
        "eval/longer_baseline_accuracy": length_baseline_accuracy(arrays, eval_rows, longer=True),
        "warnings": warnings,
        "train/loss": last["train/loss"], "train/accuracy": last["train/accuracy"],
        "n_pairs": int(len(arrays["index"])), "n_train_pairs": int(len(train_rows)),
        "n_eval_pairs": int(len(eval_rows)),
        "n_train_prompts": len(set(groups[train_rows].tolist())), "n_eval_prompts": n_eval_prompts,
        "epochs": cfg.reward.epochs, "steps": n_steps,
        "time/train_s": train_s, "time/total_s": time.perf_counter() - t0,
        **report.flat_metrics(), "data_report": report.to_dict(), "history": history,
    }
    try:
        from jaxppo.config import to_dict

        metrics["config"] = to_dict(cfg)
    except (TypeError, AttributeError):  # a config-like object that is not a jaxppo Config
        pass
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_reward_model(model, out, tokenizer=tokenizer, meta={
            "base_model": cfg.model.path, "max_prompt_length": cfg.data.max_prompt_length,
            "max_response_length": cfg.data.max_response_length, "truncation": cfg.data.truncation,
            "chat_template": cfg.data.chat_template})
        metrics["model_dir"] = str(out)
        metrics["time/total_s"] = time.perf_counter() - t0
        if is_main_process():
            (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return TrainResult(metrics=metrics, model=model, report=report)
