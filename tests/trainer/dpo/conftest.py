"""Fixtures of the DPO tests: ~64 real HH-RLHF pairs, stories260K, lengths 16, a shared XLA compilation cache."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

TINY = [
    "data.schema=preference", "data.preference_format=hh", "data.max_rows=64", "data.max_prompt_length=16",
    "data.max_response_length=16", "data.eval_fraction=0.25", "data.behaviour_batch_size=32",
    "dpo.beta=0.1", "dpo.batch_size=16", "dpo.micro_batch_size=8", "actor.optim.lr=1e-3",
    "reward.kind=model",  # no reward.model_path: the reward evaluation is skipped with a warning
    "guards.ppl_every=1000", "guards.ppl_tolerance=10.0",
    "trainer.total_steps=12", "trainer.save_every=2", "trainer.keep_last=2", "trainer.eval_every=6",
    "trainer.progress=false", "trainer.tensorboard=false", "trainer.plots=false", "trainer.save_hf=false",
]


@pytest.fixture(scope="session", autouse=True)
def dpo_compile_cache(tmp_path_factory) -> Path:
    """A persistent XLA compilation cache shared by the tests and their CLI subprocesses."""
    import jax

    d = tmp_path_factory.mktemp("xla_cache_dpo")
    jax.config.update("jax_compilation_cache_dir", str(d))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return d


def dpo_overrides(stories_model: Path, hh_pairs: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return [f"model.path={stories_model}", f"data.path={hh_pairs}", f"data.cache_dir={cache}",
            f"trainer.output_dir={out}", *TINY, *extra]
