"""One lock per output folder: a second ``run``, ``evaluate``, ``merge`` or ``score`` on a folder in use refuses.

The lock is ``fcntl.flock`` (exclusive, non-blocking) on ``<output_dir>/.xbench.lock``. Why ``flock`` and not a
lock-file library: the kernel drops it when the holding process ends, however it ends (``kill -9`` included), so a
stale lock never blocks the next run and no pid file is ever cleaned up; it is in the standard library (the
``filelock`` package's Unix lock is the same call). ``flock`` holds on local file systems and on NFS (Linux ≥ 2.6.12
maps it onto a byte-range lock).

Re-entrant per process: a workflow that takes the lock may call another that takes it (``run`` evaluates), counted.
A forked child (the evaluation's worker processes) inherits the open lock and never takes it again. With ``wait``
seconds the second process waits that long for the first to finish, then refuses. Under ``torchrun``
(``WORLD_SIZE`` > 1) rank 0 holds the lock for the run; the other ranks of that run share it and take none.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import XBenchError

__all__ = ["FolderLocked", "LOCK_NAME", "output_lock"]

LOCK_NAME = ".xbench.lock"
_HELD: dict[str, tuple[int, int]] = {}  # real path of the lock file -> (fd, depth), this process's locks
_GUARD = threading.Lock()


class FolderLocked(XBenchError):
    """Another XBench process works on the output folder."""


def _forget() -> None:  # a forked child does not own its parent's locks
    _HELD.clear()


os.register_at_fork(after_in_child=_forget)


@contextmanager
def output_lock(folder: str | Path, what: str, *, wait: float = 0.0) -> Iterator[Path]:
    """Hold the output folder's lock while the block runs (the folder is created if needed).

    ``what`` names the command for the message; ``wait``: seconds to wait for another holder (0: refuse at once).
    Raises :class:`FolderLocked` naming the folder and the holder's pid (as it wrote it) when the lock stays taken.
    """
    folder = Path(folder)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and os.environ.get("RANK", "0") not in ("", "0"):
        yield folder  # a rank of a torchrun other than 0: rank 0 holds the run's lock
        return
    created = not folder.exists()  # a folder made only to hold the lock is removed again if the block fails
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    key = os.path.realpath(path)
    with _GUARD:
        if key in _HELD:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth + 1)
            fd = -1
        else:
            fd = None
    if fd == -1:  # re-entered
        try:
            yield folder
        finally:
            with _GUARD:
                fd, depth = _HELD[key]
                _HELD[key] = (fd, depth - 1)
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        deadline = time.monotonic() + max(wait, 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                    waited = f" (waited {wait:g} s)" if wait > 0 else ""
                    raise FolderLocked(f"{folder} is in use by another XBench process (pid {holder}){waited}; "
                                       f"`xbench {what}` refuses to work on it at the same time — wait for it to "
                                       "finish or use another output folder") from None
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        with _GUARD:
            _HELD[key] = (fd, 1)
    except BaseException:
        os.close(fd)
        raise
    failed = True
    try:
        yield folder
        failed = False
    finally:
        with _GUARD:
            fd, depth = _HELD.pop(key, (fd, 1))
        if failed and created and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
            path.unlink(missing_ok=True)  # nothing was written: leave no folder behind (e.g. a refused preflight)
            with contextlib.suppress(OSError):
                folder.rmdir()
        os.close(fd)  # closing the last descriptor drops the flock
