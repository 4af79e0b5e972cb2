"""The results store: per-case scores and native-grid maps, written atomically per chunk.

Layout under a run's output folder::

    store/<dataset>/<model>/meta.json           what produced the chunks (config, code version, findings)
    store/<dataset>/<model>/chunk-00003.npz     case_ids, scores (N, C) float32, probs (N, C) float32,
                                                 maps (N, C, h, w) float16, sizes (N, 2), windows (N, 4),
                                                 skipped_ids, skipped_reasons

Cases are split into fixed chunks of ``chunk_size`` consecutive dataset rows.
A chunk file is written to a temporary name and renamed (atomic on POSIX), so an
interrupted run loses at most the chunk in flight and a re-run skips every chunk
already present. ``.npz`` is plain NumPy: ``np.load(path)`` inspects it.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import XBenchError

STORE_VERSION = 1


@dataclass
class StoredPredictions:
    """All chunks of one (dataset, model), concatenated in dataset row order."""

    case_ids: np.ndarray  # (N,) str
    scores: np.ndarray  # (N, C) float32, the model's raw score
    probs: np.ndarray  # (N, C) float32, probability used for F1 / accuracy
    maps: np.ndarray  # (N, C, h, w) float16, native grid
    sizes: np.ndarray  # (N, 2) int, (H, W) of each image as read
    windows: np.ndarray  # (N, 4) float, (y0, x0, y1, x1): the part of the image the model input covers
    skipped: dict[str, str]  # case_id -> reason
    meta: dict[str, Any]


class ResultStore:
    """Read/write access to ``<output_dir>/store``."""

    def __init__(self, output_dir: str | Path):
        self.root = Path(output_dir) / "store"

    def folder(self, dataset: str, model: str) -> Path:
        return self.root / dataset / model

    def chunk_path(self, dataset: str, model: str, chunk: int) -> Path:
        return self.folder(dataset, model) / f"chunk-{chunk:05d}.npz"

    # -- meta --------------------------------------------------------------------------
    def prepare(self, dataset: str, model: str, meta: dict[str, Any], *, overwrite: bool = False) -> None:
        """Create the folder and write ``meta.json``; refuse to mix chunks from another configuration."""
        folder = self.folder(dataset, model)
        path = folder / "meta.json"
        meta = {**meta, "store_version": STORE_VERSION}
        if path.exists() and not overwrite:
            old = json.loads(path.read_text())
            keys = sorted(k for k in meta if k in old and k not in ("code_version", "created") and old[k] != meta[k])
            if keys:
                raise XBenchError(
                    f"{folder} holds results of a different configuration (differs in {', '.join(keys)}); "
                    "use another output_dir or pass overwrite=True / --overwrite to recompute."
                )
            return
        if overwrite and folder.exists():
            for old_chunk in folder.glob("chunk-*.npz"):
                old_chunk.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(path, json.dumps(meta, indent=1, sort_keys=True, default=str).encode())

    def meta(self, dataset: str, model: str) -> dict[str, Any]:
        path = self.folder(dataset, model) / "meta.json"
        if not path.exists():
            raise XBenchError(f"No results for dataset {dataset!r} × model {model!r} under {self.root} (missing {path}).")
        return json.loads(path.read_text())

    # -- chunks ------------------------------------------------------------------------
    def has_chunk(self, dataset: str, model: str, chunk: int) -> bool:
        return self.chunk_path(dataset, model, chunk).exists()

    def write_chunk(self, dataset: str, model: str, chunk: int, *, case_ids: Iterable[str], scores: np.ndarray,
                    probs: np.ndarray, maps: np.ndarray, skipped: dict[str, str], sizes: np.ndarray | None = None,
                    windows: np.ndarray | None = None) -> Path:
        """Write one chunk atomically (temporary file + rename).

        Maps are stored as float16 unless given as float32 (run config ``map_dtype: float32``).

        ``sizes`` / ``windows`` default to "unknown size, whole image" (NaN), which the
        evaluation treats as a plain resize of the whole image.
        """
        path = self.chunk_path(dataset, model, chunk)
        ids = np.asarray(list(case_ids), dtype=str)
        sizes = np.full((len(ids), 2), -1, np.int64) if sizes is None else np.asarray(sizes, np.int64)
        windows = np.full((len(ids), 4), np.nan) if windows is None else np.asarray(windows, np.float64)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
        os.close(fd)
        try:
            np.savez(tmp, case_ids=ids, scores=np.asarray(scores, np.float32), probs=np.asarray(probs, np.float32),
                     maps=np.asarray(maps, np.float32 if np.asarray(maps).dtype == np.float32 else np.float16), sizes=sizes, windows=windows, skipped_ids=np.asarray(list(skipped), dtype=str),
                     skipped_reasons=np.asarray(list(skipped.values()), dtype=str))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def chunks(self, dataset: str, model: str) -> list[Path]:
        return sorted(self.folder(dataset, model).glob("chunk-*.npz"))

    def read(self, dataset: str, model: str, *, expected_chunks: int | None = None) -> StoredPredictions:
        """Concatenate every chunk; with ``expected_chunks`` a missing chunk is an error naming it."""
        meta = self.meta(dataset, model)
        files = self.chunks(dataset, model)
        if expected_chunks is not None:
            missing = sorted(set(range(expected_chunks)) - {int(f.stem.split("-")[1]) for f in files})
            extra = sorted({int(f.stem.split("-")[1]) for f in files} - set(range(expected_chunks)))
            if extra:
                raise XBenchError(
                    f"{self.folder(dataset, model)}: chunks {extra[:10]} lie beyond the {expected_chunks} chunks of this "
                    "dataset — the store was filled with another dataset size or chunk_size; use --overwrite."
                )
            if missing:
                raise XBenchError(
                    f"{self.folder(dataset, model)}: chunks {missing[:10]} of {expected_chunks} are missing — "
                    "run the remaining shards (or `xbench run` again to resume) before computing metrics."
                )
        parts = [np.load(f) for f in files]
        n_cls, grid = len(meta["findings"]), tuple(meta["grid"])
        if not parts:
            empty = np.zeros((0, n_cls), np.float32)
            return StoredPredictions(np.zeros(0, str), empty, empty, np.zeros((0, n_cls, *grid), np.float16),
                                     np.zeros((0, 2), np.int64), np.zeros((0, 4)), {}, meta)
        skipped: dict[str, str] = {}
        for p in parts:
            skipped.update(zip(p["skipped_ids"].tolist(), p["skipped_reasons"].tolist()))
        return StoredPredictions(
            case_ids=np.concatenate([p["case_ids"] for p in parts]),
            scores=np.concatenate([p["scores"] for p in parts]),
            probs=np.concatenate([p["probs"] for p in parts]),
            maps=np.concatenate([p["maps"] for p in parts]),
            sizes=np.concatenate([p["sizes"] if "sizes" in p.files else np.full((len(p["case_ids"]), 2), -1) for p in parts]),
            windows=np.concatenate([p["windows"] if "windows" in p.files else np.full((len(p["case_ids"]), 4), np.nan)
                                    for p in parts]),
            skipped=skipped,
            meta=meta,
        )


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_table(df: "Any", path_stem: str | Path) -> list[Path]:
    """Write a DataFrame as ``<stem>.csv`` and ``<stem>.parquet`` (atomically); returns the paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for suffix, writer in ((".csv", lambda p: df.to_csv(p, index=False)), (".parquet", lambda p: df.to_parquet(p, index=False))):
        final = stem.with_suffix(suffix)
        tmp = final.with_name(final.name + ".tmp")
        writer(tmp)
        os.replace(tmp, final)
        out.append(final)
    return out
