"""Bounded text of untrusted values, for error messages and reports.

:func:`brief` describes any object read from a file in at most ``limit`` characters, visiting at most
``limit`` of its parts: ``repr``, ``str`` and hashing walk a whole structure (a pickled tuple that doubles
at each of 60 levels holds 2**60 leaves through shared references), and ``f"{x!r:.80}"`` builds the whole
text before cutting it. :func:`visible` shows control characters (line breaks, Unicode bidi overrides,
NUL, ...) as ``\\uXXXX`` escapes, so a value cannot break a one-line error or display reversed.

>>> brief({"a": [1, 2, 3], "b": "x" * 200}, limit=40)
"{'a': [1, 2, 3], 'b': 'xxxxxxxxxxxxxxxx…"
>>> t = (1,)
>>> for _ in range(60):
...     t = (t, t)
>>> brief(t)
'((((((((((((((((((((((((((((((((((((((((…'
>>> visible("evil\\u202eexe.png\\nnext")
'evil\\\\u202eexe.png\\\\u000anext'
"""
from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["brief", "visible"]

_ATOMS = (bool, int, float, complex, type(None))
_MAX_ATOM = 64  # characters of one int / float written before it is cut (a 10**100000 int is never formatted whole)


def visible(text: str, limit: int | None = None, keep: str = "") -> str:
    """``text`` with every control / format / separator character but the space and those in ``keep`` (categories
    C*, Zl, Zp: line breaks, NUL, the bidi controls U+202A–U+202E, U+2066–U+2069, U+200E/F, U+061C, ...) written as
    ``\\uXXXX``; cut to ``limit`` characters of input (marked ``…``) when given."""
    cut = text if limit is None or len(text) <= limit else text[:limit]
    if cut.isprintable() and "\u2028" not in cut and "\u2029" not in cut:  # the common case, in C
        return cut + ("…" if cut is not text else "")
    out = []
    for ch in cut:
        cat = unicodedata.category(ch)
        if ch != " " and ch not in keep and (cat[0] == "C" or cat in ("Zl", "Zp")):
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out) + ("…" if cut is not text else "")


def brief(obj: Any, limit: int = 80) -> str:
    """At most ``limit`` characters describing ``obj`` (``…`` marks a cut), built from at most ``limit`` of its
    parts: nothing is hashed, and no ``repr`` / ``str`` of a container or an unknown object is taken (those are
    named by type)."""
    parts: list[str] = []
    size = 0
    todo: list[Any] = [obj]
    budget = limit
    while todo and size <= limit and budget > 0:
        item = todo.pop()
        budget -= 1
        if isinstance(item, _Text):
            text = item.text
        elif isinstance(item, str | bytes | bytearray):
            text = visible(repr(item[:limit]))
            if len(item) > limit:
                text = text[:-1]  # the closing quote: the value goes on
        elif isinstance(item, _ATOMS):
            text = _atom(item)
        elif type(item) in (list, tuple, set, frozenset, dict):
            opening, closing = {list: "[]", tuple: "()", set: "{}", frozenset: "{}", dict: "{}"}[type(item)]
            children: list[Any] = [_Text(opening)]
            for i, child in enumerate(item.items() if isinstance(item, dict) else item):
                if i:
                    children.append(_Text(", "))
                if len(children) > limit:
                    children.append(_Text("…"))
                    break
                if isinstance(item, dict):
                    children += [child[0], _Text(": "), child[1]]
                else:
                    children.append(child)
            children.append(_Text(closing))
            todo.extend(reversed(children))
            continue
        elif isinstance(item, type):
            text = f"<class {item.__module__}.{item.__qualname__}>"
        else:
            text = f"<{type(item).__module__}.{type(item).__qualname__}>"
        parts.append(text)
        size += len(text)
    text = "".join(parts)
    if todo or size > limit:
        return text[: limit - 1] + "…"
    return text


class _Text:
    """Literal text (brackets, separators) queued between the parts of a container."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def _atom(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<int of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= _MAX_ATOM else text[:_MAX_ATOM] + "…"
