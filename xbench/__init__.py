"""XBench: do chest X-ray vision-language models look where radiologists look?

One door per concern: :func:`load_dataset`, :func:`create_model`, and the
metric functions in :mod:`xbench.metrics`.
"""
from __future__ import annotations

from . import analysis, metrics, tables
from .datasets import load_dataset
from .models import create_model
from .registry import add_config_path, list_datasets, list_models
from .session import open_run
from .version import __version__ as __version__

__all__ = ["analysis", "metrics", "tables", "load_dataset", "create_model", "add_config_path", "list_datasets", "list_models", "open_run", "evaluate_maps"]


def __getattr__(name: str):
    if name == "evaluate_maps":  # imported on first use: xbench.score pulls in the evaluation stack
        from .score import evaluate_maps

        return evaluate_maps
    raise AttributeError(f"module 'xbench' has no attribute {name!r}")
