"""The README and docs/ stay short, linked and true to the code.

- README.md is at most 90 lines, links every page of docs/ and quotes no dated measurement, run ordinal or issue
  number (measurements are records under results/, their tables generated);
- every relative link in README.md and docs/*.md names an existing file, and an ``#anchor`` names a heading of
  the target (GitHub's heading slugs);
- the README's test command is exactly the commands of ``.ci/run`` joined by ``&&``;
- docs/configs.md has one table row ``| `key` | `default` | meaning |`` for every leaf key of the config schema
  (``jaxppo/config/schema.py``), with the schema's default, and no row for a key the schema does not have;
- docs/results.md holds the sweep report's generator markers once each, in order.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 90

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(text: str) -> list[str]:
    """Link targets of ``[text](target)`` outside fenced code blocks."""
    return LINK.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (``-``, ``_`` kept), spaces -> ``-``."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text, with GitHub's ``-1``, ``-2`` suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for h in HEADING.findall(FENCE.sub("", text)):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def broken_links(path: Path) -> list[str]:
    """``target: why`` for each relative link of ``path`` that does not resolve."""
    bad = []
    text = path.read_text(encoding="utf-8")
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):     # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            bad.append(f"{target}: no file {rel}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{anchor} in {rel}")
    return bad


def ci_command() -> str:
    """The commands ``.ci/run`` runs (not comments, ``set``, ``cd`` or ``export``), joined by `` && ``."""
    cmds = []
    for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line.split()[0] not in ("set", "cd", "export"):
            cmds.append(line)
    return " && ".join(cmds)


def render_default(v) -> str:
    """A default as configs.md writes it (YAML spelling): ``null``, ``true``, ``[a, b]``, ``{}``."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(render_default(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{}" if not v else repr(v)
    return repr(v) if isinstance(v, float) else str(v)


def schema_defaults() -> dict[str, str]:
    """``{dotted key: rendered default}`` of every leaf of the default ``Config`` (nested sections walked)."""
    from jaxppo.config.schema import Config

    out = {}

    def walk(node, prefix):
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if dataclasses.is_dataclass(v):
                walk(v, f"{prefix}{f.name}.")
            else:
                out[prefix + f.name] = render_default(v)

    walk(Config(), "")
    return out


def configs_rows(text: str) -> dict[str, str]:
    """``{key: default}`` of the rows ``| `key` | `default` | ... |`` of configs.md (keys with a dot)."""
    rows = {}
    row = re.compile(r"^\|\s*`([a-z_]+(?:\.[a-z_0-9]+)+)`\s*\|\s*`([^`]*)`\s*\|", re.MULTILINE)
    for key, default in row.findall(text):
        assert key not in rows, f"docs/configs.md: key {key} has two rows"
        rows[key] = default
    return rows


# ------------------------------------------------------------------------------------------------------ README


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}); move reference into docs/"


def test_readme_has_no_dated_measurement_run_ordinal_or_issue_number():
    text = README.read_text(encoding="utf-8")
    months = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
    for pattern in (r"\b20\d\d-\d\d-\d\d\b", rf"\b\d{{1,2}} ({months})\b", r"\bissue \d+", r"#\d+\b",
                    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) run\b", r"load average"):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        assert not found, f"README.md: {pattern!r} matches {found} (put measurements in results/ records)"


def test_readme_links_every_doc_page():
    targets = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text(encoding="utf-8"))}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in targets]
    assert not missing, f"README.md does not link docs/{missing}"


def test_readme_test_command_is_what_ci_runs():
    cmd = ci_command()
    assert cmd.split(" && ")[-1].startswith("python3 -m pytest -q"), cmd   # .ci/run still ends with the test run
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert cmd in [b.strip() for b in blocks], f"README.md has no bash block equal to .ci/run's commands: {cmd}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(path):
    assert not broken_links(path), f"{path.relative_to(REPO)}: broken links: {broken_links(path)}"


# ------------------------------------------------------------------------------------------------------ docs/


def test_configs_md_lists_every_schema_key_with_its_default():
    want = schema_defaults()
    have = configs_rows((DOCS / "configs.md").read_text(encoding="utf-8"))
    missing = sorted(set(want) - set(have))
    unknown = sorted(set(have) - set(want))
    wrong = {k: (have[k], want[k]) for k in sorted(set(want) & set(have)) if have[k] != want[k]}
    assert not missing, f"docs/configs.md lacks rows for {missing}"
    assert not unknown, f"docs/configs.md has rows for keys the schema does not have: {unknown}"
    assert not wrong, f"docs/configs.md defaults differ from the schema (doc, schema): {wrong}"


def test_results_md_has_the_generator_markers():
    from jaxppo.sweeps.report import BEGIN, END

    text = (DOCS / "results.md").read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)
    assert "python -m jaxppo.sweeps.report" in text
    assert BEGIN not in README.read_text(encoding="utf-8")    # the table lives in docs/results.md only


# ------------------------------------------------------------------------------------------ the checks themselves


def test_slug_and_links_helpers():
    assert slug("Results: offline preference data (HH-RLHF)") == "results-offline-preference-data-hh-rlhf"
    assert slug("Importance sampling and verl's rollout correction") == \
        "importance-sampling-and-verls-rollout-correction"
    assert slug("`pf_ppo`") == "pf_ppo"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert links("[x](a.md) [y](b.md#c)\n```\n[z](skipped.md)\n```\n`[1, 2]` (not a link)") == ["a.md", "b.md#c"]


def test_broken_links_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "t.md").write_text("# Top\n[ok](t.md#top) [gone](nope.md) [bad anchor](t.md#missing) "
                                   "[web](https://example.org/x)\n", encoding="utf-8")
    assert broken_links(tmp_path / "t.md") == ["nope.md: no file nope.md", "t.md#missing: no heading #missing in t.md"]


def test_configs_rows_reads_the_table():
    text = ("| key | default | meaning |\n| --- | --- | --- |\n| `a.b` | `null` | x |\n"
            "| `a.c.d` | `[0.9, 0.999]` | y |\n")
    assert configs_rows(text) == {"a.b": "null", "a.c.d": "[0.9, 0.999]"}
    assert render_default((0.9, 0.999)) == "[0.9, 0.999]" and render_default(1e-5) == "1e-05"
    assert render_default(False) == "false" and render_default({}) == "{}" and render_default("k1+") == "k1+"
