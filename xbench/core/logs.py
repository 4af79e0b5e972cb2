"""Logging and progress conventions of XBench.

* Messages go through :mod:`logging` under the ``xbench`` logger; the CLI calls :func:`setup_logging`
  once (``--quiet``: warnings and errors only, no progress; default: info; ``-v``: debug).
* Warnings (:class:`~xbench.core.errors.XBenchWarning` for counted skips and undefined metrics) are routed
  into the same log by the CLI, one line each, without the echoed source line.
* ``--quiet`` also silences other libraries: the root logger (where e.g. open_clip's "No pretrained
  weights" goes through ``logging.warning``) shows errors only, and Python warnings other than
  :class:`~xbench.core.errors.XBenchWarning` are ignored.
* A Jupyter kernel started by ``xbench reproduce`` gets ``XBENCH_LOG_LEVEL`` (-1, 0, 1) in its environment;
  ``import xbench`` then calls :func:`setup_logging` there, so progress lines show in the executed
  notebook and, relayed, on the driver's terminal.
* :func:`progress_bar` is a tqdm bar on an interactive terminal; elsewhere (a log file, CI, an executed
  notebook) it writes one ``logging`` line per tenth of the work instead of redrawing a bar.
"""
from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any

__all__ = ["setup_logging", "progress_bar", "progress_iter", "advance", "LineProgress"]

log = logging.getLogger("xbench")


def _short_warning(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    return f"{category.__name__}: {message}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each message (test capture, notebooks)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(verbosity: int = 0) -> None:
    """Configure the ``xbench`` logger for the command line: ``-1`` quiet, ``0`` info, ``1`` debug."""
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    if not any(getattr(h, "_xbench", False) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("xbench: %(message)s"))
        handler._xbench = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        warn_log = logging.getLogger("py.warnings")
        warn_log.addHandler(handler)
        warn_log.propagate = False
        warn_log.setLevel(logging.WARNING)  # not the root's level, which --quiet raises to ERROR
    log.setLevel(level)
    log.propagate = False
    warnings.formatwarning = _short_warning  # type: ignore[assignment]
    logging.captureWarnings(True)
    if verbosity < 0:
        from .errors import XBenchWarning

        logging.getLogger().setLevel(logging.ERROR)  # third-party root-logger warnings (open_clip)
        warnings.filterwarnings("ignore")
        warnings.filterwarnings("default", category=XBenchWarning)


def current_verbosity() -> int | None:
    """The verbosity :func:`setup_logging` was last called with (``-1``, ``0``, ``1``), or None when it was not:
    what a helper process passes on so its lines look like this process's."""
    if not any(getattr(h, "_xbench", False) for h in log.handlers):
        return None
    return -1 if log.level >= logging.WARNING else 1 if log.level <= logging.DEBUG else 0


def setup_logging_from_env() -> None:
    """:func:`setup_logging` at the level ``$XBENCH_LOG_LEVEL`` holds (set by ``xbench reproduce`` for its
    kernels); nothing when it is unset or not an integer."""
    import os

    value = os.environ.get("XBENCH_LOG_LEVEL", "")
    if value.lstrip("-").isdigit():
        setup_logging(max(-1, min(1, int(value))))


class LineProgress:
    """tqdm's ``update``/``set_postfix``/``close`` as a few log lines (one per tenth of ``total`` and a last one)."""

    def __init__(self, total: int, desc: str = "", unit: str = "it", logger: logging.Logger | None = None, steps: int = 10):
        self.total, self.desc, self.unit, self.n, self.skipped = int(total), desc, unit, 0, 0
        self.log = logger or log
        self._every = max(1, -(-self.total // steps)) if self.total else 1
        self._next = self._every
        self._started = time.perf_counter()
        self._postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next and self.n < self.total:
            self._line()
            while self._next <= self.n:
                self._next += self._every

    def set_postfix(self, **kwargs: Any) -> None:
        self._postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def _line(self) -> None:
        done = self.n - self.skipped  # the rate counts work done only
        rate = done / max(time.perf_counter() - self._started, 1e-9)
        if self.skipped:
            self.log.info("%s: %d/%d %s done, %d skipped (%.1f %s/s)", self.desc, done, self.total, self.unit,
                          self.skipped, rate, self.unit)
        else:
            self.log.info("%s: %d/%d %s (%.1f %s/s)", self.desc, self.n, self.total, self.unit, rate, self.unit)

    def close(self) -> None:
        """The last line, unless nothing was counted: a run stopped before its first item (a failed inference under
        ``--keep-going``) prints no "0/4 pair" line that reads as if work had been done.

        Examples
        --------
        >>> LineProgress(4, "evaluate", "pair").close()  # prints nothing
        """
        if self.total and self.n:
            self._line()

    def __iter__(self):  # pragma: no cover - not used as an iterator wrapper
        raise TypeError("LineProgress wraps counts, not iterables")


def progress_bar(*, total: int, desc: str = "", unit: str = "it", disable: bool = False) -> Any:
    """A tqdm bar on a terminal, :class:`LineProgress` elsewhere, a silent tqdm when ``disable``.

    The console tqdm, never ``tqdm.auto``: in a notebook kernel without ipywidgets that one warns "IProgress not
    found" on every bar, disabled ones included.
    """
    from tqdm import tqdm

    if disable:
        return tqdm(total=total, disable=True)
    stream = sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return tqdm(total=total, desc=desc, unit=unit)
    return LineProgress(total, desc, unit)


def advance(bar: Any, done: int, skipped: int, started: float) -> None:
    """Move ``bar`` (from :func:`progress_bar`) by ``done + skipped`` items, counting the skipped ones apart:
    the rate is of work done only (a mostly missing dataset does not read "54624.5 img/s").

    Examples
    --------
    >>> bar = LineProgress(10, "x", "img")
    >>> advance(bar, 2, 8, time.perf_counter())
    >>> (bar.n, bar.skipped)
    (10, 8)
    """
    if isinstance(bar, LineProgress):
        bar.skipped += skipped
        bar.update(done + skipped)
        return
    bar.skipped = getattr(bar, "skipped", 0) + skipped
    bar.update(done + skipped)
    rate = (bar.n - bar.skipped) / max(time.perf_counter() - started, 1e-9)
    bar.set_postfix(**({"skipped": bar.skipped} if bar.skipped else {}), img_s=f"{rate:.1f}")


def progress_iter(items: Any, *, desc: str = "", unit: str = "it", disable: bool = False) -> Any:
    """Iterate ``items`` (a sized iterable) with :func:`progress_bar`."""
    items = list(items) if not hasattr(items, "__len__") else items
    bar = progress_bar(total=len(items), desc=desc, unit=unit, disable=disable)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()
