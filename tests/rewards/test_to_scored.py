"""``reward to-scored`` keeps exactly the pairs ``reward train`` and ``jaxppo.dpo`` keep, writes each distinct answer
once with a per-prompt group id, and prints the data report."""

import json

import numpy as np
import pytest

from jaxppo.config import load_config

# stories260K tokens: " The cat ran away." and " The cat ran home." share their first 5 tokens
_ROWS = [
    {"prompt": "Once upon a time", "chosen": " A dog barked.", "rejected": " The cat ran away."},     # 0: A > B
    {"prompt": "Once upon a time", "chosen": " A dog barked.", "rejected": " The cat ran home."},     # 1: A > C
    {"prompt": "Once upon a time", "chosen": " The cat ran away.", "rejected": " The cat ran home."},  # 2: cut alike
    {"prompt": "Once upon a time", "chosen": " The cat ran home.", "rejected": " The cat sat."},      # 3: C > D
    {"prompt": "The dog", "chosen": " ran.", "rejected": " sat."},                                    # 4
    {"prompt": "The dog", "chosen": " ran.", "rejected": " ran."},                                    # 5: identical
    {"prompt": "The dog", "chosen": " ran."},                                                         # 6: missing
]


@pytest.fixture(scope="module")
def pairs_cfg(shared_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("to_scored")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _ROWS), encoding="utf-8")
    cfg = root / "cfg.yaml"
    cfg.write_text(f"model: {{path: {shared_dir / 'models' / 'stories260K'}}}\n"
                   f"data: {{path: {data}, schema: preference, max_prompt_length: 8, max_response_length: 5}}\n",
                   encoding="utf-8")
    return cfg


def test_to_scored_keeps_the_pairs_dpo_keeps_and_writes_each_answer_once(pairs_cfg, tmp_path, capsys):
    from jaxppo.hf import load_tokenizer
    from jaxppo.cli.reward import main
    from jaxppo.trainer.dpo.algorithm import load_pairs

    out = tmp_path / "out"
    assert main(["to-scored", "--config", str(pairs_cfg), f"trainer.output_dir={out}"]) == 0
    console = capsys.readouterr().out
    # the data report is on the console: every skip reason with its count
    assert "kept 4 of 7 rows, skipped 3" in console
    for reason in ("identical_after_truncation", "identical_pair", "missing_field"):
        assert f"skipped      1 {reason}" in console
    assert "wrote 6 scored rows (each distinct answer once; 2 prompt groups) from 4 pairs" in console

    recs = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    m = json.loads((out / "to_scored_metrics.json").read_text())
    assert m["n_pairs"] == 4 and m["n_rows"] == 6 and m["n_prompts"] == 2 and m["score_source"] == "win_rate"
    assert m["data/skipped/identical_after_truncation"] == 1
    # hand tally of pairs 0, 1, 3, 4: A beats B and C; C beats D; "ran." beats "sat."; in order of first appearance
    assert [(r["prompt"], r["response"], r["score"], r["group_id"], r["wins"], r["losses"], r["source_rows"])
            for r in recs] == [
        ("Once upon a time", " A dog barked.", 1.0, 0, 2, 0, [0, 1]),
        ("Once upon a time", " The cat ran away.", 0.0, 0, 0, 1, [0]),
        ("Once upon a time", " The cat ran home.", 0.5, 0, 1, 1, [1, 3]),
        ("Once upon a time", " The cat sat.", 0.0, 0, 0, 1, [3]),
        ("The dog", " ran.", 1.0, 1, 1, 0, [4]),
        ("The dog", " sat.", 0.0, 1, 0, 1, [4]),
    ]

    # the same pairs as DPO's (and the reward model's: both read load_preference_arrays) ...
    cfg = load_config(str(pairs_cfg))
    arrays, group, report = load_pairs(cfg, load_tokenizer(cfg.model.path))
    assert sorted(arrays["index"].tolist()) == sorted({i for r in recs for i in r["source_rows"]}) == [0, 1, 3, 4]
    assert report.skipped == {"identical_after_truncation": 1, "identical_pair": 1, "missing_field": 1}
    # ... and the same prompt groups
    by_row = {i: r["group_id"] for r in recs for i in r["source_rows"]}
    np.testing.assert_array_equal(group, [by_row[int(i)] for i in arrays["index"]])


def test_scored_file_reads_back_as_groups_per_prompt(pairs_cfg, tmp_path):
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_rows, tokenize_rows
    from jaxppo.hf import load_tokenizer
    from jaxppo.cli.reward import main

    out = tmp_path / "out"
    assert main(["to-scored", "--config", str(pairs_cfg), f"trainer.output_dir={out}"]) == 0
    cfg = load_config(str(pairs_cfg))
    dc = DataConfig(path=str(out / "scored.jsonl"), schema="scored", max_prompt_length=8, max_response_length=5)
    loaded = load_rows(dc)
    arrays = tokenize_rows(loaded, load_tokenizer(cfg.model.path), dc)
    np.testing.assert_array_equal(arrays["group_id"], [0, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(arrays["score"], [1.0, 0.0, 0.5, 0.0, 1.0, 0.0])


def test_context_longer_than_the_model_is_a_config_error(pairs_cfg, tmp_path, capsys):
    from jaxppo.cli.reward import main

    # stories260K: max_position_embeddings 512
    assert main(["to-scored", "--config", str(pairs_cfg), "data.max_response_length=600",
                 f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("data.max_prompt_length + data.max_response_length = 8 + 600 = 608 > 512, the context length "
            "(max_position_embeddings)") in err and "lower data.max_response_length" in err
    assert not (tmp_path / "scored.jsonl").exists()


def test_every_command_checks_the_context_before_reading_rows(stories_model, tmp_path):
    from jaxppo.config import ConfigError
    from jaxppo.config.schema import DataConfig
    from jaxppo.data import load_scored_arrays
    from jaxppo.data.pipeline import check_context, load_preference_arrays

    missing = str(tmp_path / "no_such_file.jsonl")   # never read: the lengths are checked first
    check_context(DataConfig(max_prompt_length=256, max_response_length=256), str(stories_model))   # 512 fits
    too_long = DataConfig(path=missing, max_prompt_length=256, max_response_length=257)
    with pytest.raises(ConfigError, match=r"256 \+ 257 = 513 > 512"):
        load_scored_arrays(too_long, None, reference_path=str(stories_model))    # jaxppo.train
    with pytest.raises(ConfigError, match=r"256 \+ 257 = 513 > 512"):
        load_preference_arrays(DataConfig(path=missing, schema="preference", max_prompt_length=256,
                                          max_response_length=257), None, str(stories_model))  # dpo, reward
