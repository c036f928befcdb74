"""Bradley-Terry reward model: the loss by hand, a tiny training run that must learn, save/load, CLI."""

import json
import math
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config import load_config
from jaxppo.rewards.model_training import bradley_terry_loss, iterate_batches, pair_inputs


def _softplus(x):
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


# ----------------------------------------------------------------------------- the loss

class TestBradleyTerryLoss(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        f = self.variant(bradley_terry_loss)
        loss, m = f(jnp.array([1.0, 0.0, -2.0]), jnp.array([0.0, 0.0, 1.0]))
        # d = r_c - r_j = [1, 0, -3]; -log sigma(d) = [log(1+e^-1), log 2, log(1+e^3)]
        want = (math.log(1 + math.exp(-1)) + math.log(2) + math.log(1 + math.exp(3))) / 3
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(m["accuracy"], 1 / 3, rtol=1e-6)  # only d=1 counts (d=0 is no win)
        np.testing.assert_allclose(m["margin"], (1 + 0 - 3) / 3, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_weights_drop_padding_rows(self):
        f = self.variant(bradley_terry_loss)
        loss, m = f(jnp.array([2.0, -5.0]), jnp.array([0.0, 5.0]), jnp.array([1.0, 0.0]))
        np.testing.assert_allclose(loss, math.log(1 + math.exp(-2)), rtol=1e-6)
        np.testing.assert_allclose(m["accuracy"], 1.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient_is_minus_sigmoid_of_minus_margin(self):
        # d/d r_c of softplus(r_j - r_c) = -sigmoid(r_j - r_c), divided by the batch size
        g = self.variant(jax.grad(lambda rc, rj: bradley_terry_loss(rc, rj)[0]))
        rc, rj = jnp.array([0.5, -1.0]), jnp.array([0.0, 1.0])
        want = -1 / (1 + np.exp(-(np.array(rj) - np.array(rc)))) / 2
        np.testing.assert_allclose(g(rc, rj), want, rtol=1e-5)


_f32 = st.floats(-30, 30, width=32, allow_subnormal=False)


@given(st.lists(st.tuples(_f32, _f32, st.floats(0.1, 3.0)), min_size=1, max_size=12))
def test_loss_matches_a_plain_python_reference(rows):
    rc, rj, w = (np.array(x, np.float32) for x in zip(*rows))
    loss, m = bradley_terry_loss(jnp.asarray(rc), jnp.asarray(rj), jnp.asarray(w))
    d = rc.astype(np.float64) - rj
    # XLA on CPU flushes float32 subnormals to zero, so a margin below the smallest normal float32 is no win
    d = np.where(np.abs(rc - rj) < np.finfo(np.float32).tiny, 0.0, d)
    want = sum(wi * _softplus(-di) for wi, di in zip(w, d)) / w.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(m["accuracy"]), float((w * (d > 0)).sum() / w.sum()), atol=1e-6)
    # swapping chosen and rejected: softplus(-d) - softplus(d) = -d
    loss_sw, _ = bradley_terry_loss(jnp.asarray(rj), jnp.asarray(rc), jnp.asarray(w))
    np.testing.assert_allclose(float(loss) - float(loss_sw), -(w * d).sum() / w.sum(), rtol=1e-4, atol=1e-4)


def test_pair_inputs_and_batches():
    arrays = {"prompt_ids": np.array([[0, 7], [8, 9], [6, 5]]), "prompt_mask": np.array([[0, 1], [1, 1], [1, 1]]),
              "chosen_ids": np.array([[1], [2], [3]]), "chosen_mask": np.ones((3, 1), int),
              "rejected_ids": np.array([[4], [5], [6]]), "rejected_mask": np.ones((3, 1), int)}
    batches = list(iterate_batches(arrays, np.array([2, 0, 1]), 2))
    assert [b["weight"].tolist() for b in batches] == [[1, 1], [1, 0]]
    assert batches[1]["chosen_ids"][:, 0].tolist() == [2, 3]  # padding row = a copy of the first row (2)
    ids, mask = pair_inputs({k: jnp.asarray(v) for k, v in batches[0].items()})
    assert ids.tolist() == [[6, 5, 3], [0, 7, 1], [6, 5, 6], [0, 7, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]]


# ----------------------------------------------------------------------------- a tiny real run

WORDS = ["tree", "ball", "dog", "cat", "sun", "house", "car", "bird", "fish", "girl", "boy", "park"]


def _synthetic_pairs(n: int, seed: int = 0) -> list[dict]:
    """Chosen answers contain the word 'happy' (at a random place among 3 random words); rejected
    answers are 4 other random words, so a fresh head scores the two sides at random."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=3))
        pos = int(rng.integers(0, 4))
        rows.append({"prompt": f"Story {i}: the {words[0]} and the {words[1]}",
                     "chosen": " " + " ".join(words[:pos] + ["happy"] + words[pos:]),
                     "rejected": " " + " ".join(rng.choice(WORDS, size=4))})
    return rows


# ----------------------------------------------------------------------------- the optimizer

def _reward_cfg(**kw):
    return load_config(None, [f"reward.{k}={v}" for k, v in kw.items()]).reward


def test_optimizer_is_the_trainers_factory_with_warmup_then_cosine_to_zero():
    """lr=1, 2 warmup steps, 6 steps: 0, 1/2, then ½(1 + cos(π k / 4)) for k = 0..4 (the trainers' schedule,
    ``jaxppo.optim.lr_schedule``); the factory's state holds the injected learning rate the step sets."""
    from jaxppo.optim import learning_rate_of, lr_schedule, set_learning_rate
    from jaxppo.rewards.model_training import make_optimizer, reward_optim

    rc = _reward_cfg(lr=1.0, warmup_steps=2, schedule="cosine")
    sched = lr_schedule(reward_optim(rc, 6), 6)
    want = [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    np.testing.assert_allclose([float(sched(t)) for t in range(7)], want, atol=1e-6)
    params = {"w": jnp.ones(3)}
    opt = make_optimizer(rc, 6).init(params)
    assert float(learning_rate_of(set_learning_rate(opt, sched(3)))) == pytest.approx(want[3], abs=1e-6)


@given(lr=st.floats(1e-5, 1.0), warm=st.integers(0, 8), total=st.integers(1, 40),
       cosine=st.booleans())
def test_schedule_matches_the_previous_reward_model_schedule(lr, warm, total, cosine):
    """The shared factory keeps the reward model's schedule: optax's warmup + cosine decay to 0 (or warmup then
    constant), warmup capped at ``total - 1`` steps."""
    import optax

    from jaxppo.optim import lr_schedule
    from jaxppo.rewards.model_training import reward_optim

    rc = _reward_cfg(lr=lr, warmup_steps=warm, schedule="cosine" if cosine else "constant")
    w = min(warm, max(total - 1, 0))
    if cosine:
        old = optax.warmup_cosine_decay_schedule(0.0 if w else lr, lr, w, max(total, w + 1), end_value=0.0)
    elif w:
        old = optax.join_schedules([optax.linear_schedule(0.0, lr, w), optax.constant_schedule(lr)], [w])
    else:
        old = optax.constant_schedule(lr)
    new = lr_schedule(reward_optim(rc, total), total)
    np.testing.assert_allclose([float(new(t)) for t in range(total)], [float(old(t)) for t in range(total)],
                               rtol=1e-5, atol=1e-7 * lr)


@pytest.fixture(scope="module")
def trained(shared_dir, tmp_path_factory):
    """One short training run shared by the tests below: (config file, output dir, TrainResult)."""
    from jaxppo.rewards.model_training import train_reward_model

    root = tmp_path_factory.mktemp("rm")
    rows = _synthetic_pairs(96)
    bad = [{"prompt": "p", "chosen": "same", "rejected": "same"},  # identical_pair
           {"prompt": "p", "chosen": "x"},  # missing_field
           {"prompt": "p", "chosen": 3, "rejected": "y"}]  # not_a_string
    data = root / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows + bad) + "\n", encoding="utf-8")
    cfg_file = root / "rm.yaml"
    cfg_file.write_text(
        f"model: {{path: {shared_dir / 'models' / 'stories260K'}}}\n"
        f"data: {{path: {data}, schema: preference, max_prompt_length: 12, max_response_length: 12,"
        f" eval_fraction: 0.25, seed: 1}}\n"
        "reward: {lr: 0.01, epochs: 6, batch_size: 24, eval_batch_size: 32, warmup_steps: 2}\n"
        "trainer: {seed: 0, progress: false}\n", encoding="utf-8")
    out = root / "out"
    result = train_reward_model(load_config(str(cfg_file)), out_dir=out)
    return cfg_file, out, result


def test_training_learns_an_easy_signal_and_writes_metrics(trained):
    _, out, result = trained
    m = json.loads((out / "metrics.json").read_text())
    assert m == json.loads(json.dumps(result.metrics))
    assert m["eval/accuracy"] > 0.9, m["history"]
    assert m["eval/accuracy_init"] < 0.8  # the fresh head did not already know it
    assert m["n_eval_pairs"] == 24 and m["n_train_pairs"] == 72  # 25% of the 96 distinct prompts
    assert m["data/rows_seen"] == 99 and m["data/rows_kept"] == 96
    for reason in ("identical_pair", "missing_field", "not_a_string"):
        assert m[f"data/skipped/{reason}"] == 1
    assert m["history"][-1]["eval/accuracy"] == m["eval/accuracy"]
    lo, hi = m["eval/accuracy_ci95"]
    assert 0.0 <= lo <= m["eval/accuracy"] <= hi <= 1.0
    assert m["eval/length_baseline_accuracy"] + m["eval/longer_baseline_accuracy"] == pytest.approx(1.0)
    assert m["n_eval_prompts"] == 24 and m["warnings"] == [   # 24 < MIN_EVAL_PROMPTS = 30
        "warning: the held-out accuracy comes from 24 pairs of 24 prompts (< 30): a small sample, read its interval; "
        "more prompts with a larger data.eval_fraction or more data"]
    assert m["train/loss"] < math.log(2)


def test_folder_is_safetensors_and_json_only(trained):
    _, out, _ = trained
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "reward_model.safetensors", "reward_config.json", "metrics.json"} <= names
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".pt", ".bin", ".npy"))]
    meta = json.loads((out / "reward_config.json").read_text())
    assert meta["max_prompt_length"] == 12 and meta["max_response_length"] == 12


def test_save_load_round_trip_gives_identical_scores(trained):
    from jaxppo.hf import load_tokenizer
    from jaxppo.rewards.model_io import load_reward_scorer, score_arrays, tokenize_pairs_for_scoring

    cfg_file, out, result = trained
    rows = _synthetic_pairs(10, seed=5)
    prompts = [r["prompt"] for r in rows] * 2
    responses = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
    tok = load_tokenizer(load_config(str(cfg_file)).model.path)
    t = tokenize_pairs_for_scoring(tok, prompts, responses, max_prompt_length=12, max_response_length=12)
    direct = score_arrays(result.model, t["input_ids"], t["attention_mask"], batch_size=8)
    loaded = load_reward_scorer(out, batch_size=16)(prompts, responses)
    np.testing.assert_array_equal(loaded, direct)
    assert (loaded[:10] > loaded[10:]).mean() > 0.9  # the loaded model also prefers 'happy'


def test_registry_model_reward_uses_the_folder(trained):
    from jaxppo.rewards import get_reward_fn

    _, out, _ = trained
    fn = get_reward_fn("model", path=str(out))
    s = fn(["Story 1: the dog and the cat"] * 2, [" dog happy cat", " dog tree cat"])
    assert s.dtype == np.float32 and s.shape == (2,) and s[0] > s[1]


def test_cli_score_on_preference_and_scored_data(trained, tmp_path, capsys):
    from jaxppo.cli.reward import main

    cfg_file, out, result = trained
    assert main(["score", "--config", str(cfg_file), f"reward.model_path={out}",
                 f"trainer.output_dir={tmp_path / 's1'}"]) == 0
    m = json.loads((tmp_path / "s1" / "score_metrics.json").read_text())
    assert m["n_pairs"] == 96 and m["accuracy"] > 0.9 and m["data/skipped/identical_pair"] == 1
    assert len((tmp_path / "s1" / "scores.jsonl").read_text().splitlines()) == 96
    assert "accuracy" in capsys.readouterr().out

    scored = tmp_path / "scored.jsonl"
    scored.write_text("\n".join(json.dumps({"prompt": "a tale", "response": r, "score": s})
                                for r, s in [(" cat happy", 1.0), (" cat ball", 0.0), (" dog happy", 1.0),
                                             (" dog park", 0.0), ("", 1.0)]) + "\n")
    assert main(["score", "--config", str(cfg_file), f"reward.model_path={out}", f"data.path={scored}",
                 "data.schema=scored", f"trainer.output_dir={tmp_path / 's2'}"]) == 0
    m = json.loads((tmp_path / "s2" / "score_metrics.json").read_text())
    assert m["n_rows"] == 4 and m["data/skipped/empty_text"] == 1
    assert m["pearson_with_score"] > 0.5


def test_cli_train_prints_the_report_the_interval_both_baselines_and_the_warning(trained, tmp_path, capsys):
    from jaxppo.cli.reward import main

    cfg_file, _, _ = trained
    assert main(["train", "--config", str(cfg_file), "reward.epochs=1", f"trainer.output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "metrics.json").read_text())
    lo, hi = m["eval/accuracy_ci95"]
    assert "kept 96 of 99 rows, skipped 3" in out
    assert f"eval/accuracy {m['eval/accuracy']:.4f} [95% interval over prompts {lo:.4f}, {hi:.4f}] on 24" in out
    assert (f"pick-the-shorter-answer {m['eval/length_baseline_accuracy']:.4f}, "
            f"pick-the-longer-answer {m['eval/longer_baseline_accuracy']:.4f}") in out
    assert "warning: the held-out accuracy comes from 24 pairs of 24 prompts (< 30)" in out


def test_cli_errors_are_clear(trained, tmp_path, capsys):
    from jaxppo.cli.reward import main

    cfg_file, out, _ = trained
    with pytest.raises(SystemExit) as e:
        main(["score", "--config", str(cfg_file), "reward.lrr=1"])
    assert e.value.code == 2 and "reward.lrr" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--config", str(cfg_file)])
    assert e.value.code == 2 and "invalid choice: 'evaluate'" in capsys.readouterr().err
    cases = [
        (["score", f"trainer.output_dir={tmp_path}"], "reward.model_path is not set"),
        (["score", f"reward.model_path={tmp_path}", f"trainer.output_dir={tmp_path}"], "is not a reward-model folder: config.json is missing"),
        (["train", "data.schema=scored", f"trainer.output_dir={tmp_path}"], "needs data.schema=preference"),
        (["train", f"model.path={tmp_path / 'nope'}", f"trainer.output_dir={tmp_path}"], "does not exist"),
        (["train", f"data.path={tmp_path / 'nope.jsonl'}", f"trainer.output_dir={tmp_path}"], "data file not found"),
    ]
    for args, msg in cases:
        assert main([args[0], "--config", str(cfg_file), *args[1:]]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and "error" in err, (args, err)


def test_broken_reward_model_folder_is_named(trained, tmp_path):
    from safetensors.numpy import load_file, save_file

    from jaxppo.rewards.model_io import load_reward_model

    _, out, _ = trained
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "reward_config.json"):
        (bad / name).write_text((out / name).read_text())
    t = load_file(str(out / "reward_model.safetensors"))
    t.pop("score_head.kernel")
    save_file(t, str(bad / "reward_model.safetensors"))
    with pytest.raises(ValueError, match="missing: \\['score_head.kernel'\\]"):
        load_reward_model(bad)
    t = load_file(str(out / "reward_model.safetensors"))
    t["score_head.kernel"] = np.zeros((3, 1), np.float32)
    save_file(t, str(bad / "reward_model.safetensors"))
    with pytest.raises(ValueError, match="score_head.kernel has shape \\(3, 1\\)"):
        load_reward_model(bad)


def test_module_runs_as_a_script_and_reports_usage():
    r = subprocess.run([sys.executable, "-m", "jaxppo.reward", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train" in r.stdout and "score" in r.stdout
    r = subprocess.run([sys.executable, "-m", "jaxppo.reward"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "required: command" in r.stderr


# ----------------------------------------------------------------------------- preference pairs -> scored dataset

_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
           "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _hh_messages(text: str) -> list[dict]:
    import re

    parts = re.split(r"\n\n(Human|Assistant):", text)
    return [{"role": "user" if r == "Human" else "assistant", "content": c.strip()}
            for r, c in zip(parts[1::2], parts[2::2])]


@pytest.fixture(scope="module")
def hh(shared_dir, tmp_path_factory):
    """The first 40 real HH-RLHF pairs as a string file and as a conversational (explicit prompt) file,
    a ChatML template file and a base config (stories260K)."""
    import gzip

    root = tmp_path_factory.mktemp("hh")
    with gzip.open(shared_dir / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as fh:
        rows = [json.loads(next(fh)) for _ in range(40)]
    (root / "hh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    conv = []
    for r in rows:
        c, j = _hh_messages(r["chosen"]), _hh_messages(r["rejected"])
        conv.append({"prompt": c[:-1], "chosen": c[-1:], "rejected": j[-1:]})
    (root / "hh_conv.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conv), encoding="utf-8")
    (root / "chatml.jinja").write_text(_CHATML, encoding="utf-8")
    cfg = root / "cfg.yaml"
    cfg.write_text(
        f"model: {{path: {shared_dir / 'models' / 'stories260K'}}}\n"
        f"data: {{path: {root / 'hh.jsonl'}, schema: preference, max_prompt_length: 96, max_response_length: 32,"
        f" eval_fraction: 0.25, seed: 0}}\n"
        "reward: {lr: 0.005, epochs: 1, batch_size: 8, eval_batch_size: 16}\n"
        "trainer: {seed: 0, progress: false}\n", encoding="utf-8")
    return root, cfg, rows


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _torch_logprobs(path, prompt, response):
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([prompt + response])).logits[0].float(), dim=-1)
    return np.array([logp[len(prompt) + t - 1, tok].item() for t, tok in enumerate(response)])


def test_to_scored_label_mode_on_hh_pairs_then_reference_logprobs(hh, shared_dir, tmp_path, capsys):
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_scored_arrays
    from jaxppo.hf import load_pretrained, load_tokenizer
    from jaxppo.cli.reward import main

    root, cfg, rows = hh
    out = tmp_path / "label"
    assert main(["to-scored", "--config", str(cfg), f"trainer.output_dir={out}"]) == 0
    console = capsys.readouterr().out
    assert "win-rate scores (wins / pairs" in console and "data " in console and "kept " in console
    m = json.loads((out / "to_scored_metrics.json").read_text())
    recs = _read_jsonl(out / "scored.jsonl")
    assert m["score_source"] == "win_rate" and m["n_pairs"] == m["data/rows_kept"] and m["n_rows"] == len(recs)
    assert not any("behaviour_logprobs" in r for r in recs)
    assert len({(r["prompt"], r["response"]) for r in recs}) == len(recs)   # each answer once
    groups = {}
    for r in recs:   # prompt + response is the chosen or rejected dialogue of each pair it came from
        assert r["score"] == r["wins"] / (r["wins"] + r["losses"])
        assert groups.setdefault(r["prompt"], r["group_id"]) == r["group_id"]
        for i in r["source_rows"]:
            assert r["prompt"] + r["response"] == (rows[i]["chosen"] if r["wins"] else rows[i]["rejected"])
    assert sorted(groups.values()) == list(range(len(groups)))   # one dense id per prompt
    n = len(recs)

    model_dir = shared_dir / "models" / "stories260K"
    tok = load_tokenizer(model_dir)
    dc = DataConfig(path=str(out / "scored.jsonl"), schema="scored", max_prompt_length=96, max_response_length=32,
                    cache_dir=str(tmp_path / "cache"))
    arrays, report = load_scored_arrays(dc, tok, reference_path=str(model_dir), reference=load_pretrained(model_dir))
    assert len(arrays["index"]) == n and not arrays["has_behaviour"].any()
    assert report.notes["behaviour_logprobs_computed"] == n
    np.testing.assert_array_equal(arrays["group_id"], [r["group_id"] for r in recs])
    assert arrays["score"].tolist() == [r["score"] for r in recs]
    lp, mask = arrays["behaviour_logprobs"], arrays["response_mask"].astype(bool)
    assert (lp[mask] < 0).all() and (lp[~mask] == 0).all()
    # the filled log-probs are the reference's: transformers' own Llama on row 3 (no padding)
    p = arrays["prompt_ids"][3][arrays["prompt_mask"][3] == 1].tolist()
    y = arrays["response_ids"][3][mask[3]].tolist()
    np.testing.assert_allclose(lp[3][mask[3]], _torch_logprobs(model_dir, p, y), atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def conv_rm(hh, tmp_path_factory):
    """A reward model trained for a few steps on the conversational HH pairs (ChatML file on stories260K)."""
    from jaxppo.rewards.model_training import train_reward_model

    root, cfg, _ = hh
    out = tmp_path_factory.mktemp("conv_rm")
    c = load_config(str(cfg), [f"data.path={root / 'hh_conv.jsonl'}",
                               f"data.chat_template_file={root / 'chatml.jinja'}"])
    result = train_reward_model(c, out_dir=out)
    return out, result


def test_reward_model_trains_on_conversational_pairs_and_keeps_the_template(conv_rm, hh):
    from transformers import AutoTokenizer

    out, result = conv_rm
    m = result.metrics
    assert m["n_pairs"] == 40 and m["data/rows_skipped"] == 0 and m["steps"] == 4  # 30 train pairs / batch 8
    assert np.isfinite(m["train/loss"])
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == _CHATML  # the folder renders like training


def test_to_scored_with_a_reward_model_on_conversational_pairs(conv_rm, hh, shared_dir, tmp_path, capsys):
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_scored_arrays
    from jaxppo.data.tokenize import fit_prompt, fit_response, left_pad, right_pad
    from jaxppo.cli.reward import main
    from jaxppo.rewards.model_io import score_arrays

    rm_dir, result = conv_rm
    root, cfg, rows = hh
    out = tmp_path / "rm"
    # the pairs are filtered as the policy (stories260K + the ChatML file) will read them, scored by the reward model
    assert main(["to-scored", "--config", str(cfg), f"data.path={root / 'hh_conv.jsonl'}",
                 f"data.chat_template_file={root / 'chatml.jinja'}", f"reward.model_path={rm_dir}",
                 f"trainer.output_dir={out}"]) == 0
    assert "reward-model scores" in capsys.readouterr().out
    recs = _read_jsonl(out / "scored.jsonl")
    m = json.loads((out / "to_scored_metrics.json").read_text())
    assert m["score_source"] == "reward_model" and len(recs) == m["n_rows"]
    by_text = {(json.dumps(r["prompt"]), json.dumps(r["response"])): r["score"] for r in recs}
    conv = _read_jsonl(root / "hh_conv.jsonl")
    kept = sorted({i for r in recs for i in r["source_rows"]})

    def score_of(i, side):
        return by_text[(json.dumps(conv[i]["prompt"]), json.dumps(conv[i][side]))]
    assert recs[0]["prompt"][-1]["role"] == "user" and recs[0]["response"][0]["role"] == "assistant"  # kept as messages
    # independent scores: ChatML text built from the raw HH strings, tokenized and scored directly
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    p_ids, r_ids = [], []
    for r in [rows[i] for i in kept[:6]]:
        for text in (r["chosen"], r["rejected"]):
            msgs = _hh_messages(text)
            p = "".join(f"<|im_start|>{x['role']}\n{x['content']}<|im_end|>\n" for x in msgs[:-1])
            p_ids.append(fit_prompt(tok([p + "<|im_start|>assistant\n"], add_special_tokens=False)["input_ids"][0],
                                    96, "left")[0])
            resp = f"{msgs[-1]['content']}<|im_end|>\n"
            r_ids.append(fit_response(tok([resp], add_special_tokens=False)["input_ids"][0], 32, "left")[0])
    pi, pm = left_pad(p_ids, 96, 0)
    ri, rm = right_pad(r_ids, 32, 0)
    want = score_arrays(result.model, np.concatenate([pi, ri], 1), np.concatenate([pm, rm], 1))
    np.testing.assert_allclose([score_of(i, side) for i in kept[:6] for side in ("chosen", "rejected")], want,
                               rtol=1e-5, atol=1e-5)
    assert m["accuracy"] == pytest.approx(np.mean([score_of(i, "chosen") > score_of(i, "rejected") for i in kept]))

    # the scored file trains: rendered by the policy's tokenizer (+ the template file), log-probs from the reference
    from jaxppo.hf import load_pretrained, load_tokenizer

    model_dir = shared_dir / "models" / "stories260K"
    dc = DataConfig(path=str(out / "scored.jsonl"), schema="scored", max_prompt_length=96, max_response_length=32,
                    chat_template_file=str(root / "chatml.jinja"), cache_dir=str(tmp_path / "cache"))
    arrays, report = load_scored_arrays(dc, load_tokenizer(model_dir), reference_path=str(model_dir),
                                        reference=load_pretrained(model_dir))
    assert len(arrays["index"]) == len(recs) and report.notes["behaviour_logprobs_computed"] == len(recs)
    np.testing.assert_array_equal(arrays["group_id"], [r["group_id"] for r in recs])
    np.testing.assert_allclose(arrays["score"], [x["score"] for x in recs], rtol=1e-6)
    assert (arrays["behaviour_logprobs"][arrays["response_mask"] == 1] < 0).all()

    # score on the conversational pairs gives the same accuracy
    assert main(["score", "--config", str(cfg), f"data.path={root / 'hh_conv.jsonl'}", f"reward.model_path={rm_dir}",
                 f"trainer.output_dir={tmp_path / 's'}"]) == 0
    assert json.loads((tmp_path / "s" / "score_metrics.json").read_text())["accuracy"] == pytest.approx(m["accuracy"])


def test_to_scored_needs_preference_data(hh, tmp_path, capsys):
    from jaxppo.cli.reward import main

    _, cfg, _ = hh
    assert main(["to-scored", "--config", str(cfg), "data.schema=scored", f"trainer.output_dir={tmp_path}"]) == 2
    assert "to-scored reads preference pairs: set data.schema=preference" in capsys.readouterr().err


def test_packed_pairs_give_the_padded_scores_loss_and_gradients():
    """``data.packing``: a batch's 2B sequences packed without padding give the padded stack's scores, Bradley-Terry
    loss and gradients (float32 within 1e-5), the last batch's weight-0 copies included."""
    from flax import nnx

    from jaxppo.models import RewardModel
    from jaxppo.rewards.model_training import make_eval_step, pair_scores
    from tests.models.test_packing import assert_grads_close
    from tests.models.tiny_lm import tiny_config

    rng = np.random.default_rng(0)
    n, P, R = 5, 6, 4
    lp, lc, lr = rng.integers(1, P + 1, n), rng.integers(1, R + 1, n), rng.integers(0, R + 1, n)
    pm = (np.arange(P)[None] >= P - lp[:, None]).astype(np.int32)
    cm = (np.arange(R)[None] < lc[:, None]).astype(np.int32)
    rm = (np.arange(R)[None] < lr[:, None]).astype(np.int32)
    arrays = {"prompt_ids": rng.integers(1, 61, (n, P)).astype(np.int32) * pm, "prompt_mask": pm,
              "chosen_ids": rng.integers(1, 61, (n, R)).astype(np.int32) * cm, "chosen_mask": cm,
              "rejected_ids": rng.integers(1, 61, (n, R)).astype(np.int32) * rm, "rejected_mask": rm}
    model = RewardModel(tiny_config("qwen2", initializer_range=0.1), rngs=nnx.Rngs(3))
    graphdef, params = nnx.split(model)
    rows = np.arange(n)
    padded = list(iterate_batches(arrays, rows, 3))
    packed = list(iterate_batches(arrays, rows, 3, packing=True))
    assert "packed" not in padded[0] and packed[0]["packed"].ids.shape[1] == P + R

    def loss(p, batch):
        rc, rj = pair_scores(nnx.merge(graphdef, p), batch)
        return bradley_terry_loss(rc, rj, batch["weight"])[0]

    vg = jax.jit(jax.value_and_grad(loss))
    for a, b in zip(padded, packed):
        sa, sb = pair_scores(model, a), pair_scores(model, b)
        np.testing.assert_allclose(np.asarray(sb), np.asarray(sa), rtol=1e-5, atol=1e-5)
        (la, ga), (lb, gb) = vg(params, a), vg(params, b)
        np.testing.assert_allclose(float(lb), float(la), rtol=1e-5, atol=1e-6)
        assert_grads_close(ga, gb)
    ev = make_eval_step(graphdef)
    from jaxppo.rewards.model_training import evaluate

    np.testing.assert_allclose(list(evaluate(ev, params, arrays, rows, 3, packing=True).values()),
                               list(evaluate(ev, params, arrays, rows, 3).values()), rtol=1e-5, atol=1e-6)
