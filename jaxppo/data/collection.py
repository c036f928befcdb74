"""Collecting an offline dataset (the library side of ``python -m jaxppo.collect``).

``collect(cfg)`` builds an offline dataset: ``rollout.n`` responses per prompt of the prompt file ``rollout.prompts``
are sampled from the behaviour model ``model.path`` with the KV-cache generator
(``rollout.temperature`` / ``top_k`` / ``top_p`` / ``max_new_tokens``), their token log-probs under
the sampling distribution are recorded, and each response is scored by ``reward.kind`` (a reward
function or a trained reward model). Writes

- ``DIR/data.parquet`` (or ``data.jsonl`` with ``rollout.output_format=jsonl``): columns ``prompt``,
  ``response``, ``prompt_ids`` (the model input: chat template applied when ``rollout.chat_template``,
  truncated to ``data.max_prompt_length``), ``response_ids`` (up to and including EOS), ``behaviour_logprobs``
  (one per response token), ``score``, ``group_id`` (the prompt's number), ``sample`` (0..n-1),
  ``finished`` (ended with EOS); it loads back with ``data.schema=scored``;
- ``DIR/metadata.json``: model, sampling parameters, seed, reward, counts and timings.

Prompts longer than ``data.max_prompt_length`` tokens are truncated by ``data.truncation``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxppo.config import Config, to_dict
from jaxppo.data.conversation import Text, apply_chat_template_file, check_prompt, parse_messages, to_json
from jaxppo.data.report import DataError, DataReport, RowSkip
from jaxppo.data.tokenize import encode_prompts, fit_prompt, left_pad, pad_id_of
from jaxppo.models.eos import eos_ids, eos_tuple
from jaxppo.parallel.host import is_main_process, to_host


def read_prompts(path: str | None, max_prompts: int | None = None) -> list[Text]:
    """Prompts of a text file (one a line; blank lines and lines starting with ``#`` ignored) or of a
    JSON-lines file (``.jsonl``: objects with a ``prompt`` string, or a ``prompt`` list of chat messages
    ``{"role", "content"}`` ending with a user turn, rendered by the chat template; one kind per file)."""
    if not path:
        raise DataError("rollout.prompts is not set: give a prompt file (one prompt a line, or jsonl with 'prompt')")
    p = Path(path)
    if not p.is_file():
        raise DataError(f"prompt file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = p.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{p} line {line}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    prompts: list[str] = []
    if p.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p} line {lineno}: not valid JSON ({e})") from None
            if isinstance(item, dict) and isinstance(item.get("prompt"), list):
                try:
                    prompts.append(check_prompt(parse_messages(item["prompt"], "prompt")))
                except RowSkip as e:
                    raise DataError(f"{p} line {lineno}: {e.message} ({e.reason})") from None
                continue
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
                raise DataError(f"{p} line {lineno}: expected an object with a non-empty 'prompt' string "
                                "or a list of chat messages")
            prompts.append(item["prompt"])
        if len({isinstance(x, str) for x in prompts}) > 1:
            raise DataError(f"{p} mixes plain-text prompts and chat-message prompts; use one kind per file")
    else:
        prompts = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if max_prompts is not None:
        prompts = prompts[:max_prompts]
    if not prompts:
        raise DataError(f"{p} has no prompts")
    return prompts


def sample_responses(model: Any, prompt_ids: Sequence[Sequence[int]], *, max_prompt_length: int, n: int,
                     batch_size: int, key: jax.Array, max_new_tokens: int, temperature: float, top_k: int,
                     top_p: float, eos_token_id: int | Sequence[int] | None, pad_id: int,
                     progress: bool = False) -> list[dict]:
    """``n`` samples for each prompt; one dict per sample with ``prompt_index``, ``sample``,
    ``response_ids`` (through EOS), ``behaviour_logprobs`` and ``finished``.

    Rows are generated in batches of ``batch_size`` (the last batch padded with copies of its first
    row, so a single shape is compiled); batch ``b`` uses ``jax.random.fold_in(key, b)``.
    """
    from jaxppo.models import generate

    jobs = [(i, k) for i in range(len(prompt_ids)) for k in range(n)]
    eos = eos_tuple(eos_token_id)
    out: list[dict] = []
    bs = min(batch_size, len(jobs))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="collect", unit="resp")
    for b, s in enumerate(range(0, len(jobs), bs)):
        chunk = jobs[s:s + bs]
        m = len(chunk)
        padded = chunk + [chunk[0]] * (bs - m)
        ids, mask = left_pad([prompt_ids[i] for i, _ in padded], max_prompt_length, pad_id)
        gen = generate(model, ids, mask, jax.random.fold_in(key, b), max_new_tokens=max_new_tokens,
                       temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
                       pad_token_id=pad_id)
        toks, lps, gmask = to_host((gen.tokens, gen.logprobs, gen.mask))
        for j, (i, k) in enumerate(chunk):
            keep = gmask[j].astype(bool)
            n_real = int(keep.sum())
            if not keep[:n_real].all():
                raise RuntimeError("generate returned a response mask with holes; expected 1s then 0s")
            r_ids = toks[j, :n_real].astype(np.int32)
            out.append({"prompt_index": i, "sample": k, "response_ids": r_ids,
                        "behaviour_logprobs": lps[j, :n_real].astype(np.float32),
                        "finished": bool(n_real and int(r_ids[-1]) in eos)})
        if bar is not None:
            bar.update(m)
    if bar is not None:
        bar.close()
    return out


def collect(cfg: Config, reward_fn: Callable[[Sequence[str], Sequence[str]], np.ndarray], *,
            progress: bool = True) -> dict:
    """Run the collection described by ``cfg`` and write ``cfg.trainer.output_dir``; returns the metadata.

    ``reward_fn(prompts, responses) -> float32 [N]`` scores the samples (the caller builds it, e.g.
    ``jaxppo.rewards.reward_fn_from_config(cfg.reward)``: data sits below rewards)."""
    from jaxppo.hf.from_config import load_model, load_tokenizer_of
    from jaxppo.hf.paths import resolve_model_path

    t0 = time.perf_counter()
    ro, dc = cfg.rollout, cfg.data
    out_dir = Path(cfg.trainer.output_dir)
    prompts = read_prompts(ro.prompts, ro.max_prompts)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = apply_chat_template_file(load_tokenizer_of(cfg.model), dc.chat_template_file)

    report = DataReport(source=str(ro.prompts), rows_seen=len(prompts))
    encoded = encode_prompts(tokenizer, prompts, chat_template=ro.chat_template)
    trunc = dc.truncation if dc.truncation in ("left", "right") else "left"
    fitted = []
    for i, ids in enumerate(encoded):
        if not ids:
            raise DataError(f"prompt {i} of {ro.prompts} tokenizes to no tokens")
        if len(ids) > dc.max_prompt_length and dc.truncation in ("error", "skip"):
            raise DataError(f"prompt {i} has {len(ids)} tokens > data.max_prompt_length={dc.max_prompt_length} "
                            f"(data.truncation={dc.truncation}); raise the length or use left/right truncation")
        ids2, cut = fit_prompt(ids, dc.max_prompt_length, trunc)
        if cut:
            report.truncate("prompt", cut)
        fitted.append(ids2)
    report.rows_kept = len(fitted)

    # the model is loaded last, after every check of the prompts and the reward config
    model = load_model(cfg.model, model_path)
    t_load = time.perf_counter() - t0

    pad = pad_id_of(tokenizer)
    eos = eos_tuple(eos_ids(model.config, tokenizer))
    t1 = time.perf_counter()
    samples = sample_responses(model, fitted, max_prompt_length=dc.max_prompt_length, n=ro.n,
                               batch_size=ro.batch_size, key=jax.random.PRNGKey(ro.seed),
                               max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_k=ro.top_k,
                               top_p=ro.top_p, eos_token_id=eos or None, pad_id=pad,
                               progress=progress)
    t_gen = time.perf_counter() - t1
    texts = [tokenizer.decode(s["response_ids"].tolist(), skip_special_tokens=True) for s in samples]
    row_prompts = [prompts[s["prompt_index"]] for s in samples]
    t2 = time.perf_counter()
    scores = np.asarray(reward_fn(row_prompts, texts), dtype=np.float32)
    t_score = time.perf_counter() - t2
    if scores.shape != (len(samples),) or not np.isfinite(scores).all():
        raise ValueError(f"reward {cfg.reward.kind!r} returned {scores.shape} scores with non-finite values "
                         f"for {len(samples)} responses")

    columns = {
        "prompt": [to_json(x) for x in row_prompts],
        "response": texts,
        "prompt_ids": [fitted[s["prompt_index"]] for s in samples],
        "response_ids": [s["response_ids"].tolist() for s in samples],
        "behaviour_logprobs": [s["behaviour_logprobs"].tolist() for s in samples],
        "score": scores.tolist(),
        "group_id": [s["prompt_index"] for s in samples],
        "sample": [s["sample"] for s in samples],
        "finished": [s["finished"] for s in samples],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = out_dir / ("data.parquet" if ro.output_format == "parquet" else "data.jsonl")
    if is_main_process():   # several processes: every one sampled the same rows, process 0 writes
        _write_table(columns, data_file)
    lengths = np.array([len(r) for r in columns["response_ids"]])
    meta = {
        "data_file": data_file.name,
        "model": cfg.model.path, "model_file": model_path, "tokenizer": cfg.model.tokenizer_path or cfg.model.path,
        "prompts_file": ro.prompts, "n_prompts": len(prompts), "n_responses": len(samples),
        "sampling": {"n": ro.n, "temperature": ro.temperature, "top_k": ro.top_k, "top_p": ro.top_p,
                     "max_new_tokens": ro.max_new_tokens, "chat_template": ro.chat_template,
                     "max_prompt_length": dc.max_prompt_length, "batch_size": ro.batch_size,
                     "eos_token_ids": list(eos), "pad_token_id": pad},
        "seed": ro.seed,
        "reward": {"kind": cfg.reward.kind, "model_path": cfg.reward.model_path,
                   "target_length": cfg.reward.target_length, "format_pattern": cfg.reward.format_pattern},
        "logprobs": "log-prob of each sampled token under the sampling distribution (temperature/top-k/top-p "
                    "applied); equal to the model's own log-probs when temperature=1, top_k=0, top_p=1",
        "stats": {"score_mean": float(scores.mean()), "score_std": float(scores.std()),
                  "response_length_mean": float(lengths.mean()),
                  "finished_fraction": float(np.mean(columns["finished"])),
                  "tokens_per_s": float(lengths.sum() / max(t_gen, 1e-9))},
        "timing_s": {"load": t_load, "generate": t_gen, "score": t_score, "total": time.perf_counter() - t0},
        "prompt_report": report.to_dict(),
        "config": to_dict(cfg),
    }
    if is_main_process():
        (out_dir / "metadata.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def _write_table(columns: dict[str, list], path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    if path.suffix == ".parquet":
        tmp = path.with_name(path.name + ".tmp")
        datasets.Dataset.from_dict(columns).to_parquet(str(tmp))
        tmp.replace(path)
    else:
        n = len(next(iter(columns.values())))
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({k: v[i] for k, v in columns.items()}, ensure_ascii=False) + "\n")


__all__ = ["collect", "read_prompts", "sample_responses"]
