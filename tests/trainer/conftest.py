"""Fixtures of the trainer tests: a small scored dataset collected once from stories260K, tiny configs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# every trainer test run uses these shapes (small: the whole directory must run in a few minutes on 2 cores)
TINY = [
    "data.max_prompt_length=16", "data.max_response_length=16", "data.eval_fraction=0.25",
    "data.behaviour_batch_size=64",
    "rollout.temperature=1.0", "rollout.max_new_tokens=16", "rollout.batch_size=64", "rollout.n=4",
    "reward.kind=vader",
    "actor.ppo_mini_batch_size=16", "actor.ppo_micro_batch_size=8", "actor.kl_loss_coef=0.01",
    "actor.optim.lr=5e-4", "actor.optim.warmup_steps=2", "critic.optim.lr=3e-3",
    "algorithm.gamma=1.0", "replay.capacity=1024", "replay.refresh_every=5",
    "guards.ppl_every=1000", "guards.ppl_tolerance=10.0", "guards.kl_threshold=10.0",
    "trainer.total_steps=20", "trainer.save_every=4", "trainer.keep_last=2", "trainer.eval_prompts=8",
    "trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false", "trainer.save_hf=false",
]


@pytest.fixture(scope="session", autouse=True)
def compile_cache(subprocess_compile_cache) -> Path:
    """The session's persistent XLA compilation cache (tests/conftest.py), used by these tests in the pytest process
    too (programs that compile in 0.5 s or more) and by their CLI subprocesses: the same shapes are compiled once
    instead of once per test. The size limit turns on JAX's file lock (never reached)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(subprocess_compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    from tests.conftest import CACHE_LOCK_SIZE

    jax.config.update("jax_compilation_cache_max_size", CACHE_LOCK_SIZE)
    return subprocess_compile_cache


@pytest.fixture(scope="session")
def scored_data(tmp_path_factory, stories_model) -> Path:
    """``data.jsonl``: 4 stories260K samples for each of 40 story openings, VADER-scored (jaxppo.collect)."""
    from jaxppo.cli.collect import collect
    from jaxppo.config import load_config

    out = tmp_path_factory.mktemp("scored")
    cfg = load_config(None, [f"model.path={stories_model}", f"rollout.prompts={REPO / 'configs/prompts/story_openings.txt'}",
                             "rollout.max_prompts=40", "rollout.output_format=jsonl", f"trainer.output_dir={out}",
                             *[o for o in TINY if o.startswith(("rollout.", "data.", "reward."))]])
    from jaxppo.rewards import reward_fn_from_config

    collect(cfg, reward_fn_from_config(cfg.reward), progress=False)
    return out / "data.jsonl"


@pytest.fixture
def make_cfg(tmp_path, stories_model, scored_data):
    """``make_cfg(*overrides)`` → a tiny Config writing into a fresh tmp folder."""
    from jaxppo.config import load_config

    def make(*overrides: str, out: Path | None = None):
        return load_config(None, [f"model.path={stories_model}", f"data.path={scored_data}",
                                  f"trainer.output_dir={out or tmp_path / 'run'}", *TINY, *overrides])
    return make


def overrides_for_cli(stories_model: Path, scored_data: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.path={stories_model}", f"data.path={scored_data}", f"trainer.output_dir={out}", *TINY, *extra]


def row_layout_prepare(run):
    """The prepare pass of ``run`` (a ``build_run`` result, not packed) in the row layout, every row through the trunk
    with its own prompt (``make_prepare_fn(..., group_size=1)``): the reference of the shared-prompt layout that the
    build picks for data of whole prompt groups (``windows.prompt_group_size``)."""
    from jaxppo.optim import shardings_of
    from jaxppo.trainer.ppo.hparams import step_hparams
    from jaxppo.trainer.ppo.prepare import make_prepare_fn

    a = run.cfg.actor
    return make_prepare_fn(run.actor_gd, run.critic_gd, chunk=a.ppo_micro_batch_size or a.ppo_mini_batch_size,
                           hp=step_hparams(run.cfg), state_shardings=shardings_of(run.state), base=run.parts.base,
                           group_size=1)
