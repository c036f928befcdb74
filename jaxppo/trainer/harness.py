"""The run harness every trainer plugs into: ``fit(cfg, Algo, build) -> (summary, final state)``.

A trainer (``jaxppo.trainer.ppo``, ``jaxppo.trainer.dpo``) gives a ``build(cfg) -> run`` (the run's ``state`` is
the initial state; the run is read, never written) and an :class:`Algorithm` subclass: its update step, the state
fields a rollback restores, its held-out sequences, evaluation, checkpoint metadata and final summary. The
harness owns everything else, once:

- the run folder (:func:`jaxppo.trainer.run_dir.start_run`: ``config.json``, checkpointer, resume with damaged
  checkpoints moved aside and logged as ``checkpoint_damaged`` events);
- the step loop; per step (1-based ``step_no``): ``perf/step_time_s``, ``perf/throughput``; the NaN guard on the
  device counts ``state.nan_streak`` / ``state.nan_total`` (``guards.max_nan_steps`` in a row -> rollback); the
  held-out perplexity every ``guards.ppl_every`` steps (the first value is the baseline; above
  ``(1 + guards.ppl_tolerance)`` x baseline -> rollback); the trainer's evaluation every ``trainer.eval_every``
  steps (and its step-0 metrics); the KL / length guards on the step's metrics (``lower_lr``: the actor's update
  is scaled by ``state.lr_scale``, :func:`jaxppo.trainer.guards.cut_lr_scale`);
- the logging cadence: ``metrics.jsonl`` gets a row every ``trainer.log_every`` steps and at every step with an
  evaluation, a perplexity check, a guard action or the last step (the guards see every step);
- verified checkpoints: every ``trainer.save_every`` steps, at the end and at every step whose perplexity check
  passed (those are *verified*; so is step 0 when there is held-out data); a state with non-finite parameters is
  not written (``checkpoint_skipped`` event);
- the rollback, a pure function of two states: the ``Algorithm.rollback_fields`` of the newest *verified*
  checkpoint (the newest readable one when none is verified), the NaN streak zeroed, the step counter, RNG, NaN
  total and LR cut kept; damaged checkpoints met on the way are moved aside and logged (``checkpoint_damaged``);
  then ``Algorithm.after_rollback`` (PPO re-prepares its buffer);
- the data: the run's data report (rows seen, kept, skipped by reason) is printed at the start and written into
  ``summary.json``; a trainer's build calls :func:`check_rows` to stop on fewer usable rows than one minibatch or
  no held-out prompt while ``data.eval_fraction > 0``;
- preemption: SIGTERM / SIGINT during the step loop stop the run after the current step, agreed by every process,
  with that step's checkpoint written completely (:mod:`jaxppo.trainer.preemption`: ``Preempted`` is raised; a second
  signal aborts at once);
- the end: the trainer's final summary, ``hf/`` export, ``plots/`` and ``summary.json``, with the wall seconds of
  each phase: ``time/setup_s`` (build), ``time/train_s`` (the trainer's start and the step loop) and inside it
  ``time/evaluations_s`` (the trainer's evaluations, step 0 included), ``time/perplexity_s`` (the perplexity
  checks, the baseline included) and ``time/checkpoints_s`` (what the loop waits for checkpoint writes);
  ``time/first_step_s`` (the first update, with its compile), ``time/eval_s`` (the final evaluation),
  ``time/export_s`` (``hf/`` and plots), ``time/total_s``. Each counts this process's run (a resumed run starts
  its clocks again; ``perf/train_time_s``, the update steps' own time, carries over).
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxppo.config import to_dict
from jaxppo.parallel.host import broadcast_from_main, float_from_main, from_host, is_main_process, to_host
from jaxppo.trainer.preemption import Preempted, PreemptionWatch
from jaxppo.trainer.checkpoint import Checkpointer
from jaxppo.trainer.run_dir import RunStart, metrics_logger, start_run
from jaxppo.trainer.run_state import RunState

logger = logging.getLogger("jaxppo.trainer")


class Algorithm(abc.ABC):
    """What a trainer plugs into :func:`fit`. One instance per ``fit`` call (it may keep host-side counters, e.g.
    PPO's consumed tokens, restored from ``start.meta`` on resume)."""

    #: the state fields a rollback restores from the checkpoint (the rest of the state is kept)
    rollback_fields: tuple[str, ...] = ()
    #: the summary's name for the number of training / held-out rows
    count_names: tuple[str, str] = ("n_train", "n_heldout")

    def __init__(self, run: Any, start: RunStart):
        self.run = run
        self.cfg = run.cfg

    # -- data --------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def heldout_sequences(self) -> dict[str, np.ndarray]:
        """Held-out ``prompt_ids/prompt_mask/response_ids/response_mask`` of the perplexity guard (0 rows: none)."""

    @abc.abstractmethod
    def n_rows(self) -> tuple[int, int]:
        """``(training rows, held-out rows)``."""

    @property
    @abc.abstractmethod
    def tokens_per_step(self) -> int:
        """Token slots of the rows one update reads (prompt + response, padding included): ``perf/throughput`` is
        this over the step time. It counts the data, not the model's work: with whole prompt groups
        (``replay.group_size``) the trunk computes fewer positions (each prompt once) for the same count.
        (``train/tokens_consumed`` counts the sampled rows' real response tokens instead.)"""

    # -- the step ----------------------------------------------------------------------------------------------
    def before_step(self, state: Any, s: int) -> tuple[Any, Any]:
        """``(state, batch)`` for 0-based step ``s`` (untimed: data loading, buffer refresh)."""
        return state, None

    @abc.abstractmethod
    def step(self, state: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        """The jitted update: ``(state, metrics)``."""

    def step_extras(self, state: Any, step_no: int, metrics: dict[str, float]) -> None:
        """Add host-side metrics of step ``step_no`` (before the guards see them); none by default."""
        return None

    # -- evaluation --------------------------------------------------------------------------------------------
    @property
    def can_evaluate(self) -> bool:
        return False

    def initial_metrics(self) -> dict[str, float]:
        """Metrics logged at step 0 when ``trainer.eval_every`` is set (e.g. the reference's evaluation)."""
        return {}

    def evaluate(self, params: Any) -> dict[str, float]:
        """The ``trainer.eval_every`` metrics of the policy ``params``."""
        return {}

    # -- rollback, checkpoints, end ----------------------------------------------------------------------------
    def after_rollback(self, state: Any) -> Any:
        return state

    def meta(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint's metadata."""
        return {}

    def summary(self, state: Any, out: Path) -> dict[str, Any]:
        """The trainer's counters of the summary (before the final evaluation)."""
        return {}

    def final_evaluation(self, state: Any, out: Path) -> dict[str, Any]:
        return {}

    def plot(self, metrics_jsonl: Path, plots_dir: Path, summary: dict[str, Any]) -> list[Path]:
        return []


def report_counts(report: Any) -> str:
    """``kept K of N rows; skipped S (reason n, ...)``: the data report's counts on one line."""
    if report is None:
        return "no data report"
    why = ", ".join(f"{k} {v}" for k, v in sorted(report.skipped.items()))
    return (f"kept {report.rows_kept} of {report.rows_seen} rows, skipped {report.n_skipped}"
            + (f" ({why})" if why else ""))


def check_rows(report: Any, n_train: int, n_heldout: int, *, min_train: int, min_train_key: str,
               eval_fraction: float, unit: str = "rows") -> None:
    """Stop before training on too little data (``DataError`` with the data report's counts): fewer usable training
    ``unit`` than one minibatch (``min_train``, set by ``min_train_key``), or no held-out prompt although
    ``data.eval_fraction > 0`` asks for a held-out evaluation."""
    from jaxppo.data.report import DataError

    src = f"data {report.source}: " if report is not None and report.source else "data: "
    if n_train < min_train:
        raise DataError(f"{src}{n_train} usable training {unit}, fewer than one minibatch ({min_train_key}="
                        f"{min_train}); {report_counts(report)}")
    if eval_fraction > 0 and n_heldout == 0:
        raise DataError(f"{src}data.eval_fraction={eval_fraction} but no held-out prompt remains (every usable row "
                        f"has the same prompt); {report_counts(report)}; set data.eval_fraction=0 to train without "
                        "a held-out evaluation")


def show_report(report: Any) -> dict[str, Any]:
    """Print the data report (as ``jaxppo.reward`` does) and return its summary entries: ``data/rows_seen``,
    ``data/rows_kept``, ``data/rows_skipped``, ``data/skipped/<reason>``, ... and ``data_report`` (the full dict)."""
    if report is None:
        return {}
    report.emit(print)
    return {**report.flat_metrics(), "data_report": report.to_dict()}


def heldout_ppl(algo: Algorithm, params: Any) -> float:
    """Perplexity of the policy ``params`` on ``algo.heldout_sequences()`` (NaN without held-out tokens). Under
    several processes every process gets process 0's value (:func:`jaxppo.parallel.float_from_main`), so the
    perplexity guard's baseline and rollback decisions are taken once."""
    from jaxppo.trainer.evaluation import heldout_perplexity

    arr = algo.heldout_sequences()
    if arr["prompt_ids"].shape[0] == 0 or np.asarray(arr["response_mask"]).sum() == 0:
        return float("nan")
    return float_from_main(heldout_perplexity(algo.run.policy(params), arr,
                                              batch_size=algo.cfg.data.behaviour_batch_size,
                                              packing=algo.cfg.data.packing))


def _meta(algo: Algorithm, guards, train_time_s: float) -> dict[str, Any]:
    return {"guards": guards.state_dict(), "config": to_dict(algo.cfg), "train_time_s": float(train_time_s),
            **algo.meta()}


def restore_fields(state: RunState, good: RunState, fields: tuple[str, ...]) -> RunState:
    """The rollback as a pure function of two states: ``state`` with the ``fields`` of the restored checkpoint
    ``good`` and a zero NaN streak (everything else of ``state`` kept)."""
    return state.replace(**{k: getattr(good, k) for k in fields},
                         nan_streak=from_host(np.int32(0), state.nan_streak.sharding))


def rollback(algo: Algorithm, ckpt: Checkpointer, state: RunState, step_no: int, mlog: Any = None) -> RunState:
    """Restore ``algo.rollback_fields`` from the newest verified checkpoint (module doc); damaged checkpoints met on
    the way are moved aside and logged."""
    # the NaN streak restarts whatever happens next (the guard reads it from the state)
    state = state.replace(nan_streak=from_host(np.int32(0), state.nan_streak.sharding))
    ckpt.wait()

    def note_damaged(bad: int, moved: Path, why: str) -> None:   # the checkpointer has logged the warning
        if mlog is not None:
            mlog.event(step_no, "checkpoint_damaged", f"{why}; moved aside to {moved.name}",
                       checkpoint_step=bad, moved_to=str(moved))

    # process 0's view decides (restore_newest then agrees on the step with every process)
    verified_only = bool(broadcast_from_main(np.int32(ckpt.newest_verified() is not None)))
    res = ckpt.restore_newest(state, verified_only=verified_only, on_damaged=note_damaged)
    if res.step is None and verified_only:
        res = ckpt.restore_newest(state, on_damaged=note_damaged)
        verified_only = False
    if res.step is None:
        logger.warning("step %d: rollback requested but no checkpoint exists", step_no)
        return state
    good = res.state
    logger.warning("step %d: rolled back %s to checkpoint step %d", step_no, "/".join(algo.rollback_fields), res.step)
    if mlog is not None:
        mlog.event(step_no, "rollback_restored", f"restored checkpoint step {res.step}"
                   f"{' (verified)' if verified_only else ' (not verified: no verified checkpoint)'}",
                   checkpoint_step=int(res.step), verified=verified_only, data_cursor=int(to_host(good.data_cursor)))
    return algo.after_rollback(restore_fields(state, good, algo.rollback_fields))


def apply_action(algo: Algorithm, ckpt: Checkpointer, state: RunState, act: Any, step_no: int,
                 mlog: Any = None) -> RunState:
    """A guard action on the state: ``lower_lr`` scales the actor's update, ``rollback`` (:func:`rollback`); other
    actions are warnings only."""
    from jaxppo.trainer.guards import cut_lr_scale

    if act.kind == "lower_lr":
        scale = cut_lr_scale(float(to_host(state.lr_scale)), act.data, algo.cfg.actor.optim.lr)
        logger.warning("step %d: actor LR scale %.4g -> %.4g", step_no, float(to_host(state.lr_scale)), scale)
        return state.replace(lr_scale=from_host(np.float32(scale), state.lr_scale.sharding))
    if act.kind == "rollback":
        return rollback(algo, ckpt, state, step_no, mlog)
    return state


@dataclass
class Clocks:
    """Wall seconds the step loop spends beside the updates, by phase (module doc: ``time/<phase>_s``)."""

    evaluations: float = 0.0
    perplexity: float = 0.0
    checkpoints: float = 0.0

    @contextlib.contextmanager
    def timing(self, phase: str):
        """Add the wall time of the ``with`` body to ``phase``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, phase, getattr(self, phase) + time.perf_counter() - t0)

    def summary(self) -> dict[str, float]:
        return {f"time/{k}_s": v for k, v in vars(self).items()}


@dataclass
class Loop:
    """What the step loop threads besides the state: the run's pieces and the clocks. ``train_time`` is the
    cumulative update-step time (evaluation, checkpoints and logging excluded), carried across resumes;
    ``compile_s`` the first step's time."""

    algo: Algorithm
    tc: Any   # cfg.trainer
    ckpt: Checkpointer
    guards: Any
    mlog: Any
    watch: PreemptionWatch
    have_heldout: bool
    train_time: float
    compile_s: float | None = None
    clocks: Clocks = field(default_factory=Clocks)


@dataclass
class StepOutcome:
    """One update step's result: the metrics (as floats), the guard actions and whether the step checked the
    held-out perplexity (``ppl_checked``) or ran the trainer's evaluation (``evaluated``)."""

    metrics: dict[str, float]
    actions: list[Any]
    ppl_checked: bool
    evaluated: bool


def open_algorithm(rs: RunStart, algorithm: Callable[[Any, RunStart], Algorithm],
                   clocks: Clocks) -> tuple[Algorithm, bool, dict]:
    """The trainer on the started run: ``(algo, have_heldout, data summary)``; the perplexity baseline is taken
    here (timed in ``clocks``) when the guards have none yet. The checkpointer is closed when this fails."""
    try:
        data_summary = show_report(getattr(rs.run, "report", None))
        algo = algorithm(rs.run, rs)
        have_heldout = algo.heldout_sequences()["prompt_ids"].shape[0] > 0
        if rs.guards.ppl_baseline is None and have_heldout:
            with clocks.timing("perplexity"):
                baseline = heldout_ppl(algo, rs.state.actor)
            rs.guards.check_perplexity(0, baseline)
    except BaseException:
        rs.ckpt.close()
        raise
    return algo, have_heldout, data_summary


def begin_from_scratch(loop: Loop, state: RunState) -> None:
    """Step 0: the first "last good" checkpoint for rollbacks, verified by the perplexity baseline (already there
    when a run killed before its first step resumes from it), and the trainer's step-0 metrics."""
    algo, tc = loop.algo, loop.tc
    if 0 not in loop.ckpt.all_steps():
        with loop.clocks.timing("checkpoints"):
            loop.ckpt.save(0, state, _meta(algo, loop.guards, loop.train_time), verified=loop.have_heldout)
    if tc.eval_every and algo.can_evaluate:
        with loop.clocks.timing("evaluations"):
            first = algo.initial_metrics()
        if first:
            loop.mlog.log(0, first)


def train_step(loop: Loop, state: RunState, s: int) -> tuple[RunState, StepOutcome]:
    """The step body of the 0-based step ``s``: the update, its timing metrics, the NaN and perplexity guards, the
    trainer's evaluation and extras, the KL / length guards (module doc)."""
    algo, guards, tc = loop.algo, loop.guards, loop.tc
    state, batch = algo.before_step(state, s)
    t0 = time.perf_counter()
    state, metrics = algo.step(state, batch)
    metrics = {k: float(v) for k, v in to_host(metrics).items()}
    nan_streak, nan_total = (int(x) for x in to_host((state.nan_streak, state.nan_total)))
    dt = time.perf_counter() - t0
    loop.compile_s = dt if loop.compile_s is None else loop.compile_s
    step_no = s + 1
    loop.train_time += dt
    metrics["perf/step_time_s"] = dt
    metrics["perf/train_time_s"] = loop.train_time
    metrics["perf/throughput"] = algo.tokens_per_step / max(dt, 1e-9)
    actions = guards.check_nan(step_no, nan_streak, nan_total)
    ppl_checked = loop.have_heldout and guards.should_check_perplexity(step_no)
    if ppl_checked:
        with loop.clocks.timing("perplexity"):
            metrics["eval/perplexity"] = heldout_ppl(algo, state.actor)
        actions += guards.check_perplexity(step_no, metrics["eval/perplexity"])
    evaluated = bool(tc.eval_every) and step_no % tc.eval_every == 0 and algo.can_evaluate
    if evaluated:
        with loop.clocks.timing("evaluations"):
            metrics.update(algo.evaluate(state.actor))
    algo.step_extras(state, step_no, metrics)
    actions += guards.check(step_no, metrics)   # KL and the policy's generation length
    return state, StepOutcome(metrics, actions, ppl_checked, evaluated)


def should_log(tc: Any, step_no: int, out: StepOutcome) -> bool:
    """A ``metrics.jsonl`` row: every ``log_every`` steps, the last step, and any step with an evaluation, a
    perplexity check or a guard action."""
    return (step_no % tc.log_every == 0 or step_no == tc.total_steps or out.evaluated or out.ppl_checked
            or bool(out.actions))


def should_save(tc: Any, step_no: int, verified: bool, preempted: bool) -> bool:
    """A checkpoint: every ``save_every`` steps, the last step, a verified step and a preempted one."""
    return step_no % tc.save_every == 0 or step_no == tc.total_steps or verified or preempted


def after_step(loop: Loop, state: RunState, step_no: int, out: StepOutcome) -> RunState:
    """The log / save decision after step ``step_no``: the metrics row, the guard actions on the state, the
    checkpoint (verified: the perplexity guard checked this step's policy and nothing was rolled back) and the stop
    on preemption (:class:`Preempted` raised after the checkpoint is written)."""
    algo, ckpt, mlog, tc = loop.algo, loop.ckpt, loop.mlog, loop.tc
    if should_log(tc, step_no, out):
        mlog.log(step_no, out.metrics)
    for act in out.actions:
        mlog.event(step_no, act.kind, act.message, **act.data)
        state = apply_action(algo, ckpt, state, act, step_no, mlog)
    verified = out.ppl_checked and not any(a.kind == "rollback" for a in out.actions)
    preempted = loop.watch.requested()   # the same answer on every process
    if should_save(tc, step_no, verified, preempted):
        with loop.clocks.timing("checkpoints"):
            saved = ckpt.save(step_no, state, _meta(algo, loop.guards, loop.train_time), verified=verified)
        if not saved:
            mlog.event(step_no, "checkpoint_skipped", "parameters are not finite; checkpoint not written")
    if preempted:
        ckpt.wait()
        mlog.event(step_no, "preempted", f"{loop.watch.signame}: stopped after step {step_no}",
                   checkpoint_step=ckpt.latest_step())
        raise Preempted(step_no, ckpt.latest_step(), ckpt.directory, loop.watch.signame)
    return state


def log_damaged(mlog: Any, rs: RunStart) -> None:
    """A ``checkpoint_damaged`` event for each checkpoint the resume moved aside."""
    for bad_step, moved, why in rs.damaged:
        mlog.event(rs.start, "checkpoint_damaged", f"{why}; moved aside to {moved.name}, resuming from "
                   f"{'step ' + str(rs.start) if rs.start else 'scratch'}", checkpoint_step=bad_step,
                   moved_to=str(moved))


def fit(cfg: Any, algorithm: Callable[[Any, RunStart], Algorithm], build: Callable[[Any], Any],
        run: Any = None) -> tuple[dict[str, Any], Any]:
    """Run the job described by ``cfg`` with the trainer ``algorithm`` (module doc): ``(summary, final state)``.
    ``run`` (default ``build(cfg)``) is only read: its ``state`` is the initial state."""
    rs = start_run(cfg, build, run)
    # from here on only `state` is threaded, `run` is read-only
    state, start = rs.state, rs.start
    clocks, t_train0 = Clocks(), time.perf_counter()
    algo, have_heldout, data_summary = open_algorithm(rs, algorithm, clocks)
    mlog = metrics_logger(cfg, rs.out, start, rs.ckpt)   # closes ckpt when it cannot be opened
    log_damaged(mlog, rs)
    watch = PreemptionWatch().__enter__()   # SIGTERM/SIGINT: stop at the next step boundary with a checkpoint
    loop = Loop(algo, cfg.trainer, rs.ckpt, rs.guards, mlog, watch, have_heldout,
                float(rs.meta.get("train_time_s", 0.0)), clocks=clocks)
    try:
        if start == 0:
            begin_from_scratch(loop, state)
        for s in range(start, cfg.trainer.total_steps):
            state, out = train_step(loop, state, s)
            state = after_step(loop, state, s + 1, out)
        with clocks.timing("checkpoints"):
            rs.ckpt.wait()
    finally:
        watch.__exit__(None, None, None)
        mlog.close()
        rs.ckpt.close()
    timing = dict(setup_s=rs.t_setup, train_s=time.perf_counter() - t_train0, compile_s=loop.compile_s or 0.0,
                  start_step=start, t_start=rs.t_start, data=data_summary, phases=clocks.summary())
    return finish(algo, state, rs.out, timing), state


def finish(algo: Algorithm, state: Any, out: Path, timing: dict[str, Any]) -> dict[str, Any]:
    """The summary: counters, the trainer's final evaluation, ``hf/`` export, plots, ``summary.json``."""
    cfg = algo.cfg
    n_train, n_heldout = algo.n_rows()
    summary: dict[str, Any] = {"steps": cfg.trainer.total_steps, "resumed_from": timing["start_step"],
                               algo.count_names[0]: int(n_train), algo.count_names[1]: int(n_heldout),
                               "nan_skipped_total": int(to_host(state.nan_total)), **algo.summary(state, out),
                               **timing.get("data", {}),
                               "time/setup_s": timing["setup_s"], "time/train_s": timing["train_s"],
                               "time/first_step_s": timing["compile_s"], **timing.get("phases", {})}
    t0 = time.perf_counter()
    summary.update(algo.final_evaluation(state, out))
    summary["time/eval_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if cfg.trainer.save_hf:
        from jaxppo.hf import save_pretrained

        save_pretrained(algo.run.policy(state.actor), out / "hf", tokenizer=algo.run.tokenizer)
    if cfg.trainer.plots and is_main_process() and (out / "metrics.jsonl").is_file():
        summary["plots"] = [str(p) for p in algo.plot(out / "metrics.jsonl", out / "plots", summary)]
    summary["time/export_s"] = time.perf_counter() - t0
    summary["time/total_s"] = time.perf_counter() - timing["t_start"]
    if is_main_process():
        (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


__all__ = ["Algorithm", "Clocks", "Loop", "StepOutcome", "after_step", "apply_action", "begin_from_scratch",
           "check_rows", "finish", "fit", "heldout_ppl", "log_damaged", "open_algorithm", "report_counts", "restore_fields",
           "rollback", "should_log", "should_save", "show_report", "train_step"]
