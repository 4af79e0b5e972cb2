"""Dataset loaders: one class per source, one :class:`Sample` record for all."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import XBenchError
from ..spec.registry import dataset_manifest, import_target, list_datasets
from .base import BaseDataset, Box, EncodedMask, Polygon, Region, Sample

if TYPE_CHECKING:
    from ..spec.config import DatasetSpec

__all__ = ["BaseDataset", "Box", "EncodedMask", "Polygon", "Region", "Sample", "load_dataset", "open_dataset", "list_datasets",
           "data_root"]


def data_root(name: str, root: str | Path | None, manifest: dict[str, Any] | None = None) -> Path | None:
    """The one resolution of a dataset's folder: ``root`` if given, else (a generated source, such as the
    phantom) None — the loader picks its cache folder — else ``$XBENCH_DATA/<name>``; neither → a clear error.

    ``manifest`` defaults to the registered manifest of ``name``.
    """
    if root is not None:
        return Path(root)
    if (manifest if manifest is not None else dataset_manifest(name)).get("generated"):
        return None
    env = os.environ.get("XBENCH_DATA")
    if env:
        return Path(env) / name
    raise XBenchError(f"No data root for dataset {name!r}: pass root=... or set XBENCH_DATA (folder holding <name>/).")


def load_dataset(name: str, root: str | Path | None = None, split: str | None = None, **kwargs: Any) -> BaseDataset:
    """Open a registered dataset from the user's local copy (``xbench.load_dataset("chestx_det10", root=...)``)."""
    manifest = dataset_manifest(name)
    cls = import_target(manifest["class"])
    split = split or manifest.get("default_split", "test")
    return cls(data_root(name, root, manifest), split, manifest=manifest, **kwargs)


def open_dataset(spec: DatasetSpec, split: str | None = None) -> BaseDataset:
    """The dataset a run config's entry names (``split`` overrides the entry's, e.g. a baseline's ``fit_split``)."""
    return load_dataset(spec.name, root=spec.root, split=split or spec.split, **spec.options)
