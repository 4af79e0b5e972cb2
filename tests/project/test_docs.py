"""The user documents stay short, linked and current: README.md and docs/ are checked as files.

* every relative Markdown link (and image) in README.md and docs/**/*.md names a file or folder that exists, and
  its ``#anchor``, if any, a heading of the page it points to;
* README.md is at most 450 lines and docs/performance.md at most 250 (a reader finds an answer in a minute);
* docs/perf/ holds at most 40 files: the evidence behind the numbers the documents cite now;
* no development history ("round 12", "issue 22", "round14_…") in the package, README.md or docs/: docstrings and
  documents state conventions and reasons; the history is in git (and, if kept, in one file, docs/history.md).
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
HISTORY_FILE = DOCS / "history.md"  # the one place allowed to tell the story round by round

README_MAX_LINES = 450
PERFORMANCE_MAX_LINES = 250
PERF_EVIDENCE_MAX_FILES = 40

#: "round 12", "rounds 6-15", "issue 22", "issue #22", "round14_h100_…": history, not a convention
HISTORY = re.compile(r"\b(?:round|issue)s?[ _#]*\d+", re.IGNORECASE)
#: an inline link or image: [text](target) / ![alt](target "title")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def _prose_lines(path: Path):
    """(line number, text) of the lines outside fenced code blocks, inline code spans removed."""
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, re.sub(r"`[^`]*`", "", line)


def relative_links(path: Path, *, fragments: bool = False) -> list[tuple[int, str]]:
    """The relative link targets of a Markdown file: (line, target), without its #fragment unless ``fragments``."""
    found = []
    for number, line in _prose_lines(path):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http:, https:, mailto:, …
            found.append((number, target if fragments else target.split("#", 1)[0]))
    return [(n, t) for n, t in found if t]


def anchors(path: Path) -> set[str]:
    """The heading anchors of a Markdown file as GitHub makes them: lower case, punctuation dropped, spaces → '-'."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for _, line in _headings(path)}


def _headings(path: Path):
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside and re.match(r"^#{1,6} ", line):
            yield number, line


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def broken_links(paths: list[Path]) -> list[str]:
    """``file:line: target`` for every relative link whose file does not exist (resolved from the linking file's
    folder) or whose ``#anchor`` names no heading of the Markdown file it points to."""
    broken = []
    for path in paths:
        for number, target in relative_links(path, fragments=True):
            file, _, anchor = target.partition("#")
            resolved = path.parent / file if file else path
            if not resolved.exists():
                broken.append(f"{_name(path)}:{number}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{_name(path)}:{number}: {target} (no such heading)")
    return broken


def history_mentions(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        if path == HISTORY_FILE:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    return hits


def test_the_checks_find_what_they_look_for(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# There\n## Models and weights (`xbench.models`)\n")
    page.write_text("# Page\n[a](there.md) [b](missing.md#part) ![c](img/none.png) [d](https://x.org/y) [e](#page)\n"
                    "[g](there.md#models-and-weights-xbenchmodels) [h](there.md#gone) [i](#nowhere)\n"
                    "```\n[f](inside_code.md)\n# not a heading\n```\nround 12 and issue #22 and round14_h100.json\n")
    assert relative_links(page) == [(2, "there.md"), (2, "missing.md"), (2, "img/none.png"), (3, "there.md"),
                                    (3, "there.md")]
    assert broken_links([page]) == ["page.md:2: missing.md#part", "page.md:2: img/none.png",
                                    "page.md:3: there.md#gone (no such heading)",
                                    "page.md:3: #nowhere (no such heading)"]
    history = [line for line in page.read_text().splitlines() if HISTORY.search(line)]
    assert history == ["round 12 and issue #22 and round14_h100.json"]
    assert not HISTORY.search("rounded to 2 decimals; Round trip tested; issues named by file")


def test_every_relative_link_resolves():
    assert broken_links(_markdown_files()) == []


@pytest.mark.parametrize(("name", "limit"), [("README.md", README_MAX_LINES),
                                             ("docs/performance.md", PERFORMANCE_MAX_LINES)])
def test_documents_are_short(name, limit):
    lines = len((REPO / name).read_text(encoding="utf-8").splitlines())
    assert lines <= limit, f"{name} has {lines} lines (at most {limit}): move reference material to a docs/ page"


def test_perf_evidence_is_only_what_the_documents_cite():
    files = [p for p in (DOCS / "perf").rglob("*") if p.is_file()]
    assert len(files) <= PERF_EVIDENCE_MAX_FILES, f"docs/perf holds {len(files)} files"
    cited = "\n".join(p.read_text(encoding="utf-8") for p in _markdown_files())
    for folder in ("xbench", "benchmarks", "tests"):
        cited += "\n".join(p.read_text(encoding="utf-8") for p in (REPO / folder).rglob("*.py"))
    uncited = sorted(p.name for p in files if p.name not in cited)
    assert uncited == [], f"docs/perf files no document or code cites: {uncited}"


def test_no_development_history_in_package_readme_or_docs():
    paths = [p for p in (REPO / "xbench").rglob("*") if p.is_file() and p.suffix in {".py", ".yaml", ".yml", ".md"}]
    paths += _markdown_files()
    paths += [p for p in (DOCS / "perf").rglob("*") if p.is_file() and p.suffix not in {".gz", ".tgz", ".png"}]
    assert history_mentions(paths) == []
