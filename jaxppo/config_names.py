"""The one check of the config values that name a registry entry (``jaxppo.registry``), run by every command
right after loading its config and before any model loads (``jaxppo.cli.util.parse_args_and_config``; the sweep runner
for each run's config).

The config schema (``jaxppo.config``) sits below every registry, so it types these keys as plain strings; the
allowed names are the registries' names at check time: the built-in entries plus any registered before the
command checks its config. This module imports the layers that register the built-ins, hence it belongs to the
command-line layer.
"""

from __future__ import annotations

from typing import Any

from jaxppo import ops, replay
from jaxppo.config.core import ConfigError
from jaxppo.registry import Registry
from jaxppo.rewards.registry import REWARDS
from jaxppo.trainer.ppo.policy_losses import POLICY_LOSSES

#: dotted config key -> (registry, its public home, values besides the registry's names that mean "off")
NAMED_KEYS: dict[str, tuple[Registry, str, tuple[str, ...]]] = {
    "algorithm.adv_estimator": (ops.ADVANTAGE_ESTIMATORS, "jaxppo.ops.ADVANTAGE_ESTIMATORS", ()),
    "replay.priority": (ops.PRIORITIES, "jaxppo.ops.PRIORITIES", ()),
    "actor.policy_loss": (POLICY_LOSSES, "jaxppo.trainer.ppo.policy_losses.POLICY_LOSSES", ()),
    "pf_ppo.filter": (replay.PF_FILTERS, "jaxppo.replay.PF_FILTERS", ()),
    "pf_ppo.reweight_method": (replay.PF_REWEIGHTS, "jaxppo.replay.PF_REWEIGHTS", ("none",)),
    "reward.kind": (REWARDS, "jaxppo.rewards.REWARDS", ()),
}


def allowed_names(key: str) -> tuple[str, ...]:
    """The values ``key`` (a key of :data:`NAMED_KEYS`) accepts now."""
    registry, _, off = NAMED_KEYS[key]
    return tuple(sorted({*registry.names(), *off}))


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_config_names(cfg: Any) -> None:
    """``ConfigError`` naming the key and listing the known names for the first value of :data:`NAMED_KEYS` that
    no registry holds (``replay.priority: null`` means the estimator's default and is accepted)."""
    for key, (registry, home, _) in NAMED_KEYS.items():
        value = _value(cfg, key)
        if value is None and key == "replay.priority":
            continue
        names = allowed_names(key)
        if value not in names:
            raise ConfigError(f"{key}: unknown {registry.kind} {value!r}; known: {', '.join(names)} (register "
                              f"others with @{home}.register before the config is checked)")
