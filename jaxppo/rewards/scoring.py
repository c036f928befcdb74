"""Reward-model scoring of datasets (the library side of ``python -m jaxppo.reward score|to-scored``).

- :func:`score_dataset`: loads ``reward.model_path`` and scores ``data.path``: for ``data.schema=preference``
  the accuracy on all usable pairs, for ``scored`` data a score per (prompt, response) and, when the rows carry a
  score, the correlation with it. Writes ``trainer.output_dir/scores.jsonl`` and ``score_metrics.json``.
- :func:`preference_to_scored`: turns the preference pairs of ``data.path`` into a training-ready **scored** dataset
  ``trainer.output_dir/scored.jsonl``. The pairs pass the filter of ``reward train`` and ``jaxppo.dpo``
  (:func:`jaxppo.data.pipeline.load_preference_arrays`, with the policy's tokenizer and the ``data.*`` lengths), so
  a pair they skip is not written. Each distinct (prompt, response) is written **once**
  (:mod:`jaxppo.data.answers`): ``prompt``, ``response``, ``score``, ``group_id`` (per prompt, so the answers to
  one prompt form a group and a by-group split holds out the prompts DPO holds out), ``wins``, ``losses``, ``ties``
  and ``source_rows``, and **no** behaviour log-probs. The score is the reward model's (``reward.model_path`` set)
  or, without a reward model, the answer's win rate over its pairs (only ever chosen 1.0, only ever rejected 0.0).
  Text fields keep their form: strings stay strings, chat messages stay lists of messages (prompt messages; the
  response as its assistant message), so the policy's own chat template renders them at training time. Also
  writes ``to_scored_metrics.json``; the data report (every skip and truncation) is printed.

Conversational data (chat messages) is rendered with the reward model's saved tokenizer and its chat template
(see :mod:`jaxppo.data.conversation`).
"""


from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxppo.config import Config
from jaxppo.data.conversation import Text
from jaxppo.data.report import RowSkip
from jaxppo.data.schemas import PreferencePair
from jaxppo.data.tokenize import encode_rows, fit_prompt, fit_response, left_pad, pad_id_of, right_pad
from jaxppo.data.validation import require_rows
from jaxppo.parallel.host import is_main_process


def score_texts(scorer: Any, prompts: Sequence[Text],
                responses: Sequence[Text]) -> tuple[np.ndarray, dict[int, RowSkip]]:
    """Reward-model scores [N] float32 of (prompt, response) rows whose fields may be strings or chat
    messages, tokenized with the reward model's tokenizer and settings (``scorer.meta``) exactly like
    :meth:`RewardModelScorer.__call__ <jaxppo.rewards.model_io.RewardModelScorer.__call__>` does for
    strings. Rows that cannot be rendered get NaN and their :class:`RowSkip` in the returned dict."""
    from jaxppo.rewards.model_io import score_arrays

    meta = scorer.meta
    P, R = int(meta["max_prompt_length"]), int(meta["max_response_length"])
    side = meta.get("truncation", "left")
    side = side if side in ("left", "right") else "left"
    p_ids, (r_ids,), failures = encode_rows(scorer.tokenizer, prompts, [responses],
                                            chat_template=bool(meta.get("chat_template", False)))
    ok = [i for i in range(len(prompts)) if i not in failures]
    out = np.full(len(prompts), np.nan, np.float32)
    if ok:
        pad = pad_id_of(scorer.tokenizer)
        pi, pm = left_pad([fit_prompt(p_ids[i], P, side)[0] for i in ok], P, pad)
        ri, rm = right_pad([fit_response(r_ids[i], R, side)[0] for i in ok], R, pad)
        out[ok] = score_arrays(scorer.model, np.concatenate([pi, ri], 1), np.concatenate([pm, rm], 1),
                               batch_size=scorer.batch_size)
    return out, failures


def _drop_failed(rows: list, failures: dict[int, RowSkip], report: Any) -> list[int]:
    """Indices of ``rows`` without a failure; each failure is counted in ``report``."""
    for i, e in sorted(failures.items()):
        report.skip(e.reason, f"row {rows[i].index}: {e.message}")
    report.rows_kept = len(rows) - len(failures)
    return [i for i in range(len(rows)) if i not in failures]


def score_pairs(scorer, pairs: list, report: Any) -> tuple[list, np.ndarray, np.ndarray]:
    """``(pairs kept, r_chosen, r_rejected)``: both answers of every pair scored; a pair whose chosen or rejected
    text fails to score is dropped and counted in ``report``; none left is an error (``require_rows``)."""
    prompts = [p.prompt for p in pairs]
    rc, fc = score_texts(scorer, prompts, [p.chosen for p in pairs])
    rj, fj = score_texts(scorer, prompts, [p.rejected for p in pairs])
    keep = _drop_failed(pairs, {**fj, **fc}, report)
    pairs = [pairs[i] for i in keep]
    require_rows(pairs, report)
    return pairs, rc[keep], rj[keep]


def score_dataset(cfg: Config) -> dict:
    """Score ``cfg.data`` with the reward model ``cfg.reward.model_path``; returns the metrics."""
    from jaxppo.data.pipeline import load_rows
    from jaxppo.rewards.model_io import load_reward_scorer

    if not cfg.reward.model_path:
        raise ValueError("reward.model_path is not set: give the folder written by `python -m jaxppo.reward train`")
    t0 = time.perf_counter()
    scorer = load_reward_scorer(cfg.reward.model_path, batch_size=cfg.reward.eval_batch_size)
    loaded = load_rows(cfg.data)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"model_path": cfg.reward.model_path, "data": cfg.data.path, "schema": loaded.schema}
    rows = loaded.rows
    if loaded.schema == "preference":
        rows, rc, rj = score_pairs(scorer, rows, loaded.report)
        metrics.update({"accuracy": float(np.mean(rc > rj)), "margin": float(np.mean(rc - rj)),
                        "n_pairs": len(rows)})
        records = [{"index": p.index, "r_chosen": float(a), "r_rejected": float(b)} for p, a, b in zip(rows, rc, rj)]
    else:
        r, failed = score_texts(scorer, [x.prompt for x in rows], [x.response for x in rows])
        keep = _drop_failed(rows, failed, loaded.report)
        rows, r = [rows[i] for i in keep], r[keep]
        require_rows(rows, loaded.report)
        s = np.array([x.score for x in rows], np.float32)
        metrics.update({"n_rows": len(rows), "rm_score_mean": float(r.mean()), "rm_score_std": float(r.std())})
        if len(r) > 1 and r.std() > 0 and s.std() > 0:
            metrics["pearson_with_score"] = float(np.corrcoef(r, s)[0, 1])
        records = [{"index": x.index, "rm_score": float(v)} for x, v in zip(rows, r)]
    metrics.update(loaded.report.flat_metrics())
    metrics["data_report"] = loaded.report.to_dict()
    metrics["time_s"] = time.perf_counter() - t0
    if is_main_process():   # several processes: every one scored the same rows, process 0 writes
        with open(out / "scores.jsonl", "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
        (out / "score_metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return metrics


SCORED_FILE = "scored.jsonl"


def scored_records(pairs: Sequence[PreferencePair], r_chosen: np.ndarray | None = None,
                   r_rejected: np.ndarray | None = None) -> tuple[list[dict], str]:
    """``(rows, score source)``: one scored row per distinct ``(prompt, response)`` of ``pairs``
    (:class:`~jaxppo.data.answers.AnswerTable`) with ``prompt``, ``response``, ``score``, ``group_id`` (per prompt,
    dense in order of first appearance), ``wins``, ``losses``, ``ties`` and ``source_rows``. The score is, in this
    order: the reward model's (``r_chosen``/``r_rejected`` [N], one per pair; the same text always gets the same
    reward) -> ``"reward_model"``; the answers' ratings when every pair carries them (ranking rows with scores) ->
    ``"rating"``; else the win rate ``(wins + ties / 2) / (wins + losses + ties)`` -> ``"win_rate"`` (an answer only
    ever chosen scores 1, only ever rejected 0). A kept tie (two pairs, both orders) counts once, as a tie."""
    from jaxppo.data.answers import AnswerTable

    table = AnswerTable()
    if r_chosen is not None and r_rejected is not None:
        source = "reward_model"
        sc, sr = [float(x) for x in r_chosen], [float(x) for x in r_rejected]
    elif pairs and all(p.chosen_score is not None and p.rejected_score is not None for p in pairs):
        source = "rating"
        sc, sr = [p.chosen_score for p in pairs], [p.rejected_score for p in pairs]
    else:
        source = "win_rate"
        sc = sr = [None] * len(pairs)
    seen_ties = set()
    for p, a, b in zip(pairs, sc, sr):
        if p.tie:
            key = (p.row, frozenset((p.chosen, p.rejected)))
            if key in seen_ties:
                continue
            seen_ties.add(key)
        table.add_pair(p.prompt, p.chosen, p.rejected, p.row, tie=p.tie, score_chosen=a, score_rejected=b)
    return table.records("win_rate" if source == "win_rate" else "given"), source


def preference_to_scored(cfg: Config) -> dict:
    """Write ``trainer.output_dir/scored.jsonl`` from the preference pairs ``cfg.data`` (see the module
    docstring); returns the metrics (also written to ``to_scored_metrics.json``) with the data report in
    ``data_report``.

    The pairs go through :func:`jaxppo.data.pipeline.load_preference_arrays` with the policy's tokenizer
    (``model.tokenizer_path`` or ``model.path``) and ``data.*`` lengths, the filter of ``reward train`` and
    ``jaxppo.dpo``: a pair they skip is not written."""
    from jaxppo.data.pipeline import load_preference_arrays
    from jaxppo.hf import load_tokenizer
    from jaxppo.hf.paths import resolve_model_path, tokenizer_path

    if cfg.data.schema != "preference":
        raise ValueError(f"to-scored reads preference pairs: set data.schema=preference (got {cfg.data.schema!r})")
    t0 = time.perf_counter()
    scorer = None
    if cfg.reward.model_path:
        from jaxppo.rewards.model_io import load_reward_scorer

        scorer = load_reward_scorer(resolve_model_path(cfg.reward.model_path), batch_size=cfg.reward.eval_batch_size)
    got = load_preference_arrays(cfg.data, load_tokenizer(tokenizer_path(cfg.model)),
                                 resolve_model_path(cfg.model.path))
    rows, report = got.pairs, got.report
    rc = rj = None
    if scorer is not None:
        rows, rc, rj = score_pairs(scorer, rows, report)
    records, source = scored_records(rows, rc, rj)
    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if is_main_process():   # several processes: every one scored the same rows, process 0 writes
        tmp = out / (SCORED_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        tmp.replace(out / SCORED_FILE)
    metrics: dict = {"data": cfg.data.path, "output": str(out / SCORED_FILE),
                     "score_source": source,
                     "model_path": cfg.reward.model_path, "n_pairs": len(rows), "n_rows": len(records),
                     "n_prompts": len({r["group_id"] for r in records}),
                     "behaviour_logprobs": "absent: the trainer computes them with the reference policy "
                                           "(pi_prox/mu = pi_prox/pi_ref)"}
    if scorer is not None:
        scores = np.array([r["score"] for r in records], np.float32)
        metrics.update({"accuracy": float(np.mean(rc > rj)), "margin": float(np.mean(rc - rj)),
                        "score_mean": float(scores.mean()), "score_std": float(scores.std())})
    metrics.update(report.flat_metrics())
    metrics["data_report"] = report.to_dict()
    metrics["time_s"] = time.perf_counter() - t0
    if is_main_process():
        (out / "to_scored_metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return metrics


__all__ = ["preference_to_scored", "score_dataset", "score_texts", "scored_records"]
