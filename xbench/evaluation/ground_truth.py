"""Ground truth of a dataset at the evaluation grid: rasterised once per (dataset, grid), in parallel, cached.

Conventions
-----------
* **What is a grounding pair.** A positive (case, finding) whose drawn region is non-empty at the grid. Positives
  without a region (or with one that vanishes at the grid) are counted (``no_region``), not scored. Classes marked
  ``localized: false`` in the manifest (recognition-only) have no entry.
* **Order.** Rows of each finding are ascending dataset rows; the masks are ``sample.mask(finding, grid)`` of
  those rows, whether rasterised serially or by a process pool over chunks of rows (chunks are concatenated in
  row order, so the masks are the same bits either way).
* **Cache.** ``<output_dir>/cache/ground_truth/<dataset>-<split>-<H>x<W>-<options digest>.npz`` holds the rows,
  the masks (bit-packed) and the counts, with the key they were made from (:func:`ground_truth_key`: dataset,
  split, options, grid, manifest classes, annotation files' sha256, the case table's digest and the source of the
  rasterising code) and a sha256 of the payload. A file is served only when its key equals the current key and
  its payload hashes to the stored digest; otherwise it is *stale* or *damaged*, and is recomputed and
  rewritten (atomically, :mod:`xbench.core.atomic`), never served. It is read only as a regular file inside its
  folder, with bounded decompression (:func:`xbench.core.safe_arrays.read_npz`: a member that declares more than
  the archive may expand to is refused before anything is allocated); a damaged file is one warning line, counted
  in :data:`DAMAGED`.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import pickle
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write
from ..core.logs import progress_bar, progress_iter
from ..core.version import __version__
from ..core.errors import FormatError, XBenchError
from ..core.files import regular_size
from ..core.safe_arrays import read_npz
from ..core.workers import capture_warnings, replay_warnings, round_trips
from ..datasets import BaseDataset
from ..datasets.regions import Region, rasterize
from .worker_state import State, apply_state, process_state

__all__ = ["GroundTruth", "ground_truth", "rasterize_stack", "shippable", "ground_truth_key", "cache_file", "cached_ground_truth", "ground_truth_file", "read_cache",
           "write_cache", "CACHE_FORMAT", "MIN_CHUNK"]

log = logging.getLogger("xbench.evaluation")

#: damaged ground-truth cache files met by this process (each logged as a warning, recomputed and rewritten)
DAMAGED: list[str] = []
CACHE_FORMAT = 1  #: layout of the cache file; a change makes every older file stale
MIN_CHUNK = 64  #: fewest positive cases per pool job (smaller datasets are rasterised in the calling process)


class GroundTruth(NamedTuple):
    """Grounding pairs of one finding: dataset rows, their masks at the grid, positives left out."""

    rows: np.ndarray  # (n,) int row indices into the dataset
    masks: np.ndarray  # (n, *grid) bool
    no_region: int  # positive cases without a region (or with one that vanishes at the grid)


def _localized(dataset: BaseDataset) -> list[str]:
    """Findings with grounding pairs (all but the manifest's ``localized: false`` classes), in dataset order."""
    localized = {c["name"]: c.get("localized", True) for c in dataset.manifest.get("classes", [])}
    return [f for f in dataset.findings if localized.get(f, True)]


def rasterize_stack(regions: Sequence[Sequence[Region]], size: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
    """Bool masks ``(n, *grid)``: :func:`~xbench.datasets.regions.rasterize` of ``n`` region lists drawn on images
    of one ``size`` (a pool job of pairs that share an image size, e.g. ``benchmarks/bench_evaluate.py``)."""
    return np.stack([rasterize(r, size, grid) for r in regions]) if len(regions) else np.zeros((0, *grid), bool)


def _rasterise_rows(dataset: BaseDataset, rows: np.ndarray, grid: tuple[int, int],
                    findings: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Finding → (rows with a non-empty region at the grid, their bool masks) for ``rows`` in the given order."""
    found: dict[str, tuple[list[int], list[np.ndarray]]] = {f: ([], []) for f in findings}
    for r in rows:
        sample = dataset[int(r)]
        for f, (idx, masks) in found.items():
            if sample.labels.get(f) == 1 and sample.regions.get(f):
                mask = sample.mask(f, grid)
                if mask.any():
                    idx.append(int(r))
                    masks.append(mask)
    return {f: (np.asarray(idx, int), np.stack(masks) if masks else np.zeros((0, *grid), bool))
            for f, (idx, masks) in found.items()}


def _rasterise_job(state: State, dataset: BaseDataset, name: str, rows: np.ndarray, grid: tuple[int, int],
                   findings: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`_rasterise_rows` in a worker, after the parent's state is installed, its masks bit-packed
    (:func:`_pack_masks`: an eighth of the bytes to send back and for the parent to join). An error comes back as
    itself (XBench errors name their file and line), or, when it cannot cross the process boundary intact, as an
    :class:`~xbench.core.errors.XBenchError` naming the dataset and rows."""
    try:
        apply_state(state)
        return {f: (idx, _pack_masks(masks)) for f, (idx, masks) in _rasterise_rows(dataset, rows, grid, findings).items()}
    except Exception as exc:
        if round_trips(exc):
            raise
        raise XBenchError(f"{name}: ground truth of dataset rows {rows[0]}–{rows[-1]}: {type(exc).__name__}: "
                          f"{exc}") from exc


def _pack_masks(masks: np.ndarray) -> np.ndarray:
    """Bool masks ``(n, H, W)`` → ``(n, ceil(H·W / 8))`` uint8, each mask's bits in row-major order (``np.packbits``)."""
    masks = np.asarray(masks, bool)
    return np.packbits(masks.reshape(len(masks), int(np.prod(masks.shape[1:]))), axis=1)


def _unpack_masks(bits: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """:func:`_pack_masks` undone: ``(n, *grid)`` bool."""
    return np.unpackbits(bits, axis=1, count=grid[0] * grid[1]).astype(bool).reshape(len(bits), *grid)


def shippable(dataset: BaseDataset) -> tuple[State, BaseDataset] | None:
    """``(parent state, dataset)`` for worker jobs once both are known to pickle, or None (with a log line saying why) when either
    cannot be pickled: then the dataset is handled in the calling process."""
    state, why = process_state()
    if state is not None:
        try:
            pickle.dumps(dataset)  # the pool pickles it for every job; refused here, it stays in this process
            return state, dataset
        except Exception as exc:  # PicklingError, TypeError, AttributeError ("Can't pickle local object")
            why = f"the dataset cannot be pickled ({type(exc).__name__}: {exc})"
    else:
        why = f"the metric table or config folders cannot be pickled ({why})"
    log.info("%s: evaluated in this process, not in workers: %s", dataset.name, why)
    return None


def ground_truth(dataset: BaseDataset, grid: tuple[int, int], *, progress: bool = True,
                 pool: Executor | None = None, workers: int = 1, warning_registry: dict | None = None,
                 shipped: tuple[State, BaseDataset] | None = None) -> dict[str, GroundTruth]:
    """Finding → :class:`GroundTruth` (row indices, bool masks ``(n, *grid)``, positives without a region).

    With a ``pool`` of ``workers`` processes the positive cases are split into chunks of consecutive rows
    (at least :data:`MIN_CHUNK`, about four per worker) rasterised in the pool and concatenated in row order:
    the same masks, bit for bit, as the serial loop. Without a pool (or with a single chunk) it runs here.
    Warnings of the pool's jobs are raised here (``warning_registry``: see
    :func:`~xbench.core.workers.replay_warnings`). ``shipped``: :func:`shippable` of the dataset, if the
    caller made it already.
    """
    arrays = _pool_arrays(dataset, grid, progress=progress, pool=pool, workers=workers,
                          warning_registry=warning_registry, shipped=shipped)
    if arrays is not None:
        return unpack_cache(arrays, {"grid": list(grid)})
    findings = _localized(dataset)
    labels = dataset.labels()
    rows = np.flatnonzero((labels == 1).any(axis=1))
    found = _rasterise_rows(dataset, progress_iter(rows, desc=f"ground truth {dataset.name}", unit="case",
                                                   disable=not progress), grid, findings)
    return {f: GroundTruth(idx.astype(int), masks, int((labels[:, dataset.findings.index(f)] == 1).sum()) - len(idx))
            for f, (idx, masks) in found.items()}


def _pool_arrays(dataset: BaseDataset, grid: tuple[int, int], *, progress: bool, pool: Executor | None, workers: int,
                 warning_registry: dict | None, shipped: tuple[State, BaseDataset] | None) -> dict[str, np.ndarray] | None:
    """The cache file's arrays (:func:`_arrays`: masks bit-packed) rasterised by the pool's workers, joined in row
    order without unpacking; None when :func:`ground_truth` runs serially (no pool, a single chunk, or a dataset
    that cannot be shipped)."""
    labels = dataset.labels()
    findings = _localized(dataset)
    rows = np.flatnonzero((labels == 1).any(axis=1))
    size = max(MIN_CHUNK, math.ceil(len(rows) / max(1, 4 * workers)))
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    if pool is None or len(chunks) <= 1:
        return None
    shipped = shippable(dataset) if shipped is None else shipped
    if shipped is None:
        return None
    futures = [pool.submit(capture_warnings, _rasterise_job, *shipped, dataset.name, chunk, grid, findings)
               for chunk in chunks]
    bar = progress_bar(total=len(rows), desc=f"ground truth {dataset.name}", unit="case", disable=not progress)
    parts = []
    try:
        for chunk, future in zip(chunks, futures):  # submission (= row) order
            part, caught = future.result()
            replay_warnings(caught, warning_registry)
            parts.append(part)
            bar.update(len(chunk))
    finally:
        bar.close()
        for future in futures:
            future.cancel()
    joined = {}
    for f in findings:
        idx = np.concatenate([p[f][0] for p in parts]).astype(int)
        positives = int((labels[:, dataset.findings.index(f)] == 1).sum())
        joined[f] = (idx, np.concatenate([p[f][1] for p in parts]), positives - len(idx))
    return _arrays(joined)


def _arrays(gt: Mapping[str, tuple[np.ndarray, np.ndarray, int]], packed: bool = True) -> dict[str, np.ndarray]:
    """The cache file's arrays of ground truth: ``findings``, then per finding ``rows{i}`` (int64), ``masks{i}``
    (bit-packed, :func:`_pack_masks`; ``packed=False``: bool masks to pack here) and ``no_region{i}``."""
    arrays: dict[str, np.ndarray] = {"findings": np.array(list(gt), dtype=str)}
    for i, (rows, masks, no_region) in enumerate(gt.values()):
        arrays[f"rows{i}"] = np.asarray(rows, np.int64)
        arrays[f"masks{i}"] = masks if packed else _pack_masks(masks)
        arrays[f"no_region{i}"] = np.asarray(no_region, np.int64)
    return arrays


# -- the cache ---------------------------------------------------------------------------------------

def _code_version(dataset: BaseDataset) -> str:
    """sha256 of the source that decides the masks: this module, the region rasteriser, the loader base and the
    dataset's own loader (plus the package version)."""
    from ..datasets import base, regions

    h = hashlib.sha256(__version__.encode())
    for module in (__name__, base.__name__, regions.__name__, type(dataset).__module__):
        try:
            h.update(Path(inspect.getfile(__import__(module, fromlist=["_"]))).read_bytes())
        except (OSError, TypeError):  # no source file (frozen): its name stands for it
            h.update(module.encode())
    return h.hexdigest()


def _cases_digest(dataset: BaseDataset) -> str:
    """sha256 of the case table's ids, image paths, sizes and labels (what rows mean and where masks are drawn)."""
    cols = [c for c in ("case_id", "image_path", "height", "width") if c in dataset.cases.columns]
    cols += [f"label:{f}" for f in dataset.findings]
    hashed = pd.util.hash_pandas_object(dataset.cases[cols].astype(str), index=False).to_numpy()
    return hashlib.sha256(hashed.tobytes()).hexdigest()


def ground_truth_key(dataset: BaseDataset, grid: tuple[int, int], options: Mapping[str, Any] | None = None) -> dict:
    """What the masks of ``dataset`` at ``grid`` are made from (the cache key; see the module docstring)."""
    from ..store.fingerprint import dataset_fingerprint

    return {"format": CACHE_FORMAT, "dataset": dataset.name, "split": dataset.split,
            "options": dict(options or {}), "grid": [int(g) for g in grid],
            "classes": dataset.manifest.get("classes", []), "annotations": dataset_fingerprint(dataset),
            "cases": _cases_digest(dataset), "code": _code_version(dataset)}


def _key_text(key: Mapping[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def cache_file(folder: str | Path, dataset: BaseDataset, grid: tuple[int, int],
               options: Mapping[str, Any] | None = None) -> Path:
    """``folder/<dataset>-<split>-<H>x<W>-<options digest>.npz``: one file per dataset entry and grid."""
    tag = hashlib.sha256(_key_text(dict(options or {})).encode()).hexdigest()[:10]
    return Path(folder) / f"{dataset.name}-{dataset.split}-{int(grid[0])}x{int(grid[1])}-{tag}.npz"


def _payload_digest(key_text: str, arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256(key_text.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_cache(path: str | Path, key: Mapping[str, Any], gt: Mapping[str, GroundTruth]) -> Path:
    """Write ``gt`` with its ``key`` to ``path`` atomically (masks bit-packed, payload sha256 stored)."""
    return _write_arrays(path, key, _arrays(gt, packed=False))


def _write_arrays(path: str | Path, key: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Path:
    """The cache file of :func:`_arrays` with its ``key`` and payload sha256, written atomically."""
    text = _key_text(key)
    payload = {**arrays, "key": np.array(text), "digest": np.array(_payload_digest(text, arrays))}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda tmp: np.savez(tmp, **payload))


class CacheUnusable(Exception):
    """A cache file that must not be served: ``reason`` is ``"stale"`` or ``"damaged"``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def read_cache(path: str | Path, key: Mapping[str, Any], findings: Iterable[str] | None = None) -> dict[str, GroundTruth]:
    """The ground truth in ``path`` if it was made from ``key`` and is intact; else :class:`CacheUnusable`
    (``FileNotFoundError`` when there is no file). ``findings``: unpack only these (the whole file is checked)."""
    return unpack_cache(load_cache(path, key), key, findings)


def load_cache(path: str | Path, key: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of the cache file at ``path``, masks still bit-packed, once its key and payload digest are
    checked (:func:`read_cache`'s errors); :func:`unpack_cache` makes ground truth of them."""
    path = Path(path)
    try:  # a regular file inside its folder, read with bounded decompression (a bomb is refused from its header)
        regular_size(path, within=path.parent)
        data = read_npz(path)
    except FileNotFoundError:
        raise
    except FormatError as exc:
        raise CacheUnusable("damaged", f"unreadable ({exc})") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CacheUnusable("damaged", f"unreadable ({type(exc).__name__}: {exc})") from exc
    if "key" not in data or "digest" not in data or "findings" not in data:
        raise CacheUnusable("damaged", "entries missing")
    stored = str(data.pop("key"))
    if stored != _key_text(key):
        try:
            old = json.loads(stored)
            changed = sorted(k for k in set(old) | set(key) if _key_text({k: old.get(k)}) != _key_text({k: key.get(k)}))
        except ValueError:
            changed = ["key"]
        raise CacheUnusable("stale", f"made from other inputs ({', '.join(changed)} changed)")
    digest = str(data.pop("digest"))
    if _payload_digest(stored, data) != digest:
        raise CacheUnusable("damaged", "payload sha256 differs from the one stored")
    return data


def unpack_cache(data: Mapping[str, np.ndarray], key: Mapping[str, Any],
                 findings: Iterable[str] | None = None) -> dict[str, GroundTruth]:
    """Ground truth of the findings in ``findings`` (default: all, in the file's order) from :func:`load_cache`."""
    grid = tuple(key["grid"])
    wanted = None if findings is None else set(findings)
    out: dict[str, GroundTruth] = {}
    try:
        for i, finding in enumerate(data["findings"].tolist()):
            if wanted is not None and finding not in wanted:
                continue
            rows = data[f"rows{i}"]
            masks = _unpack_masks(data[f"masks{i}"], grid)
            if len(masks) != len(rows):
                raise ValueError(f"{len(rows)} rows but {len(masks)} masks for {finding}")
            out[finding] = GroundTruth(rows.astype(int), masks, int(data[f"no_region{i}"]))
    except (KeyError, ValueError) as exc:
        raise CacheUnusable("damaged", f"inconsistent arrays ({exc})") from exc
    return out


def cached_ground_truth(dataset: BaseDataset, grid: tuple[int, int], folder: str | Path, *,
                        options: Mapping[str, Any] | None = None, pool: Executor | None = None, workers: int = 1,
                        progress: bool = True, warning_registry: dict | None = None,
                        shipped: tuple[State, BaseDataset] | None = None) -> tuple[dict[str, GroundTruth], Path, dict[str, Any], str]:
    """:func:`ground_truth` through the cache in ``folder``: ``(gt, file, key, status)``, status one of
    ``"hit"``, ``"miss"``, ``"stale"``, ``"damaged"`` (the last three recompute and rewrite the file)."""
    key, path, status, arrays = _look_up(dataset, grid, folder, options)
    if arrays is not None:
        return unpack_cache(arrays, key), path, key, status
    arrays = _pool_arrays(dataset, grid, progress=progress, pool=pool, workers=workers,
                          warning_registry=warning_registry, shipped=shipped)
    if arrays is not None:
        _write_arrays(path, key, arrays)
        return unpack_cache(arrays, key), path, key, status
    gt = ground_truth(dataset, grid, progress=progress, warning_registry=warning_registry)
    write_cache(path, key, gt)
    return gt, path, key, status


def ground_truth_file(dataset: BaseDataset, grid: tuple[int, int], folder: str | Path, *,
                      options: Mapping[str, Any] | None = None, pool: Executor | None = None, workers: int = 1,
                      progress: bool = True, warning_registry: dict | None = None,
                      shipped: tuple[State, BaseDataset] | None = None) -> tuple[dict[str, int], Path, dict[str, Any], str]:
    """The cache file of :func:`cached_ground_truth`, checked or made, for a caller whose workers read it
    (:func:`read_cache`): ``(grounding pairs per finding, file, key, status)``, the same file and status.

    The masks are never unpacked here: a file found is checked (key, payload sha256, array shapes) as it is, and
    with a pool the workers' bit-packed chunks are joined and written as they come. For a 3,000-case stand-in of
    VinDr-CXR at 224² (18,877 masks, 947 MB as bools) the calling process's CPU was 0.66–0.70 s against 4.30–4.55 s
    through :func:`cached_ground_truth` when the file is made, 0.34–0.35 s against 0.85–0.95 s when it is found
    (2 workers, 2 cores).
    """
    key, path, status, arrays = _look_up(dataset, grid, folder, options)
    if arrays is None:
        arrays = _pool_arrays(dataset, grid, progress=progress, pool=pool, workers=workers,
                              warning_registry=warning_registry, shipped=shipped)
        if arrays is None:
            arrays = _arrays(ground_truth(dataset, grid, progress=progress, warning_registry=warning_registry), packed=False)
        _write_arrays(path, key, arrays)
    return {f: len(arrays[f"rows{i}"]) for i, f in enumerate(arrays["findings"].tolist())}, path, key, status


def _look_up(dataset: BaseDataset, grid: tuple[int, int], folder: str | Path,
             options: Mapping[str, Any] | None) -> tuple[dict[str, Any], Path, str, dict[str, np.ndarray] | None]:
    """``(key, file, status, arrays)``: the arrays of a usable cache file (status ``"hit"``), else None with the
    reason (``"miss"``, ``"stale"``, ``"damaged"``)."""
    key = ground_truth_key(dataset, grid, options)
    path = cache_file(folder, dataset, grid, options)
    try:
        arrays = load_cache(path, key)
        _check_arrays(arrays, tuple(key["grid"]))
        return key, path, "hit", arrays
    except FileNotFoundError:
        return key, path, "miss", None
    except CacheUnusable as exc:  # stale: made from other inputs (expected); damaged: a warning line, counted
        (log.warning if exc.reason == "damaged" else log.info)("ground-truth cache %s is %s; recomputing it", path, exc)
        if exc.reason == "damaged":
            DAMAGED.append(str(path))
        return key, path, exc.reason, None


def _check_arrays(arrays: Mapping[str, np.ndarray], grid: tuple[int, int]) -> None:
    """:class:`CacheUnusable` ("damaged") unless every finding has rows, bit-packed masks of the grid, one per row,
    and a count, without unpacking them."""
    width = math.ceil(grid[0] * grid[1] / 8)
    try:
        for i, finding in enumerate(arrays["findings"].tolist()):
            rows, masks, no_region = arrays[f"rows{i}"], arrays[f"masks{i}"], arrays[f"no_region{i}"]
            if (rows.ndim != 1 or masks.dtype != np.uint8 or masks.shape != (len(rows), width)
                    or no_region.shape != ()):
                raise ValueError(f"{finding}: rows {rows.shape}, masks {masks.dtype} {masks.shape}, "
                                 f"no_region {no_region.shape} (grid {grid})")
    except (KeyError, ValueError) as exc:
        raise CacheUnusable("damaged", f"inconsistent arrays ({exc})") from exc
