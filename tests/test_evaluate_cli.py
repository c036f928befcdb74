"""``python -m jaxppo.evaluate``: stories260K against itself, an exact copy and a perturbed copy; bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from tests.xla_flags import cli_env
from flax import nnx

from jaxppo.cli.evaluate import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Once upon a time, there was a little girl named Lily.", "One day, Tom went to the park with his mom.",
           "The sun was shining and the birds were singing.", "There was a boy who loved to play with his red ball.",
           "Once upon a time, a small dog lived in a big house.", "Sam had a big box of toys.",
           "The cat sat on the mat.", "Mia found a shiny stone."]
RESPONSES = ["She was very happy.", "He was sad and cried.", "They played all day."]
EVAL_FRACTION, SEED = 0.5, 3
SMALL = ["data.max_prompt_length=24", "data.max_response_length=12", "rollout.max_new_tokens=12",
         "rollout.batch_size=8", "data.behaviour_batch_size=16", f"data.eval_fraction={EVAL_FRACTION}",
         f"data.seed={SEED}", "reward.kind=vader", "trainer.seed=1"]


@pytest.fixture(scope="module")
def stories(stories_model) -> Path:
    return stories_model


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """8 prompt groups x 3 scored responses (group ids 10..17, so they are not row numbers)."""
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for g, p in enumerate(PROMPTS):
            for k, r in enumerate(RESPONSES):
                fh.write(json.dumps({"prompt": p, "response": r, "score": float(g - k), "group_id": 10 + g}) + "\n")
    return path


def _args(stories: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.path={stories}", f"data.path={data}", f"trainer.output_dir={out}", *SMALL, *extra]


def _load(out: Path) -> tuple[dict, list[dict]]:
    result = json.loads((out / "eval.json").read_text())
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines() if line.strip()]
    return result, samples


def _save_copy(stories: Path, out: Path, noise: float) -> Path:
    from jaxppo.hf import load_pretrained, load_tokenizer, save_pretrained

    model = load_pretrained(stories)
    if noise:
        params = nnx.state(model, nnx.Param)
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
        noisy = [x + noise * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
        nnx.update(model, jax.tree.unflatten(treedef, noisy))
    return save_pretrained(model, out, tokenizer=load_tokenizer(stories))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, stories, data_file):
    """eval.json + samples of: the reference against itself (no --policy), an exact saved copy, a perturbed copy."""
    base = tmp_path_factory.mktemp("evals")
    policies = {"self": None, "copy": _save_copy(stories, base / "copy_hf", 0.0),
                "perturbed": _save_copy(stories, base / "perturbed_hf", 0.02)}
    results = {}
    for name, pol in policies.items():
        out = base / name
        argv = _args(stories, data_file, out) + ([] if pol is None else ["--policy", str(pol)])
        assert main(argv) == 0
        results[name] = _load(out)
    return results


def test_self_evaluation_has_zero_gain_and_zero_kl(runs):
    for name in ("self", "copy"):
        r, samples = runs[name]
        # same weights, same key -> same samples; the reference against itself runs no log-prob pass (KL exactly 0),
        # a copy's policy term comes from the generator and the reference's from a full pass: equal to float rounding
        assert r["eval/kl"] == 0.0 if name == "self" else abs(r["eval/kl"]) < 1e-6, (name, r["eval/kl"])
        assert r["eval/reward_gain"] == 0.0
        lo, hi = r["eval/reward_gain_ci95"]
        assert lo <= 0.0 <= hi
        assert r["eval/reward_policy"] == r["eval/reward_reference"]
        assert r["eval/perplexity"] == r["eval/perplexity_reference"]
        assert all(s["response_policy"] == s["response_reference"] for s in samples)


def test_heldout_prompts_are_the_trainers_split(runs, data_file):
    from jaxppo.data import split_by_group

    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    _, eval_rows = split_by_group([row["group_id"] for row in rows], EVAL_FRACTION, SEED)
    expected = list(dict.fromkeys(rows[i]["prompt"] for i in eval_rows))  # one per group, file order
    assert len(expected) == round(EVAL_FRACTION * len(PROMPTS))
    for name, (r, samples) in runs.items():
        assert [s["prompt"].strip() for s in samples] == expected, name
        assert r["n_prompts"] == len(expected)
        assert r["n_heldout_rows"] == len(expected) * len(RESPONSES)


def test_outputs_parse_and_rewards_match_the_samples(runs):
    from jaxppo.rewards import vader_reward

    for name, (r, samples) in runs.items():
        for k in ("eval/reward_policy", "eval/reward_reference", "eval/reward_gain", "eval/kl", "eval/perplexity"):
            assert np.isfinite(r[k]), (name, k)
        assert len(r["eval/reward_gain_ci95"]) == 2 and r["eval/reward_gain_ci95"][0] <= r["eval/reward_gain_ci95"][1]
        assert 1.0 < r["eval/perplexity_reference"] < 512  # stories260K (512 tokens) beats uniform on stories
        assert r["eval/perplexity"] > 1.0
        rp = np.array([s["reward_policy"] for s in samples])
        rr = np.array([s["reward_reference"] for s in samples])
        assert r["eval/reward_policy"] == pytest.approx(rp.mean(), abs=1e-6)
        assert r["eval/reward_gain"] == pytest.approx((rp - rr).mean(), abs=1e-6)
        prompts = [s["prompt"] for s in samples]
        np.testing.assert_allclose(vader_reward(prompts, [s["response_policy"] for s in samples]), rp, atol=1e-6)
        np.testing.assert_allclose(vader_reward(prompts, [s["response_reference"] for s in samples]), rr, atol=1e-6)
        lengths = r["eval/response_length_policy"]
        assert 1.0 <= lengths <= 12.0


def test_perturbed_policy_has_positive_kl_and_the_same_reference_side(runs):
    r, samples = runs["perturbed"]
    r0, samples0 = runs["self"]
    assert r["eval/kl"] > 1e-4
    assert r["eval/perplexity"] != r["eval/perplexity_reference"]
    # the reference's samples and rewards do not depend on the policy
    assert r["eval/reward_reference"] == r0["eval/reward_reference"]
    assert r["eval/perplexity_reference"] == r0["eval/perplexity_reference"]
    assert [s["response_reference"] for s in samples] == [s["response_reference"] for s in samples0]
    assert any(s["response_policy"] != s["response_reference"] for s in samples)
    lo, hi = r["eval/reward_gain_ci95"]
    assert lo <= r["eval/reward_gain"] <= hi


def test_table_is_printed(stories, data_file, tmp_path, capsys):
    assert main(_args(stories, data_file, tmp_path / "o")) == 0
    text = capsys.readouterr().out
    assert "reward gain +0.0000" in text and "KL(policy||ref) 0.00000" in text and "4 held-out prompts" in text


def _vocab_mismatch(tmp_path: Path, stories: Path) -> Path:
    from jaxppo.hf import save_pretrained
    from jaxppo.models import CausalLM, LMConfig

    hf = json.loads((stories / "config.json").read_text())
    hf["vocab_size"] = 600
    return save_pretrained(CausalLM(LMConfig.from_hf(hf), rngs=nnx.Rngs(0)), tmp_path / "other_vocab")


@pytest.mark.parametrize("case, match", [
    ("missing_policy", r"--policy .*nope does not exist"),
    ("not_a_model_dir", r"--policy .*ckpt: no config.json"),
    ("vocab", r"vocabulary mismatch: policy .* has vocab_size=600 but the reference .* has vocab_size=512"),
    ("no_heldout", r"no held-out prompts in .*data.eval_fraction=0.0"),
    ("mesh", r"mesh: data=16 x fsdp=1 x tensor=1 = 16 devices, but only 8 are available"),
])
def test_bad_input_is_one_line_exit_2(case, match, stories, data_file, tmp_path, capsys):
    import re

    out = tmp_path / "out"
    extra: list[str] = []
    if case == "missing_policy":
        extra = ["--policy", str(tmp_path / "nope")]
    elif case == "not_a_model_dir":
        (tmp_path / "ckpt").mkdir()
        extra = ["--policy", str(tmp_path / "ckpt")]
    elif case == "vocab":
        extra = ["--policy", str(_vocab_mismatch(tmp_path, stories))]
    elif case == "no_heldout":
        extra = ["data.eval_fraction=0"]
    elif case == "mesh":
        if len(jax.devices()) != 8:
            pytest.skip("needs the 8 simulated devices of tests/conftest.py")
        extra = ["mesh.data=16"]
    assert main(_args(stories, data_file, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("python -m jaxppo.evaluate: error: ")
    assert re.search(match, err), err
    assert not (out / "eval.json").exists()


def test_module_entry_point_reports_a_missing_policy(stories, data_file, tmp_path):
    env = cli_env()
    cmd = [sys.executable, "-m", "jaxppo.evaluate", "--policy", str(tmp_path / "missing"),
           *_args(stories, data_file, tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"python -m jaxppo.evaluate: error: FileNotFoundError: --policy {tmp_path / 'missing'} does not exist "
        "(give a Hugging Face folder such as a training run's <output_dir>/hf, or a .gguf file)"]


def test_unknown_config_key_exits_2(stories, data_file, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(_args(stories, data_file, tmp_path / "out", "trainer.no_such_key=1"))
    assert e.value.code == 2


def test_evaluating_a_training_runs_export_reproduces_its_final_evaluation(stories, data_file, tmp_path):
    """Same config → the trainer's held-out prompts, key and sampling: eval.json of <run>/hf equals summary.json."""
    from jaxppo.config import load_config
    from jaxppo.trainer.ppo.algorithm import train
    from jaxppo.trainer.ppo.build import build_run

    run_dir = tmp_path / "run"
    train_args = ["actor.ppo_mini_batch_size=4", "replay.capacity=64", "trainer.total_steps=2",
                  "trainer.save_every=2", "trainer.progress=false", "trainer.tensorboard=false",
                  "trainer.plots=false", "actor.optim.lr=1e-2", "guards.kl_threshold=100"]
    cfg = load_config(None, _args(stories, data_file, run_dir, *train_args))
    summary = train(cfg, run=build_run(cfg, devices=jax.devices()[:1]))
    assert main(_args(stories, data_file, tmp_path / "eval", *train_args, "--policy", str(run_dir / "hf"))) == 0
    r, samples = _load(tmp_path / "eval")
    assert r["eval/kl"] > 0.0  # the policy moved
    assert r["n_prompts"] == summary["eval/n_prompts"]
    assert r["eval/reward_reference"] == summary["eval/reward_before"]
    assert r["eval/reward_policy"] == summary["eval/reward_after"]
    assert r["eval/reward_gain_ci95"] == summary["eval/reward_gain_ci95"]
    assert r["eval/kl"] == pytest.approx(summary["eval/kl"], rel=1e-6)
    trained = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert [(s["prompt"], s["response_reference"], s["response_policy"]) for s in samples] == [
        (t["prompt"], t["before"], t["after"]) for t in trained]


PAIRS = [(p, c, r) for p in PROMPTS for c, r in [("She smiled and hugged her mom.", "It was bad."),
                                                 ("They had fun.", "No.")]]


@pytest.fixture(scope="module")
def pairs_config(tmp_path_factory, stories) -> Path:
    """A preference-pair config on the same model: 8 prompts x 2 pairs, half the prompts held out."""
    base = tmp_path_factory.mktemp("pairs")
    data = base / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in PAIRS))
    cfg = base / "pairs.yaml"
    cfg.write_text(f"model:\n  path: {stories}\ndata:\n  path: {data}\n  schema: preference\n"
                   f"  max_prompt_length: 24\n  max_response_length: 12\n  eval_fraction: 0.5\n  seed: {SEED}\n"
                   f"  cache_dir: {base / 'cache'}\n")
    return cfg


def test_pair_accuracy_is_the_implicit_reward_ranking_of_heldout_pairs(stories, data_file, pairs_config, tmp_path):
    """--pairs: against itself every implicit reward is 0, so no pair is ranked right (ties are wrong, as in DPO's
    accuracy); for a perturbed copy the accuracy equals a recount from the models' own continuation log-probs on
    the held-out pairs of the DPO split, and the interval resamples the held-out prompts."""
    from jaxppo.config import load_config
    from jaxppo.hf import load_pretrained, load_tokenizer
    from jaxppo.trainer.dpo.algorithm import load_pairs, split_pairs

    out = tmp_path / "self"
    assert main(_args(stories, data_file, out, "--pairs", str(pairs_config))) == 0
    r, _ = _load(out)
    assert r["eval/pair_accuracy"] == 0.0 and r["eval/pair_accuracy_ci95"] == [0.0, 0.0]
    assert r["n_heldout_pairs"] == 8 and r["n_heldout_pair_prompts"] == 4

    pol_dir = _save_copy(stories, tmp_path / "perturbed_hf", 0.05)
    out = tmp_path / "perturbed"
    assert main(_args(stories, data_file, out, "--policy", str(pol_dir), "--pairs", str(pairs_config))) == 0
    r, _ = _load(out)

    cfg = load_config(pairs_config)
    tok = load_tokenizer(stories)
    arrays, group, _ = load_pairs(cfg, tok)
    _, held = split_pairs(group, cfg.data)
    ref, pol = load_pretrained(stories), load_pretrained(pol_dir)

    def summed(model, side):
        a = {k: np.asarray(v)[held] for k, v in arrays.items()}
        lp = model.continuation_logprobs(a["prompt_ids"], a["prompt_mask"], a[f"{side}_ids"], a[f"{side}_mask"])
        return np.asarray(lp * a[f"{side}_mask"]).sum(1)

    margin = (summed(pol, "chosen") - summed(ref, "chosen")) - (summed(pol, "rejected") - summed(ref, "rejected"))
    assert np.min(np.abs(margin)) > 1e-4       # no near-tie whose side could flip with the batch layout
    assert r["eval/pair_accuracy"] == pytest.approx(float(np.mean(margin > 0)), abs=1e-12)
    lo, hi = r["eval/pair_accuracy_ci95"]
    assert 0.0 <= lo <= r["eval/pair_accuracy"] <= hi <= 1.0
