"""Wasted iterations of a run, from its ``metrics.jsonl`` (host-side NumPy).

Two measures, both over the run's update steps ``t = 1..T`` (every step logged: ``trainer.log_every = 1``):

- ``zero_grad_token_frac``: the mean over steps of ``waste/zero_grad_token_frac``, the share of the sampled
  minibatch's response tokens whose policy-loss term has no gradient (the clipped or dual-clipped branch selected, a
  zero advantage, a zero weight such as a masked importance ratio or a filtered sample, or a token masked out of the
  loss);
- ``low_grad_update_frac``: the share of steps ``t >= 2`` whose actor gradient norm ``g_t`` (``actor/grad_norm``:
  the policy and KL terms of the loss, before clipping) is below ``fraction`` (0.1) of the median of the earlier
  steps' norms ``median(g_1..g_{t-1})``: updates that move the policy an order of magnitude less than is usual for
  the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

LOW_GRAD_FRACTION = 0.1


def run_waste(rows: Iterable[dict], fraction: float = LOW_GRAD_FRACTION) -> dict[str, float]:
    """Both measures (module docstring) of one run's metric rows (``metrics.jsonl`` records, any order); NaN for a
    measure with no logged step."""
    by_step: dict[int, dict] = {}
    for r in rows:
        s = r.get("step")
        if isinstance(s, int) and s >= 1:
            by_step.setdefault(s, {}).update(r)
    steps = sorted(by_step)
    z = [float(by_step[s]["waste/zero_grad_token_frac"]) for s in steps if "waste/zero_grad_token_frac" in by_step[s]]
    g = [float(by_step[s]["actor/grad_norm"]) for s in steps if "actor/grad_norm" in by_step[s]]
    low = [g[t] < fraction * float(np.median(g[:t])) for t in range(1, len(g))]
    return {"zero_grad_token_frac": float(np.mean(z)) if z else math.nan,
            "low_grad_update_frac": float(np.mean(low)) if low else math.nan}
