"""RSNA Pneumonia Detection Challenge (2018): one class, boxes on 1024² DICOMs.

Files (relative to ``root``, as ``data_manifests/rsna_pneumonia.yaml`` says)
    ``stage_2_train_labels.csv``
        ``patientId,x,y,width,height,Target``, **one row per box**: a positive
        image (``Target=1``, "Lung Opacity") has 1–4 rows with xywh floats on
        the 1024×1024 grid; a negative image has one row with empty
        coordinates and ``Target=0``. Box → :class:`~xbench.datasets.base.Box`
        ``(x, y, x + width, y + height)``.
    ``lovt_split/test.csv`` (split ``test`` only)
        LoVT / MedKLIP test list (``ID,boxes,classes``); only ``ID`` is used —
        the boxes come from the labels file.
    ``stage_2_train_images/<patientId>.dcm``
        The DICOMs (read only by :meth:`Sample.image`).

Splits: ``test`` = the IDs of the split list (5,337; 1,218 positive);
``all`` = every labelled image (26,684; 6,012 positive; 9,555 boxes).

Labels: ``Pneumonia`` = ``Target`` (1 / 0). Size: the manifest's ``image_size``
(1024×1024). View: not in the CSV (``None``).

Errors (``on_error``): a row without 6 fields, a non-numeric or partial box,
``Target`` not 0/1, a positive row without a box, a negative row with one, a
box outside the image, or a split ID missing from the labels file raises
:class:`~xbench.core.errors.FormatError` naming file and 1-based line, or drops
the row (the ID) and counts it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.errors import FormatError
from ..spec.manifests import file_entries
from .base import BaseDataset, Box, Region
from .records import csv_records
from .regions import validate_box

__all__ = ["RSNAPneumonia"]

_HEADER = ["patientId", "x", "y", "width", "height", "Target"]


class RSNAPneumonia(BaseDataset):
    """RSNA pneumonia boxes (module docstring); single class from the manifest."""

    def _read_index(self) -> pd.DataFrame:
        labels_path = self.file("labels")
        entries = file_entries(self.manifest, self.split)
        split_path = self.file("split_list") if "split_list" in entries else None
        size = tuple(int(v) for v in self.manifest.get("image_size", (1024, 1024)))
        (finding,) = self.findings
        header, rows = csv_records(labels_path)
        if header[: len(_HEADER)] != _HEADER:
            raise FormatError(labels_path, f"expected header {','.join(_HEADER)}, got {','.join(header)}", line=1)
        target: dict[str, float] = {}
        boxes: dict[str, list[Region]] = {}
        for line, fields in rows:
            if len(fields) != 6:
                self.fail(labels_path, f"expected 6 fields, got {len(fields)}", line=line, reason="malformed row")
                continue
            pid, coords, flag = fields[0], fields[1:5], fields[5]
            if flag not in ("0", "1"):
                self.fail(labels_path, f"Target must be 0 or 1, got {flag!r}", line=line, field="Target", reason="malformed row")
                continue
            boxes.setdefault(pid, [])
            target[pid] = max(target.get(pid, 0.0), float(flag))
            if all(v == "" for v in coords):
                if flag == "1":
                    self.fail(labels_path, "Target=1 row without a box", line=line, field="x", reason="malformed row")
                continue
            try:
                if flag == "0":
                    raise ValueError("Target=0 row with a box")
                x, y, w, h = (float(v) for v in coords)
                box = Box(x, y, x + w, y + h)
                validate_box(box, size)
            except ValueError as exc:
                self.fail(labels_path, str(exc), line=line, field="x,y,width,height", reason="bad box")
                continue
            boxes[pid].append(box)
        ids = self._split_ids(split_path, labels_path, target) if split_path is not None else list(target)
        self._boxes = {pid: {finding: boxes[pid]} for pid in ids}
        return pd.DataFrame({
            "case_id": ids,
            "image_path": [str(self.image_path(f"{pid}.dcm")) for pid in ids],
            "height": size[0],
            "width": size[1],
            "view": None,
            f"label:{finding}": [target[pid] for pid in ids],
        })

    def _split_ids(self, path: Path, labels_path: Path, known: dict[str, float]) -> list[str]:
        header, rows = csv_records(path)
        if not header or header[0] != "ID":
            raise FormatError(path, f"expected a first column 'ID', got {','.join(header)!r}", line=1)
        ids: list[str] = []
        seen: set[str] = set()
        for line, fields in rows:
            pid = fields[0]
            if pid not in known:
                self.fail(path, f"patientId {pid!r} is not in {labels_path.name}", line=line, field="ID", reason="unknown ID")
                continue
            if pid not in seen:
                seen.add(pid)
                ids.append(pid)
        return ids

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        return self._boxes[str(row["case_id"])]
