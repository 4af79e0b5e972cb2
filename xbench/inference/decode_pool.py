"""Decoding processes that each answer on a pipe of their own: rows in, results out as they finish.

Why not ``torch.utils.data.DataLoader`` (which the feed used before): its workers hand every result to one shared
result queue. A worker's results are written by its feeder thread, which takes the queue's cross-process write
lock and then needs this worker's GIL to write; while the worker's main thread sits in a long GIL-holding call
(``np.bincount`` or a table gather over a 3,000² DICOM, tens of ms), the lock is held and every other worker's
result waits behind it. Profiled on a 16-core H100 host (``docs/perf/profile_decode_pool_h100.txt``): during the
VinDr-CXR stand-ins the workers' feeder threads sat at that lock acquisition (waiting for it, or holding it and
waiting for their own GIL: a sample cannot tell which) and the workers otherwise waited for new rows; the machine
ran at 13-19 % CPU and the stage took 57 s where its CPU work needed ~14 s. With this pool the same stage took
11.2 s (``docs/perf/decode_pool_h100.json``).

Here each worker sends its result itself, from its main thread, on its own pipe (no lock shared between workers,
no feeder thread), and gets a new row as soon as it returns one (``prefetch`` rows in flight per worker), so a slow
file delays only the rows queued behind it on that worker. Tensors travel as named shared memory (``file_system``
sharing is set in the workers; the receiver maps the segment, nothing is copied through the pipe).

Conventions
-----------
* Workers are forked from the caller (as ``DataLoader`` workers are): they inherit the dataset, its reader and
  the adapters without pickling them. They run the reader, numpy and Pillow only, with one torch thread; CUDA is
  never touched in a worker.
* A row's exception is raised in the caller as itself (XBench errors pickle as themselves), with the worker's
  traceback added as a note; an exception that cannot be pickled is raised as ``RuntimeError`` naming its type
  and message. A worker that dies (killed, out of memory) is an error naming its exit code; nothing is skipped
  silently.
* :meth:`DecodePool.close` stops the workers (at once after an error or when the caller stops early).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from ..core.errors import XBenchError
from .recorder import Stopwatch

__all__ = ["DecodePool"]

_STOP = None


def _serve(conn: Connection, fn: Callable[[int], Any], init: Callable[[], None] | None) -> None:
    """A worker: receive a row, answer ``("ok", row, result)`` or ``("error", row, exception, traceback)``."""
    import torch

    torch.set_num_threads(1)
    if init is not None:
        init()
    while True:
        try:
            row = conn.recv()
        except (EOFError, OSError):  # the caller went away
            return
        if row is _STOP:
            return
        try:
            answer: tuple[Any, ...] = ("ok", row, fn(row))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            answer = ("error", row, exc, traceback.format_exc())
        try:
            conn.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            text = f"{type(answer[2]).__name__}: {answer[2]}" if answer[0] == "error" else f"result of row {row}"
            conn.send(("error", row, RuntimeError(f"decode worker could not send {text} ({exc})"),
                       answer[3] if answer[0] == "error" else traceback.format_exc()))
        except (BrokenPipeError, OSError):
            return


class DecodePool:
    """``workers`` forked processes computing ``fn(row)``; see the module docstring.

    Parameters
    ----------
    fn : callable
        ``row -> result``; run in the workers (inherited by fork, not pickled). Results must pickle.
    workers : int
        Processes (≥ 1).
    prefetch : int
        Rows in flight per worker.
    init : callable, optional
        Run once in each worker before its first row.
    """

    def __init__(self, fn: Callable[[int], Any], workers: int, *, prefetch: int = 2,
                 init: Callable[[], None] | None = None):
        if workers < 1:
            raise ValueError(f"a decode pool needs at least one worker, got {workers}")
        self.prefetch = max(1, int(prefetch))
        # the caller's seconds in imap_unordered: waiting for any answer, and reading answers (unpickling, mapping
        # shared tensors)
        self.seconds = Stopwatch(("idle", "receive"))
        self._owner = os.getpid()
        if "fork" not in multiprocessing.get_all_start_methods():
            raise XBenchError("decoding processes (num_workers > 0) are forked from this process, and this platform "
                              "has no fork start method: set num_workers: 0")
        ctx = multiprocessing.get_context("fork")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        for i in range(workers):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_serve, args=(theirs, fn, init), name=f"xbench-decode-{i}", daemon=True)
            proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(mine)

    def imap_unordered(self, rows: Iterable[int]) -> Iterator[Any]:
        """Results of ``fn`` for every row, in the order they finish."""
        todo = iter(rows)
        busy = {i: 0 for i in range(len(self._conns))}

        def dead(i: int) -> RuntimeError:
            self._procs[i].join(timeout=5.0)
            return RuntimeError(f"decode worker {i} (pid {self._procs[i].pid}) ended with exit code "
                                f"{self._procs[i].exitcode} while {busy[i]} row(s) were in flight")

        def feed(i: int) -> None:
            while busy[i] < self.prefetch:
                row = next(todo, _STOP)
                if row is _STOP:
                    return
                busy[i] += 1
                try:
                    self._conns[i].send(row)
                except OSError:
                    raise dead(i) from None

        for i in busy:
            feed(i)
        by_conn = {id(c): i for i, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: i for i, p in enumerate(self._procs)}
        while any(busy.values()):
            with self.seconds("idle"):
                ready = wait([self._conns[i] for i, n in busy.items() if n]
                             + [self._procs[i].sentinel for i, n in busy.items() if n])
            for handle in ready:
                i = by_sentinel[handle] if isinstance(handle, int) else by_conn[id(handle)]
                try:
                    if isinstance(handle, int):  # a worker with rows in flight ended
                        raise EOFError
                    with self.seconds("receive"):
                        answer = handle.recv()
                except (EOFError, OSError):  # OSError: connection reset by a killed worker
                    raise dead(i) from None
                except Exception as exc:  # an answer that pickled in the worker but cannot be rebuilt here
                    raise RuntimeError(f"decode worker {i}: its answer could not be read "
                                       f"({type(exc).__name__}: {exc})") from exc
                busy[i] -= 1
                if answer[0] == "error":
                    _, row, exc, text = answer
                    if isinstance(exc, BaseException):
                        if hasattr(exc, "add_note"):
                            exc.add_note(f"(in decode worker {i}, row {row})\n{text}")
                        raise exc
                    raise RuntimeError(f"decode worker {i}, row {row}: {exc}\n{text}")
                feed(i)
                yield answer[2]

    def close(self, *, now: bool = False) -> None:
        """Stop every worker and close the pipes: after their rows in flight, or at once (``now``: after an error,
        or when the caller stopped early)."""
        for conn in self._conns:
            try:
                conn.send(_STOP)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            if now:
                proc.terminate()
            proc.join(timeout=2.0 if not now else 5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():  # pragma: no cover - a worker that ignores SIGTERM
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> "DecodePool":
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        self.close(now=kind is not None)

    def __del__(self) -> None:  # pragma: no cover - best effort when a caller forgot close()
        if getattr(self, "_procs", None) and getattr(self, "_owner", None) == os.getpid():
            try:
                self.close(now=True)
            except Exception:
                pass
