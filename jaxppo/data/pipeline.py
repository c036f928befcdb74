"""File -> validated rows -> fixed-shape arrays, driven by ``cfg.data`` (a :class:`DataConfig`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxppo.config.schema import DataConfig
from jaxppo.data.conversation import apply_chat_template_file
from jaxppo.data.loading import read_records
from jaxppo.data.report import DataError, DataReport
from jaxppo.data.schemas import PreferencePair, ScoredTrajectory
from jaxppo.data.tokenize import tokenize_preference, tokenize_scored
from jaxppo.data.validation import require_rows, validate_preference, validate_scored


@dataclasses.dataclass
class LoadedRows:
    """The usable rows of a dataset in its schema, with the report of what was dropped."""

    schema: str  # "preference" | "scored"
    rows: list[PreferencePair] | list[ScoredTrajectory]
    report: DataReport


def rows_from_records(records: list[dict[str, Any]], cfg: DataConfig, report: DataReport | None = None) -> LoadedRows:
    """Validate in-memory ``records`` with the schema and column mapping of ``cfg``."""
    report = report if report is not None else DataReport(source=str(cfg.path or "<memory>"))
    if cfg.schema == "preference":
        rows = validate_preference(records, columns=cfg.columns, max_text_chars=cfg.max_text_chars,
                                   report=report, preference_format=cfg.preference_format, ties=cfg.ties)
    else:
        rows = validate_scored(records, columns=cfg.columns, max_text_chars=cfg.max_text_chars, report=report)
    require_rows(rows, report)
    return LoadedRows(cfg.schema, rows, report)


def load_rows(cfg: DataConfig) -> LoadedRows:
    """Read ``cfg.path`` and validate its rows (``cfg.schema``, ``cfg.columns``, ``cfg.max_rows``).

    Raises :class:`DataError` when the file cannot be read or no row is usable.
    """
    report = DataReport(source=str(cfg.path))
    records = read_records(cfg.path, split=cfg.split, max_rows=cfg.max_rows, report=report)
    return rows_from_records(records, cfg, report)


def tokenize_rows(loaded: LoadedRows, tokenizer: Any, cfg: DataConfig) -> dict[str, np.ndarray]:
    """Fixed-shape arrays of ``loaded`` rows (see :mod:`jaxppo.data.tokenize`); updates its report.

    With ``cfg.chat_template_file`` the tokenizer's chat template is first replaced by that file's
    text (``tokenizer.chat_template`` is set). Raises :class:`DataError` when tokenization leaves no row.
    """
    apply_chat_template_file(tokenizer, cfg.chat_template_file)
    kw = dict(max_prompt_length=cfg.max_prompt_length, max_response_length=cfg.max_response_length,
              truncation=cfg.truncation, chat_template=cfg.chat_template, report=loaded.report)
    if loaded.schema == "preference":
        arrays = tokenize_preference(loaded.rows, tokenizer, **kw)
    else:
        arrays = tokenize_scored(loaded.rows, tokenizer, logged_mismatch=cfg.logged_mismatch, **kw)
    require_rows(list(arrays["index"]), loaded.report)
    return arrays


def model_context(model_path: str) -> int | None:
    """The context length (``max_position_embeddings``) of the checkpoint at ``model_path`` (a resolved HF folder
    or ``.gguf`` file), read from its config only; None when the config does not state it or there is no model
    config there (the model's own loading then reports that)."""
    from jaxppo.hf.load import open_source

    try:
        n = open_source(model_path).config_dict().get("max_position_embeddings")
    except (FileNotFoundError, ValueError):
        return None
    return int(n) if n else None


def check_context(cfg: DataConfig, model_path: str) -> None:
    """``ConfigError`` when ``data.max_prompt_length + data.max_response_length`` exceeds the context length of the
    model at ``model_path`` (:func:`model_context`): every row is laid out in that many positions."""
    from jaxppo.config import ConfigError

    n = model_context(model_path)
    total = cfg.max_prompt_length + cfg.max_response_length
    if n is not None and total > n:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {cfg.max_prompt_length} + "
                          f"{cfg.max_response_length} = {total} > {n}, the context length (max_position_embeddings) "
                          f"of {model_path}: lower data.max_response_length or data.max_prompt_length")


@dataclasses.dataclass
class PairArrays:
    """Preference pairs that passed every filter: ``loaded`` (validated rows and the report), ``arrays`` (the
    tokenized pairs of :func:`~jaxppo.data.tokenize.tokenize_preference`) and ``prompt_group`` [N] int32 (a dense
    id of each tokenized pair's prompt, :func:`prompt_groups`)."""

    loaded: LoadedRows
    arrays: dict[str, np.ndarray]
    prompt_group: np.ndarray

    @property
    def report(self) -> DataReport:
        return self.loaded.report

    @property
    def pairs(self) -> list[PreferencePair]:
        """The kept pairs, in the order of ``arrays`` (one per tokenized row)."""
        by_index = {p.index: p for p in self.loaded.rows}
        return [by_index[int(i)] for i in self.arrays["index"]]


def load_preference_arrays(cfg: DataConfig, tokenizer: Any, model_path: str | None = None) -> PairArrays:
    """THE filter path of preference pairs, shared by ``reward train``, ``reward to-scored`` and ``jaxppo.dpo``:
    :func:`check_context` against ``model_path`` (when given), :func:`load_rows` (validation: every bad row counted
    by reason), :func:`tokenize_rows` with the policy's ``tokenizer`` (truncation, ``identical_after_truncation``,
    ``empty_tokens`` ...) and :func:`prompt_groups`. A pair kept by one command is kept by the others."""
    if cfg.schema != "preference":
        raise DataError(f"preference pairs are read with data.schema=preference (got {cfg.schema!r})")
    if model_path is not None:
        check_context(cfg, model_path)
    loaded = load_rows(cfg)
    arrays = tokenize_rows(loaded, tokenizer, cfg)
    return PairArrays(loaded, arrays, prompt_groups(loaded, arrays))


def prompt_groups(loaded: LoadedRows, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """A dense id ``[N] int32`` of the prompt of each tokenized row of ``arrays`` (ids in order of first
    appearance; a conversational prompt counts by its messages): the groups of the by-prompt split of pairs
    (``split_by_group(prompt_groups(...).tolist(), ...)``, used by DPO and the reward model alike)."""
    by_index = {row.index: row.prompt for row in loaded.rows}
    table: dict[Any, int] = {}
    return np.array([table.setdefault(by_index[int(i)], len(table)) for i in arrays["index"]], dtype=np.int32)


def split_by_group(keys: list[Any], eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train_rows, eval_rows)``: the distinct ``keys`` (e.g. prompts) are shuffled with ``seed``
    and the first ``round(eval_fraction · n_keys)`` go to eval, so no key is on both sides.

    With ``eval_fraction > 0`` and at least two keys, both sides get at least one key.
    """
    distinct = list(dict.fromkeys(keys))
    order = np.random.default_rng(seed).permutation(len(distinct))
    n_eval = int(round(eval_fraction * len(distinct)))
    if eval_fraction > 0 and len(distinct) >= 2:
        n_eval = min(max(n_eval, 1), len(distinct) - 1)
    eval_keys = {distinct[j] for j in order[:n_eval]}
    is_eval = np.array([k in eval_keys for k in keys], dtype=bool)
    return np.nonzero(~is_eval)[0], np.nonzero(is_eval)[0]
