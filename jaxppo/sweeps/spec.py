"""The sweep file: schema, profiles, and the run plan, validated before any run starts.

A sweep file is YAML (read with ``yaml.safe_load``)::

    name: per_alpha                      # optional; default: the file's stem
    base: configs/smoke.yaml             # the base config (relative paths: from the current directory)
    command: train                       # train -> python -m jaxppo.train, dpo -> python -m jaxppo.dpo
    seeds: [0, 1, 2, 3, 4]
    seed_keys: [trainer.seed]            # config keys set to the seed (default: trainer.seed only)
    overrides: [trainer.progress=false]  # dotted overrides common to every run
    variants:                            # name -> dotted overrides of that variant
      uniform: [replay.sampling=uniform]
      per_a06: [replay.sampling=prioritized, replay.alpha=0.6]
    baseline: uniform                    # its mean final reward is the data-efficiency target
    eval: {every_samples: 320, samples_per_prompt: 4, prompts: 32}
    budget: {samples: 1280}
    output_dir: runs/sweeps/per_alpha    # default: runs/sweeps/<name>
    batch_key: actor.ppo_mini_batch_size # the config key holding the trajectories consumed per step
    bootstrap: {resamples: 2000, seed: 0}
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
``variants``, ``bootstrap``) merge key by key, ``overrides`` is *appended* to the file's overrides (so
the profile's win), any other key replaces the file's value.

Seeds: ``trainer.seed`` drives the replay sampling order, the critic head's initialisation and the
evaluation samples. ``data.seed`` (the held-out split) is deliberately not a seed key by default: every
seed of a sweep evaluates on the same held-out prompts. Add it to ``seed_keys`` to vary it too. The issue
asks for at least 5 seeds; fewer is allowed (``ci`` profiles) with a warning.

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
from pathlib import Path
from typing import Any, Mapping

import yaml

COMMANDS = {"train": "jaxppo.train", "dpo": "jaxppo.dpo"}
TOP_KEYS = ("name", "description", "base", "command", "seeds", "seed_keys", "overrides", "variants", "baseline",
            "eval", "budget", "output_dir", "batch_key", "bootstrap", "profiles")
EVAL_KEYS = ("every_samples", "samples_per_prompt", "prompts")
BUDGET_KEYS = ("samples",)
BOOTSTRAP_KEYS = ("resamples", "seed")
# keys the sweep sets itself; a sweep file may not override them
OWNED_KEYS = ("trainer.total_steps", "trainer.eval_every", "trainer.eval_samples", "trainer.eval_prompts",
              "trainer.output_dir", "trainer.resume")
MIN_SEEDS = 5
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class SweepError(ValueError):
    """A sweep file is invalid; the message names the key (and variant/seed) at fault."""


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    every_samples: int
    samples_per_prompt: int = 1
    prompts: int | None = None  # None: the base config's trainer.eval_prompts


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
    bootstrap_resamples: int = 2000
    bootstrap_seed: int = 0
    description: str = ""

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


def _unknown(keys, allowed, where: str) -> None:
    for k in keys:
        if k not in allowed:
            close = difflib.get_close_matches(str(k), list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(f"{where}: unknown key {k!r}{hint}; allowed: {', '.join(allowed)}")


def _int(value: Any, key: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(f"{key}: expected an integer, got {value!r}")
    if value < minimum:
        _fail(f"{key}: must be >= {minimum}, got {value}")
    return int(value)


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        _fail(f"{key}: expected a list of 'dotted.key=value' strings, got {value!r}")
    for v in value:
        if "=" not in v:
            _fail(f"{key}: override {v!r} is not of the form dotted.key=value")
    return tuple(value)


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
    _unknown(prof, [k for k in TOP_KEYS if k != "profiles"], f"profiles.{profile}")
    for k, v in prof.items():
        if k == "overrides":
            data["overrides"] = list(_str_list(data.get("overrides"), "overrides")) + list(
                _str_list(v, f"profiles.{profile}.overrides"))
        elif isinstance(v, Mapping) and isinstance(data.get(k), Mapping):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return data


def parse_sweep(raw: Any, *, name: str = "sweep", profile: str | None = None,
                output_dir: str | None = None) -> SweepSpec:
    """A :class:`SweepSpec` from the parsed YAML mapping ``raw``; every field is checked here."""
    if not isinstance(raw, Mapping):
        _fail(f"a sweep file must be a mapping, got {type(raw).__name__}")
    _unknown(raw, TOP_KEYS, "sweep file")
    data = apply_profile(dict(raw), profile)
    for req in ("base", "seeds", "variants", "baseline", "eval", "budget"):
        if data.get(req) is None:
            _fail(f"{req}: required")
    name = data.get("name", name)
    if not isinstance(name, str) or not _NAME.match(name):
        _fail(f"name: must be a non-empty string of letters, digits, '_', '.', '-', got {name!r}")
    base = data["base"]
    if not isinstance(base, str) or not base:
        _fail(f"base: expected a config file path, got {base!r}")
    if not Path(base).is_file():
        _fail(f"base: config file {base} not found (relative paths are resolved from {Path.cwd()})")
    command = data.get("command", "train")
    if command not in COMMANDS:
        _fail(f"command: one of {', '.join(COMMANDS)}, got {command!r}")
    if importlib.util.find_spec(COMMANDS[command]) is None:
        _fail(f"command: {command!r} needs the module {COMMANDS[command]}, which is not installed")
    seeds = data["seeds"]
    if not isinstance(seeds, (list, tuple)) or not seeds:
        _fail(f"seeds: expected a non-empty list of integers, got {seeds!r}")
    seeds = tuple(_int(s, "seeds", minimum=0) for s in seeds)
    if len(set(seeds)) != len(seeds):
        _fail(f"seeds: duplicates in {list(seeds)}")
    if len(seeds) < MIN_SEEDS:
        warnings.warn(f"sweep {name}: {len(seeds)} seeds (< {MIN_SEEDS}): the confidence intervals are wide",
                      stacklevel=2)
    seed_keys = data.get("seed_keys", ["trainer.seed"])
    if (not isinstance(seed_keys, (list, tuple)) or not seed_keys
            or not all(isinstance(k, str) and k and "=" not in k for k in seed_keys)):
        _fail(f"seed_keys: expected a non-empty list of dotted config keys, got {seed_keys!r}")
    overrides = _str_list(data.get("overrides"), "overrides")
    variants_raw = _mapping(data["variants"], "variants")
    if not variants_raw:
        _fail("variants: at least one variant is required")
    variants: dict[str, tuple[str, ...]] = {}
    for vname, vover in variants_raw.items():
        if not isinstance(vname, str) or not _NAME.match(vname):
            _fail(f"variants: name {vname!r} must be letters, digits, '_', '.', '-' (it names a folder)")
        variants[vname] = _str_list(vover, f"variants.{vname}")
    baseline = data["baseline"]
    if baseline not in variants:
        _fail(f"baseline: {baseline!r} is not a variant (variants: {', '.join(variants)})")
    ev = _mapping(data["eval"], "eval")
    _unknown(ev, EVAL_KEYS, "eval")
    if "every_samples" not in ev:
        _fail("eval.every_samples: required")
    evs = EvalSpec(every_samples=_int(ev["every_samples"], "eval.every_samples", minimum=1),
                   samples_per_prompt=_int(ev.get("samples_per_prompt", 1), "eval.samples_per_prompt", minimum=1),
                   prompts=None if ev.get("prompts") is None else _int(ev["prompts"], "eval.prompts", minimum=1))
    bud = _mapping(data["budget"], "budget")
    _unknown(bud, BUDGET_KEYS, "budget")
    if "samples" not in bud:
        _fail("budget.samples: required")
    budget = _int(bud["samples"], "budget.samples", minimum=1)
    if budget % evs.every_samples:
        _fail(f"budget.samples={budget} is not a multiple of eval.every_samples={evs.every_samples} "
              "(every curve must end with an evaluation at the budget)")
    bs = _mapping(data.get("bootstrap"), "bootstrap")
    _unknown(bs, BOOTSTRAP_KEYS, "bootstrap")
    batch_key = data.get("batch_key", "actor.ppo_mini_batch_size")
    if not isinstance(batch_key, str) or not batch_key:
        _fail(f"batch_key: expected a dotted config key, got {batch_key!r}")
    out = output_dir or data.get("output_dir") or f"runs/sweeps/{name}"
    if not isinstance(out, str):
        _fail(f"output_dir: expected a path, got {out!r}")
    desc = data.get("description", "")
    spec = SweepSpec(name=name, base=base, command=command, seeds=seeds, seed_keys=tuple(seed_keys),
                     overrides=overrides, variants=variants, baseline=baseline, eval=evs, budget_samples=budget,
                     output_dir=out, batch_key=batch_key,
                     bootstrap_resamples=_int(bs.get("resamples", 2000), "bootstrap.resamples", minimum=1),
                     bootstrap_seed=_int(bs.get("seed", 0), "bootstrap.seed", minimum=0),
                     description=desc if isinstance(desc, str) else str(desc))
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
    """Read and validate the sweep file ``path`` (``yaml.safe_load``), with ``profile`` merged in."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"sweep file {p} not found")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SweepError(f"sweep file {p}: not valid YAML: {e}") from None
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
