"""One schema mechanism for every YAML XBench reads: run configs, model YAMLs and dataset manifests.

A schema is a dataclass whose fields are the file's keys (a trailing ``_`` is dropped: ``class_`` is the
key ``class``; ``metadata={"key": "bootstrap.replicates"}`` reads a key of a nested mapping).
:func:`load` builds one from a parsed mapping and raises one :class:`~xbench.core.errors.FormatError` naming
file and field for the first problem:

* an **unknown key**, with "did you mean" and the known keys;
* a **missing key** (a field without default);
* a **wrong type**, read from the annotation: ``int`` (not ``bool``, not ``4.7``), ``float`` (any number),
  ``bool``, ``str`` (non-empty), ``X | None``, ``Literal[...]`` (with "did you mean"), ``list[X]``,
  ``tuple[X, Y]`` / ``tuple[X, ...]``, ``dict[str, X]``, a nested schema, ``Any``;
* a value outside ``metadata={"choices": ...}`` (e.g. the canonical finding ids), with "did you mean".

Field metadata ``kind="path"`` accepts a non-empty ``str`` or :class:`~pathlib.Path` (kept as ``str``);
``parse=f`` hands the raw value to ``f(where, field, value)``. After building, a schema's own
``_check(where, prefix)`` method (if any) runs the checks that span several keys.

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass
... class Point:
...     x: int
...     label: str = "p"
>>> load(Point, {"x": 3})
Point(x=3, label='p')
>>> load(Point, {"x": 3, "lable": "q"}, "p.yaml")
Traceback (most recent call last):
...
xbench.core.errors.FormatError: p.yaml, field 'lable': unknown key(s) 'lable' (did you mean 'label'?); known: label, x
"""
from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ..core.errors import FormatError

__all__ = ["load", "did_you_mean", "unknown_keys", "check_type", "check_choice", "yaml_key", "fields_of", "check_value"]

T = TypeVar("T")

_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a non-empty string",
             "path": "a non-empty path"}


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known word, else ``""``."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys(where: str | Path, what: str, keys: Iterable[str], known: Iterable[str], field: str) -> FormatError:
    """The error for unknown keys: each with its "did you mean", then the known ones."""
    known = sorted(map(str, known))
    hints = "; ".join(f"{k!r}{did_you_mean(k, known)}" for k in keys)
    return FormatError(where, f"unknown {what} {hints}; known: {', '.join(known) or '(none)'}", field=field)


def check_type(where: str | Path, field: str, value: Any, kind: str) -> Any:
    """``value`` if it is of ``kind`` (int | float | bool | str | path), else a FormatError naming the field.

    ``float`` values come back as ``float``; ``path`` values as given.
    """
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str) and value != "",
        "path": isinstance(value, (str, Path)) and str(value).strip() != "",
    }[kind]
    if not ok:
        raise FormatError(where, f"must be {_EXPECTED[kind]}, got {value!r} ({type(value).__name__})", field=field)
    return float(value) if kind == "float" else value


def check_choice(where: str | Path, field: str, value: Any, choices: Iterable[Any], what: str = "value") -> Any:
    """``value`` if it is one of ``choices``, else a FormatError with "did you mean"."""
    choices = list(choices)
    if value not in choices:
        names = sorted(map(str, choices))
        shown = ", ".join(names) if len(names) <= 12 else ", ".join(names[:12]) + f", … ({len(names)} in all)"
        raise FormatError(where, f"unknown {what} {value!r}{did_you_mean(str(value), names)}; one of: {shown}",
                          field=field)
    return value


def yaml_key(f: dataclasses.Field) -> str:
    """The YAML key of a schema field (``metadata["key"]``, else the name without a trailing ``_``)."""
    return f.metadata.get("key", f.name.rstrip("_"))


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


_SIMPLE = {int: "int", float: "float", bool: "bool", str: "str", Path: "path"}


def _convert(where: str | Path, field: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` checked (and converted where the annotation says so) against the annotation ``tp``."""
    if "parse" in meta:
        return meta["parse"](where, field, value)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert_union(where, field, value, get_args(tp), meta)
    if tp is Any:
        out = value
    elif origin is Literal:
        out = check_choice(where, field, value, get_args(tp))
    elif dataclasses.is_dataclass(tp):
        out = load(tp, value, where, field)
    elif origin in (list, tuple, dict):
        out = _convert_container(where, field, value, origin, get_args(tp))
    elif tp in _SIMPLE:
        out = check_type(where, field, value, meta.get("kind", _SIMPLE[tp]))
        if tp is str and isinstance(out, Path):
            out = str(out)
    else:
        raise TypeError(f"schema field {field!r}: annotation {tp!r} is not supported")
    if "choices" in meta:
        check_choice(where, field, out, meta["choices"], meta.get("what", "value"))
    return out


def _convert_union(where: str | Path, field: str, value: Any, args: tuple, meta: Mapping[str, Any]) -> Any:
    """``value`` as the first option of a union that takes it (null only where the union has ``None``); else the
    first option's error."""
    if value is None:
        if type(None) in args:
            return None
        raise FormatError(where, "must not be null", field=field)
    errors = []
    for option in (a for a in args if a is not type(None)):
        try:
            return _convert(where, field, value, option, meta)
        except FormatError as exc:
            errors.append(exc)
    raise errors[0]


def _convert_container(where: str | Path, field: str, value: Any, origin: type, args: tuple) -> Any:
    """A ``list[...]``, ``tuple[...]`` (fixed length, or ``tuple[T, ...]``) or ``dict[str, ...]`` value, each item
    converted against its annotation."""
    if origin is dict:
        if not isinstance(value, Mapping):
            raise FormatError(where, f"must be a mapping, got {value!r}", field=field)
        return {k: _convert(where, _join(field, str(k)), v, args[1] if args else Any, {}) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise FormatError(where, f"must be a list, got {value!r}", field=field)
        return [_convert(where, f"{field}[{i}]", v, args[0] if args else Any, {}) for i, v in enumerate(value)]
    if not isinstance(value, (list, tuple)):
        raise FormatError(where, f"must be a list, got {value!r}", field=field)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(where, field, v, args[0], {}) for v in value)
    if len(value) != len(args):
        raise FormatError(where, f"must be a list of {len(args)} values, got {value!r}", field=field)
    return tuple(_convert(where, field, v, a, {}) for v, a in zip(value, args))


def check_value(where: str | Path, field: str, value: Any, annotation: Any) -> Any:
    """``value`` checked against a type annotation (as :func:`load` checks a field); ``TypeError`` when the
    annotation is not one the schema understands."""
    return _convert(where, field, value, annotation, {})


def load(cls: type[T], raw: Any, where: str | Path = "<config>", prefix: str = "") -> T:
    """Build the schema dataclass ``cls`` from the mapping ``raw`` read from ``where``.

    Parameters
    ----------
    cls : dataclass type
        The schema.
    raw : mapping
        The parsed YAML (or its part at ``prefix``).
    where : str or Path
        The file, named in every error.
    prefix : str
        Field path of ``raw`` inside the file (``"classes[3]"``), prefixed to field names in errors.

    Raises
    ------
    FormatError
        The first unknown key (with "did you mean"), missing key, wrong type or unknown choice.
    """
    if not isinstance(raw, Mapping):
        raise FormatError(where, f"must be a mapping, got {raw!r}", field=prefix or None)
    fields = [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]
    _check_keys(cls, raw, fields, where, prefix)
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields:
        key = yaml_key(f)
        top, _, sub = key.partition(".")
        holder = (raw.get(top) or {}) if sub else raw
        name = sub or top
        if name not in holder:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FormatError(where, "missing required key", field=_join(prefix, key))
            continue
        kwargs[f.name] = _convert(where, _join(prefix, key), holder[name], hints[f.name], f.metadata)
    obj = cls(**kwargs)
    check: Callable[[str | Path, str], None] | None = getattr(obj, "_check", None)
    if check is not None:
        check(where, prefix)
    return obj


def _check_keys(cls: type, raw: Mapping[str, Any], fields: list[dataclasses.Field], where: str | Path,
                prefix: str) -> None:
    """The first unknown key of ``raw`` (with "did you mean"), at the top or inside a nested mapping read into flat
    fields (``bootstrap.replicates``), or a nested mapping that is not one, raises :class:`FormatError`."""
    known = {yaml_key(f).split(".")[0] for f in fields}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise unknown_keys(where, getattr(cls, "__schema_what__", "key(s)"), unknown, known,
                           prefix or unknown[0])
    groups: dict[str, set[str]] = {}
    for f in fields:
        top, _, sub = yaml_key(f).partition(".")
        if sub:
            groups.setdefault(top, set()).add(sub)
    for top, subs in groups.items():
        value = raw.get(top)
        if value is not None and not isinstance(value, Mapping):
            raise FormatError(where, f"must be a mapping with keys {', '.join(sorted(subs))}, got {value!r}",
                              field=_join(prefix, top))
        extra = sorted(str(k) for k in (value or {}) if k not in subs)
        if extra:
            raise unknown_keys(where, "key(s)", extra, subs, _join(prefix, top))


def fields_of(cls: type) -> list[str]:
    """The YAML keys of a schema, in declaration order."""
    return [yaml_key(f) for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]

