"""Experiment trackers beside ``metrics.jsonl``: Weights & Biases, MLflow and Trackio (``trainer.logger``).

``trainer.logger`` (verl's key) is a list such as ``["console", "tensorboard", "wandb"]`` or one string:

- ``"console"``: the progress bar on stderr (still switched by ``trainer.progress``); always accepted;
- ``"tensorboard"``: TensorBoard event files under ``<output_dir>/tensorboard``. TensorBoard is on when
  ``trainer.tensorboard`` is true OR ``"tensorboard"`` is listed (:func:`resolve_logger`), so existing configs
  that set only ``trainer.tensorboard`` keep working;
- ``"wandb"``: a W&B run in ``<output_dir>/wandb``. Mode ``WANDB_MODE`` if set, else ``"offline"`` (no network;
  ``wandb sync <output_dir>/wandb/offline-run-*`` uploads it later);
- ``"mlflow"``: an MLflow run in the file store ``<output_dir>/mlruns`` (``MLFLOW_TRACKING_URI`` if set);
  the file store needs ``MLFLOW_ALLOW_FILE_STORE=true`` on MLflow 3, which is set when unset;
- ``"trackio"``: a Trackio run (its local store; ``TRACKIO_DIR`` if set).

The last three are optional extras: ``pip install 'jaxppo[track]'``; each is imported only when listed, and a
missing one is an ``ImportError`` naming the extra. Names: the run is ``trainer.run_name`` (default: the
output folder's name) in group ``trainer.group`` (W&B group and project ``jaxppo``; MLflow experiment;
Trackio project; default ``"jaxppo"``), so a sweep groups its runs by setting ``trainer.group``.

Every tracker gets the finite step metrics (``log``), the guard events (``event``: W&B/Trackio as an
``events/<kind>`` count of 1 at the step, MLflow as the tag ``event.<step>.<kind>`` = message) and ``close``.
Only process 0 creates trackers (``MetricsLogger(write=...)``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

CONSOLE, TENSORBOARD = "console", "tensorboard"
TRACKERS = ("wandb", "mlflow", "trackio")
LOGGER_KINDS = (CONSOLE, TENSORBOARD, *TRACKERS)
EXTRA = "jaxppo[track]"
DEFAULT_GROUP = "jaxppo"


def resolve_logger(logger: str | Sequence[str], tensorboard: bool = False) -> tuple[bool, tuple[str, ...]]:
    """``trainer.logger`` (+ ``trainer.tensorboard``) -> (TensorBoard on?, tracker names in order, no repeats)."""
    names = (logger,) if isinstance(logger, str) else tuple(logger)
    bad = [n for n in names if n not in LOGGER_KINDS]
    if bad:
        raise ValueError(f"trainer.logger: unknown logger(s) {bad}; expected some of {list(LOGGER_KINDS)}")
    trackers = tuple(dict.fromkeys(n for n in names if n in TRACKERS))
    return bool(tensorboard) or TENSORBOARD in names, trackers


def _import(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"trainer.logger lists {module!r} but the {module!r} package is not installed: "
                          f"pip install '{EXTRA}' (or pip install {module})") from e


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def _flat(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (config or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker(Protocol):
    """What ``MetricsLogger`` calls: ``log(step, metrics)``, ``event(step, kind, message, data)``, ``close()``.
    The adapters below implement it; any object with these three methods is a tracker."""

    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def event(self, step: int, kind: str, message: str, data: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, out_dir: Path, run_name: str, group: str, config: Mapping[str, Any] | None):
        wandb = _import("wandb")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=DEFAULT_GROUP, group=group, name=run_name, dir=str(out_dir),
                              mode=os.environ.get("WANDB_MODE", "offline"), config=dict(config or {}))

    def log(self, step, metrics):
        vals = _finite(metrics)
        if vals:
            self.run.log(vals, step=step)

    def event(self, step, kind, message, data):
        self.run.log({f"events/{kind}": 1.0}, step=step)

    def close(self):
        self.run.finish()


class MlflowTracker(Tracker):
    name = "mlflow"
    MAX_PARAMS = 100           # MLflow's per-call limits of log_batch
    MAX_METRICS = 1000

    def __init__(self, out_dir: Path, run_name: str, group: str, config: Mapping[str, Any] | None):
        mlflow = _import("mlflow")
        from mlflow.entities import Metric, Param

        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (out_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(group)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(group)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flat(config).items()]
        for i in range(0, len(params), self.MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + self.MAX_PARAMS])

    def log(self, step, metrics):
        ts = int(time.time() * 1000)
        ms = [self._metric(k, v, ts, step) for k, v in _finite(metrics).items()]
        for i in range(0, len(ms), self.MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=ms[i:i + self.MAX_METRICS])

    def event(self, step, kind, message, data):
        self.client.set_tag(self.run_id, f"event.{step}.{kind}", str(message)[:5000])

    def close(self):
        self.client.set_terminated(self.run_id)


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, out_dir: Path, run_name: str, group: str, config: Mapping[str, Any] | None):
        self.trackio = _import("trackio")
        self.run = self.trackio.init(project=group, name=run_name, config=dict(config or {}))

    def log(self, step, metrics):
        vals = _finite(metrics)
        if vals:
            self.trackio.log(vals, step=step)

    def event(self, step, kind, message, data):
        self.trackio.log({f"events/{kind}": 1.0}, step=step)

    def close(self):
        self.trackio.finish()


_CLASSES = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


def make_trackers(names: Sequence[str], out_dir: str | os.PathLike, *, run_name: str | None = None,
                  group: str | None = None, config: Mapping[str, Any] | None = None) -> list[Tracker]:
    """The trackers ``names`` (a subset of :data:`TRACKERS`) for a run writing under ``out_dir``.

    ``run_name`` defaults to ``out_dir``'s folder name, ``group`` to ``"jaxppo"``; ``config`` (a nested dict,
    e.g. ``jaxppo.config.to_dict(cfg)``) is recorded as the run's config / params. If one fails to start,
    the ones already started are closed and the error propagates."""
    out_dir = Path(out_dir)
    run_name = run_name or out_dir.resolve().name
    group = group or DEFAULT_GROUP
    made: list[Tracker] = []
    try:
        for n in names:
            if n not in _CLASSES:
                raise ValueError(f"unknown tracker {n!r}; expected one of {list(TRACKERS)}")
            made.append(_CLASSES[n](out_dir, run_name, group, config))
    except BaseException:
        for t in made:
            t.close()
        raise
    return made


__all__ = ["CONSOLE", "EXTRA", "LOGGER_KINDS", "MlflowTracker", "TENSORBOARD", "TRACKERS", "Tracker",
           "TrackioTracker", "WandbTracker", "make_trackers", "resolve_logger"]
