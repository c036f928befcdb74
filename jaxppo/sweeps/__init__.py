"""Multi-seed sweeps (``python -m jaxppo.sweep --config FILE``): seeds x variants of one base config, each an ordinary
``jaxppo.train`` / ``jaxppo.dpo`` run in its own folder, compared with the baseline seed by seed.

- :mod:`jaxppo.sweeps.spec` — the sweep file's schema (checked by the config loader), profiles, the run plan;
- :mod:`jaxppo.sweeps.runner` — runs (or prints) the commands, resumable, failures recorded; a run folder with a
  ``summary.json`` (committed under ``results/sweeps`` included) is finished;
- :mod:`jaxppo.sweeps.stats` — the pure statistics: seed-paired t-intervals, exact sign-flip tests, censored first
  passage, power;
- :mod:`jaxppo.sweeps.results` — ``results.csv`` / ``summary.csv`` and the verdict sentence;
- :mod:`jaxppo.sweeps.calibrate` — ``python -m jaxppo.sweeps.calibrate``: the error rates of every statistic the
  report prints, on synthetic A/A sweeps;
- :mod:`jaxppo.sweeps.legacy` — the withdrawn data-efficiency ratio, kept only for the calibration to show its
  miscalibration;
- :mod:`jaxppo.sweeps.plots` — reward vs samples and reward vs KL figures;
- :mod:`jaxppo.sweeps.report` — ``python -m jaxppo.sweeps.report``: the Results tables, power lines and verdicts;
- :mod:`jaxppo.sweeps.notebook` — the ablation notebooks' helpers.
"""

from jaxppo.sweeps.spec import RunSpec, SweepError, SweepSpec, load_sweep, plan_runs

__all__ = ["RunSpec", "SweepError", "SweepSpec", "load_sweep", "plan_runs"]
