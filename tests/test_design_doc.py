"""Every module and file path docs/design.md names exists: dotted names ``jaxppo.x.y[.attr]`` resolve to a module of
the package (and the attribute, when the last part is not a module), slash paths to a file or folder of the repo."""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
DOTTED = sorted(set(re.findall(r"\bjaxppo(?:\.[A-Za-z_][A-Za-z_0-9]*)+", TEXT)))
PATHS = sorted(set(re.findall(r"\b(?:jaxppo|benchmarks|tests|configs|launch|notebooks|docs)/[A-Za-z_0-9/.-]*[A-Za-z_0-9/]",
                              TEXT)))


def _module_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def test_the_page_names_modules():
    assert len(DOTTED) > 20 and "jaxppo.trainer.harness" in DOTTED and "jaxppo.data.behaviour" in DOTTED


@pytest.mark.parametrize("name", DOTTED)
def test_dotted_name_exists(name):
    parts = name.split(".")
    for k in range(len(parts), 0, -1):   # the longest prefix that is a module, then attributes
        mod = ".".join(parts[:k])
        if _module_spec(mod) is not None:
            break
    else:
        pytest.fail(f"{name}: no module")
    rest = parts[k:]
    if rest:
        obj = importlib.import_module(mod)
        for attr in rest:
            assert hasattr(obj, attr), f"docs/design.md names {name}: {mod} has no {'.'.join(rest)}"
            obj = getattr(obj, attr)


@pytest.mark.parametrize("path", PATHS)
def test_path_exists(path):
    assert (ROOT / path).exists() or (ROOT / "jaxppo" / path).exists(), f"docs/design.md names {path}"
