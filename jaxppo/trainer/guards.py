"""Host-side training guards (docs/design.md, "Guards"); each returns the actions the trainer must take.

* **KL guard** — ``kl > kl_threshold`` for the first KL metric of ``kl_keys`` present in a step's
  metrics (default ``"actor/ppo_kl"``, the approximate KL of the update to the PPO "old" policy;
  pass e.g. ``kl_keys=("actor/kl_loss",)`` or ``("eval/kl",)`` to guard the KL to the reference)
  → ``GuardAction("lower_lr", data={"factor": kl_lr_factor, "kl": kl, "key": key})`` (or
  ``data["lr"] = kl_lr`` when an absolute ``guards.kl_lr`` is set). It fires once when the KL crosses
  the threshold and again only after the KL has been at or below the threshold in between. The trainer
  applies it with :func:`cut_lr_scale`: relative, ``scale' = scale · kl_lr_factor`` (the actor's LR
  becomes ``kl_lr_factor`` × its current value; repeated excursions compound), or absolute,
  ``scale' = min(scale, kl_lr / lr)``.
* **Response-length guard** — ``L > length_factor × m`` where ``L`` is the mean length of the
  *policy's own generations* (default keys ``"eval/response_length"``, the held-out evaluation
  samples at ``trainer.eval_every``, and ``"probe/response_length"``, the greedy length probe at
  ``guards.length_probe_every``; each key has its own running mean) and ``m`` is the running mean
  of all previous finite values of that metric → ``"length_warning"`` (possible
  mode collapse). ``response_length/mean`` (the length of the sampled offline minibatch, which does
  not depend on the policy) is not watched by default. The first value never warns; every finite
  value joins the running mean.
* **Perplexity guard** — ``check_perplexity(step, ppl)``: the first value is the baseline ``b``;
  later ``ppl > (1 + ppl_tolerance)·b`` or a non-finite ``ppl`` → ``"rollback"`` (to the last good
  checkpoint). ``should_check_perplexity(step)`` is ``step % ppl_every == 0``.
* **PER-weight guard** — ``replay/per_weight_mean < min_per_weight_mean`` (the mean PER importance weight of
  the sampled minibatch) → ``"weight_warning"``: the PER weights scale the policy-gradient and value losses
  but not the KL and entropy terms, so a small mean weight stalls learning (e.g. ``replay.weight_floor=0`` with
  many items at the priority floor, ``replay/floor_fraction``). Fires once when the mean crosses the threshold
  and again only after it has recovered in between.
* **NaN guard** — ``check_nan(step, streak, total)`` reads the counts the train step keeps on device
  (``TrainState.nan_streak``: consecutive skipped updates with a NaN/inf loss, 0 after a finite one;
  ``TrainState.nan_total``: all of them) — the one source of truth; ``streak >= max_nan_steps`` →
  ``"rollback"`` (the trainer then sets ``nan_streak`` to 0, so the count restarts).

All state is plain numbers (``state_dict`` / ``Guards.from_state_dict``, JSON-able), so a guard
restored from a checkpoint takes the same later actions as one that never stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from jaxppo.config.schema import GuardsConfig

LOWER_LR = "lower_lr"
LENGTH_WARNING = "length_warning"
WEIGHT_WARNING = "weight_warning"
PER_WEIGHT_KEY = "replay/per_weight_mean"
ROLLBACK = "rollback"

DEFAULT_KL_KEYS = ("actor/ppo_kl",)
DEFAULT_LENGTH_KEYS = ("eval/response_length", "probe/response_length")
STATE_VERSION = 2  # 1: also held host copies of the NaN counts (ignored when read)


@dataclass(frozen=True)
class GuardAction:
    """``kind`` in {"lower_lr", "length_warning", "weight_warning", "rollback"}; ``data`` holds JSON-able details."""

    kind: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class Guards:
    """The guards of one run. ``cfg``: a ``GuardsConfig`` or a full ``Config`` (its ``guards`` section)."""

    def __init__(self, cfg: Any, *, kl_keys: Sequence[str] = DEFAULT_KL_KEYS,
                 length_keys: Sequence[str] = DEFAULT_LENGTH_KEYS):
        cfg = getattr(cfg, "guards", cfg)
        if not isinstance(cfg, GuardsConfig):
            raise TypeError(f"Guards needs a GuardsConfig (or a Config with .guards), got {type(cfg).__name__}")
        if not kl_keys or not length_keys:
            raise ValueError("Guards: kl_keys and length_keys must name at least one metric")
        self.cfg = cfg
        self.kl_keys = tuple(kl_keys)
        self.length_keys = tuple(length_keys)
        self.kl_active = False  # KL is above the threshold and the LR cut was already requested
        self.length_sum = {k: 0.0 for k in self.length_keys}
        self.length_count = {k: 0 for k in self.length_keys}
        self.ppl_baseline: float | None = None
        self.weight_low = False  # the mean PER weight is below min_per_weight_mean and was already reported

    # ------------------------------------------------------------------ per-step metrics
    def check(self, step: int, metrics: Mapping[str, Any]) -> list[GuardAction]:
        """KL, response-length and PER-weight guards on one step's metrics (missing metrics are skipped)."""
        actions: list[GuardAction] = []
        w = _finite(metrics.get(PER_WEIGHT_KEY))
        if w is not None:
            limit = self.cfg.min_per_weight_mean
            if w < limit and not self.weight_low:
                actions.append(GuardAction(
                    WEIGHT_WARNING,
                    f"{PER_WEIGHT_KEY}={w:.4g} < min_per_weight_mean={limit:g}: the PER weights shrink the policy "
                    "gradient against the KL/entropy terms (items at the priority floor? see replay/floor_fraction; "
                    "raise replay.weight_floor or use pf_ppo.filter=dynamic_sampling)",
                    {"per_weight_mean": w, "threshold": limit}))
            self.weight_low = w < limit
        for key in self.kl_keys:
            if key not in metrics:
                continue
            kl = _finite(metrics[key])
            if kl is None:  # NaN steps are the NaN guard's business
                break
            if kl > self.cfg.kl_threshold:
                if not self.kl_active:
                    self.kl_active = True
                    data: dict[str, Any] = {"kl": kl, "key": key, "threshold": self.cfg.kl_threshold}
                    if self.cfg.kl_lr is not None:
                        data["lr"] = self.cfg.kl_lr
                        to = f"to {self.cfg.kl_lr:g}"
                    else:
                        data["factor"] = self.cfg.kl_lr_factor
                        to = f"to {self.cfg.kl_lr_factor:g} x its current value"
                    actions.append(GuardAction(
                        LOWER_LR, f"{key}={kl:.4g} > kl_threshold={self.cfg.kl_threshold:g}: lowering the actor "
                        f"learning rate {to}", data))
            else:
                self.kl_active = False
            break
        for key in self.length_keys:
            if key not in metrics:
                continue
            length = _finite(metrics[key])
            if length is None:
                continue
            n = self.length_count[key]
            if n > 0:
                mean = self.length_sum[key] / n
                if length > self.cfg.length_factor * mean:
                    actions.append(GuardAction(
                        LENGTH_WARNING,
                        f"{key}={length:.4g} > {self.cfg.length_factor:g} x running mean {mean:.4g}: "
                        "possible mode collapse",
                        {"length": length, "running_mean": mean, "key": key, "factor": self.cfg.length_factor}))
            self.length_sum[key] += length
            self.length_count[key] = n + 1
        return actions

    # ------------------------------------------------------------------ perplexity
    def should_check_perplexity(self, step: int) -> bool:
        return step % self.cfg.ppl_every == 0

    def check_perplexity(self, step: int, ppl: float) -> list[GuardAction]:
        """Held-out perplexity guard; the first call sets the baseline (ValueError if it is not finite)."""
        v = _finite(ppl)
        if self.ppl_baseline is None:
            if v is None:
                raise ValueError(f"step {step}: the baseline held-out perplexity is not finite ({ppl}); "
                                 "the starting policy or the held-out data is broken")
            self.ppl_baseline = v
            return []
        limit = (1.0 + self.cfg.ppl_tolerance) * self.ppl_baseline
        if v is None or v > limit:
            return [GuardAction(
                ROLLBACK,
                f"held-out perplexity {float(ppl):.4g} > (1 + {self.cfg.ppl_tolerance:g}) x baseline "
                f"{self.ppl_baseline:.4g}: rolling back to the last good checkpoint",
                {"ppl": float(ppl), "baseline": self.ppl_baseline, "limit": limit, "reason": "perplexity"})]
        return []

    # ------------------------------------------------------------------ NaN / inf losses
    def check_nan(self, step: int, streak: int, total: int) -> list[GuardAction]:
        """The device NaN counts after ``step`` (``TrainState.nan_streak`` / ``nan_total``): ``streak`` consecutive
        skipped updates ``>= max_nan_steps`` → rollback (the caller resets the device streak to 0)."""
        streak, total = int(streak), int(total)
        if streak < 0 or total < streak:
            raise ValueError(f"check_nan: need 0 <= streak <= total, got streak={streak}, total={total}")
        if streak >= self.cfg.max_nan_steps:
            return [GuardAction(
                ROLLBACK,
                f"{streak} consecutive updates with a NaN/inf loss (max_nan_steps={self.cfg.max_nan_steps}): "
                "rolling back to the last good checkpoint",
                {"nan_steps": streak, "nan_total": total, "reason": "nan"})]
        return []

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (floats, ints, bools, dicts of them)."""
        return {
            "version": STATE_VERSION,
            "kl_keys": list(self.kl_keys),
            "length_keys": list(self.length_keys),
            "kl_active": bool(self.kl_active),
            "length_sum": {k: float(v) for k, v in self.length_sum.items()},
            "length_count": {k: int(v) for k, v in self.length_count.items()},
            "ppl_baseline": self.ppl_baseline,
            "weight_low": bool(self.weight_low),
        }

    @classmethod
    def from_state_dict(cls, cfg: Any, d: Mapping[str, Any]) -> "Guards":
        """Guards with config ``cfg`` and the state of ``state_dict()``; ValueError naming a bad field."""
        need = ("version", "kl_keys", "length_keys", "kl_active", "length_sum", "length_count", "ppl_baseline")
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"guards state is missing field(s) {missing}")
        if d["version"] not in (1, STATE_VERSION):   # version 1's nan_streak/nan_total are the device's now
            raise ValueError(f"guards state version {d['version']!r} is not supported (expected {STATE_VERSION})")
        g = cls(cfg, kl_keys=tuple(d["kl_keys"]), length_keys=tuple(d["length_keys"]))
        if set(d["length_sum"]) != set(g.length_keys) or set(d["length_count"]) != set(g.length_keys):
            raise ValueError("guards state: length_sum/length_count keys do not match length_keys")
        g.kl_active = bool(d["kl_active"])
        g.length_sum = {k: float(d["length_sum"][k]) for k in g.length_keys}
        g.length_count = {k: int(d["length_count"][k]) for k in g.length_keys}
        g.ppl_baseline = None if d["ppl_baseline"] is None else float(d["ppl_baseline"])
        g.weight_low = bool(d.get("weight_low", False))     # absent in states written before the weight guard
        return g


def cut_lr_scale(scale: float, data: Mapping[str, Any], base_lr: float) -> float:
    """The actor's LR multiplier after a ``lower_lr`` action with ``data`` (see the module doc).

    ``data["lr"]`` (absolute): ``min(scale, lr / base_lr)`` — never raises the LR; else
    ``data["factor"]`` (relative): ``scale · factor``. ValueError for anything else.
    """
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"cut_lr_scale: the current LR scale must be finite and > 0, got {scale}")
    if not (math.isfinite(base_lr) and base_lr > 0):
        raise ValueError(f"cut_lr_scale: base_lr must be finite and > 0, got {base_lr}")
    if "lr" in data:
        lr = float(data["lr"])
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"cut_lr_scale: lr must be finite and > 0, got {data['lr']!r}")
        return min(scale, lr / float(base_lr))
    if "factor" in data:
        f = float(data["factor"])
        if not 0 < f < 1:
            raise ValueError(f"cut_lr_scale: factor must be in (0, 1), got {data['factor']!r}")
        return scale * f
    raise ValueError(f"cut_lr_scale: a lower_lr action needs 'lr' or 'factor', got keys {sorted(data)}")


__all__ = ["DEFAULT_KL_KEYS", "DEFAULT_LENGTH_KEYS", "GuardAction", "Guards", "LENGTH_WARNING", "LOWER_LR",
           "ROLLBACK", "WEIGHT_WARNING", "cut_lr_scale"]
