"""Functions stay small enough to read: none in ``xbench/`` above cyclomatic complexity 25 (radon's count, which
also counts boolean operators and comprehensions; ruff's C901 at 25 in ``pyproject.toml`` is the looser McCabe
count), none in ``xbench/inference/`` above 60 lines (docstring included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import xbench

PACKAGE = Path(xbench.__file__).resolve().parent
MOST_COMPLEX = 25
MOST_LINES = 60  # in xbench/inference/


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def complex_functions(limit: int = MOST_COMPLEX) -> dict[str, int]:
    """``path:function`` → radon's cyclomatic complexity, for every function of ``xbench/`` above ``limit``."""
    cc = pytest.importorskip("radon.complexity", reason="radon (a dev dependency, pyproject.toml) measures it")
    from radon.visitors import Class
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        todo = list(cc.cc_visit(path.read_text(encoding="utf-8")))
        while todo:  # a class's own total is not a function's: its methods and inner classes are counted instead
            block = todo.pop()
            if isinstance(block, Class):
                todo += [*block.methods, *block.inner_classes]
            elif block.complexity > limit:
                found[f"{path.relative_to(PACKAGE)}:{block.name}"] = block.complexity
    return found


def test_no_function_above_the_complexity_limit():
    over = complex_functions()
    assert not over, f"functions above cyclomatic complexity {MOST_COMPLEX}: {over} — split them into named helpers"


def test_no_inference_function_above_the_line_limit():
    long = {}
    for path in sorted((PACKAGE / "inference").rglob("*.py")):
        for fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            lines = fn.end_lineno - fn.lineno + 1
            if lines > MOST_LINES:
                long[f"{path.name}:{fn.name}"] = lines
    assert not long, f"functions of xbench/inference/ longer than {MOST_LINES} lines: {long}"
