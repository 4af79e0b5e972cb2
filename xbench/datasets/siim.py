"""SIIM-ACR Pneumothorax Segmentation (2019): one class, run-length masks on 1024² DICOMs.

Files (relative to ``root``, as ``data_manifests/siim_acr.yaml`` says)
    ``siim-pneumothorax-train-rle.csv`` (or Kaggle's stage-1 ``train-rle.csv`` under that name)
        Header ``ImageId, EncodedPixels`` — the second name has a leading
        space and Kaggle's values may too, so names and values are stripped.
        ``-1`` = no pneumothorax. Several rows per image are separate
        instances/readers and are **united** (as torchxrayvision, LoVT and
        MedKLIP do): each non-empty row is one
        :class:`~xbench.datasets.base.EncodedMask` decoded lazily with
        :func:`~xbench.datasets.regions.decode_siim_rle` (relative,
        column-major RLE; not Kaggle's stage-2 absolute RLE).
    ``lovt_split/test.csv`` (split ``test`` only)
        LoVT test list (header ``ID``).
    ``dicom-images-train/``
        DICOMs nested as ``<StudyInstanceUID>/<SeriesInstanceUID>/<ImageId>.dcm``;
        found by file name through a recursive index built once, on the first
        image read (:class:`~xbench.datasets.images.ImageFolder`).
        ``image_path`` in the case table is the flat ``dicom-images-train/<ImageId>.dcm``.

Splits: ``test`` (2,409; 515 positive) and ``all`` (every image of the RLE file).
Labels: 1 if any row of the image has a mask, else 0. Size: the manifest's
``image_size`` (1024×1024). View: ``None``.

Errors (``on_error``): a row without 2 fields or an RLE that does not parse
(checked when the table is built, without decoding) raises
:class:`~xbench.core.errors.FormatError` naming file and 1-based line, or drops
the row and counts it; a split ID missing from the RLE file likewise.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from ..core.errors import FormatError
from ..spec.manifests import file_entries
from .base import BaseDataset, EncodedMask, Region
from .records import csv_records
from .regions import decode_siim_rle, siim_rle_runs

__all__ = ["SIIMPneumothorax"]


class SIIMPneumothorax(BaseDataset):
    """SIIM-ACR pneumothorax masks (module docstring); single class from the manifest."""

    nested_images = True

    def _read_index(self) -> pd.DataFrame:
        rle_path = self.file("masks")
        entries = file_entries(self.manifest, self.split)
        split_path = self.file("split_list") if "split_list" in entries else None
        height, width = (int(v) for v in self.manifest.get("image_size", (1024, 1024)))
        (finding,) = self.findings
        header, rows = csv_records(rle_path)
        if header[:2] != ["ImageId", "EncodedPixels"]:
            raise FormatError(rle_path, f"expected header 'ImageId, EncodedPixels', got {','.join(header)!r}", line=1)
        masks: dict[str, list[Region]] = {}
        for line, fields in rows:
            if len(fields) != 2 or not fields[0]:
                self.fail(rle_path, f"expected 2 fields (ImageId, EncodedPixels), got {len(fields)}", line=line, reason="malformed row")
                continue
            image_id, rle = fields
            try:
                siim_rle_runs(rle, height, width)
            except ValueError as exc:
                self.fail(rle_path, f"bad RLE: {exc}", line=line, field="EncodedPixels", reason="bad RLE")
                continue
            masks.setdefault(image_id, [])
            if rle != "-1":
                decode = partial(decode_siim_rle, rle, height, width)
                masks[image_id].append(EncodedMask(decode, description=f"{rle_path.name}, line {line}"))
        ids = self._split_ids(split_path, masks) if split_path is not None else list(masks)
        self._masks = {image_id: {finding: masks[image_id]} for image_id in ids}
        return pd.DataFrame({
            "case_id": ids,
            "image_path": [str(self.image_path(f"{image_id}.dcm")) for image_id in ids],
            "height": height,
            "width": width,
            "view": None,
            f"label:{finding}": [float(bool(masks[image_id])) for image_id in ids],
        })

    def _split_ids(self, path: Path, known: dict[str, list[Region]]) -> list[str]:
        header, rows = csv_records(path)
        if not header or header[0] != "ID":
            raise FormatError(path, f"expected a first column 'ID', got {','.join(header)!r}", line=1)
        ids: list[str] = []
        for line, fields in rows:
            if fields[0] not in known:
                self.fail(path, f"ImageId {fields[0]!r} is not in the RLE file", line=line, field="ID", reason="unknown ID")
                continue
            ids.append(fields[0])
        return list(dict.fromkeys(ids))  # first occurrence order, duplicates dropped

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        return self._masks[str(row["case_id"])]
