"""No upward import: every ``import`` in the package (module level or inside a function, ``TYPE_CHECKING`` blocks
included) points to the same package or to a lower layer of :data:`LAYERS`, and the layer sentence of the docs
lists the same order."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "jaxppo"

#: bottom first; a module may import its own package and the packages of lower rows only
LAYERS: list[tuple[str, ...]] = [
    ("jaxppo.console",),        # what the commands print vs only log (the standard library's logging only)
    ("jaxppo.registry",),
    ("jaxppo.ops",),
    ("jaxppo.parallel",),
    ("jaxppo.config",),
    ("jaxppo.replay",),
    ("jaxppo.models",),
    ("jaxppo.optim",),          # the optimizer factory of every trainer (policy, critic, DPO, reward model)
    ("jaxppo.hf",),
    ("jaxppo.data",),
    ("jaxppo.rewards",),
    ("jaxppo.trainer",),
    ("jaxppo.config_names",),   # the one check of registry names (imports the registries' layers)
    ("jaxppo.sweeps",),
    # command lines (and their shared helpers): never imported by the library
    ("jaxppo.cli", "jaxppo.train", "jaxppo.evaluate", "jaxppo.collect", "jaxppo.reward", "jaxppo.dpo", "jaxppo.sweep",
     "jaxppo.prompts", "jaxppo.plan"),
]
#: the docs' sentence, bottom first (the command-line row is written "command lines")
SENTENCE = ["console", "registry", "ops", "parallel", "config", "replay", "models", "optim", "hf", "data", "rewards", "trainer",
            "config_names", "sweeps", "command lines"]


def _unit(module: str) -> str:
    """The LAYERS entry ``module`` belongs to (``jaxppo.ops.kl`` -> ``jaxppo.ops``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _rank(unit: str) -> int:
    for i, row in enumerate(LAYERS):
        if unit in row:
            return i
    raise AssertionError(f"{unit} is in no row of LAYERS: add it")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` of every jaxppo import in ``path`` (``from jaxppo import ops`` -> jaxppo.ops)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if base == "jaxppo":
                out += [(node.lineno, f"jaxppo.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, base))
    return [(line, m) for line, m in out if m == "jaxppo" or m.startswith("jaxppo.")]


def upward_imports(root: Path = PKG) -> list[str]:
    """Every import from a lower layer to a higher one (or between two packages of one row), as text."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        src = _module_name(path)
        if src == "jaxppo":
            continue
        src_unit = _unit(src)
        for line, target in _imports(path):
            dst_unit = _unit(target)
            if dst_unit == "jaxppo" or dst_unit == src_unit:
                continue
            if _rank(dst_unit) > _rank(src_unit) or (_rank(dst_unit) == _rank(src_unit) and _rank(src_unit) < len(
                    LAYERS) - 1):
                bad.append(f"{path.relative_to(REPO)}:{line}: {src_unit} imports {target}")
    return bad


def test_every_module_is_in_a_layer():
    for path in PKG.rglob("*.py"):
        name = _module_name(path)
        if name != "jaxppo":
            _rank(_unit(name))


def test_no_upward_import():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_checker_sees_upward_and_lazy_imports(tmp_path):
    pkg = tmp_path / "jaxppo"
    (pkg / "data").mkdir(parents=True)
    (pkg / "ops").mkdir()
    (pkg / "data" / "x.py").write_text("def f():\n    from jaxppo.rewards import get\n    from ..ops import kl\n")
    (pkg / "ops" / "y.py").write_text("from jaxppo import config\nfrom . import masked\n")
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert upward_imports(pkg) == ["jaxppo/data/x.py:2: jaxppo.data imports jaxppo.rewards",
                                       "jaxppo/ops/y.py:1: jaxppo.ops imports jaxppo.config"]
    finally:
        REPO = old


def test_the_docs_layer_sentence_is_the_table():
    """README (or a docs/ page) says the layer order in one sentence; it is LAYERS' order."""
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [m for p in texts if p.exists()
             for m in re.findall(r"Layers only import downwards: (.*?)\.\s", p.read_text(encoding="utf-8"), re.S)]
    assert found, "no 'Layers only import downwards: ...' sentence in README.md or docs/"
    for sentence in found:
        order = [re.sub(r"[`\s]+", " ", x).strip() for x in sentence.split("→")]
        assert order == SENTENCE, sentence
    assert len(SENTENCE) == len(LAYERS)
