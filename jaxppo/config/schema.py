"""The configuration schema of every jaxppo command (train, collect, evaluate, reward).

Key names follow verl where the concept is the same (``actor.clip_ratio``,
``actor.ppo_mini_batch_size``, ``algorithm.kl_ctrl.target_kl``, ...). One schema serves all
commands; a command reads the sections it needs. Each section is a frozen dataclass; cross-field
rules are checked in ``__post_init__`` and name the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from jaxppo.config.core import ConfigError, check, field
from jaxppo.ops.kl import KL_KINDS
from jaxppo.ops.losses import AGG_MODES

# derived from the ops constants (one source of truth): every KL estimator and aggregation mode the ops accept
KLKind = Literal[KL_KINDS]
AggMode = Literal[AGG_MODES]
DType = Literal["float32", "bfloat16", "float16"]


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")   # = jaxppo.models.lora.TARGETS (tests check)
# = jaxppo.models.attention.IMPLEMENTATIONS (tests check)
Attention = Literal["auto", "reference", "xla", "cudnn", "splash", "pallas_gpu"]


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters on a frozen base (``rank`` 0: off, full weights are trained)."""

    rank: int = field(0, ge=0)
    alpha: float = field(16.0, gt=0.0)   # adapter scale alpha / rank
    dropout: float = field(0.0, ge=0.0, lt=1.0)
    targets: tuple[str, ...] = LORA_TARGETS
    quantize_base: Literal["int8", "nf4"] | None = None

    def __post_init__(self):
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        check(not bad and len(self.targets) > 0 and len(set(self.targets)) == len(self.targets), "model.lora.targets",
              f"must be distinct names from {list(LORA_TARGETS)}, got {list(self.targets)}")
        check(self.dropout == 0.0 or self.rank > 0, "model.lora.dropout",
              f"adapter dropout needs adapters (model.lora.rank > 0), got dropout={self.dropout} with rank 0")
        check(self.quantize_base is None or self.rank > 0, "model.lora.quantize_base",
              "a quantized base is frozen: it needs adapters (model.lora.rank > 0)")


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and, by default, reference and critic trunk) checkpoint."""

    path: str = "../shared/models/stories260K"  # HF directory or a .gguf file
    tokenizer_path: str | None = None  # defaults to ``path`` (or its directory for .gguf)
    param_dtype: DType = "float32"
    compute_dtype: DType = "float32"
    remat: bool | Literal["dots", "auto"] = "auto"   # LMConfig.remat / remat_policy
    attention: Attention = "auto"   # LMConfig.attention (jaxppo.models.attention)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = field(1e-6, gt=0.0)
    weight_decay: float = field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = field(1e-8, gt=0.0)
    warmup_steps: int = field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    min_lr_ratio: float = field(0.0, ge=0.0, le=1.0)
    grad_clip: float = field(1.0, gt=0.0)


@dataclass(frozen=True)
class ActorConfig:
    clip_ratio: float = field(0.2, gt=0.0, lt=1.0)
    clip_ratio_low: float | None = field(None, gt=0.0, lt=1.0)  # defaults to clip_ratio
    clip_ratio_high: float | None = field(None, gt=0.0)  # defaults to clip_ratio
    clip_ratio_c: float = field(3.0, gt=1.0)  # dual-clip lower bound for negative advantages
    ppo_mini_batch_size: int = field(64, ge=1)
    ppo_micro_batch_size: int | None = field(None, ge=1)  # gradient accumulation chunk
    ppo_epochs: int = field(1, ge=1)
    entropy_coeff: float = field(0.0, ge=0.0)
    use_kl_loss: bool = True
    kl_loss_coef: float = field(0.001, ge=0.0)
    kl_loss_type: KLKind = "k1+"
    loss_agg_mode: AggMode = "token-mean"
    # a name of jaxppo.trainer.ppo.policy_losses.POLICY_LOSSES ("ppo": clipped surrogate with dual clip); registry names
    # are checked by jaxppo.config_names before any model loads
    policy_loss: str = "ppo"
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self):
        if self.ppo_micro_batch_size is not None:
            check(self.ppo_mini_batch_size % self.ppo_micro_batch_size == 0, "actor.ppo_micro_batch_size",
                  f"must divide ppo_mini_batch_size={self.ppo_mini_batch_size}, got {self.ppo_micro_batch_size}")

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


@dataclass(frozen=True)
class CriticConfig:
    model_path: str | None = None  # defaults to model.path
    share_trunk: bool = False  # value head on the actor's trunk instead of a separate model
    ppo_epochs: int = field(4, ge=1)
    cliprange_value: float = field(0.5, gt=0.0)
    vf_coef: float = field(1.0, ge=0.0)  # value-loss coefficient: scales the critic loss (joint loss when share_trunk)
    loss_agg_mode: AggMode = "token-mean"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))


@dataclass(frozen=True)
class KLCtrlConfig:
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = field(0.001, ge=0.0)
    target_kl: float = field(0.1, gt=0.0)
    horizon: int = field(10000, ge=1)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """verl's rollout correction (``algorithm.rollout_correction``; jaxppo.ops.rollout_correction) on
    ``log_ratio = prox_logp - behaviour_logprobs`` (pi_prox vs the behaviour policy mu). ``rollout_is``: IS
    weights multiplying the PPO loss (exclusive with ``importance.enabled``); ``rollout_rs``: rejection criteria
    (e.g. "token_k1" or "seq_mean_k3,token_k1") whose mask multiplies the loss's response mask."""

    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: float | str = 2.0  # TIS cap C, or an IcePop band "lo_hi" such as "0.5_5.0"
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None  # comma-separated criteria, every one must pass
    # one spec for all criteria or one per criterion (comma list, same order): "lo_hi" ratio bounds for k1
    # criteria, an upper bound for k2/k3 ones, e.g. "0.5_2.0,0.01"; required with rollout_rs
    rollout_rs_threshold: float | str | None = None

    def __post_init__(self):
        from jaxppo.ops.rollout_correction import parse_is_threshold, parse_rejection_criteria

        try:
            parse_is_threshold(self.rollout_is_threshold)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"algorithm.rollout_correction.rollout_is_threshold: {e}") from None
        if self.rollout_rs is not None:
            check(self.rollout_rs_threshold is not None, "algorithm.rollout_correction.rollout_rs_threshold",
                  f"must be set with rollout_rs={self.rollout_rs!r} (e.g. '0.5_2.0' for token_k1)")
            try:
                parse_rejection_criteria(self.rollout_rs, self.rollout_rs_threshold)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"algorithm.rollout_correction.rollout_rs / rollout_rs_threshold: {e}") from None


@dataclass(frozen=True)
class AlgorithmConfig:
    gamma: float = field(0.99, ge=0.0, le=1.0)
    lam: float = field(0.95, ge=0.0, le=1.0)
    # a name of jaxppo.ops.ADVANTAGE_ESTIMATORS: gae (needs a critic) | grpo | rloo |
    # reinforce_plus_plus | reinforce_plus_plus_baseline (critic-free: no critic is built), or a registered name
    adv_estimator: str = "gae"
    norm_adv: bool = True  # whiten GAE advantages over the buffer (critic-free estimators normalise themselves)
    norm_adv_by_std_in_grpo: bool = True  # grpo: divide by the group std (false: Dr.GRPO)
    use_kl_in_reward: bool = False
    kl_penalty: KLKind = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    priority_agg: Literal["mean", "max"] = "mean"  # per-sequence priority p_i = agg_t |delta_t| (or |A_t|) + eps
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass(frozen=True)
class ImportanceConfig:
    """Behaviour correction rho = pi_prox / mu (detached)."""

    enabled: bool = True
    level: Literal["token", "sequence", "geometric"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    threshold: float = field(2.0, gt=0.0)  # truncation cap C, or the upper bound of the mask
    lower: float | None = field(None, ge=0.0)  # lower bound of the mask (mode=mask)
    veto_threshold: float | None = field(None, gt=0.0)  # drop a sequence with any token ratio below this
    cap_rule: bool = False  # the source article's rule: ratios above 1.5 are set to 1.2

    def __post_init__(self):
        if self.lower is not None:
            check(self.lower < self.threshold, "importance.lower",
                  f"must be below importance.threshold={self.threshold}, got {self.lower}")


@dataclass(frozen=True)
class ReplayDecayConfig:
    """Staleness decay of sampling priorities (jaxppo/replay/staleness.py): p_i = b_i * rate^n_i ("sampled",
    n_i = draws since the item's refresh) or b_i * rate^age_i ("age", steps since its refresh)."""

    # "age" changes nothing in the PPO trainer: prepare refreshes every item at once every replay.refresh_every
    # steps, so all items always have the same age; only "sampled" has an effect there
    kind: Literal["none", "sampled", "age"] = "none"
    rate: float = field(1.0, gt=0.0, le=1.0)


@dataclass(frozen=True)
class ReplayConfig:
    sampling: Literal["prioritized", "uniform"] = "prioritized"
    prioritization: Literal["proportional", "rank"] = "proportional"
    # a name of jaxppo.ops.PRIORITIES (td_error | abs_advantage | group_variance; the table of
    # jaxppo/ops/priorities.py says which estimator each suits); default td_error with a critic (gae),
    # abs_advantage without; td_error needs a critic
    priority: str | None = None
    capacity: int = field(10000, ge=1)
    alpha: float = field(0.6, ge=0.0)
    beta0: float = field(0.4, ge=0.0, le=1.0)
    beta_steps: int | None = field(None, ge=1)  # defaults to trainer.total_steps
    eps: float = field(1e-6, gt=0.0)
    # κ of the PER weights w_i = min(1, (max(m_min, κ·m_max) / m_i)^β) (jaxppo.replay.weights): every weight is
    # >= κ^β however many items sit at the priority floor (0: the classic (m_min / m_i)^β, which collapses then)
    weight_floor: float = field(0.1, ge=0.0, le=1.0)
    refresh_every: int = field(100, ge=1)
    decay: ReplayDecayConfig = field(default_factory=ReplayDecayConfig)  # priority staleness decay
    # 1: minibatches of single rows. n > 1: of whole prompt groups (every group of the data has exactly n rows with
    # one prompt, e.g. GRPO's n responses per prompt); a group is drawn with the sum of its rows' priorities, each
    # row weighted so the expected gradient is that of row sampling, and the update runs each prompt through the
    # trunk once (jaxppo/replay/buffer.py, jaxppo/trainer/ppo/forward.py)
    group_size: int = field(1, ge=1)


@dataclass(frozen=True)
class PFPPOConfig:
    """Policy filtration (arXiv 2409.06957)."""

    enabled: bool = False
    # a name of jaxppo.replay.PF_FILTERS: none | best_of_n | best_random | best_worst | pow | dynamic_sampling
    # (DAPO's filter, drops prompt groups whose scores are all equal: no group-relative signal)
    filter: str = "none"
    # "none" or a name of jaxppo.replay.PF_REWEIGHTS: pow | max_min | max_random (batch level, verl semantics)
    reweight_method: str = "none"
    weight_pow: float = field(1.0, ge=0.0)


@dataclass(frozen=True)
class DataConfig:
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "buckets": "the trainer never read it: every run uses one fixed shape (max_prompt_length, "
                   "max_response_length)",
        "bucket_multiple": "it belonged to data.buckets, which the trainer never read"}

    path: str | None = None  # local json/jsonl(.gz)/parquet/arrow file, or a hub dataset name
    split: str = "train"
    schema: Literal["preference", "scored"] = "scored"
    columns: dict[str, str] = field(default_factory=dict)  # our name -> the dataset's column name
    max_prompt_length: int = field(64, ge=1)
    max_response_length: int = field(64, ge=1)
    truncation: Literal["error", "left", "right", "skip"] = "left"
    eval_fraction: float = field(0.1, ge=0.0, lt=1.0)
    max_rows: int | None = field(None, ge=1)
    cache_dir: str | None = None  # behaviour/reference log-prob cache (default: $JAXPPO_CACHE_DIR or ~/.cache/jaxppo)
    seed: int = 0
    # preference rows: "explicit" prompt/chosen/rejected, "hh" HH-RLHF dialogues, "auto" = explicit if a prompt column
    # "ranking": k answers per prompt with ratings or pairwise comparisons (jaxppo.data.rankings); auto detects it
    preference_format: Literal["auto", "explicit", "hh", "ranking"] = "auto"
    ties: Literal["drop", "keep"] = "drop"  # ranking ties: left out, or kept as both orders a > b and b > a
    # chat-completion logs whose tokens are not ours: keep with reference log-probs, or skip (jaxppo.data.logged)
    logged_mismatch: Literal["recompute", "skip"] = "recompute"
    max_text_chars: int = field(100_000, ge=1)  # longer text fields are skipped (text_too_long)
    chat_template: bool = False  # render text prompts with the tokenizer's chat template
    # a Jinja chat template that replaces the tokenizer's (for chat-message data and chat_template=true)
    chat_template_file: str | None = None
    behaviour_batch_size: int = field(32, ge=1)  # batch size of the behaviour log-prob pass
    # run packed rows without padding: behaviour/reference log-probs, held-out perplexity, reward-model train/eval,
    # the PPO prepare pass and update (replay.group_size 1), the DPO-family step and its pair log-prob pass
    packing: bool = False
    collect_if_missing: bool = False  # train: run jaxppo.collect into data.path's folder when the file is missing
    # Gaussian noise (this sd) added to the training rows' scores, drawn per row from trainer.seed (data.label_noise)
    score_noise_sd: float = field(0.0, ge=0.0)


@dataclass(frozen=True)
class RolloutConfig:
    """Behaviour sampling for ``jaxppo.collect`` and evaluation generations."""

    prompts: str | None = None  # a prompt file (one prompt a line, or jsonl with a 'prompt' key)
    n: int = field(4, ge=1)  # responses per prompt
    temperature: float = field(1.0, ge=0.0)
    top_k: int = field(0, ge=0)  # 0 = off
    top_p: float = field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = field(32, ge=1)
    batch_size: int = field(32, ge=1)
    chat_template: bool = False
    seed: int = 0
    max_prompts: int | None = field(None, ge=1)  # use only the first prompts of the file
    output_format: Literal["parquet", "jsonl"] = "parquet"


@dataclass(frozen=True)
class RewardConfig:
    """``kind``: a name of the reward registry ``jaxppo.rewards.REWARDS`` (built in: vader, length, format, model;
    more with ``@REWARDS.register`` before the config is checked); ``jaxppo.config_names`` checks it."""

    kind: str = "vader"
    model_path: str | None = None  # reward-model directory, kind=model
    target_length: int = field(32, ge=1)  # length reward target
    format_pattern: str = r"[A-Z].*[.!?]"  # format reward: 1 if the stripped response fully matches
    # reward-model training
    lr: float = field(1e-4, gt=0.0)
    epochs: int = field(1, ge=1)
    batch_size: int = field(16, ge=1)
    weight_decay: float = field(0.0, ge=0.0)
    grad_clip: float = field(1.0, gt=0.0)
    warmup_steps: int = field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    eval_batch_size: int = field(64, ge=1)


@dataclass(frozen=True)
class DPOConfig:
    """``python -m jaxppo.dpo`` (the offline preference baseline; formulas in ``jaxppo/ops/dpo.py``, TRL's names).

    The policy's optimizer is ``actor.optim``; one step draws ``batch_size`` pairs (shuffled epochs) and
    accumulates gradients over ``micro_batch_size`` pairs at a time."""

    beta: float = field(0.1, gt=0.0)
    # "kto": TRL's KTO on unpaired rows (prompt, completion, boolean label; data.schema=scored), jaxppo/ops/kto.py
    loss_type: Literal["sigmoid", "hinge", "ipo", "robust", "sigmoid_norm", "kto"] = "sigmoid"
    label_smoothing: float = field(0.0, ge=0.0, le=0.5)  # cDPO / robust epsilon (sigmoid, robust only)
    desirable_weight: float = field(1.0, ge=0.0)  # KTO: weight of the desirable (label true) rows' losses
    undesirable_weight: float = field(1.0, ge=0.0)  # KTO: weight of the undesirable rows' losses
    # RPO: + rpo_alpha x NLL of the chosen answers, a token mean over all chosen tokens of the batch (TRL)
    rpo_alpha: float = field(0.0, ge=0.0)
    batch_size: int = field(32, ge=1)  # pairs per step
    micro_batch_size: int | None = field(None, ge=1)  # gradient accumulation chunk (divides batch_size)

    def __post_init__(self):
        if self.loss_type not in ("sigmoid", "robust"):
            check(self.label_smoothing == 0.0, "dpo.label_smoothing",
                  f"is only used by loss_type sigmoid/robust; loss_type={self.loss_type} needs 0, "
                  f"got {self.label_smoothing}")
        if self.loss_type == "robust":
            check(self.label_smoothing < 0.5, "dpo.label_smoothing",
                  f"must be < 0.5 for loss_type=robust, got {self.label_smoothing}")
        if self.loss_type == "kto":
            check(self.rpo_alpha == 0.0, "dpo.rpo_alpha", f"is not used by loss_type=kto, needs 0, got {self.rpo_alpha}")
        if self.micro_batch_size is not None:
            check(self.batch_size % self.micro_batch_size == 0, "dpo.micro_batch_size",
                  f"must divide dpo.batch_size={self.batch_size}, got {self.micro_batch_size}")


@dataclass(frozen=True)
class MeshConfig:
    data: int = field(1, ge=1)
    fsdp: int = field(1, ge=1)
    tensor: int = field(1, ge=1)
    # logical axis name -> mesh axis (or list of mesh axes); null = replicated
    rules: dict[str, str | tuple[str, ...] | None] = field(default_factory=dict)
    # memory per device (GiB) the layout is made for: jaxppo.plan's budget (--hbm-gib) when set; not used by runs
    hbm_gib: float | None = field(None, gt=0.0)


@dataclass(frozen=True)
class GuardsConfig:
    kl_threshold: float = field(0.05, gt=0.0)  # KL above this -> lower the LR
    kl_lr_factor: float = field(0.1, gt=0.0, lt=1.0)  # the cut: actor LR x factor (of the current LR)
    kl_lr: float | None = field(None, gt=0.0)  # if set, the cut is to this absolute LR instead of the factor
    # the policy's mean generated length (eval/response_length) > factor x its running mean -> warning
    length_factor: float = field(2.0, gt=1.0)
    length_probe_every: int | None = field(None, ge=1)  # greedy generations on held-out prompts every N steps
    length_probe_prompts: int = field(8, ge=1)  # held-out prompts of the length probe
    ppl_every: int = field(500, ge=1)
    ppl_tolerance: float = field(0.2, gt=0.0)  # roll back if held-out ppl > (1 + tol) x baseline
    max_nan_steps: int = field(3, ge=1)  # consecutive NaN/inf updates before a rollback
    # replay/per_weight_mean below this -> a warning (the PER weights shrink the policy gradient vs the KL term)
    min_per_weight_mean: float = field(0.05, ge=0.0, le=1.0)


@dataclass(frozen=True)
class TrainerConfig:
    output_dir: str = "runs/default"
    total_steps: int = field(100, ge=1)
    seed: int = 0
    save_every: int = field(50, ge=1)
    keep_last: int = field(3, ge=1)
    resume: Literal["auto", "never"] = "auto"
    log_every: int = field(1, ge=1)  # metrics.jsonl every k steps (and at evaluations, guard actions, the end)
    eval_every: int | None = field(None, ge=1)
    eval_prompts: int = field(64, ge=1)
    eval_samples: int = field(1, ge=1)  # responses per held-out prompt; rewards are averaged per prompt
    progress: bool = True
    tensorboard: bool = True  # TensorBoard is on when this is true OR "tensorboard" is in `logger`
    # experiment trackers besides metrics.jsonl (verl's key): "console" (progress bar), "tensorboard",
    # "wandb", "mlflow", "trackio" (the last three: pip install jaxppo[track]); jaxppo/trainer/trackers.py
    logger: tuple[Literal["console", "tensorboard", "wandb", "mlflow", "trackio"], ...] | Literal[
        "console", "tensorboard", "wandb", "mlflow", "trackio"] = ("console",)
    run_name: str | None = None  # tracker run name; defaults to the output_dir folder name
    group: str | None = None  # tracker group (a sweep sets it): wandb group, mlflow experiment, trackio project
    plots: bool = True
    save_hf: bool = True


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    importance: ImportanceConfig = field(default_factory=ImportanceConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self):
        if self.replay.capacity < self.actor.ppo_mini_batch_size:
            raise ConfigError(f"replay.capacity={self.replay.capacity} is smaller than "
                              f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size}")
