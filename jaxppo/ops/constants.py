"""Numerical constants shared by several ops modules (one definition each)."""

#: clamp of a log-ratio (``log π − log π_old``, ``log π_ref − log π``, a summed sequence log-ratio) before
#: ``exp``, so ``exp`` stays finite in float32: ``exp(20) ≈ 4.9e8`` (as verl). Used by ``kl`` (k3), ``losses``
#: (the PPO ratio) and ``importance`` (token and aggregated importance weights).
LOG_RATIO_CLAMP = 20.0
