"""Multi-seed sweeps (``python -m jaxppo.sweep``): seeds x variants of one base config, each an ordinary
``jaxppo.train`` / ``jaxppo.dpo`` run in its own folder, aggregated into data-efficiency curves.

- :mod:`jaxppo.sweeps.spec` — the sweep file (YAML) schema, profiles and up-front validation;
- :mod:`jaxppo.sweeps.runner` — runs (or prints) the commands, resumable, failures recorded;
- :mod:`jaxppo.sweeps.results` — ``results.csv`` / ``summary.csv`` (t-intervals, AUC, samples-to-target,
  data-efficiency ratio with a seed bootstrap);
- :mod:`jaxppo.sweeps.plots` — reward vs samples and reward vs KL figures;
- :mod:`jaxppo.sweeps.report` — ``python -m jaxppo.sweeps.report``: the README Results table and verdicts.
"""

from jaxppo.sweeps.spec import RunSpec, SweepError, SweepSpec, load_sweep, plan_runs

__all__ = ["RunSpec", "SweepError", "SweepSpec", "load_sweep", "plan_runs"]
