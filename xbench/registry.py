"""Name → config registry (open_clip style): architectures and datasets are data.

Model configs are ``xbench/configs/models/<name>.yaml``; dataset manifests are
``data_manifests/<name>.yaml`` at the repository root (next to the package; an installed
wheel carries them as ``xbench/data_manifests/``).
Each file holds ``class: "module.path:ClassName"`` plus the entry's own keys.

Users add models and datasets without editing the package: a *config search path* of
folders, each holding ``models/*.yaml`` and/or ``datasets/*.yaml`` (and, optionally, the
Python modules their ``class:`` targets name — the folder is put on ``sys.path``). The
search path is: folders that installed packages declare under the entry-point group
``xbench.config_path`` (``mypkg = "mypkg"``: the package's folder), then ``$XBENCH_CONFIG_PATH``
(folders joined with ``os.pathsep``), then, on the command line, ``xbench --config-path DIR``
(repeatable). :func:`add_search_dir` does the same from Python, :func:`add_config_path` adds
one folder of one kind. A later folder overrides an earlier one (and the package) for the
same name.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from .errors import FormatError, UnknownNameError, XBenchError

PACKAGE_DIR = Path(__file__).resolve().parent
MODEL_CONFIG_DIRS: list[Path] = [PACKAGE_DIR / "configs" / "models"]
_SHIPPED_MANIFESTS = PACKAGE_DIR / "data_manifests"  # inside an installed wheel
MANIFEST_DIRS: list[Path] = [Path(os.environ.get("XBENCH_MANIFESTS", _SHIPPED_MANIFESTS if _SHIPPED_MANIFESTS.is_dir()
                                                 else PACKAGE_DIR.parent / "data_manifests"))]


def add_config_path(path: str | Path, kind: str = "models") -> None:
    """Register a user folder of model configs (``kind="models"``) or dataset manifests (``"datasets"``)."""
    folder = Path(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"add_config_path: {folder} is not a folder")
    {"models": MODEL_CONFIG_DIRS, "datasets": MANIFEST_DIRS}[kind].append(folder)


def add_search_dir(path: str | Path) -> None:
    """Add a config search folder: its ``models/`` and ``datasets/`` subfolders (either may be absent) are
    registered and the folder goes on ``sys.path`` so that ``class:`` targets of modules inside it import."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise XBenchError(f"config search path ($XBENCH_CONFIG_PATH or --config-path): {folder} is not a folder")
    subs = [(folder / "models", "models"), (folder / "datasets", "datasets")]
    if not any(sub.is_dir() for sub, _ in subs):
        raise XBenchError(f"config search path: {folder} holds neither models/ nor datasets/ (see xbench.registry)")
    for sub, kind in subs:
        if sub.is_dir() and sub not in {"models": MODEL_CONFIG_DIRS, "datasets": MANIFEST_DIRS}[kind]:
            add_config_path(sub, kind)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


_ENV_READ = False


def _env_search_path() -> None:
    """Add the folders of ``$XBENCH_CONFIG_PATH`` (once, on the first look-up, so a bad entry is a clear error
    where names are looked up rather than at import)."""
    global _ENV_READ
    if _ENV_READ:
        return
    _ENV_READ = True
    for ep in importlib.metadata.entry_points(group="xbench.config_path"):
        target = ep.load()  # a folder path, or a module whose folder holds models/ and/or datasets/
        add_search_dir(Path(target.__file__).parent if hasattr(target, "__file__") else target)
    for entry in filter(None, os.environ.get("XBENCH_CONFIG_PATH", "").split(os.pathsep)):
        add_search_dir(entry)


def _scan(dirs: list[Path]) -> dict[str, Path]:
    _env_search_path()
    found: dict[str, Path] = {}
    for folder in dirs:
        for file in sorted(folder.glob("*.yaml")):
            found[file.stem] = file
    return found


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a malformed file raises :class:`FormatError` naming it."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise FormatError(path, f"not UTF-8 text (byte {raw[exc.start:exc.start + 1]!r} at offset {exc.start}); "
                          "save the file as UTF-8", line=line) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise FormatError(path, f"invalid YAML: {exc}", line=mark.line + 1 if mark else None) from exc
    if not isinstance(data, dict):
        raise FormatError(path, f"expected a mapping at top level, got {type(data).__name__}")
    return data


def list_models() -> list[str]:
    """Names of every registered model config."""
    return sorted(_scan(MODEL_CONFIG_DIRS))


def list_datasets() -> list[str]:
    """Names of every registered dataset manifest."""
    return sorted(_scan(MANIFEST_DIRS))


def model_config(name: str) -> dict[str, Any]:
    """The parsed config of model ``name`` (with ``name`` and ``config_path`` added)."""
    return _entry(name, MODEL_CONFIG_DIRS, "model")


def dataset_manifest(name: str) -> dict[str, Any]:
    """The parsed manifest of dataset ``name`` (with ``name`` and ``config_path`` added)."""
    return _entry(name, MANIFEST_DIRS, "dataset")


def _entry(name: str, dirs: list[Path], kind: str) -> dict[str, Any]:
    from .names import check_name

    check_name(name, kind)
    files = _scan(dirs)
    if name not in files:
        raise UnknownNameError(kind, name, files)
    cfg = read_yaml(files[name])
    if "class" not in cfg:
        raise FormatError(files[name], "missing required key", field="class")
    cfg.setdefault("name", name)
    check_name(cfg["name"], kind, f"{files[name]}, field 'name'")
    cfg["config_path"] = str(files[name])
    return cfg


def import_target(target: str) -> Any:
    """Import ``"package.module:Attr"``."""
    module, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"class target must look like 'module:Class', got {target!r}")
    return getattr(importlib.import_module(module), attr)
