"""Saving, loading and scoring with a trained reward model.

A reward-model folder holds:

- ``config.json``: the trunk's Hugging Face style config (``LMConfig.to_hf()``);
- ``reward_model.safetensors``: every parameter of the NNX ``RewardModel`` under its dotted path
  (e.g. ``model.layers.q``, ``score_head.kernel``), float tensors only, no pickle;
- ``reward_config.json``: how texts are tokenized for it (prompt/response lengths, truncation,
  chat template, layer layout) and where the trunk came from;
- the tokenizer files (``tokenizer.json`` ...), so the folder is self-contained.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxppo.parallel.host import is_main_process, to_host
from jaxppo.data.tokenize import encode_prompts, encode_responses, fit_prompt, fit_response, left_pad, pad_id_of, right_pad

WEIGHTS = "reward_model.safetensors"
META = "reward_config.json"


def _flat_params(model: nnx.Module) -> list[tuple[str, nnx.Variable]]:
    return [(".".join(str(p) for p in path), var) for path, var in nnx.to_flat_state(nnx.state(model))]


def save_reward_model(model: Any, out_dir: str | Path, *, tokenizer: Any = None, meta: dict | None = None) -> Path:
    """Write ``model`` (a ``jaxppo.models.RewardModel``) to ``out_dir`` (see the module docstring). Under several
    processes every process reads the weights (``to_host``: a collective for sharded ones), only process 0 writes."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    tensors = {name: np.ascontiguousarray(to_host(var.get_value())) for name, var in _flat_params(model)}
    if not is_main_process():
        return out
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / (WEIGHTS + ".tmp")), metadata={"format": "jaxppo-reward-model"})
    (out / (WEIGHTS + ".tmp")).replace(out / WEIGHTS)
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2), encoding="utf-8")
    info = dict(meta or {})
    info.setdefault("scan_layers", bool(getattr(model.config, "scan_layers", True)))
    (out / META).write_text(json.dumps(info, indent=2), encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


def check_reward_model_dir(path: str | Path | None, key: str = "reward.model_path") -> Path:
    """The folder ``path`` (``key`` in the config) when it holds a reward model (``config.json``, the weights and
    ``reward_config.json``); FileNotFoundError / ValueError naming ``key`` and what is missing otherwise. Reads no
    weights: the commands call it before loading any data."""
    if not path:
        raise ValueError(f"{key} is not set: give the folder written by `python -m jaxppo.reward train`")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{key}={path}: no such folder (relative paths are resolved from {Path.cwd()}; "
                                "write one with `python -m jaxppo.reward train`)")
    for name in ("config.json", WEIGHTS, META):
        if not (root / name).is_file():
            raise FileNotFoundError(f"{root} is not a reward-model folder: {name} is missing "
                                    "(write one with `python -m jaxppo.reward train`)")
    return root


def load_reward_model(path: str | Path) -> tuple[Any, dict]:
    """``(RewardModel, reward_config dict)`` from a folder written by :func:`save_reward_model`.

    Raises FileNotFoundError / ValueError naming the missing file or the mismatching tensors.
    """
    from safetensors.numpy import load_file

    from jaxppo.models import LMConfig, RewardModel

    root = check_reward_model_dir(path)
    meta = json.loads((root / META).read_text(encoding="utf-8"))
    cfg = LMConfig.from_hf(json.loads((root / "config.json").read_text(encoding="utf-8")),
                           scan_layers=bool(meta.get("scan_layers", True)))
    model = nnx.eval_shape(lambda: RewardModel(cfg, rngs=nnx.Rngs(0)))
    tensors = load_file(str(root / WEIGHTS))
    expected = dict(_flat_params(model))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{root / WEIGHTS}: tensors do not match the reward model of config.json "
                         f"(missing: {missing[:8]}, unexpected: {unexpected[:8]})")
    for name, var in expected.items():
        value = tensors[name]
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{root / WEIGHTS}: {name} has shape {value.shape}, expected {tuple(var.shape)}")
        var.set_value(jnp.asarray(value, dtype=var.dtype))
    return model, meta


def tokenize_pairs_for_scoring(tokenizer: Any, prompts: Sequence[str], responses: Sequence[str], *,
                               max_prompt_length: int, max_response_length: int, truncation: str = "left",
                               chat_template: bool = False) -> dict[str, np.ndarray]:
    """``input_ids`` / ``attention_mask`` [N, P+R] of ``concat(prompt, response)`` for scoring.

    Over-long texts are always truncated here (``truncation`` picks the side of the prompt; with
    ``skip``/``error`` the prompt's start is cut): a reward must be given for every response.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
    side = truncation if truncation in ("left", "right") else "left"
    p_tok = [fit_prompt(p, max_prompt_length, side)[0] for p in encode_prompts(tokenizer, prompts, chat_template=chat_template)]
    r_tok = [fit_response(r, max_response_length, side)[0] for r in encode_responses(tokenizer, responses)]
    pad = pad_id_of(tokenizer)
    pi, pm = left_pad(p_tok, max_prompt_length, pad)
    ri, rm = right_pad(r_tok, max_response_length, pad)
    return {"input_ids": np.concatenate([pi, ri], 1), "attention_mask": np.concatenate([pm, rm], 1)}


@functools.partial(jax.jit, static_argnums=0)
def _scores(graphdef, state, input_ids, attention_mask):
    return nnx.merge(graphdef, state)(input_ids, attention_mask)


def score_arrays(model: Any, input_ids: np.ndarray, attention_mask: np.ndarray, *, batch_size: int = 64) -> np.ndarray:
    """Reward-model scores [N] float32 of token arrays (jitted, one static batch shape)."""
    n = input_ids.shape[0]
    if n == 0:
        return np.zeros((0,), np.float32)
    graphdef, state = nnx.split(model)
    bs = min(batch_size, n)
    out = []
    for s in range(0, n, bs):
        ids, mask = input_ids[s:s + bs], attention_mask[s:s + bs]
        m = ids.shape[0]
        if m < bs:
            ids = np.concatenate([ids, np.repeat(ids[:1], bs - m, 0)])
            mask = np.concatenate([mask, np.repeat(mask[:1], bs - m, 0)])
        out.append(to_host(_scores(graphdef, state, ids, mask))[:m])
    return np.concatenate(out).astype(np.float32)


class RewardModelScorer:
    """``scorer(prompts, responses) -> np.ndarray float32 [N]`` with a loaded reward model."""

    def __init__(self, model: Any, tokenizer: Any, meta: dict, *, batch_size: int = 64):
        self.model, self.tokenizer, self.meta, self.batch_size = model, tokenizer, meta, batch_size

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        t = tokenize_pairs_for_scoring(self.tokenizer, prompts, responses,
                                       max_prompt_length=int(self.meta["max_prompt_length"]),
                                       max_response_length=int(self.meta["max_response_length"]),
                                       truncation=self.meta.get("truncation", "left"),
                                       chat_template=bool(self.meta.get("chat_template", False)))
        return score_arrays(self.model, t["input_ids"], t["attention_mask"], batch_size=self.batch_size)


def load_reward_scorer(path: str | Path, *, batch_size: int = 64) -> RewardModelScorer:
    """A scorer for the reward-model folder ``path`` (model, tokenizer and tokenization settings)."""
    from transformers import AutoTokenizer

    model, meta = load_reward_model(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return RewardModelScorer(model, tokenizer, meta, batch_size=batch_size)
