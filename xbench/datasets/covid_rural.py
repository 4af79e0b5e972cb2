"""COVID-19 Rural (TCIA COVID-19-AR CXRs with opacity annotations by Tang et al., 2020).

Files (relative to ``root``, as ``data_manifests/covid_rural.yaml`` says), laid out like the
``covid_rural_annot/`` folder of ``haimingt/opacity_segmentation_covid_chest_X_ray``
--------------------------------------------------------------------------------------
``lovt_split/{split}.csv``
    LoVT's patient-disjoint split lists (``train`` / ``validation`` / ``test``:
    133 / 44 / 44 images), header ``ID``, one image stem per line, e.g.
    ``COVID-19-AR-16406505_01-14-2012-XR``.
``jpgs/<ID>.jpg``
    The radiographs (full resolution, saved as colour JPEGs; read as luma).
``pngs_masks/<ID>.png`` (default region source)
    Binary opacity masks, values {0, 1}, same size as the JPEG (LoVT and
    MedKLIP use these as the grounding ground truth).
``jpgs/jsons/<ID>.json`` (``regions="polygons"``)
    LabelMe 4.5.6 files: ``shapes[]`` of ``{label, points [[x, y], ...],
    shape_type: "polygon"}`` plus ``imageHeight`` / ``imageWidth``. The lung
    outlines (manifest ``lung_outline_labels``: ``right_lung``, ``left_lung``)
    are dropped; every other polygon (``consolidation``, ``groud_glass_opacity``
    [sic], ...) is an opacity region.

Conventions
-----------
* Cases: the IDs of the split list, in file order.
* One class; every case is labelled positive (1.0): all patients of the
  collection are COVID-19 positive. Only images with a non-empty opacity mask
  are **positive pairs** for grounding: an empty mask is a positive without a
  region, counted (``evaluation_log.json``: ``positive_without_region``) and
  never scored (the paper's values imply 32 such pairs among the 44 test
  images). With every label positive, AUC, AUPRC, F1 and accuracy are
  undefined (NaN, named under the recognition table); Hamming accuracy, the
  share of images scored ≥ 0.5, is the recognition metric that stays defined.
* Regions: with ``regions="masks"`` every case has exactly one
  :class:`~xbench.datasets.base.EncodedMask` (decoded lazily, so an all-zero
  mask is still listed); with ``"polygons"`` one polygon per opacity shape.
* Image size: from the PNG mask header (``regions="masks"``) or the LabelMe
  ``imageHeight`` / ``imageWidth`` (``regions="polygons"``); the JPEGs are only
  needed when an image is read. When a mask is decoded it must be 2-D with
  values in {0, 1}; if its JPEG is present, their sizes must agree.
* Errors name the file, the line (split list) or the 1-based shape number
  (LabelMe), and the field. With ``on_error="skip"`` a bad split row drops
  that image; a bad shape drops that polygon only.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import FormatError, MissingFileError
from .base import BaseDataset, Box, EncodedMask, Polygon, Region
from .images import image_size, read_mask
from .records import csv_records
from .regions import validate_box

__all__ = ["COVIDRural"]

_ID = re.compile(r"^COVID-19-AR-\d+_\d{2}-\d{2}-\d{4}-XR$")
_REGION_SOURCES = ("masks", "polygons")  # manifest ``files`` keys


class COVIDRural(BaseDataset):
    """COVID-19 Rural opacity masks, on LoVT's train / validation / test split.

    Parameters
    ----------
    root, split, manifest, on_error
        See :class:`~xbench.datasets.base.BaseDataset`; ``split`` is one of
        ``"train"``, ``"validation"``, ``"test"`` (default).
    regions : {"masks", "polygons"}, default="masks"
        Region source: the binary PNG masks or the LabelMe polygons.
    """

    def __init__(self, root: str | Path, split: str = "test", *, manifest: dict[str, Any],
                 on_error: str = "raise", regions: str = "masks"):
        if regions not in _REGION_SOURCES:
            raise ValueError(f"regions must be one of {_REGION_SOURCES}, got {regions!r}")
        self.region_source = regions
        super().__init__(root, split, manifest=manifest, on_error=on_error)

    def _read_index(self) -> pd.DataFrame:
        if len(self.findings) != 1:
            raise FormatError(self.manifest.get("config_path", self.name), f"expected one class, got {self.findings}",
                              field="classes")
        ids = self._read_split(self.file("split"))
        files = self.manifest["files"]
        suffix = ".png" if self.region_source == "masks" else ".json"
        self._regions_by_case: dict[str, list[Region]] = {}
        rows = []
        for case_id in ids:
            source = self.image_path(f"{case_id}{suffix}", key=self.region_source)
            if not source.is_file():
                raise MissingFileError(source, f"COVID-19 Rural {self.region_source[:-1]} of {case_id}",
                                       files[self.region_source].get("source"))
            image_path = self.image_path(f"{case_id}.jpg")
            if self.region_source == "masks":
                size = image_size(source)
                self._regions_by_case[case_id] = [EncodedMask(_mask_reader(source, image_path), source.name)]
            else:
                size, polygons = self._read_labelme(source)
                self._regions_by_case[case_id] = polygons
            rows.append({"case_id": case_id, "image_path": str(image_path), "height": size[0], "width": size[1],
                         "view": None, f"label:{self.findings[0]}": 1.0})
        return pd.DataFrame(rows, columns=["case_id", "image_path", "height", "width", "view",
                                           f"label:{self.findings[0]}"])

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        return {self.findings[0]: list(self._regions_by_case[str(row["case_id"])])}

    # -- readers --------------------------------------------------------------------
    def _read_split(self, path: Path) -> list[str]:
        header, rows = csv_records(path)
        if header != ["ID"]:
            raise FormatError(path, f"expected the single column 'ID', got header {header}", line=1, field="ID")
        ids: list[str] = []
        for line, row in rows:
            if len(row) != 1 or not _ID.match(row[0]):
                self.fail(path, f"expected one ID like COVID-19-AR-<patient>_<MM-DD-YYYY>-XR, got {row}",
                          line=line, field="ID", reason="bad ID")
            elif row[0] in ids:
                self.fail(path, f"duplicate ID {row[0]!r}", line=line, field="ID", reason="duplicate ID")
            else:
                ids.append(row[0])
        return ids

    def _read_labelme(self, path: Path) -> tuple[tuple[int, int], list[Region]]:
        """Image size and opacity polygons of one LabelMe file (``line`` = 1-based shape number)."""
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(path, f"not valid JSON: {exc}", line=getattr(exc, "lineno", None)) from exc
        size = (data.get("imageHeight"), data.get("imageWidth")) if isinstance(data, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
            raise FormatError(path, f"expected positive integers imageHeight / imageWidth, got {size}",
                              field="imageHeight/imageWidth")
        shapes = data.get("shapes")
        if not isinstance(shapes, list):
            raise FormatError(path, f"expected a list 'shapes', got {type(shapes).__name__}", field="shapes")
        outlines = set(self.manifest.get("lung_outline_labels") or [])
        polygons: list[Region] = []
        for number, shape in enumerate(shapes, start=1):
            if not isinstance(shape, dict) or not isinstance(shape.get("label"), str):
                self.fail(path, f"shape {number}: expected an object with a string 'label'", line=number,
                          field="label", reason="malformed shape")
                continue
            if shape["label"] in outlines:
                continue
            if shape.get("shape_type", "polygon") != "polygon":
                self.fail(path, f"shape {number} ({shape['label']}): shape_type {shape.get('shape_type')!r}, "
                          "expected 'polygon'", line=number, field="shape_type", reason="not a polygon")
                continue
            try:
                points = np.asarray(shape.get("points"), dtype=float)
            except (TypeError, ValueError):
                points = np.empty(0)
            if points.ndim != 2 or points.shape[1] != 2 or len(points) < 3 or not np.isfinite(points).all():
                self.fail(path, f"shape {number} ({shape['label']}): 'points' must be >= 3 finite [x, y]",
                          line=number, field="points", reason="malformed polygon")
                continue
            (x0, y0), (x1, y1) = points.min(axis=0), points.max(axis=0)
            try:
                validate_box(Box(x0, y0, x1, y1), size)
            except ValueError as exc:
                self.fail(path, f"shape {number} ({shape['label']}) leaves the {size[0]}x{size[1]} image: {exc}",
                          line=number, field="points", reason="polygon outside the image")
                continue
            polygons.append(Polygon(points))
        return (int(size[0]), int(size[1])), polygons


def _mask_reader(mask_path: Path, image_path: Path) -> Callable[[], np.ndarray]:
    """Lazy decoder of one binary PNG mask (values {0, 1}) → bool ``(H, W)`` (picklable: a dataset crosses to
    evaluation worker processes)."""
    return partial(_read_mask, mask_path, image_path)


def _read_mask(mask_path: Path, image_path: Path) -> np.ndarray:
    """The mask of :func:`_mask_reader`, read and checked now."""
    mask = read_mask(mask_path)  # bounded like the images (pixel count, PNG text); unreadable → FormatError
    if mask.ndim != 2:
        raise FormatError(mask_path, f"expected a single-channel mask, got shape {mask.shape}")
    values = np.unique(mask)
    if not np.isin(values, (0, 1)).all():
        raise FormatError(mask_path, f"expected mask values in {{0, 1}}, got {values[:10].tolist()}")
    if image_path.is_file() and image_size(image_path) != mask.shape:
        raise FormatError(mask_path, f"mask size {mask.shape} differs from the image {image_path.name} "
                          f"size {image_size(image_path)}")
    return mask.astype(bool)
