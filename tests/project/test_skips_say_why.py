"""A cross-check that cannot run says why in the test summary (``addopts = "-ra"`` prints skip reasons): every
``pytest.importorskip`` in tests/ passes a ``reason`` that tells how to get the package (quantus is installed by
``make setup`` with ``--no-deps``, not by ``pip install -e .[dev]``: it declares opencv-python, the GUI build)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_importorskip_gives_a_reason_and_the_summary_shows_it():
    calls = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip":
                calls.append((path.name, node.lineno, {k.arg for k in node.keywords}))
    assert len(calls) >= 4
    assert not [f"{name}:{line}" for name, line, keywords in calls if "reason" not in keywords]
    quantus = (ROOT / "tests" / "metrics" / "test_faithfulness.py").read_text(encoding="utf-8")
    assert "pip install --no-deps quantus==0.6.0" in quantus
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "-ra" in config["tool"]["pytest"]["ini_options"]["addopts"].split()
