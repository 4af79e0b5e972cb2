"""XBench: do chest X-ray vision-language models look where radiologists look?

One door per concern: :func:`load_dataset`, :func:`create_model`, and the
metric functions in :mod:`xbench.metrics`.

The names below are imported on first use, so that ``import xbench.cli`` (``xbench --help``, a usage
error, ``xbench list``) does not pay for importing torch.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from .core.version import __version__ as __version__  # cheap: no torch

#: public name → (module, attribute or None for the module itself)
_LAZY = {
    "analysis": ("xbench.outputs.analysis", None),
    "metrics": ("xbench.metrics", None),
    "tables": ("xbench.outputs.tables", None),
    "load_dataset": ("xbench.datasets", "load_dataset"),
    "create_model": ("xbench.models", "create_model"),
    "add_config_path": ("xbench.spec.registry", "add_config_path"),
    "list_datasets": ("xbench.spec.registry", "list_datasets"),
    "list_models": ("xbench.spec.registry", "list_models"),
    "open_run": ("xbench.session", "open_run"),
    "evaluate_maps": ("xbench.workflows.score", "evaluate_maps"),
}

__all__ = list(_LAZY)


if "XBENCH_LOG_LEVEL" in os.environ:  # a kernel started by `xbench reproduce`: log (and relay) progress there
    from .core.logs import setup_logging_from_env

    setup_logging_from_env()


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'xbench' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
