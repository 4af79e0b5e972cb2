"""Files XBench reads back from a folder it wrote (a run folder, a cache), and the folders it writes into.

Conventions:

* **Only regular files are read** (:func:`read_regular`): the path is opened with ``O_NONBLOCK`` (a FIFO cannot
  hang the open) and ``fstat``-checked to be a regular file before a byte is read, so a FIFO, a device (a link to
  ``/dev/zero``) or a folder is refused by name. With ``within``, the file's real path (links followed) must lie
  inside that folder's real path: a link out of the folder is refused.
* **Reads are bounded by the file's size**: :func:`read_regular` reads at most ``limit`` bytes and never more than
  ``fstat`` says the file holds (one byte more is asked for to catch a file that grows).
* **Written folders are contained by real paths** (:func:`contained_folder`): a folder XBench writes under an output
  folder may not be a link itself and must resolve inside the output folder's real path; checked where it is made
  and before each batch of writes (the caller calls it again).
* **Sealed bytes** (:func:`seal`, :func:`unseal`): content that XBench writes and reads back later (a decode-cache
  entry) carries its own SHA-256, the digest the results store's chunk index records for a chunk
  (:mod:`xbench.store.results`), appended after a fixed marker; a file whose digest does not match is never served.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .errors import FormatError, OutputError, XBenchError

__all__ = ["read_regular", "regular_size", "contained_folder", "seal", "unseal", "SEAL_BYTES"]

_SEAL = b"\x00XBSEAL1"  #: marker before the digest of a sealed payload
SEAL_BYTES = len(_SEAL) + 32  #: bytes a seal adds to its payload


def _inside(path: Path, folder: Path) -> bool:
    return os.path.realpath(path) == os.path.realpath(folder) or Path(os.path.realpath(path)).is_relative_to(
        os.path.realpath(folder))


def regular_size(path: str | Path, *, within: str | Path | None = None) -> int:
    """The size of ``path`` when it is a regular file (links followed, inside ``within``'s real path when given);
    :class:`~xbench.core.errors.FormatError` naming it otherwise (``FileNotFoundError`` when it is absent)."""
    path = Path(path)
    st = path.stat()
    _check_regular(path, st, within)
    return st.st_size


def _check_regular(path: Path, st: os.stat_result, within: str | Path | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise FormatError(path, f"is {kind}; only regular files are read")
    if within is not None and not _inside(path, Path(within)):
        raise FormatError(path, f"resolves to {os.path.realpath(path)}, outside {within} (a link out of the folder); "
                                "refusing to read it")


def read_regular(path: str | Path, *, within: str | Path | None = None, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (module docstring): opened without blocking, checked to be a regular
    file (inside ``within``), and refused when it holds more than ``limit`` bytes. ``FileNotFoundError`` when absent;
    :class:`~xbench.core.errors.FormatError` naming the file for anything else."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FormatError(path, f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        _check_regular(path, st, within)
        if limit is not None and st.st_size > limit:
            raise FormatError(path, f"holds {st.st_size} bytes; at most {limit} are expected")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(st.st_size + 1)
    except OSError as exc:
        raise FormatError(path, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > st.st_size:
        raise FormatError(path, "grew while it was read; refusing it")
    return data


def contained_folder(root: str | Path, *names: str, create: bool = True) -> Path:
    """``root / names…``, made when ``create`` (no link along the way; each part a real folder) and checked to resolve
    inside ``root``'s real path; :class:`~xbench.core.errors.XBenchError` naming the link otherwise.

    Each part is checked with ``lstat``: a part that is a symbolic link (even to a folder inside ``root``) is refused,
    so what XBench writes lands where the output folder's tree says."""
    root = Path(root)
    if create:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(root, exc) from exc
    path = root
    for name in names:
        path = path / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                continue
            try:
                path.mkdir(exist_ok=True)
            except OSError as exc:
                raise OutputError(path, exc) from exc
            st = os.lstat(path)
        except OSError as exc:
            raise OutputError(path, exc) from exc
        if stat.S_ISLNK(st.st_mode):
            raise XBenchError(f"{path} is a symbolic link (to {os.readlink(path)}); XBench writes only into real "
                              f"folders under {root} — remove the link")
        if not stat.S_ISDIR(st.st_mode):
            raise XBenchError(f"{path} is not a folder; XBench writes its outputs into a folder there")
    if path.exists() and not _inside(path, root):
        raise XBenchError(f"{path} resolves to {os.path.realpath(path)}, outside {root}; refusing to write there")
    return path


def seal(payload: bytes, context: str = "") -> bytes:
    """``payload`` followed by a marker and the SHA-256 of ``context`` and ``payload`` (:func:`unseal` checks it).

    ``context`` names what the payload is (a cache entry's key and content hash): a sealed file copied over another
    one's name does not unseal there."""
    return payload + _SEAL + _digest(payload, context)


def unseal(data: bytes | memoryview, context: str = "") -> memoryview | None:
    """The payload of sealed ``data`` (a view, no copy) when its SHA-256 with ``context`` matches; None when the seal
    is absent or the digest differs (damaged, edited, truncated or swapped content)."""
    view = memoryview(data)
    if len(view) < SEAL_BYTES or bytes(view[-SEAL_BYTES:-32]) != _SEAL:
        return None
    payload = view[:-SEAL_BYTES]
    return payload if _digest(payload, context) == bytes(view[-32:]) else None


def _digest(payload: bytes | memoryview, context: str) -> bytes:
    h = hashlib.sha256(context.encode("utf-8", "surrogateescape") + b"\x00")
    h.update(payload)
    return h.digest()
