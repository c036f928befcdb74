"""The names a caller needs to build and drive a PPO run, gathered from the modules that hold them:
``build`` (the run), ``windows`` (the buffer windows), ``abstract`` (the run as the memory plan sees it),
``critic`` and ``jaxppo.trainer.policy`` (the policy). Nothing is defined here."""

from jaxppo.hf.from_config import lm_config
from jaxppo.trainer.ppo.abstract import abstract_core, abstract_replay
from jaxppo.trainer.ppo.build import Core, Run, assemble_run, build_core, build_run, check_config, ensure_data
from jaxppo.trainer.ppo.critic import check_critic_vocab
from jaxppo.trainer.ppo.hparams import step_hparams
from jaxppo.trainer.ppo.windows import (
    buffer_layout,
    check_whole_groups,
    group_order,
    group_runs,
    group_windows,
    load_window,
    make_replay,
    window_items,
    window_slots,
)

__all__ = ["Core", "Run", "abstract_core", "abstract_replay", "assemble_run", "buffer_layout", "build_core",
           "build_run", "check_config", "check_critic_vocab", "check_whole_groups", "ensure_data", "group_order",
           "group_runs", "group_windows", "lm_config", "load_window", "make_replay", "step_hparams", "window_items",
           "window_slots"]
