"""A generic case-table loader: the synthetic stand-ins of the GPU benchmark (``benchmarks/bench_gpu.py``).

``<root>/cases.csv`` has the columns ``case_id, image, height, width``, one ``label:<finding>``
column per class of the manifest (1 / 0 / empty = unknown) and ``boxes``: JSON
``{finding: [[x_min, y_min, x_max, y_max], ...]}`` in original pixels. ``image`` is relative to
the root. The manifest is an ordinary one (``classes``, ``files.cases``) with
``class: xbench.datasets.standin:CaseTable``; option ``cases: N`` keeps the first N rows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from .base import BaseDataset, Box, Region


class CaseTable(BaseDataset):
    """Cases listed in ``cases.csv`` (see the module docstring)."""

    def __init__(self, root: str | Path, split: str = "test", *, manifest: dict[str, Any], cases: int | None = None,
                 on_error: str = "raise"):
        self._limit = cases
        super().__init__(root, split, manifest=manifest, on_error=on_error)

    def _read_index(self) -> pd.DataFrame:
        path = self.file("cases")
        table = pd.read_csv(path, dtype={"case_id": str, "image": str, "boxes": str}, keep_default_na=False,
                            na_values={f"label:{f}": [""] for f in self.findings})
        missing = [c for c in ("case_id", "image", "height", "width", "boxes", *(f"label:{f}" for f in self.findings))
                   if c not in table.columns]
        if missing:
            self.fail(path, f"missing column(s) {missing}", line=1)
        if self._limit is not None:
            table = table.iloc[: int(self._limit)]
        table = table.assign(image_path=[str(self.root / p) for p in table["image"]], view=None)
        return table.reset_index(drop=True)

    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        raw = json.loads(row["boxes"] or "{}")
        return {f: [Box(*map(float, b)) for b in raw.get(f, [])] for f in self.findings}
