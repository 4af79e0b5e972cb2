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
:data:`xbench.findings.CANONICAL`: synonyms across datasets share it),
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
VinDr-CXR); any other key is an error. The schema is :class:`xbench.registry.DatasetManifest`, checked by
the registry when a manifest is looked up: unknown or missing keys, wrong types, a ``finding`` that is
not canonical — one :class:`~xbench.errors.FormatError` naming file and field, with "did you mean".
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .atomic import write_frame
from .errors import UnknownNameError
from .registry import check_manifest, dataset_manifest

if TYPE_CHECKING:
    from .datasets.base import BaseDataset

__all__ = ["validate", "class_lookup", "file_entries", "sha256", "counts", "case_table", "image_files", "check", "build",
           "CheckReport", "FileStatus", "file_status"]

COUNT_KEYS = ("cases", "positive_cases", "negative_cases", "regions")


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise :class:`~xbench.errors.FormatError` (naming the manifest file and field) unless it follows the schema.

    The schema is :class:`xbench.registry.DatasetManifest` (:mod:`xbench.schema`): the registry checks every
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


def _region_table(ds: BaseDataset) -> pd.DataFrame:
    """Cases × findings table of region counts (reads annotations only, never images)."""
    rows = [[len(regions.get(f, [])) for f in ds.findings] for regions in (ds._regions(row) for _, row in ds.cases.iterrows())]
    return pd.DataFrame(np.array(rows, dtype=np.int64).reshape(len(ds.cases), len(ds.findings)), columns=ds.findings, index=ds.cases.index)


def counts(ds: BaseDataset) -> dict[str, Any]:
    """Measured counts of a loaded dataset, with the keys of a manifest's ``expected``.

    ``positive_cases`` counts cases with at least one label equal to 1
    (NaN labels count as not positive).
    """
    labels = ds.labels()
    regions = _region_table(ds)
    positive = (labels == 1).any(axis=1) if labels.size else np.zeros(len(ds), dtype=bool)
    return {
        "cases": len(ds),
        "positive_cases": int(positive.sum()),
        "negative_cases": int(len(ds) - positive.sum()),
        "regions": int(regions.to_numpy().sum()),
        "positives": {f: int((labels[:, i] == 1).sum()) for i, f in enumerate(ds.findings)},
        "region_counts": {f: int(regions[f].sum()) for f in ds.findings},
    }


def case_table(ds: BaseDataset) -> pd.DataFrame:
    """Normalised case table: ``case_id, image_path, height, width, view``,
    ``label:<class>`` (1/0/NaN) and ``regions:<class>`` (number of regions) per class."""
    table = ds.cases[["case_id", "image_path", "height", "width", "view"] + [f"label:{f}" for f in ds.findings]].copy()
    table["image_path"] = table["image_path"].astype(str)
    regions = _region_table(ds)
    for f in ds.findings:
        table[f"regions:{f}"] = regions[f].to_numpy()
    return table.reset_index(drop=True)


def image_files(ds: BaseDataset) -> tuple[int, list[str]]:
    """``(present, missing case ids)`` of a loaded dataset's image files (existence only, nothing decoded).

    A case's image is present when :meth:`~xbench.datasets.base.BaseDataset.locate_image` finds it (its
    ``image_path``, or for loaders with nested image folders the file of that name below them).
    """
    from .errors import MissingFileError

    missing = []
    for case_id, path in zip(ds.cases["case_id"].astype(str), ds.cases["image_path"].astype(str)):
        try:
            if ds.locate_image(path).is_file():
                continue
        except MissingFileError:
            pass
        missing.append(case_id)
    return len(ds) - len(missing), missing


@dataclass
class FileStatus:
    """One ``files`` entry of a manifest, as found under the user's root."""

    key: str
    path: Path
    exists: bool
    source: str | None
    sha256_expected: str | None = None
    sha256_actual: str | None = None

    @property
    def ok(self) -> bool:
        return self.exists and (self.sha256_expected is None or self.sha256_expected == self.sha256_actual)


@dataclass
class CheckReport:
    """What :func:`check` found: files, whether the loader opened, counts and mismatches."""

    name: str
    root: Path | None
    split: str
    files: list[FileStatus] = field(default_factory=list)
    opened: bool = False
    error: str | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    images_present: int = 0
    images_missing: list[str] = field(default_factory=list)
    dataset: BaseDataset | None = field(default=None, repr=False)  # the opened loader

    @property
    def ok(self) -> bool:
        """All files present with matching hashes, loader opened, every case's image present, no count mismatch."""
        return self.opened and not self.mismatches and not self.images_missing and all(f.ok for f in self.files)

    def format(self) -> str:
        """Plain-text report for the CLI."""
        lines = [f"{self.name} [{self.split}] at {self.root}: {'OK' if self.ok else 'PROBLEMS'}"]
        for f in self.files:
            if not f.exists:
                state = f"MISSING (get it from {f.source})" if f.source else "MISSING"
            elif f.sha256_expected is None:
                state = "present"
            elif f.sha256_expected == f.sha256_actual:
                state = "present, sha256 ok"
            else:
                state = f"present, sha256 differs (expected {f.sha256_expected[:12]}…, got {(f.sha256_actual or '')[:12]}…)"
            lines.append(f"  file {f.key}: {f.path}: {state}")
        lines.append(f"  loader: {'opened' if self.opened else 'failed: ' + str(self.error)}")
        if self.opened:
            total = self.images_present + len(self.images_missing)
            line = f"  image files: {self.images_present} of {total} present, {len(self.images_missing)} missing"
            if self.images_missing:
                line += f" (first: {', '.join(self.images_missing[:5])})"
            lines.append(line)
        if self.skipped:
            lines.append(f"  skipped records: {self.skipped}")
        for key in COUNT_KEYS:
            if key in self.counts:
                want = self.expected.get(key)
                lines.append(f"  {key}: {self.counts[key]}" + (f" (expected {want})" if want is not None else ""))
        lines.extend(f"  MISMATCH {m}" for m in self.mismatches)
        return "\n".join(lines)


def _compare(found: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    out = []
    for key, want in expected.items():
        if isinstance(want, Mapping):
            for cls, value in want.items():
                got = (found.get(key) or {}).get(cls)
                if got != value:
                    out.append(f"{key}[{cls}]: found {got}, expected {value}")
        elif found.get(key) != want:
            out.append(f"{key}: found {found.get(key)}, expected {want}")
    return out


def file_status(manifest: Mapping[str, Any], base: Path, split: str, *, hashes: bool = True) -> list[FileStatus]:
    """Each ``files`` entry ``split`` needs, as found under ``base`` (SHA-256 compared where the manifest gives
    one and ``hashes``; folders never)."""
    out = []
    for key, entry in file_entries(manifest, split).items():
        path = base / entry["path"]
        status = FileStatus(key=key, path=path, exists=path.exists(), source=entry.get("source"),
                            sha256_expected=entry.get("sha256"))
        if status.exists and hashes and status.sha256_expected and path.is_file():
            status.sha256_actual = sha256(path)
        out.append(status)
    return out


def check(name: str, root: str | Path | None, split: str | None = None, *, hashes: bool = True,
          options: Mapping[str, Any] | None = None, measure: bool = True) -> CheckReport:
    """Check a user's local copy of dataset ``name`` against its manifest: the one dataset checker, behind
    ``xbench manifest check`` and the dataset part of ``xbench check`` (:mod:`xbench.preflight`).

    Parameters
    ----------
    name : str
        Registered dataset name.
    root : path or None
        The user's folder (None: ``$XBENCH_DATA/<name>``, see :func:`xbench.datasets.data_root`).
    split : str, optional
        Split to check (default: the manifest's ``default_split``).
    hashes : bool, default=True
        Compare SHA-256 of files whose manifest entry gives one (folders never).
    options : mapping, optional
        Keyword options of the loader (a run config's dataset options); default ``{on_error: skip}``
        (malformed records counted in :attr:`CheckReport.skipped`).
    measure : bool, default=True
        Measure the counts and compare them with the manifest's ``expected`` (reads every annotation).

    Returns
    -------
    CheckReport
        Files present / missing with their publisher, hash comparison, whether
        the loader opened (the error text if not), image files present, measured counts and
        the differences from the manifest's ``expected`` counts. Nothing is printed;
        use :meth:`CheckReport.format`.
    """
    from .datasets import data_root, load_dataset

    manifest = dataset_manifest(name)
    split = split or manifest.get("default_split", "test")
    if split not in (manifest.get("splits") or {}):
        raise UnknownNameError(f"split of dataset {name!r}", split, manifest.get("splits") or {})
    generated = bool(manifest.get("generated"))  # its files are written by the loader, into the folder it picks
    base = data_root(name, root, manifest)
    report = CheckReport(name=name, root=base, split=split)
    if not generated:
        report.files = file_status(manifest, base, split, hashes=hashes)
    report.expected = dict(((manifest["splits"][split] or {}).get("expected") or {}))
    try:
        ds = load_dataset(name, root=root, split=split, **(dict(options) if options is not None else {"on_error": "skip"}))
    except Exception as exc:  # reported, not raised: the report is the point
        report.error = f"{type(exc).__name__}: {exc}"
        return report
    report.opened, report.dataset = True, ds
    if generated and ds.root is not None:
        report.root = Path(ds.root)
        report.files = file_status(manifest, report.root, split, hashes=hashes)
    report.skipped = dict(ds.skipped)
    report.images_present, report.images_missing = image_files(ds)
    if measure:
        report.counts = counts(ds)
        report.mismatches = _compare(report.counts, report.expected)
    return report


def build(name: str, root: str | Path | None, out_path: str | Path, split: str | None = None, *, on_error: str = "raise") -> pd.DataFrame:
    """Write the normalised case table of a dataset split and return it.

    The table has ``case_id, image_path, height, width, view``, then
    ``label:<class>`` and ``regions:<class>`` per class (see :func:`case_table`).
    ``out_path`` ending in ``.parquet`` is written as Parquet, anything else as
    CSV. Parent folders are created.
    """
    from .datasets import load_dataset

    ds = load_dataset(name, root=root, split=split, on_error=on_error)
    table = case_table(ds)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_frame(table, out)
    return table
