"""VinDr-CXR test set (PhysioNet v1.0.0): 3,000 DICOMs, boxes from a 5-reader consensus.

Files (relative to ``root``, as the manifest ``data_manifests/vindr_cxr.yaml`` says)
-----------------------------------------------------------------------------
``annotations/annotations_test.csv``
    One row per box: ``image_id,rad_id,class_name,x_min,y_min,x_max,y_max``.
    Boxes are ``xyxy`` floats in native DICOM pixels. ``No finding`` rows have
    empty coordinates. Columns are read by name; ``rad_id`` is optional
    (the test boxes are one consensus, so it carries no information here).
``annotations/image_labels_test.csv``
    One row per image: ``image_id`` and one 0/1 column per label. Its header
    spells some labels differently from the train file (``Other disease`` vs
    ``Other diseases``); the manifest's ``label_aliases`` maps them to the
    train spelling, and class names are then matched case-insensitively.
``test/<image_id>.dicom``
    The images (MONOCHROME1 and MONOCHROME2 mixed; see
    :func:`xbench.datasets.images.read_image`).

Conventions
-----------
* Cases: every image of the label file, in file order.
* Labels: from the label file (image-level consensus), not from "has a box".
* Regions: the boxes of the class, as :class:`~xbench.datasets.base.Box`
  (max exclusive, native pixels). The paper's 21 classes are the 22 local
  labels minus ``Edema`` (datasets.md §7); ``Edema`` boxes are read, checked and
  not kept (the manifest's ``ignored_classes``).
* Image size: **read from each DICOM header** (``Rows``, ``Columns``;
  ``stop_before_pixels``) while building the case table, because the table
  needs sizes and boxes are checked against them. So the images must be
  present even to build the table; a missing one raises
  :class:`~xbench.core.errors.MissingFileError` naming it.
* ``view`` is ``None`` (the annotation files do not give it).
* Errors name the file, the 1-based line and the column. With
  ``on_error="skip"`` a bad label row drops that image (and then its boxes,
  counted too); a bad box row drops that box only.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd

from ..core.errors import FormatError, MissingFileError, UnknownNameError
from .base import BaseDataset, Box, Region
from .images import image_size
from .records import csv_records
from .regions import validate_box

__all__ = ["VinDrCXR"]

_NO_FINDING = "No finding"
_BOX_FIELDS = ("x_min", "y_min", "x_max", "y_max")


class VinDrCXR(BaseDataset):
    """VinDr-CXR test split: 21 local findings with consensus boxes.

    Parameters
    ----------
    root, split, manifest, on_error
        See :class:`~xbench.datasets.base.BaseDataset`. Only ``split="test"``
        exists (the train split has 3 unfused readers per image).

    Attributes
    ----------
    image_labels : pandas.DataFrame
        The whole image-level label file, indexed by ``image_id``, columns renamed
        to the train-file spelling: all labels, including the global ones such as
        ``No finding`` and ``Other diseases`` (float 0.0 / 1.0).
    """

    def _read_index(self) -> pd.DataFrame:
        labels_path = self.file("labels")
        boxes_path = self.file("annotations")
        images = self.manifest["files"]["images"]

        self.image_labels = self._read_labels(labels_path)
        sizes: dict[str, tuple[int, int]] = {}
        paths: dict[str, Path] = {}
        for image_id in self.image_labels.index:
            path = self.image_path(f"{image_id}.dicom")
            if not path.is_file():
                raise MissingFileError(path, f"VinDr-CXR image {image_id} (its DICOM header gives the size)",
                                       images.get("source"))
            paths[image_id], sizes[image_id] = path, image_size(path)

        self._boxes = self._read_boxes(boxes_path, sizes)
        columns = [f"label:{f}" for f in self.findings]
        cases = pd.DataFrame({
            "case_id": list(self.image_labels.index),
            "image_path": [str(paths[i]) for i in self.image_labels.index],
            "height": [sizes[i][0] for i in self.image_labels.index],
            "width": [sizes[i][1] for i in self.image_labels.index],
            "view": [None] * len(self.image_labels),
        })
        labels = self.image_labels[self.findings].to_numpy(dtype=float)
        return pd.concat([cases, pd.DataFrame(labels, columns=columns)], axis=1)

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        found = self._boxes.get(str(row["case_id"]), {})
        return {f: list(found.get(f, [])) for f in self.findings}

    # -- readers --------------------------------------------------------------------
    def _read_labels(self, path: Path) -> pd.DataFrame:
        """``image_labels_test.csv`` → float table indexed by ``image_id`` (train spelling)."""
        header, rows = csv_records(path)
        aliases = {str(k).casefold(): str(v) for k, v in (self.manifest.get("label_aliases") or {}).items()}
        header = [aliases.get(name.casefold(), name) for name in header]
        if "image_id" not in header:
            raise FormatError(path, f"missing column; header: {header}", line=1, field="image_id")
        by_fold = {name.casefold(): name for name in header}
        for finding in self.findings:  # class names match the header case-insensitively
            if finding.casefold() not in by_fold:
                raise FormatError(path, f"no label column for class {finding!r}; header: {header}", line=1,
                                  field=finding)
        header = [next((f for f in self.findings if f.casefold() == name.casefold()), name) for name in header]
        label_names = [name for name in header if name not in ("image_id", "rad_id")]

        ids: list[str] = []
        seen: set[str] = set()
        values: list[list[float]] = []
        for line, row in rows:
            if len(row) != len(header):
                self.fail(path, f"expected {len(header)} fields, got {len(row)}", line=line,
                          reason="wrong number of fields")
                continue
            record = dict(zip(header, row))
            image_id = record["image_id"]
            if not image_id:
                self.fail(path, "empty image_id", line=line, field="image_id", reason="empty image_id")
                continue
            if image_id in seen:
                self.fail(path, f"duplicate image_id {image_id!r}", line=line, field="image_id",
                          reason="duplicate image_id")
                continue
            bad = next((n for n in label_names if record[n] not in _BINARY), None)
            if bad is not None:
                self.fail(path, f"label must be 0 or 1, got {record[bad]!r}", line=line, field=bad,
                          reason="label not 0/1")
                continue
            ids.append(image_id)
            seen.add(image_id)
            values.append([_BINARY[record[n]] for n in label_names])
        return pd.DataFrame(values, index=pd.Index(ids, name="image_id"), columns=label_names, dtype=float)

    def _read_boxes(self, path: Path, sizes: dict[str, tuple[int, int]]) -> dict[str, dict[str, list[Box]]]:
        """``annotations_test.csv`` → image_id → class → boxes (checked against the image size)."""
        header, rows = csv_records(path)
        for column in ("image_id", "class_name", *_BOX_FIELDS):
            if column not in header:
                raise FormatError(path, f"missing column; header: {header}", line=1, field=column)
        known = set(self.findings)
        ignored = set(self.manifest.get("ignored_classes") or [])
        boxes: dict[str, dict[str, list[Box]]] = defaultdict(lambda: defaultdict(list))
        for line, row in rows:
            if len(row) != len(header):
                self.fail(path, f"expected {len(header)} fields, got {len(row)}", line=line,
                          reason="wrong number of fields")
                continue
            record = dict(zip(header, row))
            image_id, name = record["image_id"], record["class_name"]
            if image_id not in sizes:
                self.fail(path, f"image {image_id!r} is not in the label file", line=line, field="image_id",
                          reason="box of an image absent from the label file")
                continue
            if name == _NO_FINDING:  # a row with empty coordinates
                continue
            if name not in known and name not in ignored:
                message = UnknownNameError("VinDr-CXR class", name, [*known, *ignored, _NO_FINDING]).message
                self.fail(path, message, line=line, field="class_name", reason="unknown class")
                continue
            bad = next((f for f in _BOX_FIELDS if not _is_number(record[f])), None)
            if bad is not None:
                self.fail(path, f"box coordinate {record[bad]!r} is not a number", line=line, field=bad,
                          reason="bad box coordinate")
                continue
            box = Box(*(float(record[f]) for f in _BOX_FIELDS))
            try:
                validate_box(box, sizes[image_id])
            except ValueError as exc:
                self.fail(path, f"{exc} (image {image_id}, size {sizes[image_id]})", line=line,
                          field="x_min/y_min/x_max/y_max", reason="invalid box")
                continue
            if name in known:
                boxes[image_id][name].append(box)
        return {image_id: dict(by_class) for image_id, by_class in boxes.items()}


_BINARY = {"0": 0.0, "1": 1.0, "0.0": 0.0, "1.0": 1.0}


def _is_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return value == value and abs(value) != float("inf")  # NaN / inf are not coordinates
