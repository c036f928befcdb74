"""Run logs: ``metrics.jsonl`` + ``events.jsonl`` (always), TensorBoard scalars, a progress bar and experiment
trackers (W&B, MLflow, Trackio: ``trackers.py``, ``trainer.logger``).

``metrics.jsonl`` holds one JSON object per line, ``{"step": int, "<name>": float, ...}``; each line
is flushed and ``os.fsync``-ed before ``log`` returns, so a run killed at any moment leaves at most
one half-written last line. Non-finite values are written as the JSON *strings* ``"nan"``, ``"inf"``
and ``"-inf"`` (the file is always strict JSON; :func:`read_jsonl` turns them back into floats).

``events.jsonl`` holds guard actions and other notable events,
``{"step": int, "kind": str, "message": str, ...data}``; each is also sent to ``logging.warning``.

Resume: a logger opened with ``start_step=s`` keeps only the lines with ``step <= s`` of existing
files (``s = 0``: a fresh run, the files start empty), rewritten atomically (temporary file +
``os.replace``), so the log of a run resumed from the checkpoint of step ``s`` equals the log of an
uninterrupted run. A half-written (unparsable) *last* line, as SIGKILL leaves it, is dropped; an
unparsable line anywhere else is an error naming the file and line. TensorBoard is told the same
with ``purge_step=s + 1`` (``0`` for a fresh run): events of later steps left by an earlier run in
the same folder are hidden.

Trackers receive the finite metrics of every ``log``, every ``event`` and ``close``; a resumed run starts
a new tracker run (the JSONL files are the exact record).

Multi-process runs (``jax.distributed``): only process 0 writes files, TensorBoard, trackers and the progress
bar (``write=None``, the default, means ``jax.process_index() == 0``); the other processes' loggers
only convert and return the metrics.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

logger = logging.getLogger("jaxppo.trainer")

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
TENSORBOARD_DIR = "tensorboard"
# the sampled offline minibatch's mean score as jaxppo.trainer.ppo.steps logs it: with a critic, and critic-free
DATA_SCORE_KEYS = ("critic/score/mean", "data/score/mean")
# metrics shown next to the progress bar when present (a run logs one of the data score keys: "score/mean")
PROGRESS_KEYS = (*DATA_SCORE_KEYS, "actor/pg_loss", "actor/ppo_kl", "critic/vf_loss")

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def progress_postfix(values: Mapping[str, float]) -> dict[str, str]:
    """What the progress bar shows of a step's metrics: the ``PROGRESS_KEYS`` present, by their name after the
    first ``/`` (``critic/score/mean`` or, critic-free, ``data/score/mean`` -> ``score/mean``), as ``%.4g``."""
    return {k.split("/", 1)[-1]: f"{values[k]:.4g}" for k in PROGRESS_KEYS if k in values}


def to_float(name: str, value: Any) -> float:
    """``value`` (Python/NumPy/JAX scalar or size-1 array) as a Python float; TypeError naming ``name``."""
    if isinstance(value, str):
        raise TypeError(f"metric {name!r}: expected a number, got the string {value!r}")
    try:
        if hasattr(value, "item"):
            if getattr(value, "size", 1) != 1:
                raise TypeError(f"metric {name!r}: expected a scalar, got an array of shape {value.shape}")
            value = value.item()
        return float(value)
    except (TypeError, ValueError) as e:
        if isinstance(e, TypeError) and str(e).startswith("metric "):
            raise
        raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__} {value!r}") from None


def json_number(x: float) -> float | str:
    """A finite float as itself; NaN/inf as the strings "nan"/"inf"/"-inf" (strict JSON)."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def decode_numbers(row: dict) -> dict:
    """Inverse of :func:`json_number` on one parsed row (the "nan"/"inf"/"-inf" strings become floats)."""
    return {k: (_NONFINITE[v] if isinstance(v, str) and v in _NONFINITE and k not in ("kind", "message") else v)
            for k, v in row.items()}


def _parse_lines(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a broken *last* line (an interrupted write) is dropped with a warning."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows: list[dict] = []
    # index of the last non-empty line: only that one may be half-written
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            row = json.loads(ln)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as e:
            if i == last:
                logger.warning("%s: dropping a half-written last line (%d chars)", path, len(ln))
                continue
            raise ValueError(f"{path}: line {i + 1} is not a valid log row ({e}): {ln[:80]!r}") from None
        rows.append(row)
    return rows


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All rows of a ``metrics.jsonl``/``events.jsonl`` file with non-finite values decoded to floats."""
    return [decode_numbers(r) for r in _parse_lines(Path(path))]


def truncate_log(path: Path, start_step: int) -> int:
    """Keep the rows of ``path`` with ``step <= start_step`` (atomic rewrite); returns how many were kept."""
    if not path.exists():
        return 0
    rows = [r for r in _parse_lines(path) if r["step"] <= start_step] if start_step > 0 else []
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(rows)


class _JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, row: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(row, allow_nan=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class MetricsLogger:
    """Writes step metrics and events of a run under ``out_dir`` (see the module docstring).

    ``log(step, metrics)``: one ``metrics.jsonl`` line, TensorBoard scalars, progress-bar update.
    ``event(step, kind, message, **data)``: one ``events.jsonl`` line and a ``logging`` warning.
    The progress bar (tqdm, with ETA) runs from ``start_step`` to ``total_steps``; ``progress=False``
    turns it off and tqdm turns it off itself when stderr is not a terminal.
    ``trackers``: names from ``trackers.TRACKERS`` (``"wandb"``, ``"mlflow"``, ``"trackio"``) or ready
    :class:`jaxppo.trainer.trackers.Tracker` objects; ``log``/``event``/``close`` fan out to them. Names are
    started with ``run_name``, ``group`` and ``run_config`` (see :func:`jaxppo.trainer.trackers.make_trackers`).
    """

    def __init__(self, out_dir: str | os.PathLike, *, total_steps: int, start_step: int = 0,
                 tensorboard: bool = True, progress: bool = True, write: bool | None = None,
                 trackers: Sequence[Any] = (), run_name: str | None = None, group: str | None = None,
                 run_config: Mapping[str, Any] | None = None):
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"MetricsLogger: start_step must be a non-negative int, got {start_step!r}")
        if not isinstance(total_steps, int) or total_steps < 0:
            raise ValueError(f"MetricsLogger: total_steps must be a non-negative int, got {total_steps!r}")
        if write is None:
            import jax

            write = jax.process_index() == 0
        self.write = bool(write)
        self.out_dir = Path(out_dir)
        self.total_steps = total_steps
        self.start_step = start_step
        self.metrics_path = self.out_dir / METRICS_FILE
        self.events_path = self.out_dir / EVENTS_FILE
        self._metrics = self._events = None
        self._tb = None
        self._bar = None
        self._trackers: list[Any] = []
        self._closed = False
        if not self.write:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for p in (self.metrics_path, self.events_path):
            truncate_log(p, start_step)
        self._metrics = _JsonlWriter(self.metrics_path)
        self._events = _JsonlWriter(self.events_path)
        if isinstance(trackers, str):
            trackers = (trackers,)
        names = [t for t in trackers if isinstance(t, str)]
        if names:
            from jaxppo.trainer.trackers import make_trackers

            try:
                made = iter(make_trackers(names, self.out_dir, run_name=run_name, group=group, config=run_config))
            except BaseException:
                self._metrics.close()
                self._events.close()
                raise
            self._trackers = [next(made) if isinstance(t, str) else t for t in trackers]
        else:
            self._trackers = list(trackers)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / TENSORBOARD_DIR),
                                     purge_step=start_step + 1 if start_step > 0 else 0)
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=min(start_step, total_steps), desc="train",
                             unit="step", dynamic_ncols=True, disable=None, file=sys.stderr)

    # ------------------------------------------------------------------ writing
    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Append ``{"step": step, **metrics}``; returns the metrics as Python floats."""
        self._check_open()
        step = self._check_step(step)
        if "step" in metrics:
            raise ValueError("metrics must not contain the reserved key 'step'")
        values = {str(k): to_float(str(k), v) for k, v in metrics.items()}
        if not self.write:
            return values
        self._metrics.write({"step": step, **{k: json_number(v) for k, v in values.items()}})
        if self._tb is not None:
            for k, v in values.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(min(step, self.total_steps) - self._bar.n)
            shown = progress_postfix(values)
            if shown:
                self._bar.set_postfix(shown, refresh=False)
        for t in self._trackers:
            t.log(step, values)
        return values

    def event(self, step: int, kind: str, message: str, **data: Any) -> None:
        """Record a guard action (or other event) in ``events.jsonl`` and as a logging warning."""
        self._check_open()
        step = self._check_step(step)
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"event kind must be a non-empty string, got {kind!r}")
        reserved = {"step", "kind", "message"} & set(data)
        if reserved:
            raise ValueError(f"event data must not use the reserved keys {sorted(reserved)}")
        row = {"step": step, "kind": kind, "message": str(message), **_jsonable(data)}
        if not self.write:
            return
        self._events.write(row)
        logger.warning("step %d: %s: %s", step, kind, message)
        if self._tb is not None:
            self._tb.add_text(f"events/{kind}", str(message), global_step=step)
        for t in self._trackers:
            t.event(step, kind, str(message), row)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in (self._metrics, self._events):
            if w is not None:
                w.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
        errors = []
        for t in self._trackers:          # close every tracker even if one fails, then report the first
            try:
                t.close()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MetricsLogger is closed")

    @staticmethod
    def _check_step(step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, (int,)) and not hasattr(step, "__index__"):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        return int(step)


def _jsonable(data: Mapping[str, Any]) -> dict:
    """Event data as strict-JSON values: numbers via :func:`json_number`, containers recursively, else str."""
    def conv(x: Any) -> Any:
        if isinstance(x, (bool, type(None), str)):
            return x
        if isinstance(x, int):
            return x
        if isinstance(x, float) or hasattr(x, "item") and getattr(x, "size", 2) == 1:
            return json_number(float(x))
        if isinstance(x, Mapping):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return str(x)

    return {str(k): conv(v) for k, v in data.items()}


__all__ = ["EVENTS_FILE", "METRICS_FILE", "MetricsLogger", "TENSORBOARD_DIR", "decode_numbers", "json_number",
           "read_jsonl", "to_float", "truncate_log"]
