"""Run configs by name: the configs shipped in ``xbench/configs/runs/`` (``phantom``, ``paper``, ``beyond``) are
reachable as ``--config phantom`` from any folder, in a checkout and an installed wheel alike.

Examples
--------
>>> from xbench.spec.run_configs import resolve_run_config, shipped_run_configs
>>> "phantom" in shipped_run_configs()
True
>>> resolve_run_config("phantom").name
'phantom.yaml'
>>> resolve_run_config("phantm")
Traceback (most recent call last):
...
xbench.core.errors.UnknownNameError: Unknown run config 'phantm'. Did you mean 'phantom'? Available: beyond, paper, phantom.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..core.errors import MissingFileError, UnknownNameError
from .registry import PACKAGE_DIR

log = logging.getLogger(__name__)

#: the run configs that ship with the package
RUN_CONFIG_DIR = PACKAGE_DIR / "configs" / "runs"


def shipped_run_configs() -> list[str]:
    """Names of the run configs shipped in ``xbench/configs/runs/``."""
    return sorted(p.stem for p in RUN_CONFIG_DIR.glob("*.yaml"))


def resolve_run_config(config: str | Path) -> Path:
    """The file of run config ``config``: an existing path, or the name of a shipped config.

    A bare name (no folder, no ``.yaml``) is looked up among :func:`shipped_run_configs`; an unknown one
    raises :class:`~xbench.core.errors.UnknownNameError` listing the available names. The README's
    ``xbench/configs/runs/<name>.yaml``, typed where no such file exists (outside a checkout, e.g. after
    ``pip install``), resolves to the shipped copy. Any other absent path raises
    :class:`~xbench.core.errors.MissingFileError` that names the shipped configs.
    """
    path = Path(config)
    if path.is_file():
        return path
    names = shipped_run_configs()
    if path.parent == Path(".") and path.suffix not in (".yaml", ".yml"):
        if path.name not in names:
            raise UnknownNameError("run config", path.name, names)
        return RUN_CONFIG_DIR / f"{path.name}.yaml"
    if path.parent.as_posix().endswith("xbench/configs/runs") and path.stem in names:
        log.info("run config %s is not here; using the shipped %s", path, RUN_CONFIG_DIR / path.name)
        return RUN_CONFIG_DIR / f"{path.stem}.yaml"
    raise MissingFileError(path, "run config", source=None, hint=f"Shipped configs, usable by name (--config NAME): "
                           f"{', '.join(names)}.")
