"""Reading arrays from files a user hands to XBench (``xbench score`` maps): ``.npy``, ``.npz``, ``.safetensors``.

Guarantees (each failure is a :class:`~xbench.core.errors.FormatError` naming the file and, for ``.npz``, the member):

* **Plain dtypes only** — bool, signed/unsigned integer, float, complex (:data:`PLAIN_KINDS`), and in
  ``.npy`` / ``.npz`` files fixed-width text (:data:`TEXT_KINDS`, for case ids and class names); object,
  structured, datetime and user dtypes are refused from the header, before any data is read. Nothing is
  unpickled.
* **No allocation sized by the file before its bytes are counted** — an ``.npy`` header's shape × itemsize
  must equal the bytes that follow it in the file (or the ``.npz`` member) exactly, checked before reading.
* **Bounded decompression** — an ``.npz`` member must be stored or deflated; the members' declared sizes
  together may not exceed :func:`max_expanded_bytes` of the archive (``XBENCH_MAX_EXPANSION`` × its size,
  at least ``XBENCH_MIN_EXPANDED_BYTES``), checked before decompressing, and decompression is streamed and
  never yields more than the declared size (Python's ``zipfile`` also checks each member's CRC). A caller
  that knows the expected arrays passes per-member ``limits`` (the results store: shape × itemsize from its
  ``meta.json``), checked the same way; what they allow is never refused by the archive-wide bound.
* ``.safetensors`` is read by the ``safetensors`` library (bounds-checked header and offsets, no code),
  its errors wrapped with the file's name, and its dtypes held to the same rule.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from .errors import FormatError

__all__ = ["EXPANSION", "PLAIN_KINDS", "TEXT_KINDS", "array_from_bytes", "plain_dtype", "MIN_EXPANDED_BYTES", "max_expanded_bytes", "read_npy", "read_npz", "read_safetensors"]

EXPANSION = 100  #: default bound on (decompressed bytes) / (archive bytes) of an .npz (``XBENCH_MAX_EXPANSION``)
MIN_EXPANDED_BYTES = 64 * 2**20  #: an .npz may always expand to this many bytes (``XBENCH_MIN_EXPANDED_BYTES``)
_MAX_HEADER = 10_000  # numpy's own default bound on an .npy header

#: numpy dtype kinds an array or scalar from a file may have: bool, signed / unsigned integer, float,
#: complex. No object, structured (void), string, datetime or user dtype is ever built from a file.
PLAIN_KINDS = frozenset("biufc")


#: Fixed-width text kinds (``U``, ``S``) also admitted in ``.npy`` / ``.npz`` files (case ids, class names):
#: plain bytes, no pointers. Never admitted in pickles.
TEXT_KINDS = frozenset("US")


def plain_dtype(spec: Any, where: str = "pickle", *, text: bool = False) -> np.dtype:
    """``spec`` as a numpy dtype of a plain numeric kind (:data:`PLAIN_KINDS`, or :data:`TEXT_KINDS` with ``text``),
    else ``ValueError``."""
    try:
        dtype = np.dtype(spec)
    except Exception as exc:
        raise ValueError(f"{where}: dtype {spec!r} is not a numpy dtype ({exc})") from None
    if (dtype.kind not in PLAIN_KINDS and not (text and dtype.kind in TEXT_KINDS)) or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{where}: dtype {dtype} is not admitted (plain bool/int/uint/float/complex"
                         f"{'/fixed-width text' if text else ''} only)")
    return dtype


def _nbytes(shape: Any, dtype: np.dtype) -> int:
    """Exact byte count of ``shape`` × ``dtype`` in Python integers (no overflow); ``ValueError`` if ``shape`` is not
    a tuple of non-negative ints."""
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 32:
        raise ValueError(f"array shape {shape!r} is not a tuple of at most 32 non-negative ints")
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def array_from_bytes(raw: Any, dtype: np.dtype, shape: tuple[int, ...], fortran: bool = False) -> np.ndarray:
    """A fresh array of ``shape`` filled from ``raw`` (bytes already read): its length must be exactly the array's size."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ValueError(f"array data must be raw bytes, got {type(raw).__name__}")
    need = _nbytes(shape, dtype)
    if len(raw) != need:
        raise ValueError(f"array of shape {shape} and dtype {dtype} needs {need} bytes; the data holds {len(raw)}")
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def max_expanded_bytes(archive_bytes: int) -> int:
    """Bytes an ``.npz`` of ``archive_bytes`` may decompress to in all (see the module docstring)."""
    return max(_env_int("XBENCH_MIN_EXPANDED_BYTES", MIN_EXPANDED_BYTES),
               _env_int("XBENCH_MAX_EXPANSION", EXPANSION) * archive_bytes)


def _read_npy_stream(fh: IO[bytes], size: int, where: Path, member: str | None) -> np.ndarray:
    """One ``.npy`` from ``fh`` holding exactly ``size`` bytes."""
    field = member
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh, max_header_size=_MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=_MAX_HEADER)
        else:
            raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
        dtype = plain_dtype(dtype, "header", text=True)
        header = fh.tell()
        need = _nbytes(tuple(shape), dtype)
        if need != size - header:
            raise ValueError(f"header declares shape {shape} of {dtype} ({need} bytes); the file holds "
                             f"{size - header} data bytes")
        raw = fh.read(need)
        return array_from_bytes(raw, dtype, tuple(shape), bool(fortran))
    except FormatError:
        raise
    except Exception as exc:  # numpy's header errors, short reads, zip CRC errors, ...
        raise FormatError(where, f"not a readable .npy array ({type(exc).__name__}: {exc})", field=field) from None


def read_npy(path: str | Path) -> np.ndarray:
    """An ``.npy`` file as a plain numeric array (module docstring); never unpickles."""
    path = Path(path)
    with open(path, "rb") as fh:
        return _read_npy_stream(fh, path.stat().st_size, path, None)


def _member_name(filename: str) -> str:
    return filename[:-4] if filename.endswith(".npy") else filename


def read_npz(path: str | Path, *, limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """An ``.npz`` archive as ``{name: array}`` (``.npy`` suffix dropped), with bounded decompression.

    With ``limits`` (``{name: bytes}``, names without ``.npy``) every member must be named there and may
    declare at most its limit in data bytes (its ``.npy`` header aside) — checked, like the archive's
    bound, before anything is decompressed; the archive's bound is then at least the members' limits
    together (expected content is never refused for compressing well).
    """
    path = Path(path)
    size = path.stat().st_size
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise FormatError(path, f"not a readable .npz archive ({type(exc).__name__}: {exc})") from None
    with archive:
        infos = archive.infolist()
        bound = max_expanded_bytes(size)
        if limits is not None:  # what the caller expects may always be read, however well it compresses
            bound = max(bound, sum(limits.get(_member_name(i.filename), 0) + _MAX_HEADER + 16 for i in infos))
        declared = 0
        for info in infos:
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise FormatError(path, "member is compressed with an unsupported method", field=info.filename)
            if info.compress_type == zipfile.ZIP_STORED and info.file_size > size:
                raise FormatError(path, f"member declares {info.file_size} bytes; the archive has {size}",
                                  field=info.filename)
            if limits is not None:
                name = _member_name(info.filename)
                if name not in limits:
                    raise FormatError(path, f"unexpected member (expected {', '.join(sorted(limits))})",
                                      field=info.filename)
                if info.file_size > limits[name] + _MAX_HEADER + 16:  # 16: the magic and header-length bytes
                    raise FormatError(path, f"member declares {info.file_size} bytes; at most {limits[name]} data "
                                            "bytes are expected", field=info.filename)
            declared += info.file_size
            if declared > bound:
                raise FormatError(path, f"members expand to more than {bound} bytes ({declared} declared so far, "
                                        f"{size} on disk; XBENCH_MAX_EXPANSION / XBENCH_MIN_EXPANDED_BYTES raise "
                                        "the bound)", field=info.filename)
        out: dict[str, np.ndarray] = {}
        for info in infos:
            name = _member_name(info.filename)
            try:
                with archive.open(info) as fh:
                    out[name] = _read_npy_stream(fh, info.file_size, path, info.filename)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise FormatError(path, f"unreadable member ({exc})", field=info.filename) from None
        return out


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """A ``.safetensors`` file as ``{name: array}`` through the ``safetensors`` library; errors name the file."""
    from safetensors.numpy import load_file

    path = Path(path)
    try:
        table = load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError / ValueError
        raise FormatError(path, f"not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    for name, arr in table.items():
        try:
            plain_dtype(arr.dtype, "tensor")
        except ValueError as exc:
            raise FormatError(path, str(exc), field=name) from None
    return table
