"""The offline PPO trainer: ``train(cfg) -> summary`` (``fit(cfg) -> (summary, final TrainState)``), the PPO
:class:`~jaxppo.trainer.harness.Algorithm` plugged into the run harness (``jaxppo.trainer.harness``: step loop,
guards, perplexity checks, verified checkpoints, rollback, logging cadence, run folder).

Per step ``s`` (0-based): on ``s % replay.refresh_every == 0`` the buffer window is (re)loaded and
prepared (prox log-probs, values, rewards, GAE, priorities); then one jitted update. Everything a
step depends on is in the ``TrainState`` (RNG keys are ``fold_in(rng, step)``), so a run resumed from
the checkpoint of step ``k`` logs exactly the metrics of an uninterrupted run for steps ``> k``.

A rollback restores :data:`ROLLBACK_FIELDS` (parameters, optimizer states, replay buffer, data cursor and KL
coefficient) and re-runs the prepare pass with the restored policy. Beside the harness's guards, a
mode-collapse warning when the mean length of the policy's own generations — ``eval/response_length`` from the
held-out evaluation at ``trainer.eval_every``, ``probe/response_length`` from a greedy probe at
``guards.length_probe_every`` — exceeds ``guards.length_factor`` × its running mean.

Metrics: the step's metrics, ``perf/*``, and the cumulative ``train/samples_consumed`` (``s ·
actor.ppo_mini_batch_size`` after ``s`` steps, NaN-skipped steps included) and ``train/tokens_consumed`` (the
response tokens of the sampled minibatches, ``Σ response_length/mean · ppo_mini_batch_size``, carried across
resumes in the checkpoint metadata). With ``trainer.eval_every``, the held-out evaluation
(``jaxppo.trainer.evaluation.HeldoutEval``: ``eval/reward_mean`` with its 95% bootstrap interval over prompts
``eval/reward_ci_lo``/``eval/reward_ci_hi``, ``eval/kl``, ``eval/response_length``) is logged at step 0 (the
reference, before any update) and every ``eval_every`` steps.

Outputs under ``trainer.output_dir``: ``metrics.jsonl``, ``events.jsonl``, TensorBoard files,
``checkpoints/``, ``hf/`` (final policy + tokenizer), ``plots/``, ``eval_samples.jsonl`` and
``summary.json`` (``eval/reward_before``, ``eval/reward_after``, ``eval/reward_gain_ci95``, ``eval/kl``, ...).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from jaxppo.trainer.harness import Algorithm
from jaxppo.trainer.harness import fit as fit_with
from jaxppo.trainer.ppo.build import Run, build_run
from jaxppo.trainer.ppo.windows import load_window
from jaxppo.trainer.run_dir import RunStart

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
    """The run's held-out evaluation (``HeldoutEval``) with the reference's result kept (the step-0 value and the
    "before" of the final comparison, computed once) and the last policy result kept with its parameters: the
    evaluation at the last step (``trainer.eval_every`` dividing ``trainer.total_steps``) is the final comparison's
    "after" when no rollback replaced the parameters since (the same arrays, compared by identity)."""

    def __init__(self, run: Run, eos):
        from jaxppo.trainer.evaluation import heldout_eval

        self.run = run
        self.ev = heldout_eval(run.cfg, run.heldout, run.tokenizer, eos)
        self._reference: dict[str, Any] | None = None
        self._last: tuple[Any, dict[str, Any]] | None = None

    @property
    def available(self) -> bool:
        return self.ev.available

    def reference(self) -> dict[str, Any]:
        if self._reference is None:
            ref = self.run.reference()
            self._reference = self.ev(ref, ref)
        return self._reference

    def policy(self, params) -> dict[str, Any]:
        import jax

        from jaxppo.trainer.evaluation import same_arrays

        if self._last is not None and same_arrays(self._last[0], params):
            return self._last[1]
        result = self.ev(self.run.policy(params), self.run.reference())
        self._last = (jax.tree.map(lambda x: x, params), result)   # a new container of the same arrays
        return result


class PPO(Algorithm):
    """Offline PPO on the harness (module doc)."""

    rollback_fields = ROLLBACK_FIELDS

    def __init__(self, run: Run, start: RunStart):
        from jaxppo.models.eos import eos_ids

        super().__init__(run, start)
        self.tokens_consumed = float(start.meta.get("tokens_consumed", 0.0))
        self.mini = self.cfg.actor.ppo_mini_batch_size
        eos = eos_ids(run.reference().config, run.tokenizer)
        self.evals = _Evaluations(run, eos)
        self.probe = _LengthProbe(run, eos)

    def heldout_sequences(self) -> dict[str, np.ndarray]:
        return self.run.heldout

    def n_rows(self) -> tuple[int, int]:
        return int(self.run.train["prompt_ids"].shape[0]), int(self.run.heldout["prompt_ids"].shape[0])

    @property
    def tokens_per_step(self) -> int:
        return self.run.tokens_per_step

    def before_step(self, state, s: int):
        refresh = self.cfg.replay.refresh_every
        if s % refresh == 0:
            state = load_window(self.run, state, s // refresh)
            state = self.run.prepare(state)
        return state, None

    def step(self, state, batch):
        return self.run.step(state)

    def step_extras(self, state, step_no: int, metrics: dict[str, float]) -> None:
        batch_tokens = metrics.get("response_length/mean", float("nan")) * self.mini
        self.tokens_consumed += batch_tokens if np.isfinite(batch_tokens) else 0.0
        metrics["train/samples_consumed"] = float(step_no * self.mini)
        metrics["train/tokens_consumed"] = self.tokens_consumed
        if self.probe.due(step_no):
            metrics["probe/response_length"] = self.probe(state.actor)

    @property
    def can_evaluate(self) -> bool:
        return self.evals.available

    def initial_metrics(self) -> dict[str, float]:
        return self.evals.ev.step_metrics(self.evals.reference())   # step 0: the reference, before any update

    def evaluate(self, params) -> dict[str, float]:
        return self.evals.ev.step_metrics(self.evals.policy(params))   # the policy's own generations

    def after_rollback(self, state):
        # re-prepare with the restored policy (the checkpoint's buffer may predate its prepare pass)
        return self.run.prepare(state)

    def meta(self) -> dict[str, Any]:
        return {"tokens_consumed": float(self.tokens_consumed),
                "data": {"n_train": int(self.run.train["prompt_ids"].shape[0]), "capacity": self.run.capacity}}

    def summary(self, state, out: Path) -> dict[str, Any]:
        return {"train/samples_consumed": int(self.cfg.trainer.total_steps * self.mini),
                "train/tokens_consumed": float(self.tokens_consumed),
                **dict(self.run.pf_stats or {}),   # e.g. pf_ppo/dropped_groups
                **self.run.param_summary()}       # trainable vs total parameters (adapters: a small share)

    def final_evaluation(self, state, out: Path) -> dict[str, Any]:
        from jaxppo.trainer.evaluation import before_after

        return before_after(self.evals.ev, out, self.evals.reference, lambda: self.evals.policy(state.actor))

    def plot(self, metrics_jsonl: Path, plots_dir: Path, summary: dict[str, Any]) -> list[Path]:
        from jaxppo.trainer.plots import plot_metrics

        return plot_metrics(metrics_jsonl, plots_dir, summary=summary)


def train(cfg: Any, *, run: Run | None = None) -> dict[str, Any]:
    """Run the offline PPO job described by ``cfg``; returns (and writes) the summary dict."""
    return fit(cfg, run=run)[0]


def fit(cfg: Any, *, run: Run | None = None) -> tuple[dict[str, Any], Any]:
    """:func:`train` that also returns the final ``TrainState``: ``(summary, state)``. ``run`` (default
    ``build_run(cfg)``) is only read: its ``state`` is the initial state."""
    return fit_with(cfg, PPO, build_run, run)


__all__ = ["PPO", "ROLLBACK_FIELDS", "fit", "train"]
