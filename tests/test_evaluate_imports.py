"""Evaluation and inference import in one direction only: runner → evaluate → config → datasets, no cycle.

Imports inside functions count too (they were how ``evaluate`` ↔ ``runner`` dodged a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

import xbench

PACKAGE = Path(xbench.__file__).parent


def module_name(path: Path) -> str:
    parts = ["xbench", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """xbench modules imported anywhere in ``path`` (module level or inside functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("xbench")}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            if target.startswith("xbench"):
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}  # `from . import x` may name a module
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {t for t in imports(p) if t in files and t != m} for m, p in files.items()}


def reaches(g: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo += sorted(g.get(m, ()))
    return False


def test_evaluate_does_not_import_runner_and_runner_imports_evaluate():
    g = graph()
    assert "xbench.runner" in g["xbench.cli"] and "xbench.evaluate" in g["xbench.runner"]
    for a, b in (("xbench.evaluate", "xbench.runner"), ("xbench.config", "xbench.runner"),
                 ("xbench.config", "xbench.evaluate")):
        assert not reaches(g, a, b), f"{a} imports {b} (directly or through other modules): an import cycle"


def test_dataset_spec_opens_its_dataset(phantom_cache):
    from xbench.config import DatasetSpec

    spec = DatasetSpec("phantom", split="test", options={"cases": 5})
    ds = spec.open()
    assert ds.name == "phantom" and len(ds) == 5 and ds.split == "test"
    assert spec.open(split="prior").split == "prior"
