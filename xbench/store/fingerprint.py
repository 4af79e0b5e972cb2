"""Content fingerprints of a run's inputs: weights files, annotation files, dataset and model options.

A fingerprint is a JSON-able dict written into every store ``meta.json`` (and, as a digest, next to every
chunk); resume and merge compare them, so results computed from other bytes are never mixed.

* ``weights``: ``{relative path: sha256}`` of the files a model's YAML ``weights:`` entries name inside its
  weights folder (a folder entry such as ``Med-KEBERT/`` contributes every file below it), or of every file
  of a fitted baseline's folder. The folder is the one the model was loaded from (``weights=``,
  ``$XBENCH_WEIGHTS/<name>``, or the packaged ``xbench/reference_weights/<name>``). Absent files are simply
  not listed (the adapter already refused or chose random init, which ``model_info`` records).
* ``annotations``: ``{manifest files key: sha256}`` of the dataset's annotation files for its split (the
  manifest's ``files`` entries that are files; image folders are not hashed: image content is large and is
  covered by the annotation files naming them).

Hashing cache: within one process, a file's sha256 is computed once per ``(resolved path, size, mtime_ns,
inode, ctime_ns)``; a rewritten or replaced file (new size, mtime, inode or ctime — every write sets the ctime, even
one that restores the mtime) is hashed again. :func:`hash_ahead` starts that
hashing in background threads (a run's weight files, gigabytes, while its inputs decode and its networks build):
:func:`file_sha256` then waits for the thread's result instead of reading the file itself.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..models.base import files_under, weight_files, weights_folder
from ..spec.manifests import file_entries, sha256

__all__ = ["file_sha256", "hash_ahead", "model_fingerprint", "dataset_fingerprint", "run_fingerprint", "digest",
           "diff_keys", "fit_key", "fitted_is_current", "refit", "DAMAGED_FITS"]

_CACHE: dict[tuple[str, int, int, int, int], str] = {}
_AHEAD: dict[tuple[str, int, int, int, int], Future[str]] = {}  # hashing started by hash_ahead, not yet asked for
_POOL: list[ThreadPoolExecutor] = []  # hash_ahead's threads, made on first use (a forked child makes its own)


def _key(path: str | Path) -> tuple[Path, tuple[str, int, int, int, int]]:
    real = Path(path).resolve()
    stat = real.stat()
    return real, (str(real), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, cached per (resolved path, size, mtime_ns, inode, ctime_ns) for the life of the process (the
    result of :func:`hash_ahead`'s thread when it started on these bytes)."""
    real, key = _key(path)
    if key not in _CACHE:
        ahead = _AHEAD.pop(key, None)
        _CACHE[key] = ahead.result() if ahead is not None else sha256(real)
    return _CACHE[key]


def hash_ahead(paths: Iterable[str | Path], threads: int = 4) -> int:
    """Start hashing ``paths`` in background threads (``threads`` at most; hashlib releases the GIL on large blocks);
    files already hashed or started, and absent ones, are passed over. Returns how many were started. An error of a
    thread (an unreadable file) is raised by :func:`file_sha256` when that file's hash is asked for."""
    started = 0
    for path in paths:
        try:
            real, key = _key(path)
        except OSError:
            continue
        if key in _CACHE or key in _AHEAD:
            continue
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max(1, min(threads, os.cpu_count() or 1)), thread_name_prefix="xbench-hash"))
        _AHEAD[key] = _POOL[0].submit(sha256, real)
        started += 1
    return started


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    _POOL.clear()
    _AHEAD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def model_fingerprint(name: str, weights: str | Path | None, *, fitted: str | Path | None = None) -> dict[str, str]:
    """``{file relative to its weights folder: sha256}``; ``fitted`` (a fitted baseline's folder) replaces the
    config's weights folder and every file in it is listed."""
    if fitted is not None:
        base, files = Path(fitted), files_under(Path(fitted))
    else:
        base, files = weights_folder(name, weights), weight_files(name, weights)
    return {_relative(f, base): file_sha256(f) for f in files}


def dataset_fingerprint(dataset: Any) -> dict[str, str]:
    """``{manifest files key: sha256}`` of a dataset's annotation files for its split (image folders skipped)."""
    out: dict[str, str] = {}
    for key, entry in sorted(file_entries(dataset.manifest, dataset.split).items()):
        path = Path(dataset.root) / entry["path"]
        if path.is_file():
            out[key] = file_sha256(path)
    return out


def digest(value: Any) -> str:
    """sha256 of a JSON-able value (keys sorted; non-JSON values by ``str``)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def diff_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys at which two nested dicts differ (``fingerprint.weights.model.safetensors``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += diff_keys(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if json.dumps(old, sort_keys=True, default=str) == json.dumps(new, sort_keys=True, default=str) else [prefix]


def _relative(path: Path, base: Path) -> str:
    try:
        return Path(os.path.relpath(path, base)).as_posix()
    except ValueError:
        return path.name


def run_fingerprint(dataset: Any, model: str, weights: str | Path | None, *,
                    fitted: str | Path | None = None) -> dict[str, Any]:
    """The ``fingerprint`` entry of a store ``meta.json``: weights files and annotation files by sha256."""
    return {"weights": model_fingerprint(model, weights, fitted=fitted), "annotations": dataset_fingerprint(dataset)}


# -- fitted baselines (``fit_split``) ---------------------------------------------------------------
FIT_FILE = "fit.json"  #: what a fitted baseline's folder was fitted on


def fit_key(fit_data: Any, dspec: Any, mspec: Any) -> dict[str, Any]:
    """What a ``fit_split`` baseline is fitted from: dataset, split, options, annotation sha256, model params."""
    return {"dataset": dspec.name, "fit_split": mspec.fit_split, "dataset_options": dspec.options,
            "n_cases": len(fit_data), "annotations": dataset_fingerprint(fit_data), "model": mspec.name,
            "params": mspec.params}


def fitted_is_current(folder: str | Path, key: dict[str, Any]) -> bool:
    """True when ``folder`` holds a fit made from exactly ``key`` and every file in it is intact: its ``fit.json``
    records the key and the sha256 of each file (:func:`refit`), checked here as a chunk's index is. A file that
    differs, is missing or was added is one warning line (counted in :data:`DAMAGED_FITS`) and the folder is refitted;
    a ``fit.json`` without file digests (written before they were recorded) is refitted too."""
    from ..core.errors import FormatError
    from ..core.files import read_regular

    folder = Path(folder)
    path = folder / FIT_FILE
    try:
        doc = json.loads(read_regular(path, within=folder, limit=1 << 24).decode("utf-8"))
    except (OSError, ValueError, FormatError):
        return False
    if not isinstance(doc, dict):
        return False
    files = doc.pop(_FIT_FILES, None)
    if digest(doc) != digest(key) or not isinstance(files, dict):
        return False
    problem = _fit_files_problem(folder, files)
    if problem is not None:
        import logging

        DAMAGED_FITS.append(str(folder))
        logging.getLogger(__name__).warning("fitted baseline %s: %s; refitting it", folder, problem)
        return False
    return True


_FIT_FILES = "files"  #: fit.json's entry of ``{file relative to the folder: sha256}``
#: fitted folders found damaged by this process (each logged as a warning and refitted)
DAMAGED_FITS: list[str] = []


def _fit_files(folder: Path) -> dict[str, str]:
    return {_relative(f, folder): file_sha256(f) for f in files_under(folder) if f.name != FIT_FILE}


def _fit_files_problem(folder: Path, files: dict[str, Any]) -> str | None:
    """Why the files of ``folder`` are not the ones ``fit.json`` records (None: they are)."""
    from ..core.errors import FormatError
    from ..core.files import regular_size

    found = sorted(_relative(f, folder) for f in files_under(folder) if f.name != FIT_FILE)
    if found != sorted(files):
        return f"its files {found[:5]} are not the ones fit.json records {sorted(files)[:5]}"
    for name, sha in files.items():
        try:
            regular_size(folder / name, within=folder)
        except (OSError, FormatError) as exc:
            return str(exc)
        if file_sha256(folder / name) != sha:
            return f"{name}'s sha256 differs from fit.json's (damaged or replaced)"
    return None


def refit(folder: str | Path, fit: Any, key: dict[str, Any]) -> Path:
    """Fill a fresh folder with ``fit(tmp_folder)`` plus ``fit.json`` (``key`` and the sha256 of every file) and swap
    it in for ``folder``."""
    from ..core.atomic import atomic_write_text, replace_folder

    def fill(tmp: Path) -> None:
        fit(tmp)
        doc = {**key, _FIT_FILES: _fit_files(tmp)}
        atomic_write_text(tmp / FIT_FILE, json.dumps(doc, indent=1, sort_keys=True, default=str))

    return replace_folder(folder, fill)
