"""Atomic file output: every table, JSON and store file XBench writes goes through :func:`atomic_write`.

Convention: the content is written to a temporary file in the destination's folder and renamed over the
destination (``os.replace``, atomic on POSIX). A reader therefore sees the old file or the new one, never a
truncated one; a failed write (disk full, killed process) leaves the old file (or none) and no temporary.
A failure is raised as :class:`~xbench.core.errors.OutputError` naming the destination. Files get the permission
bits a plain ``open(..., "w")`` would give under the current umask (0644 under umask 022), folders those of
``mkdir`` (0755); ``tempfile`` alone would create 0600 / 0700.
"""
from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import OutputError

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "write_frame", "check_writable", "replace_folder",
           "file_mode"]


def file_mode(folder: bool = False) -> int:
    """Permission bits of a new file (``0o666``) or folder (``0o777``) under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def atomic_write(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(tmp)`` on a temporary sibling of ``path``, then rename it to ``path``.

    ``writer`` receives the temporary path (with ``path``'s suffix, so that suffix-sniffing writers such as
    ``np.savez`` or ``savefig`` behave) and writes the whole file there.
    """
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    except OSError as exc:
        raise OutputError(path, exc) from exc
    os.close(fd)
    tmp = Path(name)
    try:
        writer(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(path, exc) from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_frame(df: Any, path: str | Path, **kwargs: Any) -> Path:
    """Write a DataFrame atomically: Parquet when ``path`` ends in ``.parquet``, else CSV (``index=False`` by default)."""
    path = Path(path)
    kwargs.setdefault("index", False)
    if path.suffix == ".parquet":
        return atomic_write(path, lambda tmp: df.to_parquet(tmp, **kwargs))
    return atomic_write(path, lambda tmp: df.to_csv(tmp, **kwargs))


def check_writable(folder: str | Path, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and prove it writable (a probe file is created and removed).

    Raises :class:`~xbench.core.errors.OutputError` naming the folder, so a read-only or full disk is reported
    before any work is done.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".xbench-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise OutputError(folder, exc, what=f"{what} is not writable") from exc
        raise OutputError(folder, exc, what=f"cannot write into {what}") from exc
    return folder


def replace_folder(folder: str | Path, fill: Callable[[Path], Any]) -> Path:
    """Build a folder with ``fill(tmp)`` in a temporary sibling, then swap it in for ``folder`` (old one removed).

    Readers see the old folder or the new one. When another process swaps in its own copy at the same time,
    the last rename wins (both copies come from the same inputs).
    """
    import shutil

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-new-", dir=folder.parent))
    old = folder.with_name(f".{folder.name}-old-{os.getpid()}")
    try:
        fill(tmp)
        os.chmod(tmp, file_mode(folder=True))
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
        os.rename(tmp, folder)
    except OSError as exc:
        if not folder.exists():
            raise OutputError(folder, exc) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return folder
