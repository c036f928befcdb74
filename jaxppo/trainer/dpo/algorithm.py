"""The offline DPO trainer: build a run from a config, train with exact resume, evaluate, export.

``build_dpo_run(cfg)``: the mesh, the policy (``model.path``, HF or GGUF) sharded by ``mesh.rules``, the
preference pairs of ``cfg.data`` (``data.schema=preference``) tokenized and split into train / held-out **by
prompt** (``split_by_group`` on the prompt text, as the reward model does), the reference's summed log-probs
of every answer (computed once with the initial policy and cached on disk like behaviour log-probs: a second
run with the same model, dtypes and data reads the file), the optimizer (``actor.optim``) and the jitted step.

``train_dpo(cfg)`` then runs ``trainer.total_steps`` steps of ``dpo.batch_size`` pairs and writes under
``trainer.output_dir``: ``metrics.jsonl`` (TRL's names: ``loss``, ``rewards/chosen|rejected|accuracies|margins``,
``logps/chosen|rejected``, ``nll_loss`` with RPO, ``grad_norm``, ``learning_rate``, ``train/nan_skipped``, and
``eval/rewards/*``, ``eval/logps/*``, ``eval/loss`` on the held-out pairs every ``trainer.eval_every`` steps and
at the end), ``events.jsonl`` (guard actions), ``checkpoints/`` (Orbax, every ``trainer.save_every``; a run
killed at any moment resumes to the same metrics), ``hf/``, ``plots/`` and ``summary.json``.

Held-out pair accuracy by implicit reward: ``r(x, y) = beta (log π(y|x) − log π_ref(y|x))``; a pair is right when
``r(x, y_c) > r(x, y_r)``; ``eval/rewards/accuracies`` is the share of right held-out pairs, with a percentile
bootstrap 95% interval that resamples held-out prompts, keeping a prompt's pairs together
(``eval/rewards/accuracies_ci95``, ``jaxppo.rewards.model_training.grouped_bootstrap_accuracy``). The final
evaluation of the policy against the reference on the held-out prompts with the configured reward
(``eval/reward_before``, ``eval/reward_after``, ``eval/reward_gain_ci95``, ``eval/kl``) is the PPO trainer's; with
``reward.kind=model`` and no reward model at ``reward.model_path`` it is skipped with a logged warning. Guards:
NaN/inf updates are skipped in-graph, ``guards.max_nan_steps`` in a row or a held-out perplexity (of the chosen
answers) above ``(1 + guards.ppl_tolerance)`` x baseline roll back to the newest verified checkpoint. The loop,
guards, checkpoints, rollback and logging cadence (``trainer.log_every``) are the run harness's
(``jaxppo.trainer.harness``); this module plugs in the DPO step (:class:`DPO`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.config import ConfigError
from jaxppo.console import warn
from jaxppo.models.packing import program_shape
from jaxppo.parallel.host import from_host, host_scalar, to_host
from jaxppo.trainer.dpo.steps import (
    KTO_KEYS,
    PAIR_KEYS,
    DPOHParams,
    DPOState,
    batch_indices,
    make_dpo_step,
    pair_logps,
    plan_pairs,
    plan_shardings,
)
from jaxppo.trainer.harness import Algorithm, check_rows
from jaxppo.trainer.harness import fit as fit_with
from jaxppo.trainer.policy import Policy, PolicyRun
from jaxppo.trainer.run_dir import RunStart

logger = logging.getLogger("jaxppo.trainer")

# restored by a rollback; the step counter, NaN total and the guards' LR cut are kept, the NaN streak is zeroed
ROLLBACK_FIELDS = ("actor", "actor_opt", "data_cursor")


@dataclasses.dataclass
class DPORun(PolicyRun):
    cfg: Any
    mesh: Any
    tokenizer: Any
    model_path: str
    parts: Policy                   # the policy's graphdef, reference and (adapters) frozen base
    state: DPOState
    step: Any                       # jitted (state, batch) -> (state, metrics)
    train: dict[str, np.ndarray]    # PAIR_KEYS + group_id, index
    heldout: dict[str, np.ndarray]
    batch_shardings: dict[str, Any]
    report: Any = None
    programs: Any = None            # data.packing: the packed update's ProgramLog (one compiled program per shape)


def check_dpo_config(cfg: Any, n_devices: int) -> None:
    """Cross-section checks of a DPO run (ConfigError naming the key)."""
    from jaxppo.trainer.micro import check_mesh

    check_mesh(cfg.mesh, n_devices, cfg.dpo.micro_batch_size or cfg.dpo.batch_size,
               "dpo.micro_batch_size (or dpo.batch_size)")
    if cfg.dpo.loss_type == "kto":
        if cfg.data.schema != "scored":
            raise ConfigError("data.schema: dpo.loss_type=kto trains on unpaired rows (prompt, completion, boolean "
                              f"label), set data.schema=scored (got {cfg.data.schema!r})")
    elif cfg.data.schema != "preference":
        raise ConfigError(f"data.schema: DPO trains on preference pairs, set data.schema=preference "
                          f"(got {cfg.data.schema!r})")
    if cfg.data.path is None:
        raise ConfigError("data.path is not set: give a preference-pair dataset (prompt/chosen/rejected or HH-RLHF)")


def load_pairs(cfg: Any, tokenizer: Any) -> tuple[dict[str, np.ndarray], np.ndarray, Any]:
    """``(arrays, prompt_group [N] int32, report)``: tokenized pairs and a dense id of each pair's prompt text."""
    from jaxppo.data.pipeline import load_preference_arrays
    from jaxppo.hf.paths import resolve_model_path

    if cfg.dpo.loss_type == "kto":
        from jaxppo.data.unpaired import load_kto_arrays

        arrays, report = load_kto_arrays(cfg.data, tokenizer, resolve_model_path(cfg.model.path))
        return arrays, arrays.pop("group_id"), report
    got = load_preference_arrays(cfg.data, tokenizer, resolve_model_path(cfg.model.path))
    return got.arrays, got.prompt_group, got.report


def split_pairs(group: np.ndarray, data_cfg: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(train_rows, eval_rows)`` of the pairs: ``split_by_group`` on the prompt groups of :func:`load_pairs` with
    ``data.eval_fraction`` / ``data.seed`` -- THE split of DPO (and of the reward model, whose config shares them)."""
    from jaxppo.data import split_by_group

    return split_by_group(np.asarray(group).tolist(), data_cfg.eval_fraction, data_cfg.seed)


def pair_prompts(cfg: Any, tokenizer: Any) -> tuple[list[Any], list[Any], int]:
    """``(train_prompts, heldout_prompts, n_unsplit)``: the distinct prompts of ``cfg.data``'s pairs in file order,
    on either side of :func:`split_pairs`; ``n_unsplit`` counts prompts of rows that passed validation but not
    tokenization (on neither side: DPO never sees them)."""
    from jaxppo.data import load_rows

    arrays, group, _ = load_pairs(cfg, tokenizer)
    loaded_rows = {p.index: p.prompt for p in load_rows(cfg.data).rows}   # read again: cheap next to tokenizing
    train_rows, eval_rows = split_pairs(group, cfg.data)
    index = np.asarray(arrays["index"])
    held_idx = {int(i) for i in index[eval_rows]}
    train_idx = {int(i) for i in index[train_rows]}
    train, held, other = {}, {}, {}
    for i, prompt in loaded_rows.items():    # file order; a prompt is keyed by its JSON text, as in load_pairs
        key = json.dumps(prompt, sort_keys=True, default=str)
        side = held if i in held_idx else train if i in train_idx else other
        side.setdefault(key, prompt)
    other = {k: v for k, v in other.items() if k not in train and k not in held}
    return list(train.values()), list(held.values()), len(other)


def reference_logps(arrays: dict[str, np.ndarray], *, model_path: str, model: Any, cache_dir: Any,
                    batch_size: int, report: Any = None, packing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Summed reference log-probs ``(chosen [N], rejected [N])`` via the cached behaviour log-prob pass
    (``jaxppo.data.behaviour.fill_behaviour_logprobs`` on the ``[2N]`` stack chosen-then-rejected)."""
    from jaxppo.data.behaviour import fill_behaviour_logprobs

    n = arrays["prompt_ids"].shape[0]
    stack = {"prompt_ids": np.concatenate([arrays["prompt_ids"]] * 2),
             "prompt_mask": np.concatenate([arrays["prompt_mask"]] * 2),
             "response_ids": np.concatenate([arrays["chosen_ids"], arrays["rejected_ids"]]),
             "response_mask": np.concatenate([arrays["chosen_mask"], arrays["rejected_mask"]])}
    stack["behaviour_logprobs"] = np.zeros(stack["response_ids"].shape, np.float32)
    stack["has_behaviour"] = np.zeros(2 * n, bool)
    out = fill_behaviour_logprobs(stack, model_path=model_path, model=model, cache_dir=cache_dir,
                                  batch_size=batch_size, report=report, packing=packing)
    sums = (out["behaviour_logprobs"] * stack["response_mask"]).sum(axis=1).astype(np.float32)
    return sums[:n], sums[n:]


def build_dpo_run(cfg: Any, *, devices=None) -> DPORun:
    """Everything a DPO run needs (see the module doc)."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxppo.data.behaviour import default_cache_dir
    from jaxppo.hf.from_config import load_tokenizer_of
    from jaxppo.models.lora import spec_from_config
    from jaxppo.optim import (
        init_optimizer,
        lr_schedule,
        make_optimizer,
        replicate_leaves,
        shardings_of,
    )
    from jaxppo.parallel import batch_sharding
    from jaxppo.trainer.policy import load_policy, split_policy

    devices = list(jax.devices() if devices is None else devices)
    check_dpo_config(cfg, len(devices))
    tokenizer = load_tokenizer_of(cfg.model)
    arrays, group, report = load_pairs(cfg, tokenizer)   # bad data stops the run before the model loads
    loaded = load_policy(cfg, devices, tokenizer=tokenizer)
    mesh, model_path, model = loaded.mesh, loaded.model_path, loaded.model
    cache_dir = cfg.data.cache_dir if cfg.data.cache_dir is not None else default_cache_dir(cfg.data.path)
    arrays["ref_chosen"], arrays["ref_rejected"] = reference_logps(
        arrays, model_path=model_path, model=model, cache_dir=cache_dir, batch_size=cfg.data.behaviour_batch_size,
        report=report, packing=cfg.data.packing)
    arrays["group_id"] = group
    train_rows, eval_rows = split_pairs(group, cfg.data)
    check_rows(report, len(train_rows), len(eval_rows), min_train=cfg.dpo.batch_size, min_train_key="dpo.batch_size",
               eval_fraction=cfg.data.eval_fraction, unit="pairs")
    train = {k: np.asarray(v)[train_rows] for k, v in arrays.items()}
    heldout = {k: np.asarray(v)[eval_rows] for k, v in arrays.items()}

    pol = split_policy(model)
    params = pol.params
    spec = spec_from_config(cfg.model.lora)
    total = cfg.trainer.total_steps
    tx = make_optimizer(cfg.actor.optim, total, params)   # 16-bit parameters: a float32 master copy
    rep = NamedSharding(mesh, PartitionSpec())
    scalar = lambda v, dt: from_host(np.asarray(v, dt), rep)  # noqa: E731
    state = DPOState(step=scalar(0, jnp.int32), actor=params, actor_opt=init_optimizer(tx, params, mesh),
                     lr_scale=scalar(1.0, jnp.float32), nan_total=scalar(0, jnp.int32),
                     nan_streak=scalar(0, jnp.int32), data_cursor=scalar(0, jnp.int32))
    state = replicate_leaves(state, mesh)
    batch_sh = {k: batch_sharding(mesh, train[k].ndim) for k in (KTO_KEYS if cfg.dpo.loss_type == "kto" else PAIR_KEYS)}
    programs = None
    if cfg.data.packing:   # each batch's [2B] stack as packed rows, planned on the host (make_batch)
        from jaxppo.models.packing import ProgramLog

        batch_sh["packed"] = plan_shardings(mesh)
        programs = ProgramLog()
    step = make_dpo_step(pol.graphdef, tx, lr_schedule(cfg.actor.optim, total), DPOHParams.from_config(cfg.dpo),
                         state_shardings=shardings_of(state), batch_shardings=batch_sh, mesh=mesh, base=pol.base,
                         lora_dropout=0.0 if spec is None else spec.dropout, seed=cfg.trainer.seed)
    return DPORun(cfg=cfg, mesh=mesh, tokenizer=tokenizer, model_path=model_path, parts=pol, state=state, step=step,
                  train=train, heldout=heldout, batch_shardings=batch_sh, report=report, programs=programs)


def batch_rows(run: DPORun, cursor: int) -> np.ndarray:
    """The training pairs at stream positions ``cursor ..`` (``jaxppo.trainer.dpo.steps.batch_indices``)."""
    return batch_indices(run.cfg.data.seed, cursor, run.cfg.dpo.batch_size, run.train["prompt_ids"].shape[0])


def make_batch(run: DPORun, cursor: int, rows: np.ndarray | None = None) -> dict[str, jax.Array]:
    """The training rows at stream positions ``cursor ..`` on the mesh (every key of the run's batch shardings);
    ``rows``: their :func:`batch_rows` when the caller has them. With ``data.packing`` the batch also carries
    ``"packed"``: its pairs' packed rows for the step's micro-batches (``steps.plan_pairs``), planned here on the
    host; a new packed shape (a new compiled program) is logged."""
    from jaxppo.parallel import batch_divisor

    idx = batch_rows(run, cursor) if rows is None else rows
    host = {k: run.train[k][idx] for k in run.batch_shardings if k != "packed"}
    batch = {k: from_host(v, run.batch_shardings[k]) for k, v in host.items()}
    if "packed" in run.batch_shardings:
        d = run.cfg.dpo
        plan = plan_pairs(host, int(d.micro_batch_size or d.batch_size), multiple_of=batch_divisor(run.mesh))
        if run.programs is not None:
            new = program_shape(plan) not in run.programs.shapes
            run.programs.add(plan)
            if new:
                run.programs.log("DPO update")
        batch["packed"] = type(plan)(*(from_host(a, sh) for a, sh in zip(plan, run.batch_shardings["packed"])))
    return batch


def pair_metrics(run: DPORun, params: Any, arrays: dict[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
    """TRL's DPO metrics of ``params`` over all pairs of ``arrays`` (``loss`` = mean ``dpo_loss``) and the
    per-pair outcome ``r_c > r_r`` (implicit rewards, see the module doc)."""
    from jaxppo.ops import dpo_loss

    d = run.cfg.dpo
    pc, pr = pair_logps(run.actor_gd, run.params_of(params), arrays, run.cfg.data.behaviour_batch_size,
                        packing=run.cfg.data.packing)
    if d.loss_type == "kto":   # right: a desirable row's implicit reward above the reference point, else below
        from jaxppo.ops.kto import kto_pair_loss

        loss, m = kto_pair_loss(pc, pr, arrays["ref_chosen"], arrays["ref_rejected"], arrays["desirable"],
                                beta=d.beta, desirable_weight=d.desirable_weight,
                                undesirable_weight=d.undesirable_weight)
        out = {k: host_scalar(v) for k, v in m.items()}
        out["loss"] = host_scalar(loss)
        above = pc - arrays["ref_chosen"] > out["kl"]
        right = (above == np.asarray(arrays["desirable"])).astype(np.float64)
        out["rewards/accuracies"] = float(right.mean()) if len(right) else float("nan")
        return out, right
    lengths = dict(chosen_length=arrays["chosen_mask"].sum(1), rejected_length=arrays["rejected_mask"].sum(1))
    loss, m = dpo_loss(pc, pr, arrays["ref_chosen"], arrays["ref_rejected"], beta=d.beta, loss_type=d.loss_type,
                       label_smoothing=d.label_smoothing, rpo_alpha=d.rpo_alpha, **lengths)
    out = {k: host_scalar(v) for k, v in m.items()}
    out["loss"] = host_scalar(jnp.mean(loss))
    right = (d.beta * (pc - arrays["ref_chosen"]) > d.beta * (pr - arrays["ref_rejected"])).astype(np.float64)
    return out, right


class DPO(Algorithm):
    """Offline DPO on the harness (module doc)."""

    rollback_fields = ROLLBACK_FIELDS
    count_names = ("n_train_pairs", "n_heldout_pairs")

    def __init__(self, run: DPORun, start: RunStart):
        super().__init__(run, start)
        d = self.cfg.dpo
        self._tokens_per_step = d.batch_size * 2 * (run.train["prompt_ids"].shape[1] + run.train["chosen_ids"].shape[1])
        # cumulative answer tokens (chosen + rejected, unpadded) of the pairs the updates consumed, across resumes
        self.tokens_consumed = float(start.meta.get("tokens_consumed", 0.0))
        self._batch_tokens = 0.0

    def heldout_sequences(self) -> dict[str, np.ndarray]:
        """The held-out prompts with their chosen answers (the perplexity guard's sequences)."""
        h = self.run.heldout
        return {"prompt_ids": h["prompt_ids"], "prompt_mask": h["prompt_mask"], "response_ids": h["chosen_ids"],
                "response_mask": h["chosen_mask"]}

    def n_rows(self) -> tuple[int, int]:
        return int(self.run.train["prompt_ids"].shape[0]), int(self.run.heldout["prompt_ids"].shape[0])

    @property
    def tokens_per_step(self) -> int:
        return self._tokens_per_step

    def before_step(self, state: DPOState, s: int):
        cursor = int(to_host(state.data_cursor))
        tr = self.run.train
        idx = batch_rows(self.run, cursor)
        self._batch_tokens = float(np.asarray(tr["chosen_mask"])[idx].sum() + np.asarray(tr["rejected_mask"])[idx].sum())
        return state, make_batch(self.run, cursor, idx)

    def step_extras(self, state: DPOState, step_no: int, metrics: dict[str, float]) -> None:
        """``train/samples_consumed`` (pairs: ``step x dpo.batch_size``, NaN-skipped steps included, as PPO) and
        ``train/tokens_consumed`` (chosen + rejected answer tokens of those pairs)."""
        self.tokens_consumed += self._batch_tokens
        metrics["train/samples_consumed"] = float(step_no * self.cfg.dpo.batch_size)
        metrics["train/tokens_consumed"] = self.tokens_consumed

    def step(self, state: DPOState, batch):
        return self.run.step(state, batch)

    @property
    def can_evaluate(self) -> bool:
        return self.run.heldout["prompt_ids"].shape[0] > 0

    def initial_metrics(self) -> dict[str, float]:
        """Step 0: the held-out pair metrics of the reference itself, the start of a sweep's accuracy curve.
        Every implicit reward is 0 up to float noise (the cached reference log-probs come from other batches), so
        the margins are ~0 and the step-0 accuracy is the share of pairs that noise puts right."""
        return self.evaluate(self.run.ref_params)

    def evaluate(self, params) -> dict[str, float]:
        ev, _ = pair_metrics(self.run, params, self.run.heldout)
        return {f"eval/{k}": v for k, v in ev.items()}

    def meta(self) -> dict[str, Any]:
        return {"data": {"n_train": int(self.run.train["prompt_ids"].shape[0]),
                         "n_heldout": int(self.run.heldout["prompt_ids"].shape[0])},
                "tokens_consumed": float(self.tokens_consumed)}

    def summary(self, state: DPOState, out: Path) -> dict[str, Any]:
        rep = self.run.report
        return {"ref_logps_cache": rep.notes.get("behaviour_logprobs_cache", "off") if rep is not None else "off",
                "train/samples_consumed": int(self.cfg.trainer.total_steps * self.cfg.dpo.batch_size),
                "train/tokens_consumed": float(self.tokens_consumed)}

    def final_evaluation(self, state: DPOState, out: Path) -> dict[str, Any]:
        """Final held-out pair accuracy (with a bootstrap interval over held-out prompts), training-pair accuracy
        and the reward evaluation."""
        from jaxppo.rewards.model_training import grouped_bootstrap_accuracy

        run = self.run
        summary: dict[str, Any] = {}
        tr, _ = pair_metrics(run, state.actor, run.train)
        summary.update({f"train/{k}": v for k, v in tr.items()})
        if run.heldout["prompt_ids"].shape[0] > 0:
            ev, right = pair_metrics(run, state.actor, run.heldout)
            lo, hi = grouped_bootstrap_accuracy(right, run.heldout["group_id"], seed=self.cfg.trainer.seed)
            summary.update({f"eval/{k}": v for k, v in ev.items()})
            summary["eval/rewards/accuracies_ci95"] = [lo, hi]
        else:
            logger.warning("no held-out pairs (data.eval_fraction=0?): no held-out pair accuracy")
        _reward_eval(run, state, out, summary)
        return summary

    def plot(self, metrics_jsonl: Path, plots_dir: Path, summary: dict[str, Any]) -> list[Path]:
        from jaxppo.trainer.dpo.plots import plot_dpo

        return plot_dpo(metrics_jsonl, plots_dir, summary)


def train_dpo(cfg: Any, *, run: DPORun | None = None) -> dict[str, Any]:
    """Run the DPO job described by ``cfg``; returns (and writes) the summary dict."""
    return fit_dpo(cfg, run=run)[0]


def fit_dpo(cfg: Any, *, run: DPORun | None = None) -> tuple[dict[str, Any], DPOState]:
    """:func:`train_dpo` that also returns the final ``DPOState``: ``(summary, state)``. ``run`` (default
    ``build_dpo_run(cfg)``) is only read: its ``state`` is the initial state."""
    return fit_with(cfg, DPO, build_dpo_run, run)


def _reward_eval(run: DPORun, state: DPOState, out: Path, summary: dict[str, Any]) -> None:
    """The PPO trainer's final before/after evaluation on the held-out prompts (module doc,
    ``jaxppo.trainer.evaluation.before_after``), skipped with a warning without the configured reward model."""
    from jaxppo.models.eos import eos_ids
    from jaxppo.trainer.evaluation import before_after, heldout_eval

    cfg = run.cfg
    rc = cfg.reward
    if rc.kind == "model" and (not rc.model_path or not Path(rc.model_path).exists()):
        msg = (f"reward.kind=model but there is no reward model at reward.model_path={rc.model_path!r}: skipping the "
               "held-out reward evaluation (train one with `python -m jaxppo.reward train`); pair accuracy only")
        warn(logger, msg)
        summary["eval/reward_skipped"] = msg
        return
    ref = run.reference()
    ev = heldout_eval(cfg, run.heldout, run.tokenizer, eos_ids(ref.config, run.tokenizer))
    summary.update(before_after(ev, out, lambda: ev(ref, ref), lambda: ev(run.policy(state.actor), ref)))


__all__ = ["DPO", "DPORun", "ROLLBACK_FIELDS", "batch_rows", "build_dpo_run", "check_dpo_config", "fit_dpo", "load_pairs",
           "make_batch", "pair_metrics", "reference_logps", "train_dpo"]
