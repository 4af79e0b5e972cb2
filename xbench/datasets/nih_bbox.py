"""NIH ChestX-ray14 bounding-box subset: 880 images, 984 boxes, 8 classes.

Files (relative to ``root``, as ``data_manifests/nih_bbox.yaml`` says)
    ``BBox_List_2017.csv``
        Header ``Image Index,Finding Label,Bbox [x,y,w,h],,,`` (malformed:
        9 header fields, 6 per row); read **positionally** as
        ``image, label, x, y, w, h``. Boxes are xywh floats on the 1024×1024
        PNG grid → :class:`~xbench.datasets.base.Box` ``(x, y, x + w, y + h)``.
        The file spells ``Infiltrate``.
    ``Data_Entry_2017_v2020.csv``
        Image-level NLP labels (``Finding Labels`` joined by ``|``) and
        ``View Position``; read positionally (columns 0, 1, 6) because the
        header has embedded commas. It spells ``Infiltration``: the manifest
        lists it as an alias of the class ``Infiltrate``.
    ``images/``
        The PNGs, either flat (``images/<Image Index>``, as NIH's tarballs
        unpack) or in nested folders such as ``images/images_001/images/``
        (Kaggle's layout); nested files are found through a recursive index
        built once, on the first image read (:class:`~xbench.datasets.images.ImageFolder`).
        ``image_path`` in the case table is the flat location.

Cases and labels
    One case per image of the box file (880). For AUC the label of a class is
    1 if the class (or its alias) is in the image's ``Finding Labels`` **or**
    the image has a box for it, else 0 — negatives come from ``Data_Entry``,
    not from "no box" (datasets.md §6: unboxed positives would otherwise be
    false negatives). Image size is the manifest's ``image_size`` (1024×1024,
    the released PNG grid the boxes live on; ``Data_Entry``'s
    ``OriginalImage`` columns are the pre-release DICOM size).

Errors (``on_error``)
    A row with fewer than 6 fields, non-numeric box values, an unknown class,
    a box outside the image, a second box for the same (image, class), or an
    image missing from ``Data_Entry`` raises :class:`~xbench.core.errors.FormatError`
    naming the box file and 1-based line, or drops the row / image and counts it.
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from ..core.errors import FormatError
from ..spec.manifests import class_lookup
from .base import BaseDataset, Box, Region
from .records import csv_records
from .regions import validate_box

__all__ = ["NIHBoxes"]


class NIHBoxes(BaseDataset):
    """NIH ChestX-ray14 boxes with Data_Entry labels (module docstring)."""

    nested_images = True

    def _read_index(self) -> pd.DataFrame:
        box_path, label_path = self.file("boxes"), self.file("labels")
        size = tuple(int(v) for v in self.manifest.get("image_size", (1024, 1024)))
        lookup = class_lookup(self.manifest)
        header, rows = csv_records(box_path)
        if [h.strip() for h in header[:2]] != ["Image Index", "Finding Label"]:
            raise FormatError(box_path, f"expected a header starting 'Image Index,Finding Label', got {','.join(header)!r}", line=1)
        boxes: dict[str, dict[str, list[Region]]] = defaultdict(lambda: {f: [] for f in self.findings})
        first_line: dict[str, int] = {}
        for line, fields in rows:
            if len(fields) < 6 or any(v != "" for v in fields[6:]):
                self.fail(box_path, f"expected 6 fields (image, label, x, y, w, h), got {len(fields)}", line=line, reason="malformed row")
                continue
            image, label = fields[0], fields[1]
            if label not in lookup:
                self.fail(box_path, f"unknown class {label!r}; classes are {sorted(lookup)}", line=line, field="Finding Label",
                          reason="unknown class")
                continue
            try:
                x, y, w, h = (float(v) for v in fields[2:6])
                box = Box(x, y, x + w, y + h)
                validate_box(box, size)
            except ValueError as exc:
                self.fail(box_path, str(exc), line=line, field="Bbox [x,y,w,h]", reason="bad box")
                continue
            name = lookup[label]
            if boxes[image][name]:
                self.fail(box_path, f"second box for ({image}, {name}); NIH has one box per finding", line=line, reason="duplicate box")
                continue
            boxes[image][name].append(box)
            first_line.setdefault(image, line)
        entry = self._data_entry(label_path, set(boxes))
        table = []
        for image, regions in boxes.items():
            if image not in entry.index:
                self.fail(box_path, f"image {image!r} is not in {label_path.name}", line=first_line[image], field="Image Index",
                          reason="image missing from Data_Entry")
                continue
            found = {lookup.get(t) for t in str(entry.at[image, "labels"]).split("|")}
            row = {"case_id": image, "image_path": str(self.image_path(image)), "height": size[0], "width": size[1],
                   "view": entry.at[image, "view"] or None}
            row.update({f"label:{f}": float(f in found or bool(regions[f])) for f in self.findings})
            table.append(row)
        self._boxes = dict(boxes)
        return pd.DataFrame(table, columns=["case_id", "image_path", "height", "width", "view"] + [f"label:{f}" for f in self.findings])

    @staticmethod
    def _data_entry(path, images: set[str]) -> pd.DataFrame:
        """``labels`` and ``view`` of the given images, indexed by Image Index."""
        try:
            table = pd.read_csv(path, usecols=[0, 1, 6], header=0, dtype=str, keep_default_na=False)
        except (ValueError, pd.errors.ParserError) as exc:
            raise FormatError(path, f"cannot read columns 1, 2 and 7 (Image Index, Finding Labels, View Position): {exc}") from exc
        table.columns = ["image", "labels", "view"]
        table = table[table["image"].isin(images)]
        return table.drop_duplicates("image").set_index("image")

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        return self._boxes[str(row["case_id"])]
