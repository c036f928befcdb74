"""Device-resident prioritized replay (pure functions over a pytree state) and PF-PPO filtration.

``init`` → ``add`` → (``sample`` → ``update_priorities`` or ``record_sample``)*, ``metrics`` for the logs;
the state is a ``flax.struct`` pytree that jits, shards over the mesh's batch axes and saves/restores with
Orbax. See ``state.py`` for what is stored, ``buffer.py`` for the formulas, ``staleness.py`` for the
priority decay with reuse/age, ``pf_ppo.py`` / ``filter_selection.py`` for PF-PPO.
"""

from jaxppo.replay import filter_selection, pf_ppo, staleness
from jaxppo.replay.buffer import add, record_sample, sample, set_priorities, update_priorities
from jaxppo.replay.filter_selection import binned_r2, filter_r2
from jaxppo.replay.metrics import metrics, staleness_metrics
from jaxppo.replay.pf_ppo import (PF_FILTERS, PF_REWEIGHTS, batch_reweight, best_of_n, best_random, best_worst, filter_weights,
                                  pow_weights, resample_indices)
from jaxppo.replay.schedule import beta_schedule, linear_beta
from jaxppo.replay.state import ReplayState, Sample, init

__all__ = ["PF_FILTERS", "PF_REWEIGHTS", "ReplayState", "Sample", "add", "batch_reweight", "beta_schedule", "best_of_n",
           "best_random", "best_worst", "binned_r2", "filter_r2", "filter_selection", "filter_weights", "init",
           "linear_beta", "metrics", "pf_ppo", "pow_weights", "record_sample", "resample_indices", "sample",
           "set_priorities", "staleness", "staleness_metrics", "update_priorities"]
