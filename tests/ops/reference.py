"""Independent reference implementations: plain numpy loops (per row, per timestep) in float64.

Written from verl's ``core_algos`` / ``torch_functional`` formulas, not from ``jaxppo.ops``: no vectorised
tricks, every quantity is built element by element so a mistake in the vectorised code cannot be copied here.
"""

from __future__ import annotations

import math

import numpy as np


def gae(rewards, values, mask, gamma, lam):
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    m = np.asarray(mask) != 0
    b, t_len = r.shape
    adv = np.zeros((b, t_len))
    for i in range(b):
        next_value = 0.0
        last = 0.0
        for t in reversed(range(t_len)):
            delta = r[i, t] + gamma * next_value - v[i, t]
            candidate = delta + gamma * lam * last
            if m[i, t]:
                next_value = v[i, t]
                last = candidate
            adv[i, t] = last
    return adv, adv + v


def masked_mean(x, mask):
    total, count = 0.0, 0.0
    for xi, mi in zip(np.ravel(x), np.ravel(mask)):
        if mi:
            total += float(xi)
            count += 1.0
    return total / (count + 1e-8)


def masked_mean_axis(x, mask, axis):
    x = np.asarray(x, np.float64)
    mask = np.asarray(mask)
    x = np.moveaxis(x, axis, -1)
    mk = np.moveaxis(mask, axis, -1)
    out = np.zeros(x.shape[:-1])
    for idx in np.ndindex(*x.shape[:-1]):
        out[idx] = masked_mean(x[idx], mk[idx])
    return out


def masked_var(x, mask):
    mean = masked_mean(x, mask)
    n = 0
    sq = 0.0
    for xi, mi in zip(np.ravel(x), np.ravel(mask)):
        if mi:
            sq += (float(xi) - mean) ** 2
            n += 1
    var = sq / (n + 1e-8)
    return var * n / (n - 1)


def masked_whiten(x, mask, shift_mean=True):
    x = np.asarray(x, np.float64)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape):
        out[idx] = (x[idx] - mean) / math.sqrt(var + 1e-8)
        if not shift_mean:
            out[idx] += mean
    return out


def entropy(logits):
    z = np.asarray(logits, np.float64)
    out = np.zeros(z.shape[:-1])
    for idx in np.ndindex(*z.shape[:-1]):
        row = z[idx]
        mx = max(row)
        exps = [math.exp(a - mx) for a in row]
        s = sum(exps)
        out[idx] = -sum((e / s) * (a - mx - math.log(s)) for a, e in zip(row, exps))
    return out


def logprobs(logits, tokens):
    z = np.asarray(logits, np.float64)
    out = np.zeros(z.shape[:-1])
    for idx in np.ndindex(*z.shape[:-1]):
        row = z[idx]
        mx = max(row)
        lse = mx + math.log(sum(math.exp(a - mx) for a in row))
        out[idx] = row[int(tokens[idx])] - lse
    return out


def kl(logp, ref_logp, kind):
    base = kind.rstrip("+")
    lp = np.asarray(logp, np.float64)
    rp = np.asarray(ref_logp, np.float64)
    out = np.zeros(lp.shape)
    for idx in np.ndindex(*lp.shape):
        d = lp[idx] - rp[idx]
        if base in ("k1", "kl"):
            out[idx] = d
        elif base == "abs":
            out[idx] = abs(d)
        elif base in ("k2", "mse"):
            out[idx] = 0.5 * d * d
        else:
            x = min(max(rp[idx] - lp[idx], -20.0), 20.0)
            out[idx] = min(max(math.exp(x) - x - 1.0, -10.0), 10.0)
    return out


def aggregate(loss, mask, mode):
    loss = np.asarray(loss, np.float64)
    mask = np.asarray(mask) != 0
    b, t_len = loss.shape
    if mode == "token-mean":
        return masked_mean(loss, mask)
    seq_values = []
    for i in range(b):
        s, n = 0.0, 0
        for t in range(t_len):
            if mask[i, t]:
                s += loss[i, t]
                n += 1
        if n == 0:
            continue  # fully masked rows do not count
        seq_values.append(s / (n + 1e-8) if mode == "seq-mean-token-mean" else s)
    if not seq_values:
        return 0.0
    out = sum(seq_values) / len(seq_values)
    if mode == "seq-mean-token-sum-norm":
        out /= t_len
    return out


def policy_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0, agg="token-mean",
                weights=None):
    logp, old_logp, adv = (np.asarray(a, np.float64) for a in (logp, old_logp, adv))
    b, t_len = logp.shape
    per = np.zeros((b, t_len))
    clipped = np.zeros((b, t_len))
    lower = np.zeros((b, t_len))
    neg_kl = np.zeros((b, t_len))
    for i in range(b):
        for t in range(t_len):
            k = min(max(logp[i, t] - old_logp[i, t], -20.0), 20.0)
            ratio = math.exp(k)
            a = adv[i, t]
            l1 = -a * ratio
            l2 = -a * min(max(ratio, 1 - clip_low), 1 + clip_high)
            l12 = max(l1, l2)
            value = l12
            if a < 0:
                value = min(l12, -a * clip_c)
                lower[i, t] = float(l12 > -a * clip_c)
            clipped[i, t] = float(l2 > l1)
            if weights is not None:
                w = np.asarray(weights, np.float64)
                value *= w[i, t] if w.shape[1] == t_len else w[i, 0]
            per[i, t] = value
            neg_kl[i, t] = -k
    metrics = {"pg_clipfrac": masked_mean(clipped, mask), "pg_clipfrac_lower": masked_mean(lower, mask),
               "ppo_kl": masked_mean(neg_kl, mask)}
    return aggregate(per, mask, agg), metrics


def value_loss(values, old_values, returns, mask, clip=0.5, agg="token-mean"):
    v, vo, ret = (np.asarray(a, np.float64) for a in (values, old_values, returns))
    b, t_len = v.shape
    per = np.zeros((b, t_len))
    frac = np.zeros((b, t_len))
    for i in range(b):
        for t in range(t_len):
            vc = min(max(v[i, t], vo[i, t] - clip), vo[i, t] + clip)
            l1 = (v[i, t] - ret[i, t]) ** 2
            l2 = (vc - ret[i, t]) ** 2
            per[i, t] = max(l1, l2)
            frac[i, t] = float(l2 > l1)
    return 0.5 * aggregate(per, mask, agg), {"vf_clipfrac": masked_mean(frac, mask)}


def importance_weights(target, behaviour, mask, level, mode, threshold, lower=None, veto=None, cap_rule=False):
    target, behaviour = np.asarray(target, np.float64), np.asarray(behaviour, np.float64)
    mask = np.asarray(mask) != 0
    b, t_len = target.shape
    if mode == "mask" and lower is None:
        lower = 1.0 / threshold
    weights = np.zeros((b, t_len))
    unit_raw, unit_final = [], []
    vetoed_rows, valid_rows = 0, 0

    def adjust(rho):
        if mode == "mask" and not (lower <= rho <= threshold):     # the band sees the raw ratio
            return 0.0
        w = rho
        if cap_rule and w > 1.5:
            w = 1.2
        if mode == "truncate":
            w = min(w, threshold)
        return w

    for i in range(b):
        lrs = [min(max(target[i, t] - behaviour[i, t], -20.0), 20.0) for t in range(t_len) if mask[i, t]]
        if not lrs:
            continue
        valid_rows += 1
        is_vetoed = veto is not None and any(math.exp(x) < veto for x in lrs)
        vetoed_rows += int(is_vetoed)
        if level == "token":
            j = 0
            for t in range(t_len):
                if mask[i, t]:
                    rho = math.exp(lrs[j])
                    w = 0.0 if is_vetoed else adjust(rho)
                    weights[i, t] = w
                    unit_raw.append(rho)
                    unit_final.append(w)
                    j += 1
        else:
            total = sum(lrs)
            if level == "sequence":
                rho = math.exp(min(max(total, -20.0), 20.0))
            else:
                rho = math.exp(total / len(lrs))
            w = 0.0 if is_vetoed else adjust(rho)
            for t in range(t_len):
                if mask[i, t]:
                    weights[i, t] = w
            unit_raw.append(rho)
            unit_final.append(w)
    n = len(unit_final)
    s1 = sum(unit_final)
    s2 = sum(w * w for w in unit_final)
    metrics = {
        "ess": (s1 * s1 / (n * s2)) if s2 > 0 else 0.0,
        "weight_mean": s1 / max(n, 1),
        "weight_max": max(unit_final, default=0.0),
        "clipped_frac": sum(1 for a, c in zip(unit_raw, unit_final) if a != c) / max(n, 1),
        "veto_frac": vetoed_rows / max(valid_rows, 1),
    }
    return weights, metrics


def adaptive_kl(coef, kl_value, n_steps, target, horizon):
    err = min(max(kl_value / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + err * n_steps / horizon)


def finite_difference_grad(f, x: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Central differences ``(f(x + eps·e_i) - f(x - eps·e_i)) / 2eps`` of a scalar ``f`` at every entry of ``x``
    (evaluated in float64)."""
    x = np.asarray(x, np.float64)
    out = np.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        out[idx] = (f(xp) - f(xm)) / (2 * eps)
    return out
