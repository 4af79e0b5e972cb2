"""The README and docs name only code that exists, for the metrics, explainers and comparisons (``xbench.metrics``,
``xbench.explain``, ``xbench.evaluation``): every backticked dotted name under them imports, and every backticked
name listed after a colon in parentheses right after a backticked module (`xbench.m` (what: `f`, `g`)) is an
attribute of that module. The docs state the perturbation count XBench uses (truncation, not rounding)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOTTED = re.compile(r"`(xbench(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
LISTED = re.compile(r"`(xbench(?:\.[A-Za-z_]\w*)+)`\s*\([^():]*:([^()]*)\)")
CHECKED = ("xbench.metrics", "xbench.explain", "xbench.evaluation")
NAME = re.compile(r"`([A-Za-z_]\w*)`")


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
        return obj
    raise ModuleNotFoundError(dotted)


def _names() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        found += [(path.name, m) for m in dict.fromkeys(DOTTED.findall(text))]
        for module, inside in LISTED.findall(text):
            found += [(path.name, f"{module}.{name}") for name in NAME.findall(inside)]
    return sorted((doc, name) for doc, name in set(found) if name.startswith(CHECKED))


def test_docs_name_only_existing_code():
    names = _names()
    assert len(names) > 8  # the scan finds the docs' names
    missing = []
    for doc, dotted in names:
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as err:
            missing.append(f"{doc}: {dotted} ({type(err).__name__})")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("wrong", ["`round(f·P)`", "comparisons_html"])
def test_docs_do_not_state_what_the_code_does_not_do(wrong):
    assert not [p.name for p in DOCS if wrong in p.read_text(encoding="utf-8")]
