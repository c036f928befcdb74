"""The sweep file: schema, profiles, and the run plan, validated before any run starts.

A sweep file is YAML, read and checked by the config loader (``jaxppo.config.read_yaml`` / ``from_dict`` of
:class:`SweepFile`: strict keys with "did you mean", typed values, ranges)::

    name: per_alpha                      # optional; default: the file's stem
    base: configs/smoke.yaml             # the base config (relative paths: from the current directory)
    command: train                       # train -> python -m jaxppo.train, dpo -> python -m jaxppo.dpo
    seeds: [0, 1, 2, 3, 4]
    seed_keys: [trainer.seed]            # config keys set to the seed (default: trainer.seed; dpo: + data.seed)
    overrides: [trainer.progress=false]  # dotted overrides common to every run
    variants:                            # name -> dotted overrides of that variant
      uniform: [replay.sampling=uniform]
      per_a06: [replay.sampling=prioritized, replay.alpha=0.6]
    baseline: uniform                    # every variant is compared with it, seed by seed
    primary: final                       # the test that gives the verdict (final | auc | at25 | at50 | first_passage)
    eval: {every_samples: 160, samples_per_prompt: 8, prompts: 20}
    budget: {samples: 1280}              # >= 8 evaluations after step 0 (fewer: a warning)
    output_dir: results/sweeps/per_alpha # default: results/sweeps/<name> (committed; see below)
    batch_key: actor.ppo_mini_batch_size # items consumed per step (default; dpo: dpo.batch_size)
    slurm: {partition: gpu, time: "02:00:00", gpus: 1, cpus: 4, mem: 16G}  # --slurm's #SBATCH resources
    profiles:                            # --profile ci: merged into the file before anything else
      ci: {seeds: [0, 1], budget: {samples: 64}, overrides: [trainer.eval_prompts=4]}

Each run is the base config plus, in this order (later wins): ``overrides``, the variant's overrides, the
seed keys, and the keys the sweep owns — ``trainer.total_steps = budget.samples / B``,
``trainer.eval_every = eval.every_samples / B``, ``trainer.eval_samples``, ``trainer.eval_prompts``,
``trainer.output_dir = <output_dir>/runs/<variant>/seed<k>`` and ``trainer.resume=auto`` (``eval.prompts``
is optional: without it ``trainer.eval_prompts`` comes from the base or the overrides), where
``B`` is the run's ``batch_key`` value (a variant may change it: the x axis is trajectories consumed,
``step x B``, so curves of different variants share it). ``B`` must divide ``eval.every_samples``, and
``eval.every_samples`` must divide ``budget.samples`` (so every curve ends with an evaluation at the
budget). The sweep-owned keys may not appear in ``overrides`` or a variant.

Profiles: ``--profile NAME`` merges ``profiles[NAME]`` into the file: mappings (``eval``, ``budget``,
``variants``) merge key by key (a variant set to null is left out, e.g. ``variants: {grpo_per: null}``),
``overrides`` is *appended* to the file's overrides (so the profile's win), any other key replaces the file's
value.

Seeds: ``trainer.seed`` drives the replay sampling order (``TrainState.rng``), the critic head's initialisation
and the evaluation key (``fold_in(PRNGKey(trainer.seed), 10007)``, so the reference evaluation at step 0 is the
same in every variant of a seed): seed ``k`` of two variants is a *pair* (:mod:`jaxppo.sweeps.stats`). For
``command: train``, ``data.seed`` (the held-out split) is deliberately not a seed key: every seed evaluates on the
same held-out prompts. For ``command: dpo`` the seed keys default to ``trainer.seed`` and ``data.seed``, because
DPO's batch order is drawn from ``data.seed`` (``batch_indices(data.seed, ...)``); ``data.seed`` also picks DPO's
held-out split, so each seed pair has its own held-out pairs (both arms the same). The batch key of ``dpo`` is
``dpo.batch_size``. At least 5 seeds are expected (fewer: a warning, e.g. ``ci`` profiles), and at least 8
evaluations after step 0 (fewer: a warning).

Grids and evaluation samples: the shipped sweeps evaluate at 8 points after step 0, the first at 1/8 of
the budget (``eval.every_samples = budget / 8``). Their evaluation samples were chosen from a measured run (the
smoke baseline of ``is_onpolicy``, seed 0, 16 samples for each of the 20 held-out prompts): the within-prompt sd of
the VADER reward was 0.386 (reference) and 0.285 (after 40 steps), so the sampling noise of the held-out mean,
``sd_within / sqrt(prompts x samples)``, is 0.043 / 0.032 with 4 samples and 0.031 / 0.023 with 8. The smoke
sweeps use 8: 0.023 at the trained policy, below the seed sd of the final reward that the A/A sweep measured
(``results/sweeps/aa``: 0.038 over 10 seeds; the evaluation noise is part of it, since the evaluation key follows
the seed) and well below the 0.065 seed sd of the quickstart-scale sweep. The 20 prompts are all the held-out groups the smoke
data has (100 prompts x ``data.eval_fraction`` 0.2); the prompt set is the same for every seed, so it adds no seed
noise.

Results live in the repository: the default ``output_dir`` is ``results/sweeps/<name>``; a run whose folder
holds a ``summary.json`` (committed from another machine included) is finished and never re-run.

Validation (:func:`plan_runs`) loads every run's full config with ``jaxppo.config.load_config`` — an
unknown key or a bad value is a :class:`SweepError` naming the variant, the seed and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from jaxppo.config.core import check, field

COMMANDS = {"train": "jaxppo.train", "dpo": "jaxppo.dpo"}
TOP_KEYS = ("name", "description", "base", "command", "seeds", "seed_keys", "overrides", "variants", "baseline",
            "primary", "eval", "budget", "output_dir", "batch_key", "slurm", "profiles")
# per command: the config keys set to the seed, and the key holding the items consumed per step
DEFAULT_SEED_KEYS = {"train": ("trainer.seed",), "dpo": ("trainer.seed", "data.seed")}
DEFAULT_BATCH_KEY = {"train": "actor.ppo_mini_batch_size", "dpo": "dpo.batch_size"}
# keys the sweep sets itself; a sweep file may not override them
OWNED_KEYS = ("trainer.total_steps", "trainer.eval_every", "trainer.eval_samples", "trainer.eval_prompts",
              "trainer.output_dir", "trainer.resume")
MIN_SEEDS = 5
MIN_EVAL_POINTS = 8   # a grid that can resolve a data-efficiency claim
DEFAULT_ROOT = "results/sweeps"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class SweepError(ValueError):
    """A sweep file is invalid; the message names the key (and variant/seed) at fault."""


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    every_samples: int = field(ge=1)
    samples_per_prompt: int = field(1, ge=1)
    prompts: int | None = field(None, ge=1)  # None: the base config's trainer.eval_prompts


@dataclasses.dataclass(frozen=True)
class BudgetSection:
    samples: int = field(ge=1)


_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")
_SLURM_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")


def slurm_value_problem(name: str, value: Any) -> str | None:
    """What is wrong with the SLURM resource ``name`` (a field of :class:`SlurmSection`) set to ``value``, or None
    when it is valid (None: the cluster's default)."""
    if value is None:
        return None
    if name == "time":
        if isinstance(value, int) and not isinstance(value, bool):
            return (f"got the number {value}: quote the time limit (YAML reads an unquoted 02:00:00 as a base-60 "
                    "number), e.g. time: \"02:00:00\"")
        if not (isinstance(value, str) and _SLURM_TIME.match(value)):
            return (f"expected a SLURM time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), "
                    f"got {value!r}")
    elif name == "mem":
        if not (isinstance(value, str) and _SLURM_MEM.match(value)):
            return f"expected a memory size (an integer with an optional unit K, M, G or T, e.g. 16G), got {value!r}"
    elif name == "partition":
        if not (isinstance(value, str) and _SLURM_PARTITION.match(value)):
            return f"expected a partition name (or a comma-separated list), got {value!r}"
    elif name in ("cpus", "gpus", "max_parallel"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"expected an integer >= 1, got {value!r}"
    else:
        return f"unknown SLURM resource (known: {', '.join(f.name for f in dataclasses.fields(SlurmSection))})"
    return None


@dataclasses.dataclass(frozen=True)
class SlurmSection:
    """``slurm:`` of a sweep file: the ``#SBATCH`` resources of each task of the ``--slurm`` array job (None: the
    cluster's default); a ``--slurm-*`` flag overrides its key."""

    partition: str | None = None       # --partition (a comma-separated list allowed)
    time: str | int | None = None      # --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (a string)
    gpus: int | None = None            # --gpus-per-task
    cpus: int | None = None            # --cpus-per-task
    mem: str | None = None             # --mem, e.g. 16G
    max_parallel: int | None = None    # the array's %N: at most N tasks at once

    def __post_init__(self):
        for f in dataclasses.fields(self):
            problem = slurm_value_problem(f.name, getattr(self, f.name))
            check(problem is None, f.name, problem or "")


@dataclasses.dataclass(frozen=True)
class SweepFile:
    """The sweep file's schema, loaded by :func:`jaxppo.config.from_dict` (strict keys, typed values, ranges); the
    checks between fields are in ``__post_init__``."""

    REMOVED_KEYS = {"bootstrap": "the data-efficiency bootstrap is gone (miscalibrated on A/A sweeps); the sweep "
                                 "statistics are seed-paired and need no resampling settings"}

    base: str
    seeds: tuple[int, ...]
    variants: dict[str, tuple[str, ...] | None]
    baseline: str
    eval: EvalSpec
    budget: BudgetSection
    name: str | None = None
    description: str = ""
    command: Literal["train", "dpo"] = "train"
    seed_keys: tuple[str, ...] | None = None
    overrides: tuple[str, ...] = ()
    output_dir: str | None = None
    batch_key: str | None = None
    primary: Literal["final", "auc", "at25", "at50", "first_passage"] = "final"
    slurm: SlurmSection = field(default_factory=SlurmSection)

    def __post_init__(self):
        check(bool(self.base), "base", "expected a config file path")
        check(Path(self.base).is_file(), "base",
              f"config file {self.base} not found (relative paths are resolved from {Path.cwd()})")
        check(bool(self.seeds), "seeds", "expected a non-empty list of integers")
        check(all(s >= 0 for s in self.seeds), "seeds", f"must be >= 0, got {list(self.seeds)}")
        check(len(set(self.seeds)) == len(self.seeds), "seeds", f"duplicates in {list(self.seeds)}")
        check(self.seed_keys is None or (bool(self.seed_keys) and all(k and "=" not in k for k in self.seed_keys)),
              "seed_keys", f"expected a non-empty list of dotted config keys, got {self.seed_keys!r}")
        check(bool(self.variants), "variants", "at least one variant is required")
        for v, over in self.variants.items():
            check(bool(_NAME.match(v)), "variants", f"name {v!r} must be letters, digits, '_', '.', '-' "
                  "(it names a folder)")
            for where, items in ((f"variants.{v}", over or ()), ("overrides", self.overrides)):
                for o in items:
                    check("=" in o, where, f"override {o!r} is not of the form dotted.key=value")
        check(self.baseline in self.variants, "baseline",
              f"{self.baseline!r} is not a variant (variants: {', '.join(self.variants)})")
        check(self.budget.samples % self.eval.every_samples == 0, "budget",
              f"budget.samples={self.budget.samples} is not a multiple of eval.every_samples="
              f"{self.eval.every_samples} (every curve must end with an evaluation at the budget)")
        check(self.name is None or bool(_NAME.match(self.name)), "name",
              f"must be a non-empty string of letters, digits, '_', '.', '-', got {self.name!r}")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    name: str
    base: str
    command: str
    seeds: tuple[int, ...]
    seed_keys: tuple[str, ...]
    overrides: tuple[str, ...]
    variants: dict[str, tuple[str, ...]]
    baseline: str
    eval: EvalSpec
    budget_samples: int
    output_dir: str
    batch_key: str = "actor.ppo_mini_batch_size"
    description: str = ""
    primary: str = "final"
    slurm: SlurmSection = SlurmSection()

    @property
    def module(self) -> str:
        return COMMANDS[self.command]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: ``python -m <module> --config <base> <overrides...>`` writing into ``out_dir``."""

    variant: str
    seed: int
    out_dir: Path
    module: str
    base: str
    overrides: tuple[str, ...]
    batch_size: int  # trajectories consumed per update step (the batch_key value)
    total_steps: int
    eval_every: int
    tokens_per_sample: int  # padded prompt + response length (tokens fallback when none are logged)
    config: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # to_dict of the Config

    @property
    def key(self) -> str:
        return f"{self.variant}/seed{self.seed}"

    def argv(self, python: str = "python") -> list[str]:
        return [python, "-m", self.module, "--config", self.base, *self.overrides]


def _fail(msg: str) -> None:
    raise SweepError(msg)


def _mapping(value: Any, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(f"{key}: expected a mapping, got {value!r}")
    return dict(value)


def apply_profile(raw: dict, profile: str | None) -> dict:
    """``raw`` with ``profiles[profile]`` merged in (see the module docstring); ``profiles`` removed."""
    data = copy.deepcopy(raw)
    profiles = _mapping(data.pop("profiles", None), "profiles")
    if profile is None:
        return data
    if profile not in profiles:
        _fail(f"--profile {profile!r}: not in this sweep file's profiles ({', '.join(profiles) or 'none defined'})")
    prof = _mapping(profiles[profile], f"profiles.{profile}")
    for k in prof:
        if k not in TOP_KEYS or k == "profiles":
            close = difflib.get_close_matches(str(k), list(TOP_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(f"profiles.{profile}: unknown key {k!r}{hint}")
    for k, v in prof.items():
        if k == "overrides":
            old, new = data.get("overrides") or [], v or []
            if not isinstance(old, (list, tuple)) or not isinstance(new, (list, tuple)):
                _fail(f"profiles.{profile}.overrides: expected lists of dotted.key=value strings")
            data["overrides"] = [*old, *new]
        elif k == "variants" and isinstance(v, Mapping) and isinstance(data.get(k), Mapping):
            unknown = [n for n, ov in v.items() if ov is None and n not in data[k]]
            if unknown:
                _fail(f"profiles.{profile}.variants: {unknown[0]!r} is set to null (left out) but the file has no "
                      f"such variant ({', '.join(map(str, data[k]))})")
            data[k] = {n: ov for n, ov in {**data[k], **v}.items() if ov is not None}
        elif isinstance(v, Mapping) and isinstance(data.get(k), Mapping):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return data


def parse_sweep(raw: Any, *, name: str = "sweep", profile: str | None = None,
                output_dir: str | None = None) -> SweepSpec:
    """A :class:`SweepSpec` from the parsed YAML mapping ``raw``, checked by the config loader
    (``jaxppo.config.from_dict`` of :class:`SweepFile`); every problem is a :class:`SweepError` naming the key."""
    from jaxppo.config import ConfigError, from_dict

    if not isinstance(raw, Mapping):
        _fail(f"a sweep file must be a mapping, got {type(raw).__name__}")
    data = apply_profile(dict(raw), profile)
    try:
        f = from_dict(SweepFile, data)
    except ConfigError as e:
        raise SweepError(str(e)) from None
    if importlib.util.find_spec(COMMANDS[f.command]) is None:
        _fail(f"command: {f.command!r} needs the module {COMMANDS[f.command]}, which is not installed")
    name = f.name or name
    if len(f.seeds) < MIN_SEEDS:
        warnings.warn(f"sweep {name}: {len(f.seeds)} seeds (< {MIN_SEEDS}): the confidence intervals are wide",
                      stacklevel=2)
    points = f.budget.samples // f.eval.every_samples
    if points < MIN_EVAL_POINTS:
        warnings.warn(f"sweep {name}: {points} evaluation points after step 0 (< {MIN_EVAL_POINTS}; the first at "
                      f"{f.eval.every_samples} of {f.budget.samples} samples): too coarse to resolve when a variant "
                      "reaches a target", stacklevel=2)
    spec = SweepSpec(name=name, base=f.base, command=f.command, seeds=f.seeds,
                     seed_keys=f.seed_keys or DEFAULT_SEED_KEYS[f.command], overrides=f.overrides,
                     variants={v: tuple(o or ()) for v, o in f.variants.items()}, baseline=f.baseline, eval=f.eval,
                     budget_samples=f.budget.samples, output_dir=output_dir or f.output_dir or f"{DEFAULT_ROOT}/{name}",
                     batch_key=f.batch_key or DEFAULT_BATCH_KEY[f.command], description=f.description,
                     primary=f.primary, slurm=f.slurm)
    _check_owned(spec)
    return spec


def _override_key(text: str) -> str:
    return text.split("=", 1)[0].strip()


def _check_owned(spec: SweepSpec) -> None:
    owned = set(OWNED_KEYS) | set(spec.seed_keys)
    if spec.eval.prompts is None:  # the base (or an override) decides the held-out prompts
        owned.discard("trainer.eval_prompts")
    for where, items in [("overrides", spec.overrides), *((f"variants.{v}", o) for v, o in spec.variants.items())]:
        for o in items:
            if _override_key(o) in owned:
                _fail(f"{where}: {_override_key(o)!r} is set by the sweep itself (seeds, eval, budget, output_dir); "
                      "remove it")


def load_sweep(path: str | Path, *, profile: str | None = None, output_dir: str | None = None) -> SweepSpec:
    """Read the sweep file ``path`` with the config loader's reader (``jaxppo.config.read_yaml``:
    ``yaml.safe_load``, ``extends:`` followed) and validate it, with ``profile`` merged in."""
    from jaxppo.config import ConfigError, read_yaml

    p = Path(path)
    if not p.is_file():
        raise SweepError(f"sweep file {p} not found")
    try:
        raw = read_yaml(p)
    except ConfigError as e:
        raise SweepError(f"sweep file {p}: {e}") from None
    return parse_sweep(raw, name=p.stem, profile=profile, output_dir=output_dir)


def _lookup(cfg_dict: dict, dotted: str, where: str) -> Any:
    node: Any = cfg_dict
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            _fail(f"{where}: config key {dotted!r} does not exist")
        node = node[part]
    return node


def run_dir(spec: SweepSpec, variant: str, seed: int) -> Path:
    return Path(spec.output_dir) / "runs" / variant / f"seed{seed}"


def plan_runs(spec: SweepSpec) -> list[RunSpec]:
    """Every run of the sweep (variants in file order, then seeds), each with its full config loaded.

    Raises :class:`SweepError` naming the variant and seed when a config key is unknown, a value is bad,
    or the batch size does not divide ``eval.every_samples`` — before any run starts.
    """
    from jaxppo.config import ConfigError, load_config, to_dict
    from jaxppo.config_names import check_config_names

    runs = []
    for variant, vover in spec.variants.items():
        for seed in spec.seeds:
            where = f"variant {variant!r} seed {seed}"
            pre = [*spec.overrides, *vover, *(f"{k}={seed}" for k in spec.seed_keys)]
            try:
                cfg = to_dict(load_config(spec.base, pre))
            except ConfigError as e:
                raise SweepError(f"{where}: config error: {e}") from None
            bsz = _lookup(cfg, spec.batch_key, where)
            if isinstance(bsz, bool) or not isinstance(bsz, int) or bsz < 1:
                _fail(f"{where}: batch_key {spec.batch_key} = {bsz!r} is not a positive integer")
            ev = spec.eval
            if ev.every_samples % bsz:
                _fail(f"{where}: eval.every_samples={ev.every_samples} is not a multiple of "
                      f"{spec.batch_key}={bsz}")
            out = run_dir(spec, variant, seed)
            owned = [f"trainer.total_steps={spec.budget_samples // bsz}",
                     f"trainer.eval_every={ev.every_samples // bsz}", f"trainer.eval_samples={ev.samples_per_prompt}",
                     *([f"trainer.eval_prompts={ev.prompts}"] if ev.prompts is not None else []),
                     f"trainer.output_dir={out}", "trainer.resume=auto"]
            try:
                loaded = load_config(spec.base, [*pre, *owned])
                check_config_names(loaded)
                cfg = to_dict(loaded)
            except ConfigError as e:
                raise SweepError(f"{where}: config error: {e}") from None
            data = cfg.get("data", {})
            tokens = int(data.get("max_prompt_length", 0)) + int(data.get("max_response_length", 0))
            runs.append(RunSpec(variant=variant, seed=seed, out_dir=out, module=spec.module, base=spec.base,
                                overrides=tuple([*pre, *owned]), batch_size=bsz,
                                total_steps=spec.budget_samples // bsz, eval_every=ev.every_samples // bsz,
                                tokens_per_sample=tokens, config=cfg))
    return runs
