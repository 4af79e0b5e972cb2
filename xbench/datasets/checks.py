"""Check a local copy of a dataset against its manifest, and build the manifest's counts from it.

The one dataset checker: ``xbench manifest check`` and the preflight of ``xbench check`` / ``xbench run`` both call
:func:`check` (files present and their SHA-256, image files counted per split, counts compared with the manifest).
The manifest itself (schema, lookups) is :mod:`xbench.spec.manifests`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import write_frame
from ..core.errors import UnknownNameError
from ..spec.manifests import COUNT_KEYS, file_entries, sha256
from ..spec.registry import dataset_manifest
from .base import BaseDataset

__all__ = ["counts", "case_table", "image_files", "check", "build", "file_status", "CheckReport", "FileStatus"]


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
    from ..core.errors import MissingFileError

    missing = []
    for case_id, path in zip(ds.cases["case_id"].astype(str), ds.cases["image_path"].astype(str)):
        try:
            if ds.locate_image(path).is_file():
                continue
        except MissingFileError:
            pass
        missing.append(case_id)
    return len(ds) - len(missing), missing


def first_missing(ds: Any, missing: list[str], root: str, n: int = 3) -> str:
    """The first ``n`` missing images as the files looked for (subfolder and extension, relative to ``root``), then
    their case ids: "test_data/36199.png, … under /data/cxd (cases 36199, …)"."""
    paths = dict(zip(ds.cases["case_id"].astype(str), ds.cases["image_path"].astype(str)))
    base = Path(root).resolve() if root else None
    shown = []
    for case in missing[:n]:
        path = Path(paths.get(case, case))
        inside = base is not None and path.is_absolute() and base in path.resolve().parents
        shown.append(str(path.resolve().relative_to(base)) if inside else str(path))
    under = f" under {base}" if base is not None and any(not Path(p).is_absolute() for p in shown) else ""
    more = f" and {len(missing) - n} more" if len(missing) > n else ""
    return f"{', '.join(shown)}{more}{under} (cases {', '.join(missing[:n])})"


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
            if self.images_missing and self.dataset is not None:
                line += f" (first: {first_missing(self.dataset, self.images_missing, str(self.root or ''))})"
            elif self.images_missing:
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
    from . import data_root, load_dataset

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
    from . import load_dataset

    ds = load_dataset(name, root=root, split=split, on_error=on_error)
    table = case_table(ds)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_frame(table, out)
    return table
