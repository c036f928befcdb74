"""jaxppo.data.label_noise and ``data.score_noise_sd`` through the run's data split."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxppo.data.label_noise import noisy_scores


def test_hand_case_is_the_seeded_normal_draws():
    s = np.array([0.5, -0.25, 0.0], np.float32)
    idx = np.array([2, 0, 5])
    z = np.random.default_rng([3, 0x5C0E]).standard_normal(6)
    out = noisy_scores(s, idx, 0.5, seed=3)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, s + 0.5 * z[[2, 0, 5]].astype(np.float32), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(noisy_scores(s, idx, 0.0, seed=3), s)
    assert noisy_scores(s, idx, 0.0, seed=3) is not s


@given(st.integers(0, 2 ** 31 - 1), st.permutations(list(range(12))))
@settings(max_examples=25, deadline=None)
def test_noise_follows_the_row_not_its_position(seed, perm):
    s = np.linspace(-1, 1, 12).astype(np.float32)
    idx = np.arange(12) * 3
    a = noisy_scores(s, idx, 1.0, seed)
    p = np.asarray(perm)
    np.testing.assert_array_equal(noisy_scores(s[p], idx[p], 1.0, seed), a[p])   # any order or subset of rows
    np.testing.assert_array_equal(noisy_scores(s[:5], idx[:5], 1.0, seed), a[:5])
    assert not np.array_equal(noisy_scores(s, idx, 1.0, seed + 1), a)          # a new seed draws new noise


def test_noise_has_the_stated_sd():
    s = np.zeros(20000, np.float32)
    z = noisy_scores(s, np.arange(20000), 0.5, seed=0)
    assert abs(float(z.mean())) < 0.02 and float(z.std()) == pytest.approx(0.5, rel=0.03)


def test_bad_input():
    with pytest.raises(ValueError, match="row indices"):
        noisy_scores(np.zeros(2), np.zeros(3, int), 1.0, 0)
    with pytest.raises(ValueError, match="sd must be"):
        noisy_scores(np.zeros(2), np.zeros(2, int), -1.0, 0)


def test_split_data_adds_noise_to_the_training_rows_only(tmp_path, stories_tokenizer, shared_dir, monkeypatch):
    """``data.score_noise_sd``: the training rows' scores move by sd * z (the run's trainer.seed, the row's index),
    the held-out rows and every other array stay as without noise."""
    from jaxppo.config import load_config
    from jaxppo.data.split import split_data

    monkeypatch.setenv("JAXPPO_CACHE_DIR", str(tmp_path / "cache"))
    rows = [{"prompt": f"Once upon a time {i}", "response": f" there was a cat {j}", "score": 0.1 * i - 0.05 * j,
             "group_id": i} for i in range(10) for j in range(2)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = [f"model.path={shared_dir / 'models' / 'stories260K'}", f"data.path={data}", "data.eval_fraction=0.2",
            "trainer.seed=7"]
    cfg0 = load_config(None, base)
    cfg1 = load_config(None, [*base, "data.score_noise_sd=0.5"])
    tr0, ho0, _ = split_data(cfg0, stories_tokenizer)
    tr1, ho1, _ = split_data(cfg1, stories_tokenizer)
    z = np.random.default_rng([7, 0x5C0E]).standard_normal(int(tr0["index"].max()) + 1)
    np.testing.assert_allclose(tr1["score"], tr0["score"] + 0.5 * z[tr0["index"]], atol=1e-6)
    assert not np.allclose(tr1["score"], tr0["score"])
    for k in ho0:
        np.testing.assert_array_equal(ho1[k], ho0[k])
    for k in tr0:
        if k != "score":
            np.testing.assert_array_equal(tr1[k], tr0[k])
