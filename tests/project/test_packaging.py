"""A non-editable wheel ships the dataset manifests and the notebooks (built and installed offline)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """Build the package's wheel offline from a clean copy of the sources; returns the wheel and the build's
    verbose output (setuptools' warnings included)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for name in ("xbench", "data_manifests", "notebooks"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    wheels = tmp_path / "wheels"
    built = subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-v", "-w", str(wheels),
                            str(src)], check=True, cwd=tmp_path, capture_output=True, text=True)
    return next(wheels.glob("xbench-*.whl")), built.stdout + built.stderr


@pytest.mark.slow
def test_wheel_install_lists_datasets_and_carries_notebooks(tmp_path):
    wheel, build_log = build_wheel(tmp_path)
    assert "would be ignored" not in build_log and "Package 'xbench" not in build_log  # a quiet install
    target = tmp_path / "target"
    subprocess.run([*PIP, "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)], check=True,
                   cwd=tmp_path, capture_output=True)
    # every data file of the package travels with it (a new folder of data needs a package-data pattern)
    data = {f.relative_to(REPO) for f in (REPO / "xbench").rglob("*")
            if f.is_file() and f.suffix not in {".py", ".pyc"} and "__pycache__" not in f.parts}
    shipped = {f.relative_to(target) for f in (target / "xbench").rglob("*") if f.is_file()}
    assert data <= shipped, sorted(map(str, data - shipped))
    assert {Path("xbench/data_manifests") / p.name for p in (REPO / "data_manifests").glob("*.yaml")} <= shipped
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    code = ("import xbench, xbench.workflows.reproduce as r; print(xbench.__file__); "
            "print(len(r.notebook_paths())); print(r.NOTEBOOKS_DIR)")
    info = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    where, n_notebooks, notebooks = info.stdout.split("\n")[:3]
    assert where.startswith(str(target)) and notebooks.startswith(str(target))
    assert int(n_notebooks) == len(list((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    listed = subprocess.run([sys.executable, "-m", "xbench.cli", "list", "datasets", "--names"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    assert listed.stdout.split() == sorted(p.stem for p in (REPO / "data_manifests").glob("*.yaml"))
    checked = subprocess.run([sys.executable, "-m", "xbench.cli", "manifest", "check", "nih_bbox", "--root",
                              str(tmp_path / "nowhere")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert "Available: (none)" not in checked.stdout + checked.stderr and "MISSING" in checked.stdout


def test_make_setup_is_quiet_about_the_editable_install():
    """`pip install --quiet -e .` still prints setuptools' multi-line "BuildBackendWarning: Editable installation"
    block (a Python warning raised in pip's build subprocess, measured with pip 25 here); the Makefile's install step
    silences warnings for that one command, so `make setup` prints nothing of its own."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if "pip install --quiet -e '.[dev]'" in x)
    assert line.strip().startswith("PYTHONWARNINGS=ignore ")
