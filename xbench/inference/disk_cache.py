"""The decode cache on disk: index records and sealed model inputs, verified when read, written atomically.

Cache on disk (``cache_dir``; optional — without it the feed lives in memory for the run):

* ``index/<sha1 of the absolute path>.json``: the file's identity (size, mtime, ctime, inode, device), content hash
  (SHA-256 of the file bytes; BLAKE2b-128 in records written by earlier versions, still served) and the
  image's ``(H, W)``. A record is served only while the file's identity is unchanged (:func:`file_identity`, git's stat
  rule with the ctime: no rewrite keeps it, so an image rewritten with the same size and mtime — ``cp -p``,
  ``rsync -a`` — is read and hashed again); a record made in the file's ctime tick is served only once the file
  hashes to it again. So an entry is never served for changed bytes.
* ``entries/<transform key>/<hash[:2]>/<hash>.sealed.npy``: one model input. The transform key is a
  hash of the adapter's ``preprocess`` outputs on two fixed probe images and of its table, so a
  change of preprocessing code or parameters gives a new key (no stale entry), and models with
  the same preprocessing (MedKLIP and MAVL) share entries.
* Every file is verified when read: a record and an entry are sealed (:func:`xbench.core.files.seal`: SHA-256 of
  what the file is — the image's path, the entry's key and hash — and its bytes); an entry is a regular file of at
  most :data:`_ENTRY_BYTES` whose ``.npy`` header must declare exactly the bytes present and an input of its model's
  shape (:func:`xbench.core.safe_arrays.read_npy_bytes`: refused before anything is allocated). A file that fails is
  logged (one warning line), counted (:attr:`~xbench.inference.input_feed.InputFeed.damaged`), removed and recomputed, never served.
* Every file is written to a unique temporary name and renamed (atomic on POSIX): ranks of one
  host that share the folder never read a half-written entry; ranks take disjoint chunks, so no
  two ranks compute the same entry in a sharded run (a collision would write identical bytes).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import FormatError
from ..core.files import read_regular, seal, unseal
from ..core.safe_arrays import read_npy_bytes
from ..spec.manifests import sha256
from .calibration import ModelInput

__all__ = ["DiskCache", "content_hash", "file_identity", "DAMAGED"]


def content_hash(path: str | Path) -> str:
    """SHA-256 hex digest of a file's bytes (the decode cache's content key).

    SHA-256, not BLAKE2b: with the SHA extensions of current x86 CPUs, OpenSSL's SHA-256 hashed 18 MB in 17.6 ms
    where BLAKE2b took 49.3 ms (the 2-core development machine), and every cold image is hashed once in a decode
    worker. Index records written with the earlier BLAKE2b-128 keys stay valid: a lookup reads the key from the
    record, it never recomputes it."""
    return sha256(path, chunk=1 << 22)


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class DiskCache:
    """The on-disk layout of the module docstring."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def _index_file(self, path: Path) -> Path:
        return self.folder / "index" / f"{hashlib.sha1(str(path.resolve()).encode()).hexdigest()}.json"

    def lookup(self, path: Path) -> dict[str, Any] | None:
        """Index record of ``path`` if its sealed record is intact and the file's identity (:func:`file_identity`) is
        unchanged, else None (the file is read and hashed again)."""
        file = self._index_file(path)
        try:
            raw = read_regular(file, within=self.folder, limit=_RECORD_BYTES)
            st = path.stat()
        except (OSError, FormatError):
            return None
        body = unseal(raw, str(path.resolve()))
        if body is None:
            _damaged(file, "its seal does not match its content")
            return None
        try:
            rec = json.loads(bytes(body))
            shape = tuple(int(d) for d in rec["shape"])
            content = str(rec["content"])
        except (ValueError, KeyError, TypeError):
            _damaged(file, "its record is malformed")
            return None
        if rec.get("identity") != file_identity(st) or len(shape) != 2 or not _HEX.fullmatch(content):
            return None
        if rec.get("racy"):  # recorded in the file's ctime tick: its bytes decide, then the record is settled
            if _rehash(path, content) != content:
                return None
            if st.st_ctime_ns <= time.time_ns() - _RACY_NS:
                self.record(path, content, shape, st)
        return {**rec, "shape": shape, "content": content}

    def record(self, path: Path, content: str, shape: tuple[int, int], st: os.stat_result) -> None:
        rec = {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "identity": file_identity(st),
               "racy": st.st_ctime_ns > time.time_ns() - _RACY_NS, "content": content,
               "shape": [int(shape[0]), int(shape[1])]}
        body = seal(json.dumps(rec).encode(), str(path.resolve()))
        _atomic_write(self._index_file(path), lambda h: h.write(body))

    def entry(self, key: str, content: str) -> Path:
        return self.folder / "entries" / key / content[:2] / f"{content}{_ENTRY_SUFFIX}"

    def load(self, key: str, content: str, spec: ModelInput | None = None) -> np.ndarray | None:
        """The entry of ``key`` for ``content``, or None when absent or unusable: a seal that does not match (damaged,
        edited, or another entry's bytes; logged and counted in :data:`DAMAGED`), more than :data:`_ENTRY_BYTES`, a
        header whose shape × itemsize is not the bytes present (refused before allocating), or, with ``spec``, an
        array that is not one of its inputs (codes ``(S, S)`` uint8 or float32 of its shape)."""
        file = self.entry(key, content)
        try:
            raw = read_regular(file, within=self.folder, limit=_ENTRY_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, FormatError) as exc:
            _damaged(file, str(exc))
            return None
        body = unseal(raw, f"{key}/{content}")
        if body is None:
            _damaged(file, "its seal does not match its content (damaged, edited or swapped)")
            return None
        try:
            array = read_npy_bytes(body, file)
        except FormatError as exc:
            _damaged(file, str(exc))
            return None
        if spec is not None and not ((array.dtype == np.uint8 and array.shape == tuple(spec.shape[1:])
                                      and spec.lut is not None)
                                     or (array.dtype == np.float32 and array.shape == tuple(spec.shape))):
            _damaged(file, f"it holds {array.dtype} {array.shape}, not an input of shape {tuple(spec.shape)}")
            return None
        return array

    def save(self, key: str, content: str, array: np.ndarray) -> None:
        npy = io.BytesIO()
        np.save(npy, array, allow_pickle=False)
        body = seal(npy.getvalue(), f"{key}/{content}")
        _atomic_write(self.entry(key, content), lambda h: h.write(body))


_ENTRY_SUFFIX = ".sealed.npy"  #: an entry: ``.npy`` bytes sealed (:func:`xbench.core.files.seal`) with its key and hash
_ENTRY_BYTES = 1 << 30  #: most bytes an entry may hold (a float32 (3, 8192, 8192) input is 805 MB)
_RECORD_BYTES = 1 << 16  #: most bytes an index record may hold (they are about 300)
_RACY_NS = 2_000_000_000  #: a file changed this recently when recorded may change again within its ctime's tick
_HEX = re.compile(r"[0-9a-f]{32,128}")
log = logging.getLogger(__name__)
#: unusable cache files met by this process (each logged once as a warning and recomputed, never served)
DAMAGED: list[str] = []


def _damaged(file: Path, why: str) -> None:
    """Count and log (one warning line) a cache file that is not served, and remove it (a link: the link alone); the
    entry is recomputed and rewritten."""
    DAMAGED.append(str(file))
    log.warning("decode cache: %s is not served (%s); recomputing it", file, why)
    try:
        file.unlink()
    except OSError:
        pass


def _rehash(path: Path, content: str) -> str:
    """``path``'s content hash by the algorithm of ``content``: 32 hex digits are BLAKE2b-128 (records written before
    the key was SHA-256), else :func:`content_hash`."""
    if len(content) == 32:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    return content_hash(path)


def file_identity(st: os.stat_result) -> list[int]:
    """What says a file is unchanged since it was hashed: size, mtime, ctime, inode and device (git's stat rule).
    No rewrite keeps the ctime: every write sets it to the clock, and ``cp -p`` / ``rsync -a`` / ``touch -d`` can
    set the mtime but never the ctime, so an image rewritten with the same size and mtime is read and hashed again.
    A record made within :data:`_RACY_NS` of the file's ctime is *racy* (a write in the same clock tick would keep
    it): it is served only after the file is hashed again and its hash is the recorded one."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
