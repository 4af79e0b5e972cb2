"""Typed errors and warnings of XBench.

Every error says what was received and what was expected; file errors name the
file (and line / field where there is one) and, for weights and datasets, where
the file is officially published.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class XBenchError(Exception):
    """Base class of every error raised by XBench.

    Every XBench error pickles as its type, ``args`` and attributes, whatever its constructor takes, so an error
    raised in a worker process reaches the caller as itself (same type, same message).
    """

    def __reduce__(self) -> tuple:
        return _rebuild_error, (type(self), self.args, dict(self.__dict__))


def _rebuild_error(cls: type, args: tuple, state: dict) -> BaseException:
    """An XBench error of type ``cls`` with ``args`` and attributes ``state``, without calling its ``__init__``."""
    error = cls.__new__(cls, *args)
    (OSError if isinstance(error, OSError) else BaseException).__init__(error, *args)  # OSError: errno, strerror
    error.__dict__.update(state)
    return error


class XBenchWarning(UserWarning):
    """Warning for undefined metrics, counted skips and unverified models."""


class UnknownNameError(XBenchError, KeyError):
    """A model, dataset, finding or metric name that is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        self.message = f"Unknown {kind} {name!r}.{hint} Available: {', '.join(known) or '(none)'}."
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class MissingFileError(XBenchError, FileNotFoundError):
    """A required local file (image, annotation, weights) is absent.

    The message names the expected path and, when known, where the file is
    officially published; XBench never downloads it.
    """

    def __init__(self, path: str | Path, what: str, source: str | None = None, hint: str | None = None):
        self.path = Path(path)
        where = f" It is officially published at {source}." if source else ""
        tail = hint or "XBench never downloads files; place it there."
        self.message = f"Missing {what}: expected {self.path}.{where} {tail}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class FormatError(XBenchError, ValueError):
    """A file whose content does not follow its published format.

    Carries the file, the 1-based line (or record) and the field when known.
    """

    def __init__(self, path: str | Path, message: str, line: int | None = None, field: str | None = None):
        self.path, self.line, self.field = Path(path), line, field
        where = str(self.path)
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        self.message = f"{where}: {message}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class CheckpointError(XBenchError, ValueError):
    """A checkpoint that does not match the architecture (missing/unexpected keys, shapes)."""


class OutputError(XBenchError, OSError):
    """A file or folder XBench must write cannot be written (read-only folder, disk full, ...).

    The message names the path and the system's reason; nothing partial is left at the path
    (:mod:`xbench.core.atomic`).
    """

    def __init__(self, path: str | Path, cause: OSError, what: str = "cannot write"):
        self.path = Path(path)
        reason = cause.strerror or str(cause)
        self.message = f"{what}: {self.path} ({reason})"
        super().__init__(cause.errno, self.message)

    def __str__(self) -> str:
        return self.message


class StoreError(XBenchError):
    """The results store holds results of other inputs, or a damaged file (named in the message)."""
