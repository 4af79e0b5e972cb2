"""ChestX-Det10 (10 classes, boxes) and ChestX-Det (13 classes, polygons): Deepwise JSON records.

File format (Deepwise-AILab/ChestX-Det10-Dataset ``{train,test}.json`` and
ChestX-Det-Dataset ``ChestX_Det_{train,test}.json``): a JSON **list** of records
``{"file_name": "36302.png", "syms": [...], "boxes": [[x1, y1, x2, y2], ...]}``,
plus ``"polygons": [[[x, y], ...], ...]`` in ChestX-Det. ``syms[i]`` is the
class of ``boxes[i]`` (and ``polygons[i]``); a class repeats when it has
several instances; a record with no syms is a no-finding negative.

Conventions
-----------
* Boxes are xyxy integers on the 1024×1024 PNG grid, read as
  :class:`~xbench.datasets.base.Box` with ``x_max``/``y_max`` exclusive.
* :class:`ChestXDet` uses ``polygons[i]`` as the region when it has at least
  3 points, else falls back to ``boxes[i]``; :class:`ChestXDet10` uses boxes.
* Labels: 1 if the class is among the record's syms, else 0 (no NaN).
* ``case_id`` is the file stem; the image is ``<images>/<file_name>``.
* Image size: the manifest's ``image_size`` (1024×1024 for both Deepwise
  releases), or, when a manifest gives none, the image header (the image must
  then exist when the table is built).
* Errors: a record that is not an object, lacks a key, has parallel lists of
  different lengths, an unknown class, a non-numeric box, or a box outside
  the image (:func:`~xbench.datasets.regions.validate_box`) raises
  :class:`~xbench.core.errors.FormatError` naming the file, the 1-based record and
  the field, or with ``on_error="skip"`` drops the whole record and counts it.

Subclassing: the JSON path and image folder come from the manifest's
``files.annotations`` and ``files.images`` (``{split}`` filled in), and the
class list from ``classes``, so another JSON source in this format (e.g. the
phantom dataset) subclasses :class:`ChestXDet` or :class:`ChestXDet10` and
only brings its own manifest.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import FormatError
from ..spec.manifests import class_lookup
from .base import BaseDataset, Box, Polygon, Region
from .images import image_size
from .regions import validate_box

__all__ = ["ChestXDet10", "ChestXDet", "read_det_json"]


def read_det_json(path: str | Path) -> list[Any]:
    """The list of records of a Deepwise detection JSON file.

    Raises :class:`~xbench.core.errors.FormatError` (with the line of a syntax
    error) when the file is not JSON or its top level is not a list.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    except UnicodeDecodeError as exc:
        raise FormatError(path, f"not UTF-8 text: {exc}") from exc
    if not isinstance(records, list):
        raise FormatError(path, f"expected a JSON list of records, got {type(records).__name__}")
    return records


class _DetJson(BaseDataset):
    """Loader of Deepwise-style JSON records (see the module docstring)."""

    use_polygons: bool = False

    def _read_index(self) -> pd.DataFrame:
        path = self.file("annotations")
        fixed = self.manifest.get("image_size")
        lookup = class_lookup(self.manifest)
        self._region_map: dict[str, dict[str, list[Region]]] = {}
        rows = []
        for number, record in enumerate(read_det_json(path), start=1):
            parsed = self._parse(path, number, record, lookup, fixed)
            if parsed is None:
                continue
            file_name, image, size, syms, regions = parsed
            case_id = Path(file_name).stem
            if case_id in self._region_map:
                self.fail(path, f"record {number}: duplicate file_name {file_name!r}", field="file_name", reason="duplicate record")
                continue
            self._region_map[case_id] = {f: [r for s, r in regions if s == f] for f in self.findings}
            row = {"case_id": case_id, "image_path": str(image), "height": size[0], "width": size[1], "view": None}
            row.update({f"label:{f}": float(f in syms) for f in self.findings})
            rows.append(row)
        columns = ["case_id", "image_path", "height", "width", "view"] + [f"label:{f}" for f in self.findings]
        return pd.DataFrame(rows, columns=columns)

    def _parse(
        self, path: Path, number: int, record: Any, lookup: dict[str, str], fixed: list[int] | None
    ) -> tuple[str, Path, tuple[int, int], set[str], list[tuple[str, Region]]] | None:
        """(file_name, image path, (height, width), classes, [(class, region)]) of one record, or None when skipped."""
        keys = ("file_name", "syms", "boxes") + (("polygons",) if self.use_polygons else ())
        if not isinstance(record, dict):
            self.fail(path, f"record {number}: expected an object, got {type(record).__name__}", reason="malformed record")
            return None
        for key in keys:
            if key not in record:
                self.fail(path, f"record {number}: missing key", field=key, reason="malformed record")
                return None
        file_name, syms, boxes = record["file_name"], record["syms"], record["boxes"]
        polygons = record["polygons"] if self.use_polygons else [None] * len(boxes)
        if not isinstance(file_name, str) or not file_name:
            self.fail(path, f"record {number}: file_name must be a non-empty string, got {file_name!r}", field="file_name", reason="malformed record")
            return None
        if not (isinstance(syms, list) and isinstance(boxes, list) and isinstance(polygons, list)) or not len(syms) == len(boxes) == len(polygons):
            self.fail(path, f"record {number} ({file_name}): syms, boxes" + (", polygons" if self.use_polygons else "")
                      + " must be lists of equal length", field="boxes", reason="malformed record")
            return None
        try:
            image = self.image_path(file_name)
        except FormatError as exc:
            self.fail(path, f"record {number}: file_name {file_name!r}: {exc}", field="file_name",
                      reason="file_name outside the dataset root")
            return None
        size = (int(fixed[0]), int(fixed[1])) if fixed else image_size(image)
        regions: list[tuple[str, Region]] = []
        for index, (sym, box, polygon) in enumerate(zip(syms, boxes, polygons)):
            if sym not in lookup:
                self.fail(path, f"record {number} ({file_name}): unknown class {sym!r}; classes are {sorted(lookup)}",
                          field=f"syms[{index}]", reason="unknown class")
                return None
            try:
                region = _region(box, polygon, size)
            except (TypeError, ValueError) as exc:
                self.fail(path, f"record {number} ({file_name}): {exc}", field=f"boxes[{index}]", reason="malformed record")
                return None
            regions.append((lookup[sym], region))
        return file_name, image, size, {s for s, _ in regions}, regions

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        return self._region_map[str(row["case_id"])]


def _region(box: Any, polygon: Any, size: tuple[int, int]) -> Region:
    """One annotation's region: its polygon where it has three points or more, else its ``[x1, y1, x2, y2]`` box
    (checked against the image ``size`` either way); a malformed one raises ``ValueError`` / ``TypeError``."""
    coords = [float(v) for v in box]
    if len(coords) != 4:
        raise ValueError(f"expected 4 numbers [x1, y1, x2, y2], got {len(coords)}")
    region: Region = Box(*coords)
    validate_box(region, size)
    if polygon is not None and len(polygon) >= 3:
        points = np.asarray(polygon, dtype=float)
        if points.ndim != 2 or points.shape[1] != 2 or not np.isfinite(points).all():
            raise ValueError(f"polygon must be finite [[x, y], ...] points, got shape {points.shape}")
        region = Polygon(points)
    return region


class ChestXDet10(_DetJson):
    """ChestX-Det10: 10 classes, xyxy boxes on 1024² (``data_manifests/chestx_det10.yaml``)."""

    use_polygons = False


class ChestXDet(_DetJson):
    """ChestX-Det: 13 classes, polygons with boxes as fallback (``data_manifests/chestx_det.yaml``)."""

    use_polygons = True
