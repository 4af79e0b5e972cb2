"""Process pools for CPU work (evaluation, ground-truth rasterising): how many processes, and how they start.

Conventions
-----------
* A worker setting is ``"auto"`` (``min(os.cpu_count(), jobs)``) or an integer; ``0`` and ``1`` mean serial, in
  the calling process (no pool). :func:`resolve_workers` turns a setting into a process count.
* Pools start their processes with the ``forkserver`` context (``spawn`` where there is none), never ``fork``
  from the caller: the parent may already run torch / OpenMP threads (inference in the same process), and a
  child forked from it would inherit their locks. The fork server is a fresh single-threaded process that
  imports the ``preload`` modules once (torch, pandas, ... ≈ 3 s), so each worker starts in milliseconds, and
  it lives as long as the parent, serving later pools too. Workers get the environment of the moment the server
  started; jobs take everything they need as arguments. The server is started with the caller's module search
  path (:func:`same_imports_env`): a ``python -c`` server would otherwise look in its working folder first, and a
  run started beside another XBench checkout would have its workers import that checkout's code. Workers do not import the caller's ``__main__`` (a
  script without an ``if __name__ == "__main__":`` guard would otherwise run again in every worker): a job
  must be a function of an importable module, unless the pool is made with ``main=True``.
* A worker ends when the process that made its pool ends, even one that never shut the pool down (killed,
  ``os._exit``, out of memory): a fork server's workers are not their owner's children and would otherwise wait
  for jobs, and keep the server alive, forever.
* Every worker is single-threaded: BLAS / OpenMP pools are limited to one thread (``threadpoolctl``) and torch's
  intra-op threads to one, so ``n`` workers use ``n`` cores. Results may depend on the BLAS thread count
  (OpenBLAS may split a matrix product's sums over its threads: the last bits of a bootstrap CI move), so
  work whose bytes must not depend on the machine runs under :func:`one_blas_thread` in-process too.
* Results are gathered by the caller in submission order, so output never depends on scheduling.
* Warnings a job raises in a worker are recorded there (:func:`capture_warnings`) and raised again in the
  parent (:func:`replay_warnings`) under the parent's filters, once per (text, category, place) as a serial
  run would show them.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import select
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .errors import XBenchError

__all__ = ["resolve_workers", "process_pool", "start_process", "single_threaded", "one_blas_thread", "round_trips", "capture_warnings", "as_caught", "replay_warnings", "Caught"]

#: a warning recorded in a worker: (message text, category, file name, line number)
Caught = tuple[str, type[Warning], str, int]


def resolve_workers(setting: int | str, jobs: int) -> int:
    """Processes to use for ``jobs`` independent jobs: ``"auto"`` → ``min(os.cpu_count(), jobs)``, an integer
    → ``min(setting, jobs)``; a result ≤ 1 means serial in-process.

    Examples
    --------
    >>> resolve_workers(0, 10), resolve_workers(1, 10), resolve_workers(4, 2)
    (1, 1, 2)
    """
    if setting == "auto":
        n = os.cpu_count() or 1
    elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0:
        n = setting
    else:
        raise XBenchError(f"worker count must be 'auto' or an integer >= 0, got {setting!r}")
    return max(1, min(n, jobs))


def single_threaded() -> None:
    """Limit this process to one BLAS / OpenMP thread and one torch intra-op thread (a pool's initializer)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


def one_blas_thread() -> Any:
    """Context manager: BLAS limited to one thread in this process while it is open (restored after)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def _forget_fork_server() -> None:
    """In a child forked from a process whose fork server runs (e.g. torchrun-style ranks forked by a test),
    drop the inherited handle: that server is not this process's child, so using it fails ("No child
    processes"); the child starts its own on its first pool."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
        server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
        server._inherited_fds = None
        server._lock = threading.Lock()
    except (AttributeError, OSError):  # pragma: no cover - another Python's internals: leave them alone
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_fork_server)


@contextmanager
def _main_hidden() -> Iterator[None]:
    """While open, ``__main__`` has no file or spec, so processes started now do not import it."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def process_pool(workers: int, preload: tuple[str, ...] = (), *, main: bool = False, nice: int = 0) -> ProcessPoolExecutor:
    """A pool of ``workers`` single-threaded processes started by the fork server (see the module docstring);
    ``preload``: modules the server imports before its first fork (only when it is not running yet); ``main``:
    let the workers import the caller's ``__main__`` (jobs defined in a script); ``nice``: added to the workers' CPU
    niceness (lower priority than this process, e.g. while it feeds a GPU)."""
    init = functools.partial(_start_worker, os.getpid(), int(nice))
    return _Pool(max_workers=workers, mp_context=_context(preload), initializer=init, hide_main=not main)


def start_process(target: Callable[..., None], args: tuple[Any, ...], *, name: str,
                  preload: tuple[str, ...] = ()) -> Any:
    """Start a process running ``target(*args)`` the way pool workers start (the fork server, this process's
    imports, ``__main__`` hidden; see the module docstring) and return it. It ends when this process ends, whether or
    not this process joins it (:func:`_end_with`). Not a daemon, so it may make pools of its own; the caller joins it.
    ``target`` must be a function of an importable module and ``args`` must pickle."""
    process = _context(preload).Process(target=_run_owned, args=(os.getpid(), target, args), name=name)
    with _main_hidden():
        process.start()
    return process


def _run_owned(owner: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    _end_with(owner)
    target(*args)


def _context(preload: tuple[str, ...] = ()) -> Any:
    """The multiprocessing context of pools and processes: the fork server (started now with this process's imports,
    ``preload`` imported first when it was not running yet), ``spawn`` where there is none."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        if preload:
            context.set_forkserver_preload(list(preload))
        _start_server()
        return context
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


_SERVER_START = threading.Lock()


def same_imports_env() -> dict[str, str]:
    """Environment variables under which a new Python process (``python -c``, ``python -m``) imports what this one
    imports: ``$PYTHONPATH`` is this process's ``sys.path`` (a relative entry made absolute), and
    ``$PYTHONSAFEPATH=1`` keeps such a process's working folder off the front of its path (Python ≥ 3.11; 3.10
    still puts it first). Used for the fork server and by ``benchmarks/bench_gpu.py`` for its ``torchrun`` ranks.

    >>> env = same_imports_env()
    >>> env["PYTHONSAFEPATH"], env["PYTHONPATH"].split(os.pathsep)[-1] == os.path.abspath(sys.path[-1] or os.curdir)
    ('1', True)
    """
    entries = (os.path.abspath(p or os.curdir) for p in sys.path if isinstance(p, str))
    return {"PYTHONPATH": os.pathsep.join(entries), "PYTHONSAFEPATH": "1"}


def _start_server() -> None:
    """Start the fork server, unless it runs, with this process's module search path (:func:`same_imports_env`).

    The server is a ``python -c`` process: Python puts its working folder first on its path, before
    ``$PYTHONPATH``, and the server ignores the path multiprocessing sends it. The variables are set for the
    server's start only, so the workers import what this process imports.
    """
    from multiprocessing import forkserver

    with _SERVER_START, environment_set(same_imports_env()):
        forkserver.ensure_running()


@contextmanager
def environment_set(changes: Mapping[str, str]) -> Iterator[None]:
    """While open, ``os.environ`` holds ``changes`` (for processes started now); each variable is restored after,
    or removed where it was not set.

    >>> with environment_set({"XBENCH_DOCTEST_VAR": "1"}):
    ...     os.environ["XBENCH_DOCTEST_VAR"]
    '1'
    >>> "XBENCH_DOCTEST_VAR" in os.environ
    False
    """
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _start_worker(owner: int, nice: int) -> None:
    """A pool's initializer: :func:`single_threaded`, ``os.nice(nice)`` where the platform has it, and
    :func:`_end_with` the pool's owner."""
    single_threaded()
    if nice and hasattr(os, "nice"):
        os.nice(nice)
    _end_with(owner)


def _end_with(owner: int) -> None:
    """End this worker when process ``owner`` (the pool's creator) ends, whether or not it shut the pool down.

    A worker started by the fork server is not the owner's child, so nothing else tells it that the owner died
    (killed, ``os._exit``, out of memory): it would wait for jobs forever and keep the fork server alive. A daemon
    thread waits on a pidfd of the owner (Linux), else, on other POSIX systems, checks every second that the owner
    still exists. Elsewhere (Windows: ``spawn`` workers, and ``os.kill(pid, 0)`` would send CTRL+C) nothing is watched.
    """
    try:
        fd: int | None = os.pidfd_open(owner)
    except (AttributeError, OSError):  # no pidfd here
        fd = None
    if fd is None and os.name != "posix":
        return

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the owner has ended
        else:
            while True:
                time.sleep(1.0)
                try:
                    os.kill(owner, 0)
                except ProcessLookupError:
                    break
                except PermissionError:  # exists, owned by another user (a reused pid): keep waiting
                    pass
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="xbench-owner-watch").start()


class _Pool(ProcessPoolExecutor):
    """A pool whose workers (started inside ``submit``, one per job while fewer than ``max_workers`` idle) are
    started with ``__main__`` hidden unless ``hide_main`` is false."""

    def __init__(self, *args: Any, hide_main: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._hide_main = hide_main

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if not self._hide_main:
            return super().submit(fn, *args, **kwargs)
        with _main_hidden():
            return super().submit(fn, *args, **kwargs)


def round_trips(exc: BaseException) -> bool:
    """Whether ``exc`` pickles back as its own type with the same message (every XBench error does; an error
    whose constructor takes other arguments than its message may not), i.e. can cross from a worker as itself."""
    import copy
    import pickle

    try:
        pickle.dumps(exc)  # its contents pickle
        again = copy.deepcopy(exc)  # rebuilt through the same __reduce_ex__ as unpickling, with no bytes read
        return type(again) is type(exc) and str(again) == str(exc)
    except Exception:
        return False


def capture_warnings(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[Caught]]:
    """``(fn(*args, **kwargs), the warnings it raised)``: every warning is recorded (none shown here)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, as_caught(caught)


def as_caught(records: list[warnings.WarningMessage]) -> list[Caught]:
    """Warnings recorded by ``warnings.catch_warnings(record=True)`` as :func:`replay_warnings` takes them."""
    return [(str(w.message), w.category, w.filename, w.lineno) for w in records]


def replay_warnings(caught: list[Caught], registry: dict | None = None) -> None:
    """Raise the warnings :func:`capture_warnings` recorded, here, under this process's filters; pass one
    ``registry`` dict for a whole run so that a warning repeated in many jobs shows once (as serially)."""
    for message, category, filename, lineno in caught:
        warnings.warn_explicit(message, category, filename, lineno, registry=registry)
