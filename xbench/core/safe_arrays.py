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
  at least ``XBENCH_MIN_EXPANDED_BYTES``), checked before decompressing; a member's compressed size is held to
  its declared size (stored: equal; deflated: at most deflate's worst case for it), inflating never yields more
  than the declared size + 1 byte (more is refused), and each member's CRC-32 is checked. A caller
  that knows the expected arrays passes per-member ``limits`` (the results store: shape × itemsize from its
  ``meta.json``), checked the same way; what they allow is never refused by the archive-wide bound.
  The zip's central directory is parsed by Python's ``zipfile``; each member is then read in one piece (its
  local header checked as ``zipfile`` does: signature, name, no encryption) and its ``.npy`` header parsed by
  a strict pattern of the headers NumPy writes, falling back to NumPy's own parser for any other header.
* ``.safetensors`` is read by the ``safetensors`` library (bounds-checked header and offsets, no code),
  its errors wrapped with the file's name, and its dtypes held to the same rule.
"""
from __future__ import annotations

import functools
import io
import math
import os
import re
import struct
import zipfile
import zlib
from pathlib import Path
from collections.abc import Collection, Mapping
from typing import IO, Any

import numpy as np

from .errors import FormatError

__all__ = ["EXPANSION", "PLAIN_KINDS", "TEXT_KINDS", "array_from_bytes", "plain_dtype", "MIN_EXPANDED_BYTES", "max_expanded_bytes", "read_npy", "read_npy_bytes", "read_npz", "read_safetensors"]

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


def read_npy_bytes(data: bytes | memoryview, where: str | Path) -> np.ndarray:
    """An ``.npy`` held whole in ``data`` (bytes read from the file ``where``), checked as :func:`read_npy` checks a
    file: plain dtype, shape × itemsize equal to the bytes present (before anything is allocated)."""
    return _npy_from_bytes(data, Path(where), None)


def _member_name(filename: str) -> str:
    return filename[:-4] if filename.endswith(".npy") else filename


#: The ``.npy`` header NumPy writes (``np.save`` / ``np.savez``, format 1.0 / 2.0): parsed here without
#: ``ast.literal_eval``; any other header goes to NumPy's own parser (:func:`_read_npy_stream`).
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=][a-zA-Z][0-9]{1,4})', 'fortran_order': (False|True), "
                         r"'shape': \(((?:[0-9]{1,19}, )*[0-9]{1,19},?)?\), \} *\n")
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader: 30 bytes before the member's name
_ZIP_UNSUPPORTED = 0x1 | 0x20 | 0x40  # encrypted, compressed patched data, strong encryption (zipfile refuses them too)
_ZIP_UTF8 = 0x800


@functools.lru_cache(maxsize=256)
def _npy_header(text: bytes) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    """(dtype, shape, fortran order) of an ``.npy`` header NumPy writes (:data:`_NPY_HEADER`), ``None`` for any other
    header; ``ValueError`` for a dtype that is not admitted. Cached: a store's chunks repeat a few headers."""
    match = _NPY_HEADER.fullmatch(text.decode("latin1"))
    if match is None:
        return None
    dims = match.group(3)
    shape = tuple(int(d) for d in dims.split(",") if d.strip()) if dims else ()
    return plain_dtype(match.group(1), "header", text=True), shape, match.group(2) == "True"


def _npy_from_bytes(data: bytes | np.ndarray, where: Path, member: str) -> np.ndarray:
    """One ``.npy`` held whole in ``data`` (a member of an archive), as :func:`_read_npy_stream` reads it. ``data``
    may be a writable ``uint8`` array owned by the caller: the array returned is then a view of it (no copy)."""
    view = memoryview(data)
    prefix = bytes(view[:12])
    parsed = None
    if prefix[:8] in (b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00") and len(prefix) == 12:
        start = 10 if prefix[6] == 1 else 12
        length = int.from_bytes(prefix[8:start], "little")
        if length <= _MAX_HEADER:
            try:
                parsed = _npy_header(bytes(view[start:start + length]))
            except ValueError as exc:
                raise FormatError(where, f"not a readable .npy array (ValueError: {exc})", field=member) from None
    if parsed is None:  # not a header NumPy writes: NumPy's parser decides (and names the problem)
        return _read_npy_stream(io.BytesIO(view), len(view), where, member)
    dtype, shape, fortran = parsed
    try:
        need = _nbytes(shape, dtype)
        if need != len(view) - start - length:
            raise ValueError(f"header declares shape {shape} of {dtype} ({need} bytes); the file holds "
                             f"{len(view) - start - length} data bytes")
        array = np.frombuffer(data, dtype, offset=start + length, count=math.prod(shape))
        array = array.reshape(shape, order="F" if fortran else "C")
        return array.copy() if fortran or not array.flags.writeable else array
    except Exception as exc:
        raise FormatError(where, f"not a readable .npy array ({type(exc).__name__}: {exc})", field=member) from None


def _deflate_bound(size: int) -> int:
    """Most bytes a deflate stream of ``size`` bytes may reasonably take: 9 bits a byte (fixed Huffman codes on
    incompressible data; zlib itself stores such blocks, 5 bytes per block) and a margin."""
    return size + size // 8 + 5 * (size // 16384 + 1) + 64


def _member_bytes(fh: IO[bytes], info: zipfile.ZipInfo, crc: bool = True) -> bytes | np.ndarray:
    """The uncompressed bytes of one member of an open zip file, checked (local header, sizes, CRC-32 unless
    ``crc`` is false for a stored member): a fresh ``uint8`` array for a stored member, ``bytes`` for a deflated
    one; ``zipfile.BadZipFile`` / ``EOFError`` for damage."""
    fh.seek(info.header_offset)
    head = fh.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size:
        raise EOFError("truncated local file header")
    fields = _LOCAL_HEADER.unpack(head)
    if fields[0] != zipfile.stringFileHeader:
        raise zipfile.BadZipFile("bad magic number for the local file header")
    name = fh.read(fields[10])
    if (name.decode("utf-8" if fields[3] & _ZIP_UTF8 else "cp437", "replace") != info.orig_filename
            or (info.flag_bits | fields[3]) & _ZIP_UNSUPPORTED or fields[4] != info.compress_type):
        raise zipfile.BadZipFile("local file header differs from the central directory (name, method) or is encrypted "
                                 "/ patched")
    fh.seek(fields[11], os.SEEK_CUR)
    if info.compress_type == zipfile.ZIP_STORED:  # read into a fresh array: its arrays are views of it, no copy
        data = np.empty(info.compress_size, np.uint8)
        got = fh.readinto(data)
        if got != info.compress_size:
            raise EOFError(f"member data cut short ({got} of {info.compress_size} bytes)")
        if crc and zlib.crc32(data) != info.CRC:
            raise zipfile.BadZipFile("bad CRC-32 for the member")
        return data
    raw = fh.read(info.compress_size)  # deflated (read_npz admits no other method)
    if len(raw) != info.compress_size:
        raise EOFError(f"member data cut short ({len(raw)} of {info.compress_size} bytes)")
    inflate = zlib.decompressobj(-15)
    data = inflate.decompress(raw, info.file_size + 1)  # one byte more than declared: a longer stream is caught
    if len(data) != info.file_size or not inflate.eof:
        raise zipfile.BadZipFile(f"member inflates to {'more than' if len(data) > info.file_size else 'less than'} "
                                 f"its declared {info.file_size} bytes (bad CRC-32 / damaged stream)")
    if zlib.crc32(data) != info.CRC:
        raise zipfile.BadZipFile("bad CRC-32 for the member")
    return data


def read_npz(path: str | Path, *, limits: Mapping[str, int] | None = None,
             self_checked: Collection[str] = ()) -> dict[str, np.ndarray]:
    """An ``.npz`` archive as ``{name: array}`` (``.npy`` suffix dropped), with bounded decompression.

    With ``limits`` (``{name: bytes}``, names without ``.npy``) every member must be named there and may
    declare at most its limit in data bytes (its ``.npy`` header aside) — checked, like the archive's
    bound, before anything is decompressed; the archive's bound is then at least the members' limits
    together (expected content is never refused for compressing well).

    ``self_checked`` names stored members whose content carries its own checksum that the caller verifies (the
    results store's zstd frame): their CRC-32 is not computed a second time. Every other member's is.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        try:
            archive = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise FormatError(path, f"not a readable .npz archive ({type(exc).__name__}: {exc})") from None
        infos = archive.infolist()
        names = [_member_name(info.filename) for info in infos]
        bound = max_expanded_bytes(size)
        if limits is not None:  # what the caller expects may always be read, however well it compresses
            bound = max(bound, sum(limits.get(name, 0) + _MAX_HEADER + 16 for name in names))
        declared = 0
        for info, name in zip(infos, names):
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise FormatError(path, "member is compressed with an unsupported method", field=info.filename)
            if info.compress_type == zipfile.ZIP_STORED and info.file_size > size:
                raise FormatError(path, f"member declares {info.file_size} bytes; the archive has {size}",
                                  field=info.filename)
            if limits is not None:
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
            most = info.file_size if info.compress_type == zipfile.ZIP_STORED else _deflate_bound(info.file_size)
            if info.compress_size > most or (info.compress_type == zipfile.ZIP_STORED and info.compress_size != most):
                raise FormatError(path, f"member's compressed size {info.compress_size} does not fit its declared "
                                        f"{info.file_size} bytes", field=info.filename)
        out: dict[str, np.ndarray] = {}
        for info, name in zip(infos, names):
            try:
                data = _member_bytes(fh, info, crc=name not in self_checked or info.compress_type != zipfile.ZIP_STORED)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError) as exc:
                raise FormatError(path, f"unreadable member ({exc})", field=info.filename) from None
            out[name] = _npy_from_bytes(data, path, info.filename)
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
