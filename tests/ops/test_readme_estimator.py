"""README's "add an estimator" example works as written: executing its code block registers the estimator, the
config accepts the name, the trainer's hyper-parameters build no critic for it, and it computes what it says."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
NAME = "score_minus_batch_mean"


def _example_code() -> str:
    text = README.read_text(encoding="utf-8")
    sec = text[text.index("### Advantage estimators"):]
    return re.search(r"```python\n(.*?)```", sec, re.S).group(1)


@pytest.fixture
def registered():
    from jaxppo.ops.group_advantages import ADVANTAGE_ESTIMATORS

    ns: dict = {}
    exec(compile(_example_code(), "README.md", "exec"), ns)   # noqa: S102 - our own README's example
    try:
        yield ns[NAME], ADVANTAGE_ESTIMATORS[NAME]
    finally:
        ADVANTAGE_ESTIMATORS.pop(NAME, None)


@pytest.mark.parametrize("jit", [False, True])
def test_readme_estimator_registers_and_computes(registered, jit):
    fn, est = registered
    assert not est.needs_critic and not est.needs_groups
    r = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]], np.float32)
    m = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
    f = jax.jit(lambda r, m: fn(r, None, m, None, None)) if jit else (lambda r, m: fn(r, None, m, None, None))
    adv, ret = f(r, m)
    # hand: scores [1, 3], batch mean 2 -> [-1, +1] on the response tokens, 0 on padding
    np.testing.assert_allclose(np.asarray(adv), [[-1, -1, 0], [1, 1, 1]])
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv))


def test_readme_estimator_is_selectable_from_config(registered, shared_dir):
    from jaxppo.config import load_config
    from jaxppo.trainer.ppo.hparams import step_hparams

    cfg = load_config(str(README.parent / "configs" / "smoke.yaml"), [f"algorithm.adv_estimator={NAME}"])
    assert cfg.algorithm.adv_estimator == NAME
    assert step_hparams(cfg).critic is None     # critic-free: no critic is built for it


def test_readme_command_config_is_valid():
    from jaxppo.config import load_config

    cmd = re.search(r"python -m jaxppo.train --config configs/smoke.yaml (algorithm\.adv_estimator=grpo[^\n]*)",
                    README.read_text(encoding="utf-8")).group(1).split()
    cfg = load_config(str(README.parent / "configs" / "smoke.yaml"), cmd)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.replay.priority == "group_variance"
