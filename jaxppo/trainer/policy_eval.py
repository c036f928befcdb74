"""Evaluating a saved policy against the reference (the library side of ``python -m jaxppo.evaluate``; the module
doc of :mod:`jaxppo.evaluate` describes the outputs).

``evaluate(cfg, policy)`` loads the reference ``model.path`` and the policy (a Hugging Face folder or ``.gguf``;
default the reference itself) on the mesh, takes the held-out rows of training (:func:`jaxppo.data.split.split_data`), runs the
trainers' evaluation (:func:`jaxppo.trainer.evaluation.heldout_eval`) on both, the held-out perplexities, and
:func:`jaxppo.trainer.evaluation.compare` (paired per-prompt bootstrap of the gain); writes ``eval.json`` and
``eval_samples.jsonl`` under ``trainer.output_dir``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np


from jaxppo.config import Config, to_dict
from jaxppo.data.split import split_data
from jaxppo.parallel.host import is_main_process

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def resolve_policy_path(policy: str | None, model_path: str) -> str:
    """The policy checkpoint: ``model_path`` when ``policy`` is None, else the folder/.gguf it names."""
    if policy is None:
        return model_path
    p = Path(policy).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"--policy {policy} does not exist (give a Hugging Face folder such as a training "
                                "run's <output_dir>/hf, or a .gguf file)")
    if p.is_dir() and not (p / "config.json").is_file():
        hint = (" (it looks like an Orbax checkpoint; use the run's hf/ export)"
                if (p / "_CHECKPOINT_METADATA").exists() or p.name == "checkpoints" else "")
        raise FileNotFoundError(f"--policy {policy}: no config.json, not a Hugging Face model folder{hint}")
    if p.is_file() and p.suffix != ".gguf":
        raise ValueError(f"--policy {policy}: expected a Hugging Face model folder or a .gguf file")
    return str(p.resolve())


def check_same_vocab(policy: Any, reference: Any, policy_path: str, reference_path: str,
                     tokenizer: Any = None) -> None:
    """ValueError when the policy's vocabulary (model size, or its own tokenizer files) differs."""
    vp, vr = int(policy.config.vocab_size), int(reference.config.vocab_size)
    if vp != vr:
        raise ValueError(f"vocabulary mismatch: policy {policy_path} has vocab_size={vp} but the reference "
                         f"{reference_path} has vocab_size={vr}; the policy must be trained from model.path")
    p = Path(policy_path)
    if tokenizer is not None and p.is_dir() and any((p / f).is_file() for f in _TOKENIZER_FILES):
        from jaxppo.hf import load_tokenizer

        if load_tokenizer(p).get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"vocabulary mismatch: the tokenizer saved in {policy_path} differs from the reference "
                             f"tokenizer (model.tokenizer_path or model.path)")


def heldout_pair_accuracy(pairs_cfg: Config, policy: Any, reference: Any, *, policy_path: str,
                          reference_path: str, seed: int = 0) -> dict[str, Any]:
    """Implicit-reward accuracy of ``policy`` against ``reference`` on the held-out preference pairs of
    ``pairs_cfg`` (a DPO config: its ``data.*`` pairs and by-prompt split, :func:`jaxppo.trainer.dpo.algorithm
    .split_pairs`).

    ``r(x, y) = Σ_t log π(y_t | x, y_<t) − Σ_t log π_ref(y_t | x, y_<t)`` over the answer's tokens (as tokenized by
    ``pairs_cfg.data``); a pair is right when ``r(x, y_chosen) > r(x, y_rejected)``. For a DPO policy this is its
    ``eval/rewards/accuracies`` (β > 0 scales both sides). Returns ``eval/pair_accuracy``, its percentile bootstrap
    95% interval resampling held-out prompts (``eval/pair_accuracy_ci95``,
    :func:`jaxppo.rewards.model_training.grouped_bootstrap_accuracy` with ``seed``), ``n_heldout_pairs`` and
    ``n_heldout_pair_prompts``. The summed log-probs go through the cached behaviour pass (one cache entry per
    model).
    """
    from jaxppo.data.behaviour import default_cache_dir
    from jaxppo.hf.from_config import load_tokenizer_of
    from jaxppo.rewards.model_training import grouped_bootstrap_accuracy
    from jaxppo.trainer.dpo.algorithm import load_pairs, reference_logps, split_pairs

    if pairs_cfg.data.schema != "preference":
        raise ValueError(f"--pairs: the config's data.schema must be preference (pairs), got {pairs_cfg.data.schema!r}")
    tokenizer = load_tokenizer_of(pairs_cfg.model)
    arrays, group, _ = load_pairs(pairs_cfg, tokenizer)
    _, eval_rows = split_pairs(group, pairs_cfg.data)
    if len(eval_rows) == 0:
        raise ValueError(f"--pairs: no held-out pairs in {pairs_cfg.data.path} (data.eval_fraction="
                         f"{pairs_cfg.data.eval_fraction})")
    held = {k: np.asarray(v)[eval_rows] for k, v in arrays.items()}
    cache = (pairs_cfg.data.cache_dir if pairs_cfg.data.cache_dir is not None
             else default_cache_dir(pairs_cfg.data.path))
    bs = pairs_cfg.data.behaviour_batch_size
    pol_c, pol_r = reference_logps(held, model_path=policy_path, model=policy, cache_dir=cache, batch_size=bs)
    ref_c, ref_r = reference_logps(held, model_path=reference_path, model=reference, cache_dir=cache, batch_size=bs)
    right = ((pol_c - ref_c) > (pol_r - ref_r)).astype(np.float64)
    groups = np.asarray(group)[eval_rows]
    lo, hi = grouped_bootstrap_accuracy(right, groups, seed=seed)
    return {"eval/pair_accuracy": float(right.mean()), "eval/pair_accuracy_ci95": [lo, hi],
            "n_heldout_pairs": int(len(right)), "n_heldout_pair_prompts": int(len(np.unique(groups)))}


def evaluate(cfg: Config, policy: str | None = None, *, devices: Sequence[Any] | None = None,
             pairs_cfg: Config | None = None) -> dict[str, Any]:
    """Run the evaluation described by the module doc; writes ``cfg.trainer.output_dir`` and returns eval.json."""
    import jax

    from jaxppo.hf.from_config import load_model, load_tokenizer_of
    from jaxppo.hf.paths import resolve_model_path
    from jaxppo.models.eos import eos_ids
    from jaxppo.trainer.mesh import check_mesh_size, mesh_from_config
    from jaxppo.rewards import reward_fn_from_config
    from jaxppo.trainer.evaluation import (
        compare,
        heldout_eval,
        heldout_perplexity,
        write_eval_samples,
    )

    t0 = time.perf_counter()
    out = Path(cfg.trainer.output_dir)
    ref_path = resolve_model_path(cfg.model.path)
    pol_path = resolve_policy_path(policy, ref_path)
    reward_fn = reward_fn_from_config(cfg.reward)  # fail early on a bad reward config
    tokenizer = load_tokenizer_of(cfg.model)

    devices = list(jax.devices() if devices is None else devices)
    n_mesh = check_mesh_size(cfg.mesh, len(devices), exact=False)
    mesh, rules = mesh_from_config(cfg.mesh, devices[:n_mesh])
    reference = load_model(cfg.model, ref_path, mesh=mesh, rules=rules)
    pol_model = reference if pol_path == ref_path else load_model(cfg.model, pol_path, mesh=mesh, rules=rules)
    check_same_vocab(pol_model, reference, pol_path, ref_path, tokenizer)

    _, heldout, _ = split_data(cfg, tokenizer)  # the trainer's rows and split (behaviour log-probs not needed)
    ev = heldout_eval(cfg, heldout, tokenizer, eos_ids(reference.config, tokenizer), reward_fn=reward_fn)
    if not ev.available:
        raise ValueError(f"no held-out prompts in {cfg.data.path}: data.eval_fraction={cfg.data.eval_fraction} "
                         "leaves none (set data.eval_fraction > 0 and a dataset with at least 2 prompt groups)")
    t_load = time.perf_counter() - t0

    t1 = time.perf_counter()
    ref_ev = ev(reference, reference)
    pol_ev = ev(pol_model, reference)
    t_gen = time.perf_counter() - t1
    bs, packing = cfg.data.behaviour_batch_size, cfg.data.packing
    ppl_ref = heldout_perplexity(reference, heldout, batch_size=bs, packing=packing)
    ppl_pol = ppl_ref if pol_model is reference else heldout_perplexity(pol_model, heldout, batch_size=bs,
                                                                        packing=packing)
    c = compare(ref_ev, pol_ev, ev.samples, seed=cfg.trainer.seed)
    result: dict[str, Any] = {
        "eval/reward_policy": c["reward_after"], "eval/reward_reference": c["reward_before"],
        "eval/reward_gain": c["gain"], "eval/reward_gain_ci95": c["gain_ci95"],
        "eval/kl": float(pol_ev["kl"]), "eval/perplexity": float(ppl_pol), "eval/perplexity_reference": float(ppl_ref),
        "eval/response_length_policy": float(pol_ev["response_length"]),
        "eval/response_length_reference": float(ref_ev["response_length"]),
        "n_prompts": c["n_prompts"], "samples_per_prompt": ev.samples,
        "n_heldout_rows": int(heldout["prompt_ids"].shape[0]),
        "policy": pol_path, "reference": ref_path, "reward": cfg.reward.kind,
        "time_s": {"load": t_load, "generate": t_gen, "total": time.perf_counter() - t0},
        "config": to_dict(cfg),
    }
    if pairs_cfg is not None:
        result.update(heldout_pair_accuracy(pairs_cfg, pol_model, reference, policy_path=pol_path,
                                            reference_path=ref_path, seed=cfg.trainer.seed))
        result["pairs_data"] = str(pairs_cfg.data.path)
    out.mkdir(parents=True, exist_ok=True)
    write_eval_samples(out / "eval_samples.jsonl", ref_ev, pol_ev, names=("reference", "policy"),
                       response_prefix="response_")
    if is_main_process():
        (out / "eval.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


__all__ = ["check_same_vocab", "evaluate", "heldout_pair_accuracy", "resolve_policy_path"]
