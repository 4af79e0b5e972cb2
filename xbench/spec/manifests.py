"""Dataset manifests (``data_manifests/<name>.yaml``): schema, validation, check and build.

A manifest describes one source: which loader reads it, where the user's
local copy is officially published, which files must be where under the
user's root, the evaluation splits with their expected counts, and the
classes. XBench never downloads; :func:`check` tells the user what is missing.

Schema
------
.. code-block:: yaml

    class: xbench.datasets.chestx_det:ChestXDet10   # loader, "module:Class" (required)
    title: ChestX-Det10                             # human name (required)
    homepage: https://github.com/Deepwise-AILab/ChestX-Det10-Dataset  # official download page (required)
    citation: "Liu et al., ChestX-Det10 ..., arXiv:2006.10550"        # (required)
    license: "..."                                  # terms as the publisher states them (required)
    image_size: [1024, 1024]                        # optional (height, width) when the format fixes it;
                                                    # otherwise loaders read image headers
    files:                                          # relative to the user's root (required)
      annotations: {path: "{split}.json", sha256: <hex or null>, source: <url>}
      images: {path: "{split}_data/", source: <url>}   # trailing "/" = a folder
      split_list: {path: lovt_split/test.csv, source: <url>, splits: [test]}  # only needed by these splits
    default_split: test                             # (required, must be a key of splits)
    splits:                                         # (required)
      test:
        description: "..."
        expected: {cases: 542, positive_cases: 459, regions: 1476,
                   positives: {Effusion: 252}, region_counts: {Effusion: 372}}  # all keys optional
    classes:                                        # (required, non-empty)
      - {name: Effusion, finding: pleural_effusion, prompt: pleural effusion,
         display: Effusion, localized: true, aliases: [Pleural Effusion]}

Keys of a file entry: ``path`` (required; ``{split}`` is replaced by the split
name), ``sha256`` (hex of the file as published, or null: not compared),
``source`` (where to get it), ``splits`` (optional list; default: every split).

Keys of a class: ``name`` (the dataset's own spelling: labels, regions and
per-dataset results use it), ``finding`` (canonical id from
:data:`xbench.spec.findings.CANONICAL`: synonyms across datasets share it),
``prompt`` (the text given to the models), ``display`` (the paper's display
name), ``localized`` (false: image labels only, no regions), and optional
``aliases`` (other spellings of the class in the dataset's own files, e.g.
NIH's ``Infiltration`` in ``Data_Entry`` for ``Infiltrate`` in the box file).

Expected counts: ``cases`` (rows of the case table), ``positive_cases``
(cases with at least one label equal to 1), ``negative_cases``, ``regions``
(regions over all cases and classes: one per box, polygon or encoded-mask
row), and per class ``positives`` / ``region_counts``.
Loaders read the extra top-level keys the schema declares for them (``generated`` and ``generator`` for
the phantom, ``lung_outline_labels`` for COVID-19 Rural, ``label_aliases`` and ``ignored_classes`` for
VinDr-CXR); any other key is an error. The schema is :class:`xbench.spec.registry.DatasetManifest`, checked by
the registry when a manifest is looked up: unknown or missing keys, wrong types, a ``finding`` that is
not canonical — one :class:`~xbench.core.errors.FormatError` naming file and field, with "did you mean".
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any


from .registry import check_manifest


__all__ = ["validate", "class_lookup", "file_entries", "sha256"]

COUNT_KEYS = ("cases", "positive_cases", "negative_cases", "regions")


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise :class:`~xbench.core.errors.FormatError` (naming the manifest file and field) unless it follows the schema.

    The schema is :class:`xbench.spec.registry.DatasetManifest` (:mod:`xbench.spec.schema`): the registry checks every
    manifest with it when the name is looked up, so this is for a manifest edited in memory.
    """
    where = manifest.get("config_path", manifest.get("name", "<manifest>"))
    check_manifest(dict(manifest), where)


def class_lookup(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Every spelling a dataset's files use for a class (``name`` and ``aliases``) → the class ``name``."""
    out: dict[str, str] = {}
    for cls in manifest.get("classes") or []:
        for spelling in [cls["name"], *(cls.get("aliases") or [])]:
            out[str(spelling)] = str(cls["name"])
    return out


def file_entries(manifest: Mapping[str, Any], split: str) -> dict[str, dict[str, Any]]:
    """The ``files`` entries that ``split`` needs, with ``{split}`` filled in their paths and sources."""
    out = {}
    for key, entry in (manifest.get("files") or {}).items():
        if entry.get("splits") is not None and split not in entry["splits"]:
            continue
        out[key] = {**entry, "path": str(entry["path"]).format(split=split)}
        if entry.get("source") is not None:
            out[key]["source"] = str(entry["source"]).format(split=split)
    return out


def sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
