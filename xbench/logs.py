"""Logging and progress conventions of XBench.

* Messages go through :mod:`logging` under the ``xbench`` logger; the CLI calls :func:`setup_logging`
  once (``--quiet``: warnings and errors only, no progress; default: info; ``-v``: debug).
* Warnings (:class:`~xbench.errors.XBenchWarning` for counted skips and undefined metrics) are routed
  into the same log by the CLI, one line each, without the echoed source line.
* :func:`progress_bar` is a tqdm bar on an interactive terminal; elsewhere (a log file, CI, an executed
  notebook) it writes one ``logging`` line per tenth of the work instead of redrawing a bar.
"""
from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any

__all__ = ["setup_logging", "progress_bar", "progress_iter", "LineProgress"]

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
    log.setLevel(level)
    log.propagate = False
    warnings.formatwarning = _short_warning  # type: ignore[assignment]
    logging.captureWarnings(True)


class LineProgress:
    """tqdm's ``update``/``set_postfix``/``close`` as a few log lines (one per tenth of ``total`` and a last one)."""

    def __init__(self, total: int, desc: str = "", unit: str = "it", logger: logging.Logger | None = None, steps: int = 10):
        self.total, self.desc, self.unit, self.n = int(total), desc, unit, 0
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
        rate = self.n / max(time.perf_counter() - self._started, 1e-9)
        self.log.info("%s: %d/%d %s (%.1f %s/s)", self.desc, self.n, self.total, self.unit, rate, self.unit)

    def close(self) -> None:
        if self.total:
            self._line()

    def __iter__(self):  # pragma: no cover - not used as an iterator wrapper
        raise TypeError("LineProgress wraps counts, not iterables")


def progress_bar(*, total: int, desc: str = "", unit: str = "it", disable: bool = False) -> Any:
    """A tqdm bar on a terminal, :class:`LineProgress` elsewhere, a silent tqdm when ``disable``."""
    from tqdm.auto import tqdm

    if disable:
        return tqdm(total=total, disable=True)
    stream = sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return tqdm(total=total, desc=desc, unit=unit)
    return LineProgress(total, desc, unit)


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
