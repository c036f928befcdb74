"""``jaxppo.collect``: a tiny real collection on stories260K, its file, its log-probs, its errors."""

import json

import numpy as np
import pytest

from jaxppo.config import load_config
from jaxppo.data.report import DataError
from jaxppo.rewards import reward_fn_from_config

PROMPTS = ["Once upon a time, there was a cat.", "Tom went to the park.", "The sun was hot and"]
REQUIRED = {"prompt", "response", "prompt_ids", "response_ids", "behaviour_logprobs", "score", "group_id"}
N, NEW, P = 2, 8, 16


def _write_config(root, shared_dir, out_name="out", extra=""):
    prompts = root / "prompts.txt"
    prompts.write_text("# a comment line\n" + "\n\n".join(PROMPTS) + "\n", encoding="utf-8")
    cfg = root / "collect.yaml"
    cfg.write_text(
        f"model: {{path: {shared_dir / 'models' / 'stories260K'}}}\n"
        f"data: {{max_prompt_length: {P}, truncation: left}}\n"
        f"rollout: {{prompts: {prompts}, n: {N}, max_new_tokens: {NEW}, batch_size: 4, temperature: 1.0,"
        f" top_k: 0, top_p: 1.0, seed: 3}}\n"
        f"reward: {{kind: vader}}\n"
        f"trainer: {{output_dir: {root / out_name}, progress: false}}\n" + extra, encoding="utf-8")
    return cfg


@pytest.fixture(scope="module")
def collected(shared_dir, tmp_path_factory):
    from jaxppo.data.collection import collect

    root = tmp_path_factory.mktemp("collect")
    cfg_file = _write_config(root, shared_dir)
    cfg = load_config(str(cfg_file))
    meta = collect(cfg, reward_fn_from_config(cfg.reward), progress=False)
    return cfg_file, root / "out", meta


@pytest.fixture(scope="module")
def stories(shared_dir):
    from jaxppo.hf import load_pretrained, load_tokenizer

    path = shared_dir / "models" / "stories260K"
    return load_pretrained(path), load_tokenizer(path)


def _load(path):
    import datasets

    return datasets.load_dataset("parquet", data_files=str(path), split="train").to_list()


def test_parquet_loads_with_datasets_and_has_every_column(collected, stories):
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    _, out, _ = collected
    _, tok = stories
    rows = _load(out / "data.parquet")
    assert len(rows) == len(PROMPTS) * N
    assert REQUIRED | {"sample", "finished"} <= set(rows[0])
    assert [r["group_id"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert [r["sample"] for r in rows] == [0, 1] * 3
    assert [r["prompt"] for r in rows] == [p for p in PROMPTS for _ in range(N)]
    sia = SentimentIntensityAnalyzer()
    for r in rows:
        assert r["prompt_ids"] == tok(r["prompt"])["input_ids"]  # BOS + the prompt's tokens
        assert 1 <= len(r["response_ids"]) <= NEW and len(r["behaviour_logprobs"]) == len(r["response_ids"])
        assert all(lp <= 0 for lp in r["behaviour_logprobs"])
        assert r["finished"] == (r["response_ids"][-1] == tok.eos_token_id)
        if not r["finished"]:
            assert len(r["response_ids"]) == NEW
        assert tok.eos_token_id not in r["response_ids"][:-1]
        assert r["response"] == tok.decode(r["response_ids"], skip_special_tokens=True)
        assert r["score"] == pytest.approx(sia.polarity_scores(r["response"])["compound"], abs=1e-6)
    # two samples of the same prompt are different draws
    assert rows[0]["response_ids"] != rows[1]["response_ids"] or rows[2]["response_ids"] != rows[3]["response_ids"]


def test_logprobs_equal_a_teacher_forced_recomputation(collected, stories):
    """At temperature 1 with no top-k/top-p, the logged log-probs are the model's own: reading the
    file back through the data pipeline and teacher-forcing the responses gives the same numbers."""
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_rows, response_logprobs, tokenize_rows

    _, out, _ = collected
    model, tok = stories
    dc = DataConfig(path=str(out / "data.parquet"), schema="scored", max_prompt_length=P, max_response_length=NEW)
    loaded = load_rows(dc)
    arrays = tokenize_rows(loaded, tok, dc)
    assert loaded.report.n_skipped == 0 and arrays["has_behaviour"].all()
    assert arrays["group_id"].tolist() == [0, 0, 1, 1, 2, 2]
    lp = np.asarray(response_logprobs(model, arrays["prompt_ids"], arrays["prompt_mask"], arrays["response_ids"],
                                      arrays["response_mask"]))
    m = arrays["response_mask"].astype(bool)
    assert m.sum() >= len(PROMPTS) * N
    np.testing.assert_allclose(lp[m], arrays["behaviour_logprobs"][m], atol=1e-4)
    assert (arrays["behaviour_logprobs"][~m] == 0).all()


def test_metadata_file(collected, shared_dir):
    cfg_file, out, meta = collected
    on_disk = json.loads((out / "metadata.json").read_text())
    assert on_disk["n_responses"] == 6 and on_disk["n_prompts"] == 3 and on_disk["seed"] == 3
    assert on_disk["model"] == str(shared_dir / "models" / "stories260K")
    assert on_disk["sampling"] == {"n": N, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": NEW,
                                   "chat_template": False, "max_prompt_length": P, "batch_size": 4,
                                   "eos_token_ids": [2], "pad_token_id": 2}
    assert on_disk["reward"]["kind"] == "vader" and on_disk["data_file"] == "data.parquet"
    assert set(on_disk["timing_s"]) == {"load", "generate", "score", "total"}
    assert on_disk["config"]["rollout"]["n"] == N
    assert on_disk["stats"]["score_mean"] == pytest.approx(np.mean([r["score"] for r in _load(out / "data.parquet")]),
                                                           abs=1e-6)


def test_same_seed_same_data_other_seed_other_data(collected, tmp_path):
    from jaxppo.data.collection import collect

    cfg_file, out, _ = collected
    base = [r["response_ids"] for r in _load(out / "data.parquet")]
    cfg = load_config(str(cfg_file), [f"trainer.output_dir={tmp_path / 'a'}"])
    collect(cfg, reward_fn_from_config(cfg.reward), progress=False)
    assert [r["response_ids"] for r in _load(tmp_path / "a" / "data.parquet")] == base
    cfg = load_config(str(cfg_file), [f"trainer.output_dir={tmp_path / 'b'}", "rollout.seed=4"])
    collect(cfg, reward_fn_from_config(cfg.reward), progress=False)
    assert [r["response_ids"] for r in _load(tmp_path / "b" / "data.parquet")] != base


def test_cli_jsonl_output_and_prompt_truncation(collected, tmp_path, capsys):
    from jaxppo.cli.collect import main
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_rows

    cfg_file, _, _ = collected
    out = tmp_path / "j"
    assert main(["--config", str(cfg_file), f"trainer.output_dir={out}", "rollout.output_format=jsonl",
                 "rollout.max_prompts=2", "data.max_prompt_length=6"]) == 0
    assert "wrote 4 responses (2 prompts x 2)" in capsys.readouterr().out
    lines = [json.loads(x) for x in (out / "data.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(len(x["prompt_ids"]) == 6 for x in lines)  # left-truncated to 6 tokens
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["prompt_report"]["truncated"] == {"prompt": 2}
    loaded = load_rows(DataConfig(path=str(out / "data.jsonl"), schema="scored"))
    assert len(loaded.rows) == 4 and all(r.behaviour_logprobs is not None for r in loaded.rows)


def test_cli_errors_are_clear(collected, tmp_path, capsys):
    from jaxppo.cli.collect import main

    cfg_file, _, _ = collected
    with pytest.raises(SystemExit) as e:
        main(["--config", str(cfg_file), "rollout.temprature=1"])
    assert e.value.code == 2 and "rollout.temprature" in capsys.readouterr().err
    cases = [
        ([f"rollout.prompts={tmp_path / 'none.txt'}"], "prompt file not found"),
        ([f"model.path={tmp_path / 'nomodel'}"], "does not exist"),
        (["reward.kind=model"], "needs path="),
        (["data.truncation=error", "data.max_prompt_length=4"], "data.max_prompt_length=4 (data.truncation=error)"),
    ]
    for args, msg in cases:
        assert main(["--config", str(cfg_file), f"trainer.output_dir={tmp_path / 'o'}", *args]) == 2, args
        err = capsys.readouterr().err
        assert "python -m jaxppo.collect: error:" in err and msg in err, (args, err)


def test_read_prompts(tmp_path):
    from jaxppo.data.collection import read_prompts

    f = tmp_path / "p.txt"
    f.write_text("# header\none\n\n  \ntwo  \n#x\nthree\n")
    assert read_prompts(str(f)) == ["one", "two  ", "three"]
    assert read_prompts(str(f), max_prompts=2) == ["one", "two  "]
    j = tmp_path / "p.jsonl"
    j.write_text('{"prompt": "a"}\n\n{"prompt": "b", "other": 1}\n')
    assert read_prompts(str(j)) == ["a", "b"]
    bad = [("x.jsonl", '{"prompt": "a"}\n{"prompt": 3}\n', "line 2: expected an object with a non-empty 'prompt'"),
           ("y.jsonl", '{"prompt": "a"}\nnot json\n', "line 2: not valid JSON"),
           ("z.txt", "# only comments\n\n", "has no prompts")]
    for name, text, msg in bad:
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match=msg):
            read_prompts(str(tmp_path / name))
    (tmp_path / "u.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(DataError, match="line 2: not valid UTF-8"):
        read_prompts(str(tmp_path / "u.txt"))
    with pytest.raises(DataError, match="rollout.prompts is not set"):
        read_prompts(None)
    with pytest.raises(DataError, match="prompt file not found"):
        read_prompts(str(tmp_path / "missing.txt"))
