"""CheXlocalize (Saporta et al., Nat. Mach. Intell. 2022): CheXpert val/test with radiologist masks.

Files (relative to ``root``, as ``data_manifests/chexlocalize.yaml`` says; ``{split}`` is ``val`` or ``test``)
-----------------------------------------------------------------------------------------------
``CheXpert/{split}_labels.csv``
    CheXpert label file: ``Path`` then one column per CheXpert class (the val
    file also has ``Sex, Age, Frontal/Lateral, AP/PA``). Values ``1``/``0``
    (``1.0``/``0.0`` accepted), empty = unknown (NaN). ``Path`` looks like
    ``test/patient64741/study1/view1_frontal.jpg``.
``CheXlocalize/gt_segmentations_{split}.json`` (default region source)
    ``{cxr_id: {task: {"size": [h, w], "counts": <COCO compressed RLE str>}}}``,
    all 10 localisation tasks per CXR (all-zero masks for negatives); only
    CXRs with at least one positive label are keys (cheXlocalize README).
``CheXlocalize/gt_annotations_{split}.json`` (``regions="annotations"``)
    ``{cxr_id: {"img_size": [h, w], task: [[[x, y], ...], ...]}}``: raw
    contours, positive tasks only, rasterised like cheXlocalize's
    ``annotation_to_segmentation.py`` (PIL polygon, outline and fill).
``CheXpert/<Path without a leading "CheXpert-v1.0/">``
    The JPEG images.

Conventions
-----------
* Cases: every row of the label file, in file order (test: 668 CXRs, lateral
  views included). ``cxr_id`` = ``patient<id>_study<n>_view<n>_<frontal|lateral>``,
  built from the last three parts of ``Path`` (the id used by the JSON files).
* Classes: the manifest's 13, spelled as in the ground-truth JSON
  (``Airspace Opacity``, the CSV's ``Lung Opacity``); a class's ``aliases`` are
  its other spellings, looked up in the label CSV header and the JSON files.
* Grounding classes are **data-driven**: :attr:`localized` lists every class
  with at least one non-empty region in the region file (the paper reports
  pointing for all 13, Fracture, Pleural Other and Pneumonia included);
  classes without one have labels only and are **absent** from
  :attr:`Sample.regions` (a localised class with no drawing on a CXR has an
  empty list instead).
* Image size: from the JSON (``size`` / ``img_size``) for CXRs listed there,
  else from the JPEG header — those images must then be present to build the
  table (:class:`~xbench.core.errors.MissingFileError` names the first one missing).
* Masks are decoded lazily; before decoding, the RLE run lengths are checked to
  sum to ``h * w``: pycocotools 2.0 rejects runs that cover too many pixels but
  silently decodes too few into a wrong mask (checked with a 30x40 mask
  claimed as 31x40).
  All-zero masks (how the segmentation file stores negatives) are not kept as
  regions, so a localised class without a drawing has an empty region list.
* ``view``: the ``AP/PA`` column when present and non-empty, else
  ``"LATERAL"`` for lateral images, else ``None``.
* Errors name the file, the line (label CSV) or the 1-based record, i.e. the
  CXR's position in the JSON file, and the field (column or task name).
  With ``on_error="skip"`` a bad CSV row drops that CXR; a bad JSON task entry
  drops that region only.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import FormatError, MissingFileError, UnknownNameError
from ..core.summary import brief
from .base import BaseDataset, Box, EncodedMask, Polygon, Region
from .images import image_size
from .records import csv_records
from .regions import decode_coco_rle, validate_box

__all__ = ["CheXlocalize"]

_PATH = re.compile(r"(?:^|/)(patient\d+)/(study\d+)/(view\d+_(?:frontal|lateral))\.jpg$")
_VALUES = {"": np.nan, "0": 0.0, "1": 1.0, "0.0": 0.0, "1.0": 1.0}
_REGION_SOURCES = ("segmentations", "annotations")  # manifest ``files`` keys


class CheXlocalize(BaseDataset):
    """CheXlocalize val / test: 13 CheXpert classes, masks for the 10 localisation tasks.

    Parameters
    ----------
    root, split, manifest, on_error
        See :class:`~xbench.datasets.base.BaseDataset`; ``split`` is ``"test"``
        (668 CXRs) or ``"val"`` (234).
    regions : {"segmentations", "annotations"}, default="segmentations"
        Region source: the released RLE masks (``gt_segmentations_*.json``) or the
        raw contours they were made from (``gt_annotations_*.json``).

    Attributes
    ----------
    localized : list of str
        The classes with at least one non-empty region in the region file, in
        :attr:`findings` order; the others are recognition-only.
    """

    def __init__(self, root: str | Path, split: str = "test", *, manifest: dict[str, Any],
                 on_error: str = "raise", regions: str = "segmentations"):
        if regions not in _REGION_SOURCES:
            raise ValueError(f"regions must be one of {_REGION_SOURCES}, got {regions!r}")
        self.region_source = regions
        super().__init__(root, split, manifest=manifest, on_error=on_error)

    def _read_index(self) -> pd.DataFrame:
        classes = self.manifest.get("classes", [])
        self._by_json = {alias: c["name"] for c in classes for alias in (c["name"], *c.get("aliases", []))}

        cases = self._read_labels(self.file("labels"))
        path = self.file(self.region_source)
        reader = self._read_segmentations if self.region_source == "segmentations" else self._read_annotations
        sizes, self._regions_by_case = reader(path, set(cases["case_id"]))
        drawn = {f for found in self._regions_by_case.values() for f, regions in found.items() if regions}
        self.localized = [f for f in self.findings if f in drawn]

        images = self.manifest["files"]["images"]
        heights, widths = [], []
        for case_id, image_path in zip(cases["case_id"], cases["image_path"]):
            if case_id not in sizes:  # no JSON entry: the image header gives the size
                if not Path(image_path).is_file():
                    raise MissingFileError(image_path, f"CheXpert image of {case_id} (its header gives the size)",
                                           images.get("source"))
                sizes[case_id] = image_size(image_path)
            heights.append(sizes[case_id][0])
            widths.append(sizes[case_id][1])
        cases.insert(2, "height", heights)
        cases.insert(3, "width", widths)
        return cases

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        found = self._regions_by_case.get(str(row["case_id"]), {})
        return {f: list(found.get(f, [])) for f in self.localized}

    # -- readers --------------------------------------------------------------------
    def _read_labels(self, path: Path) -> pd.DataFrame:
        header, rows = csv_records(path)
        if "Path" not in header:
            raise FormatError(path, f"missing column; header: {header}", line=1, field="Path")
        spellings = {c["name"]: (c["name"], *c.get("aliases", [])) for c in self.manifest.get("classes", [])}
        column = {}  # class → its CSV column (the class name or an alias)
        for f in self.findings:
            found = [a for a in spellings.get(f, (f,)) if a in header]
            if not found:
                raise FormatError(path, f"missing column; header: {header}", line=1, field=f)
            column[f] = found[0]
        records: list[dict[str, Any]] = []
        seen: set[str] = set()
        for line, row in rows:
            if len(row) != len(header):
                self.fail(path, f"expected {len(header)} fields, got {len(row)}", line=line,
                          reason="wrong number of fields")
                continue
            record = dict(zip(header, row))
            match = _PATH.search(record["Path"])
            if match is None:
                self.fail(path, f"expected .../patient<id>/study<n>/view<n>_<frontal|lateral>.jpg, "
                          f"got {record['Path']!r}",
                          line=line, field="Path", reason="bad Path")
                continue
            case_id = "_".join(match.groups())
            if case_id in seen:
                self.fail(path, f"duplicate image {case_id}", line=line, field="Path", reason="duplicate image")
                continue
            bad = next((f for f in self.findings if record[column[f]] not in _VALUES), None)
            if bad is not None:
                self.fail(path, f"label must be 1, 0 or empty, got {record[column[bad]]!r}", line=line,
                          field=column[bad], reason="label not 1/0/empty")
                continue
            seen.add(case_id)
            relative = PurePosixPath(record["Path"])
            if relative.parts and relative.parts[0] == "CheXpert-v1.0":
                relative = PurePosixPath(*relative.parts[1:])
            view = record.get("AP/PA") or ("LATERAL" if case_id.endswith("lateral") else None)
            try:
                image = self.image_path(relative)
            except FormatError as exc:
                self.fail(path, exc.message, line=line, field="Path", reason="Path outside the dataset root")
                continue
            records.append({"case_id": case_id, "image_path": str(image), "view": view,
                            **{f"label:{f}": _VALUES[record[column[f]]] for f in self.findings}})
        return pd.DataFrame(records, columns=["case_id", "image_path", "view", *[f"label:{f}" for f in self.findings]])

    def _load_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(path, f"not valid JSON: {exc}", line=getattr(exc, "lineno", None)) from exc
        if not isinstance(data, dict):
            raise FormatError(path, f"expected an object keyed by CXR id, got {type(data).__name__}")
        return data

    def _class_of(self, path: Path, record: int, cxr_id: str, task: str) -> str | None:
        """Manifest class of a JSON task name, or ``None`` after failing/skipping an unknown one."""
        if task in self._by_json:
            return self._by_json[task]
        message = f"{cxr_id}: " + UnknownNameError("CheXlocalize task", task, self._by_json).message
        self.fail(path, message, line=record, field=task, reason="unknown task")
        return None

    def _read_segmentations(self, path: Path, case_ids: set[str]):
        """``gt_segmentations_*.json`` → (sizes, regions) keyed by CXR id; ``line`` = 1-based record."""
        sizes: dict[str, tuple[int, int]] = {}
        regions: dict[str, dict[str, list[Region]]] = {}
        for record, (cxr_id, tasks) in enumerate(self._load_json(path).items(), start=1):
            if cxr_id not in case_ids:
                self.fail(path, f"CXR {cxr_id!r} is not in the label file", line=record, field=cxr_id,
                          reason="CXR absent from the label file")
                continue
            if not isinstance(tasks, dict):
                self.fail(path, f"{cxr_id}: expected an object of tasks, got {type(tasks).__name__}", line=record,
                          field=cxr_id, reason="malformed record")
                continue
            found: dict[str, list[Region]] = {}
            for task, rle in tasks.items():
                name = self._class_of(path, record, cxr_id, task)
                if name is None:
                    continue
                size = _size(rle.get("size") if isinstance(rle, dict) else None)
                if size is None or not isinstance(rle.get("counts"), str):
                    self.fail(path, f"{cxr_id}/{task}: expected {{'size': [h, w], 'counts': str}}, got {brief(rle)}",
                              line=record, field=task, reason="malformed RLE")
                    continue
                if sizes.setdefault(cxr_id, size) != size:
                    self.fail(path, f"{cxr_id}/{task}: RLE size {list(size)} differs from the image's "
                              f"{list(sizes[cxr_id])} (other tasks of this CXR)", line=record, field=task,
                              reason="RLE size mismatch")
                    continue
                if not _rle_is_empty(rle["counts"]):
                    decoder = _rle_decoder(path, record, cxr_id, task, rle)
                    found[name] = [EncodedMask(decoder, f"{path.name}:{cxr_id}/{task}")]
                    continue
                try:  # negatives are stored as all-zero masks (one run): checked now, kept as no region
                    total = rle_length(rle["counts"])
                except ValueError as exc:
                    total = f"malformed counts ({exc})"
                if total != size[0] * size[1]:
                    self.fail(path, f"{cxr_id}/{task}: RLE covers {total} pixels, size {list(size)} has "
                              f"{size[0] * size[1]} (RLE size mismatch)", line=record, field=task,
                              reason="RLE size mismatch")
            regions[cxr_id] = found
        return sizes, regions

    def _read_annotations(self, path: Path, case_ids: set[str]):
        """``gt_annotations_*.json`` → (sizes, regions) keyed by CXR id; ``line`` = 1-based record."""
        sizes: dict[str, tuple[int, int]] = {}
        regions: dict[str, dict[str, list[Region]]] = {}
        for record, (cxr_id, entry) in enumerate(self._load_json(path).items(), start=1):
            if cxr_id not in case_ids:
                self.fail(path, f"CXR {cxr_id!r} is not in the label file", line=record, field=cxr_id,
                          reason="CXR absent from the label file")
                continue
            size = _size(entry.get("img_size")) if isinstance(entry, dict) else None
            if size is None:
                self.fail(path, f"{cxr_id}: expected 'img_size': [h, w] of positive integers", line=record,
                          field="img_size", reason="malformed record")
                continue
            sizes[cxr_id] = size
            found: dict[str, list[Region]] = {}
            for task, contours in entry.items():
                if task == "img_size":
                    continue
                name = self._class_of(path, record, cxr_id, task)
                if name is None:
                    continue
                polygons = self._contours(path, record, cxr_id, task, contours, size)
                if polygons is not None:
                    found[name] = polygons
            regions[cxr_id] = found
        return sizes, regions

    def _contours(self, path: Path, record: int, cxr_id: str, task: str, contours: Any,
                  size: tuple[int, int]) -> list[Region] | None:
        polygons: list[Region] = []
        for number, contour in enumerate(contours if isinstance(contours, list) else [None]):
            try:
                points = np.asarray(contour, dtype=float)
            except (TypeError, ValueError):
                points = np.empty(0)
            if points.ndim != 2 or points.shape[1] != 2 or len(points) < 3 or not np.isfinite(points).all():
                self.fail(path, f"{cxr_id}/{task}: contour {number} must be >= 3 finite [x, y] points",
                          line=record, field=task, reason="malformed contour")
                return None
            (x0, y0), (x1, y1) = points.min(axis=0), points.max(axis=0)
            try:
                validate_box(Box(x0, y0, x1, y1), size)
            except ValueError as exc:
                self.fail(path, f"{cxr_id}/{task}: contour {number} leaves the {size[0]}x{size[1]} image: {exc}",
                          line=record, field=task, reason="contour outside the image")
                return None
            polygons.append(Polygon(points))
        return polygons


def _size(value: Any) -> tuple[int, int] | None:
    """``[h, w]`` of positive integers as a tuple, else ``None``."""
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        return int(value[0]), int(value[1])
    return None


def _rle_is_empty(counts: str) -> bool:
    """True when a COCO compressed RLE holds a single run (of zeros): an all-zero mask.

    Reads only the first count: its groups end at the first character without
    the 0x20 "more" bit; a string that ends there has exactly one run.
    """
    end = next((i for i, ch in enumerate(counts) if not (ord(ch) - 48) & 0x20), len(counts))
    return end >= len(counts) - 1


def rle_length(counts: str) -> int:
    """Number of pixels a COCO compressed RLE string covers (sum of its runs).

    The string format is pycocotools' ``rleToString``: each count is written in
    5-bit groups, low group first, as ``chr(48 + group)`` with bit 0x20 meaning
    "more groups follow" and bit 0x10 of the last group the sign; from the fourth
    count on (index >= 3), the value stored is the difference to the count two
    places before.

    Raises
    ------
    ValueError
        A character outside ``'0'..'o'``, a truncated count, or a negative run.
    """
    runs: list[int] = []
    position = 0
    while position < len(counts):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(counts):
                raise ValueError("truncated count at the end of the string")
            group = ord(counts[position]) - 48
            if not 0 <= group < 64:
                raise ValueError(f"character {counts[position]!r} at {position} is not in the RLE alphabet")
            value |= (group & 0x1F) << shift
            more = bool(group & 0x20)
            position += 1
            shift += 5
            if not more and group & 0x10:
                value -= 1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            raise ValueError(f"negative run length {value} (count {len(runs)})")
        runs.append(value)
    return sum(runs)


def _rle_decoder(path: Path, record: int, cxr_id: str, task: str, rle: dict[str, Any]) -> Callable[[], np.ndarray]:
    """Lazy decoder of one COCO RLE mask (picklable: a dataset crosses to evaluation worker processes)."""
    return partial(_decode_rle, path, record, cxr_id, task, rle)


def _decode_rle(path: Path, record: int, cxr_id: str, task: str, rle: dict[str, Any]) -> np.ndarray:
    """The mask of :func:`_rle_decoder`, checked and decoded now."""
    height, width = rle["size"]
    try:
        total = rle_length(rle["counts"])
    except ValueError as exc:
        raise FormatError(path, f"{cxr_id}/{task}: malformed RLE counts: {exc}", line=record, field=task) from exc
    if total != height * width:
        raise FormatError(path, f"{cxr_id}/{task}: RLE runs cover {total} pixels, size {height}x{width} has "
                          f"{height * width} (RLE size mismatch)", line=record, field=task)
    try:
        return decode_coco_rle(rle)
    except ValueError as exc:
        raise FormatError(path, f"{cxr_id}/{task}: {exc}", line=record, field=task) from exc
