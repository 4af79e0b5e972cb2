"""Names that become paths: one rule, checked where a name enters (the registry) and again where a path is made.

A dataset or model name matches :data:`SAFE_NAME` — a letter or digit first, then letters, digits, ``_ . + -``
(``+`` for model variants such as ``kad+gradcam``) — and holds no ``..``. So a name is always one plain path
component: never empty, ``.``, ``..``, absolute, or holding a separator or a NUL byte. :func:`contained`
joins such names under a base folder and checks that the result stays inside it.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..core.errors import XBenchError

__all__ = ["SAFE_NAME", "check_name", "contained"]

#: The rule for dataset / model names (and anything else that becomes one path component).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_name(name: object, kind: str, where: str | Path | None = None) -> str:
    """``name`` if it is a safe name (module docstring), else :class:`XBenchError` naming ``kind`` and ``where``.

    Examples
    --------
    >>> check_name("kad+gradcam", "model")
    'kad+gradcam'
    >>> check_name("..", "dataset")
    Traceback (most recent call last):
    ...
    xbench.core.errors.XBenchError: dataset name '..' is not allowed: names are a letter or digit, then letters, digits, '_', '.', '+' or '-', without '..'
    """
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        origin = f" ({where})" if where is not None else ""
        raise XBenchError(f"{kind} name {name!r}{origin} is not allowed: names are a letter or digit, then letters, "
                          "digits, '_', '.', '+' or '-', without '..'")
    return name


def contained(base: str | Path, *names: str, kind: str = "path component") -> Path:
    """``base / name / ...`` for safe names, checked to resolve inside ``base``; :class:`XBenchError` otherwise."""
    base = Path(base)
    for name in names:
        check_name(name, kind)
    path = base.joinpath(*names)
    root = base.resolve()
    if not path.resolve().is_relative_to(root):
        raise XBenchError(f"{path} resolves outside {base} (a link?); refusing to write there")
    return path
