"""The offline PPO loop: ``train(cfg) -> summary`` (``fit(cfg) -> (summary, final TrainState)``).

Per step ``s`` (0-based): on ``s % replay.refresh_every == 0`` the buffer window is (re)loaded and
prepared (prox log-probs, values, rewards, GAE, priorities); then one jitted update. Everything a
step depends on is in the ``TrainState`` (RNG keys are ``fold_in(rng, step)``), so a run resumed from
the checkpoint of step ``k`` logs exactly the metrics of an uninterrupted run for steps ``> k``.

The loop threads only the ``TrainState``: the ``Run`` (graph defs, jitted functions, data) is read, never written.
Host side after each step: guards (the device NaN streak ``state.nan_streak`` → rollback, held-out perplexity every
``guards.ppl_every`` steps → rollback, KL → actor LR cut, and a mode-collapse warning when the mean length of the policy's own
generations — ``eval/response_length`` from the held-out evaluation at ``trainer.eval_every``,
``probe/response_length`` from a greedy probe at ``guards.length_probe_every`` — exceeds
``guards.length_factor`` × its running mean), metrics through ``MetricsLogger``, checkpoints every
``trainer.save_every`` steps, at the end, and at every step whose perplexity check passed (those are
*verified*; so is step 0, whose perplexity is the baseline). A rollback restores the parameters, optimizer
states, replay buffer, data cursor and KL coefficient of the newest *verified* checkpoint (the newest
checkpoint when none is verified, e.g. without held-out data) — ``state.replace(**fields of the restored
checkpoint)``, a pure function of the two states — keeps the step counter, RNG, NaN total and the LR cut, zeroes
the NaN streak and re-runs the prepare pass with the restored policy. Resume (``trainer.resume=auto``) restores
the newest checkpoint that can be read; damaged ones are moved aside (``checkpoint_damaged`` events).

Metrics (``metrics.jsonl``, every ``trainer.log_every`` steps and at every step with an evaluation, a perplexity
check, a guard action or the last step; the guards see every step): the step's metrics, ``perf/*``, and the
cumulative ``train/samples_consumed`` (``s · actor.ppo_mini_batch_size`` after ``s`` steps, NaN-skipped steps
included) and ``train/tokens_consumed`` (the response tokens of the sampled minibatches, ``Σ response_length/mean
· ppo_mini_batch_size``, carried across resumes in the checkpoint metadata). With ``trainer.eval_every``, the
held-out evaluation (``jaxppo.trainer.evaluation.HeldoutEval``: ``eval/reward_mean`` with its 95% bootstrap
interval over prompts ``eval/reward_ci_lo``/``eval/reward_ci_hi``, ``eval/kl``, ``eval/response_length``) is
logged at step 0 (the reference, before any update) and every ``eval_every`` steps.

Outputs under ``trainer.output_dir``: ``metrics.jsonl``, ``events.jsonl``, TensorBoard files,
``checkpoints/``, ``hf/`` (final policy + tokenizer), ``plots/``, ``eval_samples.jsonl`` and
``summary.json`` (``eval/reward_before``, ``eval/reward_after``, ``eval/reward_gain_ci95``, ``eval/kl``, ...).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.config import to_dict
from jaxppo.parallel.host import is_main_process, to_host
from jaxppo.trainer.checkpoint import Checkpointer
from jaxppo.trainer.run_dir import metrics_logger, start_run
from jaxppo.trainer.setup import Run, build_run, load_window

logger = logging.getLogger("jaxppo.trainer")

# restored by a rollback (the buffer rows and the data cursor that names them go together); the step counter,
# RNG, NaN total and the guards' LR cut are kept, the NaN streak is zeroed
ROLLBACK_FIELDS = ("actor", "actor_opt", "critic", "critic_opt", "replay", "kl_coef", "data_cursor")


class _LengthProbe:
    """``guards.length_probe_every``: the policy's mean greedy generation length on the first
    ``guards.length_probe_prompts`` held-out prompts (``probe/response_length``, watched by the length guard)."""

    def __init__(self, run: Run, eos):
        from jaxppo.data.tokenize import pad_id_of
        from jaxppo.trainer.evaluation import heldout_eval_prompts

        g, ro = run.cfg.guards, run.cfg.rollout
        self.run = run
        self.every = g.length_probe_every
        self.prompt_ids, self.prompt_mask = heldout_eval_prompts(run.heldout, g.length_probe_prompts, 1)
        self.kw = dict(max_new_tokens=min(ro.max_new_tokens, run.cfg.data.max_response_length),
                       eos_token_id=eos, pad_token_id=pad_id_of(run.tokenizer), batch_size=ro.batch_size)
        if self.every and self.prompt_ids.shape[0] == 0:
            logger.warning("guards.length_probe_every is set but there are no held-out prompts: no length probe")

    def due(self, step_no: int) -> bool:
        return bool(self.every) and self.prompt_ids.shape[0] > 0 and step_no % self.every == 0

    def __call__(self, params) -> float:
        from jaxppo.trainer.evaluation import generated_length

        return generated_length(self.run.policy(params), self.prompt_ids, self.prompt_mask, **self.kw)


class _Evaluations:
    """The run's held-out evaluation (``HeldoutEval``) with the reference's result kept: it is the step-0 value
    and the "before" of the final comparison, computed once."""

    def __init__(self, run: Run, eos):
        from jaxppo.trainer.evaluation import heldout_eval

        self.run = run
        self.ev = heldout_eval(run.cfg, run.heldout, run.tokenizer, eos)
        self._reference: dict[str, Any] | None = None

    @property
    def available(self) -> bool:
        return self.ev.available

    def reference(self) -> dict[str, Any]:
        if self._reference is None:
            ref = self.run.reference()
            self._reference = self.ev(ref, ref)
        return self._reference

    def policy(self, params) -> dict[str, Any]:
        return self.ev(self.run.policy(params), self.run.reference())


def _meta(run: Run, guards, tokens_consumed: float) -> dict[str, Any]:
    return {"guards": guards.state_dict(), "config": to_dict(run.cfg), "tokens_consumed": float(tokens_consumed),
            "data": {"n_train": int(run.train["prompt_ids"].shape[0]), "capacity": run.capacity}}


def _ppl(run: Run, params) -> float:
    from jaxppo.trainer.evaluation import heldout_perplexity

    if run.heldout["prompt_ids"].shape[0] == 0:
        return float("nan")
    return heldout_perplexity(run.policy(params), run.heldout, batch_size=run.cfg.data.behaviour_batch_size)


def train(cfg: Any, *, run: Run | None = None) -> dict[str, Any]:
    """Run the offline PPO job described by ``cfg``; returns (and writes) the summary dict."""
    return fit(cfg, run=run)[0]


def fit(cfg: Any, *, run: Run | None = None) -> tuple[dict[str, Any], Any]:
    """:func:`train` that also returns the final ``TrainState``: ``(summary, state)``. ``run`` (default
    ``build_run(cfg)``) is only read: its ``state`` is the initial state."""
    from jaxppo.models.eos import eos_ids

    tc = cfg.trainer
    rs = start_run(cfg, build_run, run)
    # from here on only `state` is threaded, `run` is read-only
    run, state, ckpt, guards, start, out = rs.run, rs.state, rs.ckpt, rs.guards, rs.start, rs.out
    tokens_consumed = float(rs.meta.get("tokens_consumed", 0.0))
    have_heldout = run.heldout["prompt_ids"].shape[0] > 0
    if guards.ppl_baseline is None and have_heldout:
        guards.check_perplexity(0, _ppl(run, state.actor))
    eos = eos_ids(run.reference().config, run.tokenizer)
    evals = _Evaluations(run, eos)
    probe = _LengthProbe(run, eos)
    mlog = metrics_logger(cfg, out, start, ckpt)
    for bad_step, moved, why in rs.damaged:
        mlog.event(start, "checkpoint_damaged", f"{why}; moved aside to {moved.name}, resuming from "
                   f"{'step ' + str(start) if start else 'scratch'}", checkpoint_step=bad_step, moved_to=str(moved))
    refresh = cfg.replay.refresh_every
    mini = cfg.actor.ppo_mini_batch_size
    t_train0 = time.perf_counter()
    compile_s = None
    try:
        if start == 0:
            # the first "last good" checkpoint for rollbacks: verified by the perplexity baseline (already there
            # when a run killed before its first step resumes from it)
            if 0 not in ckpt.all_steps():
                ckpt.save(0, state, _meta(run, guards, 0.0), verified=have_heldout)
            if tc.eval_every and evals.available:   # step 0: the reference, before any update
                mlog.log(0, evals.ev.step_metrics(evals.reference()))
        for s in range(start, tc.total_steps):
            if s % refresh == 0:
                state = load_window(run, state, s // refresh)
                state = run.prepare(state)
            t0 = time.perf_counter()
            state, metrics = run.step(state)
            metrics = {k: float(v) for k, v in to_host(metrics).items()}
            nan_streak, nan_total = (int(x) for x in to_host((state.nan_streak, state.nan_total)))
            dt = time.perf_counter() - t0
            if compile_s is None:
                compile_s = dt
            step_no = s + 1
            metrics["perf/step_time_s"] = dt
            metrics["perf/throughput"] = run.tokens_per_step / max(dt, 1e-9)
            batch_tokens = metrics.get("response_length/mean", float("nan")) * mini
            tokens_consumed += batch_tokens if np.isfinite(batch_tokens) else 0.0
            metrics["train/samples_consumed"] = float(step_no * mini)
            metrics["train/tokens_consumed"] = tokens_consumed
            actions = guards.check_nan(step_no, nan_streak, nan_total)
            ppl_checked = have_heldout and step_no % cfg.guards.ppl_every == 0
            if ppl_checked:
                metrics["eval/perplexity"] = _ppl(run, state.actor)
                actions += guards.check_perplexity(step_no, metrics["eval/perplexity"])
            evaluated = bool(tc.eval_every) and step_no % tc.eval_every == 0 and evals.available
            if evaluated:
                metrics.update(evals.ev.step_metrics(evals.policy(state.actor)))  # the policy's own generations
            if probe.due(step_no):
                metrics["probe/response_length"] = probe(state.actor)
            actions += guards.check(step_no, metrics)   # KL and the policy's generation length
            if step_no % tc.log_every == 0 or step_no == tc.total_steps or evaluated or ppl_checked or actions:
                mlog.log(step_no, metrics)
            for act in actions:
                mlog.event(step_no, act.kind, act.message, **act.data)
                state = _apply_action(run, ckpt, state, act, step_no, mlog)
            # verified: the perplexity guard checked this step's policy and nothing was rolled back
            verified = ppl_checked and not any(a.kind == "rollback" for a in actions)
            if step_no % tc.save_every == 0 or step_no == tc.total_steps or verified:
                if not ckpt.save(step_no, state, _meta(run, guards, tokens_consumed), verified=verified):
                    mlog.event(step_no, "checkpoint_skipped", "parameters are not finite; checkpoint not written")
        ckpt.wait()
    finally:
        mlog.close()
        ckpt.close()
    t_train = time.perf_counter() - t_train0
    summary = _finish(run, state, evals, out, dict(setup_s=rs.t_setup, train_s=t_train, compile_s=compile_s or 0.0,
                                                   start_step=start, t_start=rs.t_start,
                                                   tokens_consumed=tokens_consumed))
    return summary, state


def _restore_fields(state, good):
    """The rollback as a pure function of two train states: ``state`` with the ``ROLLBACK_FIELDS`` of the
    restored checkpoint ``good`` and a zero NaN streak (step counter, RNG, NaN total and LR cut kept)."""
    return state.replace(**{k: getattr(good, k) for k in ROLLBACK_FIELDS},
                         nan_streak=jax.device_put(jnp.int32(0), state.nan_streak.sharding))


def _apply_action(run: Run, ckpt: Checkpointer, state, act, step_no: int, mlog=None):
    from jaxppo.trainer.guards import cut_lr_scale

    kind = act.kind
    if kind == "lower_lr":
        scale = cut_lr_scale(float(to_host(state.lr_scale)), act.data, run.cfg.actor.optim.lr)
        logger.warning("step %d: actor LR scale %.4g -> %.4g", step_no, float(to_host(state.lr_scale)), scale)
        return state.replace(lr_scale=jax.device_put(jnp.float32(scale), state.lr_scale.sharding))
    if kind == "rollback":
        # the NaN streak restarts whatever happens next (the guard reads it from the state)
        state = state.replace(nan_streak=jax.device_put(jnp.int32(0), state.nan_streak.sharding))
        ckpt.wait()

        def note_damaged(bad: int, moved: Path, why: str) -> None:
            if mlog is not None:
                mlog.event(step_no, "checkpoint_damaged", f"{why}; moved aside to {moved.name}",
                           checkpoint_step=bad, moved_to=str(moved))

        # the newest checkpoint whose policy passed the perplexity guard (any checkpoint when none is verified,
        # e.g. without held-out data)
        verified_only = ckpt.newest_verified() is not None
        res = ckpt.restore_newest(state, verified_only=verified_only, on_damaged=note_damaged)
        if res.step is None and verified_only:
            res = ckpt.restore_newest(state, on_damaged=note_damaged)
            verified_only = False
        if res.step is None:
            logger.warning("step %d: rollback requested but no checkpoint exists", step_no)
            return state
        good = res.state
        logger.warning("step %d: rolled back parameters/optimizer/replay/data cursor to checkpoint step %d",
                       step_no, res.step)
        if mlog is not None:
            mlog.event(step_no, "rollback_restored", f"restored checkpoint step {res.step}"
                       f"{' (verified)' if verified_only else ' (not verified: no verified checkpoint)'}",
                       checkpoint_step=int(res.step), verified=verified_only, data_cursor=int(to_host(good.data_cursor)))
        # re-prepare with the restored policy (the checkpoint's buffer may predate its prepare pass)
        return run.prepare(_restore_fields(state, good))
    return state  # warnings only


def _finish(run: Run, state, evals: _Evaluations, out: Path, timing: dict) -> dict[str, Any]:
    from jaxppo.trainer.evaluation import final_summary, write_eval_samples

    cfg = run.cfg
    summary: dict[str, Any] = {"steps": cfg.trainer.total_steps, "resumed_from": timing["start_step"],
                               "n_train": int(run.train["prompt_ids"].shape[0]),
                               "n_heldout": int(run.heldout["prompt_ids"].shape[0]),
                               "nan_skipped_total": int(to_host(state.nan_total)),
                               "train/samples_consumed": int(cfg.trainer.total_steps
                                                             * cfg.actor.ppo_mini_batch_size),
                               "train/tokens_consumed": float(timing["tokens_consumed"]),
                               **dict(getattr(run, "pf_stats", None) or {}),   # e.g. pf_ppo/dropped_groups
                               "time/setup_s": timing["setup_s"], "time/train_s": timing["train_s"],
                               "time/first_step_s": timing["compile_s"]}
    t0 = time.perf_counter()
    if evals.available:
        before = evals.reference()
        after = evals.policy(state.actor)
        summary.update(final_summary(evals.ev, before, after))
        write_eval_samples(out / "eval_samples.jsonl", before, after)
    else:
        logger.warning("no held-out prompts (data.eval_fraction=0?): skipping the before/after evaluation")
    summary["time/eval_s"] = time.perf_counter() - t0
    if cfg.trainer.save_hf:
        from jaxppo.hf import save_pretrained

        save_pretrained(run.policy(state.actor), out / "hf", tokenizer=run.tokenizer)
    if cfg.trainer.plots and is_main_process() and (out / "metrics.jsonl").is_file():
        from jaxppo.trainer.plots import plot_metrics

        summary["plots"] = [str(p) for p in plot_metrics(out / "metrics.jsonl", out / "plots", summary=summary)]
    summary["time/total_s"] = time.perf_counter() - timing["t_start"]
    if is_main_process():
        (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
