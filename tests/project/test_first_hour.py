"""The first hour: the documented Python snippets run as written (README.md and docs/*.md).

A snippet is the ```python block right after an HTML comment ``<!-- snippet: NAME -->``; the marker travels with the
block when it moves between README.md and a page under docs/, and a named snippet that disappears fails here by
name. Each runs in a fresh namespace with an empty temporary working folder (relative output paths land there) and
the session's phantom cache.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"<!--\s*snippet:\s*([\w.-]+)\s*-->\s*\n```python[^\n]*\n(.*?)```", re.S)
#: the snippets a newcomer meets first; each must exist exactly once
EXPECTED = ("library-example", "five-lines", "extending-metric-run")

pytestmark = pytest.mark.usefixtures("phantom_cache")


def _snippets() -> dict[str, tuple[Path, str]]:
    found: dict[str, tuple[Path, str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name, code in MARKED.findall(path.read_text(encoding="utf-8")):
            assert name not in found, f"snippet {name!r} is marked twice: {found[name][0]} and {path}"
            found[name] = (path, code)
    return found


def _run(name: str, namespace: dict | None = None) -> dict:
    path, code = _snippets()[name]
    ns = {"__name__": "__main__", **(namespace or {})}
    exec(compile(code, f"{path.name}:snippet:{name}", "exec"), ns)
    return ns


def test_every_first_hour_snippet_is_marked_once():
    found = _snippets()
    missing = [n for n in EXPECTED if n not in found]
    assert not missing, (f"documented snippets {missing} are gone: no `<!-- snippet: NAME -->` before a ```python block "
                         "in README.md or docs/**/*.md (moved? keep the marker with the block)")


def test_library_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = _run("library-example")
    assert ns["pred"].scores.shape == (8, len(ns["ds"].findings)) and ns["g"].pointing.shape == (8,)


def test_five_line_example_runs_and_prints_metric_and_value(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _run("five-lines")
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:2] == ["metric", "value"], header
    assert (tmp_path / "results" / "my_maps" / "tables" / "metrics.parquet").exists()


def test_extending_metric_example_runs_next_to_its_module(tmp_path, monkeypatch, capsys):
    from xbench.metrics import table as metric_table

    doc = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    (module,) = re.findall(r"```python energy_pointing\.py\n(.*?)```", doc, flags=re.S)
    (tmp_path / "energy_pointing.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = list(metric_table.METRIC_TABLE)
    try:
        _run("extending-metric-run")
    finally:
        metric_table.METRIC_TABLE[:] = saved
        sys.modules.pop("energy_pointing", None)
    printed = capsys.readouterr().out
    assert "center_prior" in printed and "random_prior" in printed
