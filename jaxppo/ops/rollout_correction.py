"""verl's rollout correction (``rollout_corr_helper``): IS weights, rejection masks, off-policy diagnostics.

All inputs are ``[B, T]``; ``log_ratio = log pi_train - log pi_rollout`` per token, ``mask`` 1 on response
tokens, ``n_b = sum_t m_bt``; a row is *valid* when ``n_b > 0``. Padding never reaches a result (NaN-safe).
Options are static Python values (strings are parsed outside ``jit``); metrics are 0-d arrays named as verl's.
A concrete all-zero mask raises ``ValueError`` (verl raises too); under ``jit`` such a batch gives finite
placeholder metrics. Where verl averages sequence metrics over *all* rows we average over valid rows (the same
whenever no row is fully masked).

**IS weights** (:func:`rollout_correction_weights`), ``l = clip(log_ratio, -20, 20)``:

* ``level="token"``:    ``rho_bt = exp(l_bt)``;
* ``level="sequence"``: ``rho_b = exp(clip(sum_t m_bt log_ratio_bt, -20, 20))`` broadcast over the row;
* ``threshold=C`` (a number, TIS): ``w = min(rho, C)``; the band used by the metrics is ``[1/C, C]``;
* ``threshold="lo_hi"`` (a string such as ``"0.5_5.0"``, IcePop): ``w = rho [lo <= rho <= hi]``;
* ``batch_normalize``: ``w <- w / mean(w)`` with the mean over valid tokens (token level) or valid sequences
  (sequence level), skipped when that mean is ``<= 1e-8``; ``rollout_is_batch_norm_factor`` = that mean (or 1);
* ``w <- stop_gradient(w) * m``.

Metrics, as verl 0.9.1 (``compute_is_metrics`` in ``verl/trainer/ppo/rollout_corr_helper.py``): with ``w`` the
*applied* weights (after truncation or banding, before batch normalisation) and ``rho`` the raw ratios:
``rollout_is_mean = masked_mean(w)`` over tokens; ``rollout_is_max|min``: token level, of ``w`` over valid
tokens; sequence level, ``exp(min(max_b L_b, 20))`` and ``exp(min_b L_b)`` with ``L_b`` the unclamped log-ratio
sum; ``rollout_is_ratio_fraction_high|low``: share of units whose raw ratio is ``> hi`` / ``< lo`` (units =
valid tokens, or valid rows compared in log space); ``rollout_is_std``: masked std of ``w_s = clip(w, 0, hi)``
(0 for ``<= 1`` valid token); ``rollout_is_eff_sample_size = 1 / masked_mean((w_s / (masked_mean(w_s) +
1e-8))^2)``, in ``(0, 1]``; per sequence ``q_b = masked_mean_t(w_bt)``: ``rollout_is_seq_mean|std|max|min``,
``rollout_is_seq_max_deviation = max |q_b - 1|``; ``rollout_is_seq_fraction_high|low``: share of rows whose raw
mean ratio ``masked_mean_t(rho_bt)`` is ``> hi`` / ``< lo``; with a band only, ``rollout_is_oob_ratio =
masked_mean(rho < lo or rho > hi)`` over tokens. For TIS, ``lo = 1/C``.

**Rejection** (:func:`rejection_mask`), with ``l`` as above: ``k1 = -l``, ``k2 = l^2 / 2``,
``k3 = exp(l) - 1 - l`` per token. Criteria (comma-separated, every one must pass):
``token_k{1,2,3}`` (per token), ``seq_sum_k{1,2,3}`` (``sum_t m k``), ``seq_mean_k{1,2,3}``
(``sum_t m k / (n + 1e-8)``), ``seq_max_k{2,3}`` (``max_t`` over valid tokens). A ``k1`` criterion takes
``"lo_hi"`` ratio bounds and keeps ``log lo <= stat <= log hi`` (as verl, the bounds apply to ``exp(k1)``,
i.e. ``pi_rollout / pi_train``; a single number ``C`` means ``[1/C, C]``); the others keep ``stat <= upper``.
``threshold`` is one spec shared by all criteria or one per criterion (comma-separated, same order). A token
criterion masks tokens, a sequence criterion whole rows; the result is ``mask * keep``. Metrics:
``rollout_rs_masked_fraction`` (share of valid tokens removed), ``rollout_rs_seq_masked_fraction`` (share of
valid rows that lost a token) and, per criterion ``c``, ``rollout_rs_<c>_masked_fraction``,
``rollout_rs_<c>_seq_masked_fraction``, ``rollout_rs_<c>_mean`` (token-weighted mean of the statistic),
``rollout_rs_<c>_max|min`` (over valid tokens or valid rows).

**Diagnostics** (:func:`offpolicy_metrics`): see its docstring.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxppo.ops._checks import check_choice, check_floating, check_ndim, check_same_shape, compute_dtype, is_concrete
from jaxppo.ops.constants import LOG_RATIO_CLAMP

#: clamp of log-ratios (and of their sequence sums) before ``exp``: verl's ``SAFETY_BOUND``, our one constant
SAFETY_BOUND = LOG_RATIO_CLAMP
IS_LEVELS = ("token", "sequence")
RS_CRITERIA = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
               "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _prepare(log_ratio: Any, mask: Any, name: str = "log_ratio") -> tuple[jax.Array, jax.Array, jax.Array]:
    check_ndim(name, log_ratio, 2)
    check_ndim("mask", mask, 2)
    check_same_shape(**{name: log_ratio, "mask": mask})
    check_floating(name, log_ratio)
    valid = jnp.asarray(mask) != 0
    if is_concrete(valid) and not bool(np.any(np.asarray(valid))):
        raise ValueError("mask must contain at least one valid token (1); got an all-zero mask")
    dtype = compute_dtype(log_ratio)
    lr = jnp.where(valid, jnp.asarray(log_ratio, dtype), 0)
    return lr, valid, valid.astype(dtype)


def _mean_over(x: jax.Array, units: jax.Array) -> jax.Array:
    """Mean of ``x`` where ``units`` (0 when there are none)."""
    return jnp.sum(jnp.where(units, x, 0)) / jnp.maximum(jnp.sum(units), 1).astype(x.dtype)


def _max_over(x: jax.Array, units: jax.Array) -> jax.Array:
    return jnp.where(jnp.any(units), jnp.max(jnp.where(units, x, -jnp.inf)), 0).astype(x.dtype)


def _min_over(x: jax.Array, units: jax.Array) -> jax.Array:
    return jnp.where(jnp.any(units), jnp.min(jnp.where(units, x, jnp.inf)), 0).astype(x.dtype)


def _masked_mean(x: jax.Array, m: jax.Array, axis: int | None = None) -> jax.Array:
    """verl's ``masked_mean``: ``sum(x m) / (sum(m) + 1e-8)``."""
    return jnp.sum(jnp.where(m != 0, x, 0), axis=axis) / (jnp.sum(m, axis=axis) + 1e-8)


def _parse_number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{what}: thresholds must be positive and finite, got {text!r}")
    return value


def parse_is_threshold(threshold: float | str) -> tuple[str, float, float]:
    """``C`` (number or numeric string) -> ``("truncate", 1/C, C)``; ``"lo_hi"`` -> ``("band", lo, hi)``."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise TypeError(f"threshold must be a number or a 'lo_hi' string, got {type(threshold).__name__}")
    if isinstance(threshold, str) and "_" in threshold:
        parts = threshold.split("_")
        if len(parts) != 2:
            raise ValueError(f"threshold {threshold!r} must look like 'lo_hi', e.g. '0.5_5.0'")
        lo = _parse_number(parts[0].strip(), f"threshold {threshold!r}")
        hi = _parse_number(parts[1].strip(), f"threshold {threshold!r}")
        if lo > hi:
            raise ValueError(f"threshold {threshold!r}: lower bound {lo} exceeds upper bound {hi}")
        return "band", lo, hi
    c = _parse_number(str(threshold).strip(), "threshold")
    return "truncate", 1.0 / c, c


def rollout_correction_weights(log_ratio: jax.Array, mask: jax.Array, *, level: str = "token",
                               threshold: float | str = 2.0,
                               batch_normalize: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Detached rollout IS weights ``[B, T]`` (TIS or IcePop band) and verl's metrics; see the module docstring."""
    check_choice("level", level, IS_LEVELS)
    mode, lo, hi = parse_is_threshold(threshold)
    if not isinstance(batch_normalize, bool):
        raise TypeError(f"batch_normalize must be a bool, got {type(batch_normalize).__name__}")
    lr, valid, m = _prepare(log_ratio, mask)
    dtype = m.dtype
    row_valid = jnp.any(valid, axis=-1)

    if level == "token":
        rho = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)) * m
        units = valid
        fraction_high = _mean_over((rho > hi).astype(dtype), units)
        fraction_low = _mean_over((rho < lo).astype(dtype), units)
    else:
        total = jnp.sum(lr, axis=-1)
        rho = jnp.exp(jnp.clip(total, -SAFETY_BOUND, SAFETY_BOUND))[:, None] * m
        units = row_valid
        fraction_high = _mean_over((total > np.log(hi)).astype(dtype), units)
        fraction_low = _mean_over((total < np.log(lo)).astype(dtype), units)
        rho_max = jnp.exp(jnp.minimum(_max_over(total, units), SAFETY_BOUND))
        rho_min = jnp.exp(_min_over(total, units))

    if mode == "truncate":
        w = jnp.minimum(rho, hi)
    else:
        w = jnp.where((rho >= lo) & (rho <= hi), rho, 0)
    w = jax.lax.stop_gradient(w) * m
    if level == "token":    # of the applied weights (verl 0.9.1)
        rho_max, rho_min = _max_over(w, units), _min_over(w, units)
    n_tok = jnp.sum(m)
    w_s = jnp.clip(w, 0, hi)
    mean_s = _masked_mean(w_s, m)
    var_s = _masked_mean(jnp.square(w_s), m) - jnp.square(mean_s)
    ess_den = _masked_mean(jnp.square(w_s / (mean_s + 1e-8)), m)
    q = _masked_mean(w, m, axis=-1)
    q_raw = _masked_mean(rho, m, axis=-1)
    n_rows = jnp.sum(row_valid)
    q_mean = _mean_over(q, row_valid)
    q_var = jnp.sum(jnp.where(row_valid, jnp.square(q - q_mean), 0)) / jnp.maximum(n_rows - 1, 1).astype(dtype)
    metrics = {
        "rollout_is_mean": _masked_mean(w, m),
        "rollout_is_max": rho_max.astype(dtype),
        "rollout_is_min": rho_min.astype(dtype),
        "rollout_is_ratio_fraction_high": fraction_high,
        "rollout_is_ratio_fraction_low": fraction_low,
        "rollout_is_std": jnp.where(n_tok > 1, jnp.sqrt(jnp.maximum(var_s, 0)), 0).astype(dtype),
        "rollout_is_eff_sample_size": jnp.where(ess_den > 0, 1.0 / jnp.where(ess_den > 0, ess_den, 1), 0),
        "rollout_is_seq_mean": q_mean,
        "rollout_is_seq_std": jnp.where(n_rows > 1, jnp.sqrt(q_var), 0).astype(dtype),
        "rollout_is_seq_max": _max_over(q, row_valid),
        "rollout_is_seq_min": _min_over(q, row_valid),
        "rollout_is_seq_max_deviation": _max_over(jnp.abs(q - 1.0), row_valid),
        "rollout_is_seq_fraction_high": _mean_over((q_raw > hi).astype(dtype), row_valid),
        "rollout_is_seq_fraction_low": _mean_over((q_raw < lo).astype(dtype), row_valid),
    }
    if mode != "truncate":
        metrics["rollout_is_oob_ratio"] = _masked_mean(((rho < lo) | (rho > hi)).astype(dtype), m)

    if batch_normalize:
        if level == "token":
            mean_w = _masked_mean(w, m)
        else:
            mean_w = jnp.sum(jnp.where(row_valid, _masked_mean(w, m, axis=-1), 0)) / jnp.maximum(n_rows, 1e-8)
        ok = mean_w > 1e-8
        w = jnp.where(ok, w / jnp.where(ok, mean_w, 1), w)
        metrics["rollout_is_batch_norm_factor"] = jnp.where(ok, mean_w, 1.0).astype(dtype)
    return w, jax.tree.map(lambda x: jax.lax.stop_gradient(jnp.asarray(x, dtype)), metrics)


def parse_rejection_criteria(criteria: str, threshold: float | str) -> list[tuple[str, float | None, float]]:
    """Parse ``criteria``/``threshold`` into ``[(criterion, lower or None, upper)]`` (duplicates dropped)."""
    if not isinstance(criteria, str) or not criteria.strip():
        raise ValueError("criteria must be a non-empty comma-separated string, e.g. 'token_k1,seq_max_k2'")
    names: list[str] = []
    for name in (c.strip() for c in criteria.split(",")):
        if not name:
            continue
        if name not in RS_CRITERIA:
            raise ValueError(f"unknown rejection criterion {name!r}; allowed: {', '.join(RS_CRITERIA)}")
        if name not in names:
            names.append(name)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise TypeError(f"threshold must be a number or a string, got {type(threshold).__name__}")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()] if isinstance(threshold, str) \
        else [repr(float(threshold))]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"threshold {threshold!r} gives {len(specs)} specs for {len(names)} criteria "
                         f"({', '.join(names)}); give one shared spec or exactly one per criterion")
    if len(specs) == 1:
        specs = specs * len(names)
    out: list[tuple[str, float | None, float]] = []
    for name, spec in zip(names, specs):
        what = f"threshold {spec!r} for {name}"
        if name.endswith("k1"):
            if "_" in spec:
                parts = spec.split("_")
                if len(parts) != 2:
                    raise ValueError(f"{what} must be 'lo_hi' or a single number")
                lower, upper = _parse_number(parts[0], what), _parse_number(parts[1], what)
                if lower > upper:
                    raise ValueError(f"{what}: lower bound {lower} exceeds upper bound {upper}")
            else:
                upper = _parse_number(spec, what)
                lower = 1.0 / upper
            out.append((name, lower, upper))
        else:
            if "_" in spec:
                raise ValueError(f"{what} must be a single upper bound (no '_'): only k1 criteria take 'lo_hi'")
            out.append((name, None, _parse_number(spec, what)))
    return out


def rejection_mask(log_ratio: jax.Array, mask: jax.Array, *, criteria: str = "token_k1",
                   threshold: float | str = "0.5_2.0") -> tuple[jax.Array, dict[str, jax.Array]]:
    """verl's divergence-based rejection: ``mask * keep`` (mask's dtype) and metrics; see the module docstring."""
    parsed = parse_rejection_criteria(criteria, threshold)
    lr, valid, m = _prepare(log_ratio, mask)
    dtype = m.dtype
    safe = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -safe, "k2": 0.5 * jnp.square(safe), "k3": jnp.exp(safe) - 1.0 - safe}
    row_valid = jnp.any(valid, axis=-1)
    keep_all = jnp.ones(lr.shape, bool)
    metrics: dict[str, jax.Array] = {}
    for name, lower, upper in parsed:
        kind = name[-2:]
        tok = stats[kind]
        if name.startswith("token"):
            stat, units = tok, valid
        elif name.startswith("seq_sum"):
            stat, units = jnp.sum(jnp.where(valid, tok, 0), axis=-1), row_valid
        elif name.startswith("seq_mean"):
            stat, units = _masked_mean(tok, m, axis=-1), row_valid
        else:
            stat = jnp.where(row_valid, jnp.max(jnp.where(valid, tok, -jnp.inf), axis=-1), 0)
            units = row_valid
        if lower is not None:
            keep = (stat >= np.log(lower)) & (stat <= np.log(upper))
        else:
            keep = stat <= upper
        if stat.ndim == 1:
            keep = jnp.broadcast_to(keep[:, None], lr.shape)
            stat_tok = jnp.broadcast_to(stat[:, None], lr.shape)
        else:
            stat_tok = stat
        keep_all = keep_all & keep
        prefix = f"rollout_rs_{name}"
        metrics[f"{prefix}_masked_fraction"] = _masked_mean((~keep).astype(dtype), m)
        metrics[f"{prefix}_seq_masked_fraction"] = _mean_over(jnp.any(~keep & valid, axis=-1).astype(dtype),
                                                              row_valid)
        metrics[f"{prefix}_mean"] = _masked_mean(stat_tok, m)
        metrics[f"{prefix}_max"] = _max_over(stat, units)
        metrics[f"{prefix}_min"] = _min_over(stat, units)
    metrics["rollout_rs_masked_fraction"] = _masked_mean((~keep_all).astype(dtype), m)
    metrics["rollout_rs_seq_masked_fraction"] = _mean_over(jnp.any(~keep_all & valid, axis=-1).astype(dtype),
                                                           row_valid)
    mask_arr = jnp.asarray(mask)
    new_mask = jnp.where(keep_all, mask_arr, jnp.zeros_like(mask_arr))
    return new_mask, jax.tree.map(jax.lax.stop_gradient, metrics)


def offpolicy_metrics(train_logp: jax.Array, rollout_logp: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Off-policy diagnostics between the training and the rollout policy (verl ``compute_offpolicy_metrics``).

    With ``l = train_logp - rollout_logp`` on valid tokens, per valid row ``b``:
    ``a_b = masked_mean_t(train_logp)``, ``c_b = masked_mean_t(rollout_logp)``, ``d_b = c_b - a_b``;
    ``E_b`` = mean over valid rows, ``E_t`` = ``masked_mean`` over tokens::

        kl = E_t(-l)        k3_kl = E_t(exp(l) - l - 1)
        training_ppl = E_b exp(-a_b)   training_log_ppl = E_b(-a_b)   (rollout_* likewise with c_b)
        log_ppl_diff = E_b d_b   log_ppl_abs_diff = E_b |d_b|   log_ppl_diff_max|min = max|min_b d_b
        ppl_ratio = E_b exp(d_b)
        chi2_token = E_t exp(2 clip(l, -20, 20)) - 1
        chi2_seq = E_b exp(2 clip(sum_t m l, -20, 20)) - 1
    """
    check_same_shape(train_logp=train_logp, rollout_logp=rollout_logp, mask=mask)
    check_floating("rollout_logp", rollout_logp)
    tl, valid, m = _prepare(train_logp, mask, "train_logp")
    rl = jnp.where(valid, jnp.asarray(rollout_logp, m.dtype), 0)
    lr = tl - rl
    rows = jnp.any(valid, axis=-1)
    a = _masked_mean(tl, m, axis=-1)
    c = _masked_mean(rl, m, axis=-1)
    d = c - a
    safe = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
    seq = jnp.clip(jnp.sum(lr, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    metrics = {
        "kl": _masked_mean(-lr, m),
        "k3_kl": _masked_mean(jnp.exp(lr) - lr - 1.0, m),
        "training_ppl": _mean_over(jnp.exp(-a), rows),
        "training_log_ppl": _mean_over(-a, rows),
        "rollout_ppl": _mean_over(jnp.exp(-c), rows),
        "rollout_log_ppl": _mean_over(-c, rows),
        "log_ppl_diff": _mean_over(d, rows),
        "log_ppl_abs_diff": _mean_over(jnp.abs(d), rows),
        "log_ppl_diff_max": _max_over(d, rows),
        "log_ppl_diff_min": _min_over(d, rows),
        "ppl_ratio": _mean_over(jnp.exp(d), rows),
        "chi2_token": _masked_mean(jnp.exp(2.0 * safe), m) - 1.0,
        "chi2_seq": _mean_over(jnp.exp(2.0 * seq), rows) - 1.0,
    }
    return jax.tree.map(jax.lax.stop_gradient, metrics)
