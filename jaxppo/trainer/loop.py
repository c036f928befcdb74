"""The offline PPO loop: ``train(cfg) -> summary``.

Per step ``s`` (0-based): on ``s % replay.refresh_every == 0`` the buffer window is (re)loaded and
prepared (prox log-probs, values, rewards, GAE, priorities); then one jitted update. Everything a
step depends on is in the ``TrainState`` (RNG keys are ``fold_in(rng, step)``), so a run resumed from
the checkpoint of step ``k`` logs exactly the metrics of an uninterrupted run for steps ``> k``.

Host side after each step: guards (NaN streak → rollback, held-out perplexity every ``guards.ppl_every``
steps → rollback, KL → actor LR cut, and a mode-collapse warning when the mean length of the policy's own
generations — ``eval/response_length`` from the held-out evaluation at ``trainer.eval_every``,
``probe/response_length`` from a greedy probe at ``guards.length_probe_every`` — exceeds
``guards.length_factor`` × its running mean), metrics through ``MetricsLogger``, checkpoints every
``trainer.save_every`` steps, at the end, and at every step whose perplexity check passed (those are
*verified*; so is step 0, whose perplexity is the baseline). A rollback restores the parameters, optimizer
states, replay buffer, data cursor and KL coefficient of the newest *verified* checkpoint (the newest
checkpoint when none is verified, e.g. without held-out data), keeps the step counter, RNG and the LR cut,
and re-runs the prepare pass with the restored policy. Resume (``trainer.resume=auto``) restores the newest
checkpoint that can be read; damaged ones are moved aside (``checkpoint_damaged`` events).

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

from jaxppo.config import ConfigError, to_dict
from jaxppo.trainer.checkpoint import Checkpointer
from jaxppo.trainer.setup import Run, build_run, load_window

logger = logging.getLogger("jaxppo.trainer")

# restored by a rollback (the buffer rows and the data cursor that names them go together); the step counter,
# RNG, NaN counters and the guards' LR cut are kept
ROLLBACK_FIELDS = ("actor", "actor_opt", "critic", "critic_opt", "replay", "kl_coef", "data_cursor")


def _eos_ids(run: Run):
    ids = tuple(getattr(run.policy().config, "eos_token_ids", ()) or ())
    tok_eos = getattr(run.tokenizer, "eos_token_id", None)
    if not ids and isinstance(tok_eos, int):
        ids = (tok_eos,)
    return None if not ids else (ids[0] if len(ids) == 1 else ids)


class _Evaluator:
    def __init__(self, run: Run):
        from jaxppo.data.tokenize import pad_id_of
        from jaxppo.rewards import reward_fn_from_config

        cfg = run.cfg
        self.run = run
        from jaxppo.trainer.evaluation import heldout_eval_prompts

        self.samples = cfg.trainer.eval_samples
        self.prompt_ids, self.prompt_mask = heldout_eval_prompts(run.heldout, cfg.trainer.eval_prompts,
                                                                 self.samples)
        self.reward_fn = reward_fn_from_config(cfg.reward)
        ro = cfg.rollout
        self.kw = dict(max_new_tokens=min(ro.max_new_tokens, cfg.data.max_response_length),
                       temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p, eos_token_id=_eos_ids(run),
                       pad_token_id=pad_id_of(run.tokenizer), batch_size=ro.batch_size)
        self.key = jax.random.fold_in(jax.random.PRNGKey(cfg.trainer.seed), 10_007)

    @property
    def available(self) -> bool:
        return self.prompt_ids.shape[0] > 0

    def __call__(self, params) -> dict[str, Any]:
        from jaxppo.trainer.evaluation import evaluate_policy

        return evaluate_policy(self.run.policy(params), self.run.reference(), self.run.tokenizer, self.prompt_ids,
                               self.prompt_mask, self.reward_fn, self.key, **self.kw)


class _LengthProbe:
    """``guards.length_probe_every``: the policy's mean greedy generation length on the first
    ``guards.length_probe_prompts`` held-out prompts (``probe/response_length``, watched by the length guard)."""

    def __init__(self, run: Run):
        from jaxppo.data.tokenize import pad_id_of
        from jaxppo.trainer.evaluation import heldout_eval_prompts

        g, ro = run.cfg.guards, run.cfg.rollout
        self.run = run
        self.every = g.length_probe_every
        self.prompt_ids, self.prompt_mask = heldout_eval_prompts(run.heldout, g.length_probe_prompts, 1)
        self.kw = dict(max_new_tokens=min(ro.max_new_tokens, run.cfg.data.max_response_length),
                       eos_token_id=_eos_ids(run), pad_token_id=pad_id_of(run.tokenizer), batch_size=ro.batch_size)
        if self.every and self.prompt_ids.shape[0] == 0:
            logger.warning("guards.length_probe_every is set but there are no held-out prompts: no length probe")

    def due(self, step_no: int) -> bool:
        return bool(self.every) and self.prompt_ids.shape[0] > 0 and step_no % self.every == 0

    def __call__(self, params) -> float:
        from jaxppo.trainer.evaluation import generated_length

        return generated_length(self.run.policy(params), self.prompt_ids, self.prompt_mask, **self.kw)


def _meta(run: Run, guards) -> dict[str, Any]:
    return {"guards": guards.state_dict(), "config": to_dict(run.cfg),
            "data": {"n_train": int(run.train["prompt_ids"].shape[0]), "capacity": run.capacity}}


def _ppl(run: Run, params) -> float:
    from jaxppo.trainer.evaluation import heldout_perplexity

    if run.heldout["prompt_ids"].shape[0] == 0:
        return float("nan")
    return heldout_perplexity(run.policy(params), run.heldout, batch_size=run.cfg.data.behaviour_batch_size)


def train(cfg: Any, *, run: Run | None = None) -> dict[str, Any]:
    """Run the offline PPO job described by ``cfg``; returns (and writes) the summary dict."""
    from jaxppo.trainer.guards import Guards
    from jaxppo.trainer.metrics_log import MetricsLogger

    t_start = time.perf_counter()
    tc = cfg.trainer
    out = Path(tc.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2), encoding="utf-8")
    run = build_run(cfg) if run is None else run
    t_setup = time.perf_counter() - t_start
    state = run.state
    ckpt = Checkpointer(out / "checkpoints", keep_last=tc.keep_last, async_save=True)
    guards = Guards(cfg.guards)
    start = 0
    if tc.resume == "never" and ckpt.all_steps():
        ckpt.close()
        raise ConfigError(f"trainer.resume=never but {ckpt.directory} already holds checkpoints {ckpt.all_steps()}; "
                          "use another trainer.output_dir, delete them, or resume with trainer.resume=auto")
    damaged: list[tuple[int, Path, str]] = []
    resumed = None
    if tc.resume == "auto":
        try:
            resumed = ckpt.restore_newest(state)   # damaged checkpoints are moved aside, older ones tried
        except BaseException:
            ckpt.close()
            raise
        damaged = resumed.damaged
    if resumed is not None and resumed.step is not None:
        state, meta = resumed.state, resumed.meta
        guards = Guards.from_state_dict(cfg.guards, meta["guards"])
        start = int(meta["step"])
        logger.info("resumed from %s step %d", ckpt.directory, start)
    run.state = state
    have_heldout = run.heldout["prompt_ids"].shape[0] > 0
    if guards.ppl_baseline is None and have_heldout:
        guards.check_perplexity(0, _ppl(run, state.actor))
    mlog = MetricsLogger(out, total_steps=tc.total_steps, start_step=start, tensorboard=tc.tensorboard,
                         progress=tc.progress)
    for bad_step, moved, why in damaged:
        mlog.event(start, "checkpoint_damaged", f"{why}; moved aside to {moved.name}, resuming from "
                   f"{'step ' + str(start) if start else 'scratch'}", checkpoint_step=bad_step, moved_to=str(moved))
    evaluator = _Evaluator(run)
    probe = _LengthProbe(run)
    if start == 0:
        # the first "last good" checkpoint for rollbacks: verified by the perplexity baseline
        ckpt.save(0, state, _meta(run, guards), verified=have_heldout)
    refresh = cfg.replay.refresh_every
    t_train0 = time.perf_counter()
    compile_s = None
    try:
        for s in range(start, tc.total_steps):
            if s % refresh == 0:
                state = load_window(run, state, s // refresh)
                state = run.prepare(state)
            t0 = time.perf_counter()
            state, metrics = run.step(state)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            dt = time.perf_counter() - t0
            if compile_s is None:
                compile_s = dt
            metrics["perf/step_time_s"] = dt
            metrics["perf/throughput"] = run.tokens_per_step / max(dt, 1e-9)
            step_no = s + 1
            actions = guards.note_nan(step_no) if metrics["train/nan_skipped"] > 0 else guards.note_finite(step_no)
            actions = list(actions)
            ppl_checked = have_heldout and step_no % cfg.guards.ppl_every == 0
            if ppl_checked:
                metrics["eval/perplexity"] = _ppl(run, state.actor)
                actions += guards.check_perplexity(step_no, metrics["eval/perplexity"])
            if tc.eval_every and step_no % tc.eval_every == 0 and evaluator.available:
                ev = evaluator(state.actor)
                metrics["eval/reward_mean"] = float(np.mean(ev["rewards"]))
                metrics["eval/kl"] = float(ev["kl"])
                metrics["eval/response_length"] = float(ev["response_length"])  # the policy's own generations
            if probe.due(step_no):
                metrics["probe/response_length"] = probe(state.actor)
            actions += guards.check(step_no, metrics)   # KL and the policy's generation length
            mlog.log(step_no, metrics)
            for act in actions:
                mlog.event(step_no, act.kind, act.message, **act.data)
                state = _apply_action(run, ckpt, state, act, step_no, mlog)
            run.state = state
            # verified: the perplexity guard checked this step's policy and nothing was rolled back
            verified = ppl_checked and not any(a.kind == "rollback" for a in actions)
            if step_no % tc.save_every == 0 or step_no == tc.total_steps or verified:
                if not ckpt.save(step_no, state, _meta(run, guards), verified=verified):
                    mlog.event(step_no, "checkpoint_skipped", "parameters are not finite; checkpoint not written")
        ckpt.wait()
    finally:
        mlog.close()
        ckpt.close()
    t_train = time.perf_counter() - t_train0
    run.state = state
    return _finish(run, state, evaluator, out, dict(setup_s=t_setup, train_s=t_train, compile_s=compile_s or 0.0,
                                                    start_step=start, t_start=t_start))


def _apply_action(run: Run, ckpt: Checkpointer, state, act, step_no: int, mlog=None):
    from jaxppo.trainer.guards import cut_lr_scale

    kind = act.kind
    if kind == "lower_lr":
        scale = cut_lr_scale(float(state.lr_scale), act.data, run.cfg.actor.optim.lr)
        logger.warning("step %d: actor LR scale %.4g -> %.4g", step_no, float(state.lr_scale), scale)
        return state.replace(lr_scale=jax.device_put(jnp.float32(scale), state.lr_scale.sharding))
    if kind == "rollback":
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
                       checkpoint_step=int(res.step), verified=verified_only, data_cursor=int(good.data_cursor))
        state = state.replace(**{k: getattr(good, k) for k in ROLLBACK_FIELDS},
                              nan_streak=jax.device_put(jnp.int32(0), state.nan_streak.sharding))
        # re-prepare with the restored policy (the checkpoint's buffer may predate its prepare pass)
        return run.prepare(state)
    return state  # warnings only


def _finish(run: Run, state, evaluator: _Evaluator, out: Path, timing: dict) -> dict[str, Any]:
    from jaxppo.trainer.evaluation import bootstrap_ci, prompt_means

    cfg = run.cfg
    summary: dict[str, Any] = {"steps": cfg.trainer.total_steps, "resumed_from": timing["start_step"],
                               "n_train": int(run.train["prompt_ids"].shape[0]),
                               "n_heldout": int(run.heldout["prompt_ids"].shape[0]),
                               "nan_skipped_total": int(state.nan_total),
                               "time/setup_s": timing["setup_s"], "time/train_s": timing["train_s"],
                               "time/first_step_s": timing["compile_s"]}
    t0 = time.perf_counter()
    if evaluator.available:
        before = evaluator(run.ref_params)
        after = evaluator(state.actor)
        rb_s, ra_s = np.asarray(before["rewards"], np.float64), np.asarray(after["rewards"], np.float64)
        rb, ra = prompt_means(rb_s, evaluator.samples), prompt_means(ra_s, evaluator.samples)
        lo, hi = bootstrap_ci(rb, ra, seed=cfg.trainer.seed)
        summary.update({"eval/n_prompts": int(rb.size), "eval/samples_per_prompt": evaluator.samples,
                        "eval/reward_before": float(rb.mean()),
                        "eval/reward_after": float(ra.mean()), "eval/reward_gain": float(ra.mean() - rb.mean()),
                        "eval/reward_gain_ci95": [float(lo), float(hi)], "eval/kl": float(after["kl"]),
                        "eval/response_length_before": float(before["response_length"]),
                        "eval/response_length_after": float(after["response_length"])})
        with open(out / "eval_samples.jsonl", "w", encoding="utf-8") as fh:
            for i in range(rb_s.size):
                fh.write(json.dumps({"prompt": after["prompts"][i], "before": before["responses"][i],
                                     "after": after["responses"][i], "reward_before": float(rb_s[i]),
                                     "reward_after": float(ra_s[i])}, ensure_ascii=False) + "\n")
    else:
        logger.warning("no held-out prompts (data.eval_fraction=0?): skipping the before/after evaluation")
    summary["time/eval_s"] = time.perf_counter() - t0
    if cfg.trainer.save_hf:
        from jaxppo.hf import save_pretrained

        save_pretrained(run.policy(state.actor), out / "hf", tokenizer=run.tokenizer)
    if cfg.trainer.plots and (out / "metrics.jsonl").is_file():
        from jaxppo.trainer.plots import plot_metrics

        summary["plots"] = [str(p) for p in plot_metrics(out / "metrics.jsonl", out / "plots", summary=summary)]
    summary["time/total_s"] = time.perf_counter() - timing["t_start"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
