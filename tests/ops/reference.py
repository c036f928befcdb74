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
    zero = np.zeros((b, t_len))
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
            wt = 1.0
            if weights is not None:
                w = np.asarray(weights, np.float64)
                wt = w[i, t] if w.shape[1] == t_len else w[i, 0]
                value *= wt
            zero[i, t] = float(a == 0 or l2 > l1 or (a < 0 and l12 > -a * clip_c) or wt == 0)
            per[i, t] = value
            neg_kl[i, t] = -k
    metrics = {"pg_clipfrac": masked_mean(clipped, mask), "pg_clipfrac_lower": masked_mean(lower, mask),
               "ppo_kl": masked_mean(neg_kl, mask), "pg_zero_grad_frac": masked_mean(zero, mask)}
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


# --- critic-free estimators, priorities, rollout correction, DPO (written from the formulas, plain loops) ---


def _groups(group_ids):
    groups = {}
    for i, g in enumerate(np.asarray(group_ids).tolist()):
        groups.setdefault(g, []).append(i)
    return groups


def _row_scores(rewards, mask):
    r = np.asarray(rewards, np.float64)
    mk = np.asarray(mask) != 0
    return [sum(float(r[i, t]) for t in range(r.shape[1]) if mk[i, t]) for i in range(r.shape[0])]


def _broadcast_rows(values, mask):
    mk = np.asarray(mask) != 0
    return np.array([[values[i] if mk[i, t] else 0.0 for t in range(mk.shape[1])] for i in range(mk.shape[0])])


def _mean_std(vals):
    n = len(vals)
    mu = sum(vals) / n
    sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return mu, sd


def grpo_advantages(rewards, mask, group_ids, norm_by_std=True, eps=1e-6):
    s = _row_scores(rewards, mask)
    out = [0.0] * len(s)
    for members in _groups(group_ids).values():
        vals = [s[i] for i in members]
        mu, sd = (0.0, 1.0) if len(vals) == 1 else _mean_std(vals)
        for i in members:
            out[i] = (s[i] - mu) / (sd + eps) if norm_by_std else s[i] - mu
    return _broadcast_rows(out, mask)


def rloo_advantages(rewards, mask, group_ids):
    s = _row_scores(rewards, mask)
    out = list(s)
    for members in _groups(group_ids).values():
        if len(members) > 1:
            for i in members:
                others = [s[j] for j in members if j != i]
                out[i] = s[i] - sum(others) / len(others)
    return _broadcast_rows(out, mask)


def reinforce_pp(rewards, mask, gamma):
    r = np.asarray(rewards, np.float64)
    mk = np.asarray(mask) != 0
    b, t_len = r.shape
    ret = np.zeros((b, t_len))
    for i in range(b):
        carry = 0.0
        for t in reversed(range(t_len)):
            g = (r[i, t] if mk[i, t] else 0.0) + gamma * carry
            ret[i, t] = g
            carry = g if mk[i, t] else 0.0
    adv = masked_whiten(ret, mk) * mk
    return adv, ret


def reinforce_pp_baseline(rewards, mask, group_ids):
    s = _row_scores(rewards, mask)
    centred = list(s)
    for members in _groups(group_ids).values():
        if len(members) > 1:
            mu = sum(s[i] for i in members) / len(members)
            for i in members:
                centred[i] = s[i] - mu
    mk = np.asarray(mask) != 0
    x = _broadcast_rows(centred, mask)
    return masked_whiten(x, mk) * mk


def priority_agg_abs(x, mask, agg):
    x = np.asarray(x, np.float64)
    mk = np.asarray(mask) != 0
    out = []
    for i in range(x.shape[0]):
        vals = [abs(x[i, t]) for t in range(x.shape[1]) if mk[i, t]]
        out.append(0.0 if not vals else (max(vals) if agg == "max" else sum(vals) / len(vals)))
    return np.array(out)


def group_variance(scores, group_ids):
    s = [float(v) for v in np.asarray(scores, np.float64)]
    out = [0.0] * len(s)
    for members in _groups(group_ids).values():
        _, sd = _mean_std([s[i] for i in members])
        for i in members:
            out[i] = sd * sd
    return np.array(out)


def rollout_is_weights(log_ratio, mask, level, threshold, batch_normalize=False):
    """Reference for rollout_correction_weights: weights and metrics (units = valid tokens / valid rows)."""
    lr = np.asarray(log_ratio, np.float64)
    mk = np.asarray(mask) != 0
    b, t_len = lr.shape
    if isinstance(threshold, str) and "_" in threshold:
        lo, hi = (float(v) for v in threshold.split("_"))
        band = True
    else:
        hi = float(threshold)
        lo, band = 1.0 / hi, False
    clamp = lambda v: min(max(v, -20.0), 20.0)  # noqa: E731
    rho = np.zeros((b, t_len))
    unit_rho, unit_log = [], []
    rows = [i for i in range(b) if mk[i].any()]
    for i in range(b):
        if level == "token":
            for t in range(t_len):
                if mk[i, t]:
                    rho[i, t] = math.exp(clamp(lr[i, t]))
                    unit_rho.append(rho[i, t])
                    unit_log.append(lr[i, t])
        elif i in rows:
            total = sum(lr[i, t] for t in range(t_len) if mk[i, t])
            w = math.exp(clamp(total))
            for t in range(t_len):
                if mk[i, t]:
                    rho[i, t] = w
            unit_rho.append(w)
            unit_log.append(total)
    toks = [(i, t) for i in range(b) for t in range(t_len) if mk[i, t]]
    n_tok = len(toks)
    tok_mean = lambda f: sum(f(i, t) for i, t in toks) / (n_tok + 1e-8)  # noqa: E731
    # verl 0.9.1 (compute_is_metrics): statistics of the applied weights w, fractions from the raw ratios rho
    w = np.zeros((b, t_len))
    for i, t in toks:
        w[i, t] = min(rho[i, t], hi) if not band else (rho[i, t] if lo <= rho[i, t] <= hi else 0.0)
    met = {"rollout_is_mean": tok_mean(lambda i, t: w[i, t])}
    if level == "token":
        met["rollout_is_max"] = max(w[i, t] for i, t in toks)
        met["rollout_is_min"] = min(w[i, t] for i, t in toks)
        met["rollout_is_ratio_fraction_high"] = sum(v > hi for v in unit_rho) / len(unit_rho)
        met["rollout_is_ratio_fraction_low"] = sum(v < lo for v in unit_rho) / len(unit_rho)
    else:
        met["rollout_is_max"] = math.exp(min(max(unit_log), 20.0))
        met["rollout_is_min"] = math.exp(min(unit_log))
        met["rollout_is_ratio_fraction_high"] = sum(v > math.log(hi) for v in unit_log) / len(unit_log)
        met["rollout_is_ratio_fraction_low"] = sum(v < math.log(lo) for v in unit_log) / len(unit_log)
    if band:
        met["rollout_is_oob_ratio"] = tok_mean(lambda i, t: float(rho[i, t] < lo or rho[i, t] > hi))
    ws = lambda i, t: min(max(w[i, t], 0.0), hi)  # noqa: E731
    ms = tok_mean(ws)
    var = tok_mean(lambda i, t: ws(i, t) ** 2) - ms * ms
    met["rollout_is_std"] = math.sqrt(max(var, 0.0)) if n_tok > 1 else 0.0
    met["rollout_is_eff_sample_size"] = 1.0 / tok_mean(lambda i, t: (ws(i, t) / (ms + 1e-8)) ** 2)
    row_mean = lambda x, i: sum(x[i, t] for t in range(t_len) if mk[i, t]) / (mk[i].sum() + 1e-8)  # noqa: E731
    q = [row_mean(w, i) for i in rows]
    q_raw = [row_mean(rho, i) for i in rows]
    qm, qs = _mean_std(q)
    met.update({"rollout_is_seq_mean": qm, "rollout_is_seq_std": qs, "rollout_is_seq_max": max(q),
                "rollout_is_seq_min": min(q), "rollout_is_seq_max_deviation": max(abs(v - 1) for v in q),
                "rollout_is_seq_fraction_high": sum(v > hi for v in q_raw) / len(q_raw),
                "rollout_is_seq_fraction_low": sum(v < lo for v in q_raw) / len(q_raw)})
    if batch_normalize:
        if level == "token":
            mean_w = sum(w[i, t] for i, t in toks) / (n_tok + 1e-8)
        else:
            mean_w = sum(w[i, mk[i].argmax()] for i in rows) / len(rows)
        if mean_w > 1e-8:
            w = w / mean_w
        met["rollout_is_batch_norm_factor"] = mean_w if mean_w > 1e-8 else 1.0
    return w, met


def rejection_keep(log_ratio, mask, criteria):
    """Reference for rejection_mask: ``criteria`` = [(name, lower or None, upper)]; returns (mask, metrics)."""
    lr = np.asarray(log_ratio, np.float64)
    mk = np.asarray(mask) != 0
    b, t_len = lr.shape
    keep_all = np.ones((b, t_len), bool)
    met = {}
    rows = [i for i in range(b) if mk[i].any()]
    toks = [(i, t) for i in range(b) for t in range(t_len) if mk[i, t]]
    for name, lower, upper in criteria:
        kind = name[-2:]

        def k(i, t):
            x = min(max(lr[i, t], -20.0), 20.0)
            return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[kind]  # noqa: B023

        def ok(v):
            return (math.log(lower) <= v <= math.log(upper)) if lower is not None else v <= upper  # noqa: B023

        keep = np.ones((b, t_len), bool)
        stat = np.zeros((b, t_len))
        for i in range(b):
            vals = [k(i, t) for t in range(t_len) if mk[i, t]]
            for t in range(t_len):
                if name.startswith("token"):
                    stat[i, t] = k(i, t)
                elif name.startswith("seq_sum"):
                    stat[i, t] = sum(vals)
                elif name.startswith("seq_mean"):
                    stat[i, t] = sum(vals) / (len(vals) + 1e-8)
                else:
                    stat[i, t] = max(vals) if vals else 0.0
                keep[i, t] = ok(stat[i, t])
        keep_all &= keep
        pre = f"rollout_rs_{name}"
        met[f"{pre}_masked_fraction"] = sum(not keep[i, t] for i, t in toks) / (len(toks) + 1e-8)
        met[f"{pre}_seq_masked_fraction"] = sum(any(mk[i] & ~keep[i]) for i in rows) / len(rows)
        met[f"{pre}_mean"] = sum(stat[i, t] for i, t in toks) / (len(toks) + 1e-8)
        units = [stat[i, t] for i, t in toks] if name.startswith("token") else [stat[i, 0] for i in rows]
        met[f"{pre}_max"], met[f"{pre}_min"] = max(units), min(units)
    met["rollout_rs_masked_fraction"] = sum(not keep_all[i, t] for i, t in toks) / (len(toks) + 1e-8)
    met["rollout_rs_seq_masked_fraction"] = sum(any(mk[i] & ~keep_all[i]) for i in rows) / len(rows)
    return (mk & keep_all).astype(np.float64), met


def offpolicy(train_logp, rollout_logp, mask):
    tl, rl = np.asarray(train_logp, np.float64), np.asarray(rollout_logp, np.float64)
    mk = np.asarray(mask) != 0
    b, t_len = tl.shape
    rows = [i for i in range(b) if mk[i].any()]
    toks = [(i, t) for i in range(b) for t in range(t_len) if mk[i, t]]
    tm = lambda f: sum(f(i, t) for i, t in toks) / (len(toks) + 1e-8)  # noqa: E731
    rm = lambda f: sum(f(i) for i in rows) / len(rows)  # noqa: E731
    a = {i: sum(tl[i, t] for t in range(t_len) if mk[i, t]) / (mk[i].sum() + 1e-8) for i in rows}
    c = {i: sum(rl[i, t] for t in range(t_len) if mk[i, t]) / (mk[i].sum() + 1e-8) for i in rows}
    d = {i: c[i] - a[i] for i in rows}
    lr = lambda i, t: tl[i, t] - rl[i, t]  # noqa: E731
    seq = {i: min(max(sum(lr(i, t) for t in range(t_len) if mk[i, t]), -20.0), 20.0) for i in rows}
    return {
        "kl": tm(lambda i, t: -lr(i, t)), "k3_kl": tm(lambda i, t: math.exp(lr(i, t)) - lr(i, t) - 1),
        "training_ppl": rm(lambda i: math.exp(-a[i])), "training_log_ppl": rm(lambda i: -a[i]),
        "rollout_ppl": rm(lambda i: math.exp(-c[i])), "rollout_log_ppl": rm(lambda i: -c[i]),
        "log_ppl_diff": rm(lambda i: d[i]), "log_ppl_abs_diff": rm(lambda i: abs(d[i])),
        "log_ppl_diff_max": max(d.values()), "log_ppl_diff_min": min(d.values()),
        "ppl_ratio": rm(lambda i: math.exp(d[i])),
        "chi2_token": tm(lambda i, t: math.exp(2 * min(max(lr(i, t), -20.0), 20.0))) - 1,
        "chi2_seq": rm(lambda i: math.exp(2 * seq[i])) - 1,
    }


def _log_sigmoid(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def dpo(pc, pr, rc, rr, beta, loss_type, eps=0.0, nc=None, nr=None, rpo_alpha=0.0):
    losses, ch, rj = [], [], []
    for i in range(len(pc)):
        uc, ur = float(pc[i]) - float(rc[i]), float(pr[i]) - float(rr[i])
        d = uc - ur
        if loss_type in ("ipo", "sigmoid_norm"):
            dn = uc / max(float(nc[i]), 1.0) - ur / max(float(nr[i]), 1.0)
        if loss_type == "sigmoid":
            loss = -(1 - eps) * _log_sigmoid(beta * d) - eps * _log_sigmoid(-beta * d)
        elif loss_type == "hinge":
            loss = max(0.0, 1 - beta * d)
        elif loss_type == "ipo":
            loss = (dn - 1 / (2 * beta)) ** 2
        elif loss_type == "robust":
            loss = (-(1 - eps) * _log_sigmoid(beta * d) + eps * _log_sigmoid(-beta * d)) / (1 - 2 * eps)
        else:
            loss = -_log_sigmoid(beta * dn)
        if rpo_alpha:   # TRL: one token-mean NLL over all chosen tokens of the batch, added to every pair
            loss += rpo_alpha * (-sum(float(v) for v in pc) / max(sum(float(v) for v in nc), 1.0))
        losses.append(loss)
        ch.append(beta * uc)
        rj.append(beta * ur)
    n = len(pc)
    met = {"rewards/chosen": sum(ch) / n, "rewards/rejected": sum(rj) / n,
           "rewards/accuracies": sum(c > r for c, r in zip(ch, rj)) / n,
           "rewards/margins": sum(c - r for c, r in zip(ch, rj)) / n,
           "logps/chosen": sum(float(v) for v in pc) / n, "logps/rejected": sum(float(v) for v in pr) / n}
    return np.array(losses), met
