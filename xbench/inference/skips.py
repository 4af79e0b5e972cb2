"""Skipped and unreadable cases, named where a user looks.

Under ``on_missing_image: skip`` a run leaves out the cases whose image is missing or cannot be decoded.
:func:`skip_records` turns a pair's skipped cases into rows (dataset, model, case id, reason, file,
message); :func:`first_examples` keeps the first few per reason for the log line and ``run_log.json``;
:func:`write_skips_csv` writes all of them to ``<output_dir>/skipped_cases.csv``.

:func:`decode_all` (``xbench check --deep``) decodes every present image of a dataset, in parallel
threads, and returns the unreadable ones: existence alone (``xbench check``) does not find a truncated or
corrupt file.

Examples
--------
>>> rows = skip_records("nih", "clip", {"a": "FormatError: a.png: not an image", "b": "MissingFileError: gone"},
...                     {"a": "a.png", "b": "b.png"})
>>> [(r["case_id"], r["reason"], r["file"]) for r in rows]
[('a', 'FormatError', 'a.png'), ('b', 'MissingFileError', 'b.png')]
>>> first_examples(rows, k=1)["FormatError"]
[{'case_id': 'a', 'file': 'a.png', 'message': 'a.png: not an image'}]
>>> format_examples(first_examples(rows, k=1))
'FormatError 1 (first: a a.png: a.png: not an image); MissingFileError 1 (first: b b.png: gone)'
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..core.atomic import atomic_write_bytes

__all__ = ["SKIP_COLUMNS", "skip_records", "first_examples", "format_examples", "write_skips_csv", "decode_all"]

#: columns of ``skipped_cases.csv`` (and of :func:`decode_all`'s rows, model empty)
SKIP_COLUMNS = ("dataset", "model", "case_id", "reason", "file", "message")


def skip_records(dataset: str, model: str, skipped: Mapping[str, str], files: Mapping[str, str]) -> list[dict[str, str]]:
    """Rows of :data:`SKIP_COLUMNS` for ``skipped`` (case id → ``"ErrorType: message"``, as the store keeps
    them); ``files`` maps case id → image path."""
    rows = []
    for case_id, text in skipped.items():
        reason, _, message = str(text).partition(": ")
        rows.append({"dataset": dataset, "model": model, "case_id": str(case_id), "reason": reason,
                     "file": str(files.get(str(case_id), "")), "message": message})
    return rows


def first_examples(rows: list[dict[str, str]], k: int = 3) -> dict[str, list[dict[str, str]]]:
    """Reason → its first ``k`` rows (case id, file, message), reasons in order of first appearance."""
    out: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        group = out.setdefault(row["reason"], [])
        if len(group) < k:
            group.append({"case_id": row["case_id"], "file": row["file"], "message": row["message"]})
    return out


def format_examples(examples: Mapping[str, list[dict[str, str]]], counts: Mapping[str, int] | None = None) -> str:
    """One line: per reason its count and first case (id, file, message)."""
    parts = []
    for reason, group in examples.items():
        n = (counts or {}).get(reason, len(group))
        first = group[0]
        parts.append(f"{reason} {n} (first: {first['case_id']} {first['file']}: {first['message']})")
    return "; ".join(parts)


def write_skips_csv(path: str | Path, rows: list[dict[str, str]]) -> Path:
    """Write every skipped case to ``path`` (CSV of :data:`SKIP_COLUMNS`, written atomically)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SKIP_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_bytes(Path(path), buffer.getvalue().encode())
    return Path(path)


def _decode(ds: Any, row: int) -> str | None:
    """``"ErrorType: message"`` when the image of row ``row`` cannot be read, else None."""
    try:
        ds[row].image()
    except Exception as exc:  # noqa: BLE001 - any decoder failure (FormatError, MissingFileError, ...) is the finding
        return f"{type(exc).__name__}: {exc}"
    return None


def decode_all(ds: Any, dataset: str, *, missing: set[str] | frozenset[str] = frozenset(),
               workers: int | None = None) -> tuple[int, list[dict[str, str]]]:
    """Decode every image of loaded dataset ``ds`` whose case id is not in ``missing`` (known absent) with
    ``workers`` threads (default: CPU count, at most 8; decoders release the GIL). Returns ``(decoded,
    unreadable rows)``, the rows in :data:`SKIP_COLUMNS` (model empty) in case order."""
    import os

    ids = ds.cases["case_id"].astype(str).tolist()
    paths = ds.cases["image_path"].astype(str).tolist()
    rows = [i for i, c in enumerate(ids) if c not in missing]
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda r: _decode(ds, r), rows))
    bad = {ids[r]: text for r, text in zip(rows, results) if text is not None}
    return len(rows) - len(bad), skip_records(dataset, "", bad, dict(zip(ids, paths)))
