"""DPO with LoRA adapters: a few steps on real HH-RLHF pairs; only the adapters train, the reference is the base."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.trainer.dpo.conftest import dpo_overrides

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.slow
def test_lora_dpo_trains_adapters_on_the_frozen_base(tmp_path, stories_model, hh_pairs):
    from jaxppo.config import load_config
    from jaxppo.trainer.dpo.algorithm import build_dpo_run, fit_dpo

    cfg = load_config(None, dpo_overrides(stories_model, hh_pairs, tmp_path / "run", tmp_path / "cache",
                                          "model.lora.rank=4", "model.lora.alpha=8", "actor.optim.lr=5e-3",
                                          "trainer.total_steps=4", "trainer.save_every=4", "trainer.eval_every=4"))
    run = build_dpo_run(cfg, devices=jax.devices()[:1])
    names = ["/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(run.state.actor)[0]]
    assert names and all("_lora_" in n for n in names)
    base0 = jax.tree.map(np.array, run.base)
    ids, mask = run.train["prompt_ids"][:2], run.train["prompt_mask"][:2]
    ref0 = np.asarray(run.reference()(ids, mask))
    summary, state = fit_dpo(cfg, run=run)
    assert int(state.step) == 4 and int(state.nan_total) == 0
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(run.base)):   # frozen, never donated
        np.testing.assert_array_equal(a, np.asarray(b))
    np.testing.assert_array_equal(np.asarray(run.reference()(ids, mask)), ref0)
    pol = np.asarray(run.policy(state.actor)(ids, mask))
    assert np.max(np.abs(pol - ref0)) > 0                                 # the adapters moved the policy
    assert np.isfinite(summary["train/rewards/accuracies"])
