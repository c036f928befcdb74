"""Frozen hyper-parameter records: the config turned, once in setup, into what the pure jitted functions read.

``step_hparams(cfg) -> StepHP`` validates the cross-section rules (``ConfigError`` naming the key and the fix) and
returns hashable records, so ``actor_terms`` / ``critic_terms`` / the prepare and update functions never see the
whole ``Config``:

- :class:`ActorHP`: PPO clip ``[1 − clip_low, 1 + clip_high]``, dual clip ``c``, aggregation, entropy and KL-loss
  coefficients, the policy loss name (``jaxppo.trainer.ppo.policy_losses.POLICY_LOSSES``);
- :class:`CriticHP`: value clip, aggregation, ``c_v``; ``None`` in :class:`StepHP` for a critic-free estimator;
- :class:`AdvantageHP`: the estimator (``jaxppo.ops.ADVANTAGE_ESTIMATORS``) with its
  :class:`jaxppo.ops.AdvantageHParams`, ``norm_adv``, the KL-in-reward settings;
- :class:`ImportanceHP`: ``importance.*`` (``ρ = ops.importance_weights``) and :class:`RolloutCorrHP`:
  ``algorithm.rollout_correction.*`` (verl's rollout IS weights and rejection mask; exclusive with
  ``importance.enabled``);
- :class:`ReplayHP`: sampling, the priority function name (``jaxppo.ops.PRIORITIES``), β schedule;
- :class:`PFHP`: PF-PPO filter and batch-level reweighting;
- :class:`KLCtrlHP`: the KL coefficient's controller (``algorithm.kl_ctrl``: fixed, or adaptive with its target and
  horizon); ``StepHP.lora_dropout``: the adapters' dropout rate (0 without adapters).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxppo import ops
from jaxppo.config import ConfigError
from jaxppo.models.lora import spec_from_config


@dataclasses.dataclass(frozen=True)
class ActorHP:
    clip_low: float
    clip_high: float
    clip_c: float
    agg: str
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    kl_penalty: str        # estimator of the logged ``algorithm/kl`` (and of the KL in the reward)
    policy_loss: str = "ppo"


@dataclasses.dataclass(frozen=True)
class CriticHP:
    cliprange_value: float
    agg: str
    vf_coef: float
    gamma: float
    priority_agg: str
    share_trunk: bool = False


@dataclasses.dataclass(frozen=True)
class AdvantageHP:
    estimator: str
    params: ops.AdvantageHParams
    norm_adv: bool
    use_kl_in_reward: bool
    kl_penalty: str

    @property
    def needs_critic(self) -> bool:
        return ops.ADVANTAGE_ESTIMATORS.get(self.estimator).needs_critic


@dataclasses.dataclass(frozen=True)
class ImportanceHP:
    enabled: bool = False
    level: str = "token"
    mode: str = "truncate"
    threshold: float = 2.0
    lower: float | None = None
    veto: float | None = None
    cap_rule: bool = False


@dataclasses.dataclass(frozen=True)
class RolloutCorrHP:
    is_level: str | None = None               # None | "token" | "sequence"
    is_threshold: float | str = 2.0
    is_batch_normalize: bool = False
    rs: str | None = None                     # rejection criteria, e.g. "token_k1" or "seq_mean_k3,token_k1"
    rs_threshold: float | str | None = None

    @property
    def enabled(self) -> bool:
        return self.is_level is not None or self.rs is not None


@dataclasses.dataclass(frozen=True)
class ReplayHP:
    prioritized: bool
    priority: str          # a name of ops.PRIORITIES
    priority_agg: str
    beta0: float
    beta_steps: int
    group_size: int = 1    # replay.group_size: rows per sampled prompt group (1: single rows)


@dataclasses.dataclass(frozen=True)
class PFHP:
    filter: str = "none"
    reweight_method: str = "none"
    weight_pow: float = 1.0

    @property
    def reweight(self) -> bool:
        return self.reweight_method != "none"


@dataclasses.dataclass(frozen=True)
class KLCtrlHP:
    adaptive: bool = False    # algorithm.kl_ctrl.type == "adaptive": ops.adaptive_kl_update after each step
    target_kl: float = 0.1
    horizon: int = 10000


@dataclasses.dataclass(frozen=True)
class StepHP:
    actor: ActorHP
    critic: CriticHP | None      # None: critic-free estimator, no critic
    advantage: AdvantageHP
    importance: ImportanceHP
    rollout_corr: RolloutCorrHP
    replay: ReplayHP
    pf: PFHP
    mini_batch: int
    micro_batch: int
    actor_epochs: int
    critic_epochs: int
    kl_ctrl: KLCtrlHP = KLCtrlHP()
    lora_dropout: float = 0.0    # model.lora.dropout with adapters (model.lora.rank > 0), else 0


def default_priority(needs_critic: bool) -> str:
    """``td_error`` with a critic, ``abs_advantage`` without."""
    return "td_error" if needs_critic else "abs_advantage"


def step_hparams(cfg: Any) -> StepHP:
    """The records of ``cfg`` (see the module docstring); ``ConfigError`` for inconsistent settings."""
    a, c, alg, ic, rc, pf = cfg.actor, cfg.critic, cfg.algorithm, cfg.importance, cfg.replay, cfg.pf_ppo
    needs_critic = ops.ADVANTAGE_ESTIMATORS.get(alg.adv_estimator).needs_critic
    priority = rc.priority or default_priority(needs_critic)
    if ops.PRIORITIES.get(priority).needs_critic and not needs_critic:
        raise ConfigError(f"replay.priority={priority} needs a critic, but algorithm.adv_estimator="
                          f"{alg.adv_estimator!r} is critic-free; set replay.priority=abs_advantage (or "
                          "group_variance for group estimators)")
    corr = alg.rollout_correction
    if ic.enabled and corr.rollout_is is not None:
        raise ConfigError("importance.enabled=true and algorithm.rollout_correction.rollout_is are both set: choose "
                          "one (set importance.enabled=false to use verl's rollout_is, or rollout_is=null)")
    actor = ActorHP(clip_low=a.clip_low, clip_high=a.clip_high, clip_c=a.clip_ratio_c, agg=a.loss_agg_mode,
                    entropy_coeff=a.entropy_coeff, use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef,
                    kl_loss_type=a.kl_loss_type, kl_penalty=alg.kl_penalty, policy_loss=a.policy_loss)
    critic = CriticHP(cliprange_value=c.cliprange_value, agg=c.loss_agg_mode, vf_coef=c.vf_coef, gamma=alg.gamma,
                      priority_agg=alg.priority_agg, share_trunk=c.share_trunk) if needs_critic else None
    adv = AdvantageHP(estimator=alg.adv_estimator,
                      params=ops.AdvantageHParams(gamma=alg.gamma, lam=alg.lam,
                                                  norm_by_std=alg.norm_adv_by_std_in_grpo),
                      norm_adv=alg.norm_adv, use_kl_in_reward=alg.use_kl_in_reward, kl_penalty=alg.kl_penalty)
    imp = ImportanceHP(enabled=ic.enabled, level=ic.level, mode=ic.mode, threshold=ic.threshold,
                       lower=ic.lower if ic.mode == "mask" else None, veto=ic.veto_threshold, cap_rule=ic.cap_rule)
    corr_hp = RolloutCorrHP(is_level=corr.rollout_is, is_threshold=corr.rollout_is_threshold,
                            is_batch_normalize=corr.rollout_is_batch_normalize, rs=corr.rollout_rs,
                            rs_threshold=corr.rollout_rs_threshold)
    replay = ReplayHP(prioritized=rc.sampling == "prioritized", priority=priority, priority_agg=alg.priority_agg,
                      beta0=rc.beta0, beta_steps=rc.beta_steps or cfg.trainer.total_steps, group_size=rc.group_size)
    pf_hp = PFHP(filter=pf.filter if pf.enabled else "none",
                 reweight_method=pf.reweight_method if pf.enabled else "none", weight_pow=pf.weight_pow)
    mb = a.ppo_mini_batch_size
    lora = spec_from_config(cfg.model.lora)
    n = rc.group_size
    if n > 1:
        micro = a.ppo_micro_batch_size or mb
        if mb % n or micro % n:
            raise ConfigError(f"replay.group_size={n}: actor.ppo_mini_batch_size={mb} and ppo_micro_batch_size="
                              f"{micro} must be multiples of it (minibatches of whole prompt groups)")
        if pf_hp.reweight:
            raise ConfigError(f"replay.group_size={n} does not combine with pf_ppo.reweight_method="
                              f"{pf.reweight_method!r} (a batch-level resample of single rows); use a pf_ppo.filter "
                              "or replay.group_size=1")
    return StepHP(actor=actor, critic=critic, advantage=adv, importance=imp, rollout_corr=corr_hp, replay=replay,
                  pf=pf_hp, mini_batch=mb, micro_batch=a.ppo_micro_batch_size or mb, actor_epochs=a.ppo_epochs,
                  critic_epochs=c.ppo_epochs,
                  kl_ctrl=KLCtrlHP(adaptive=alg.kl_ctrl.type == "adaptive", target_kl=alg.kl_ctrl.target_kl,
                                   horizon=alg.kl_ctrl.horizon),
                  lora_dropout=0.0 if lora is None else lora.dropout)
