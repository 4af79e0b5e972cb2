"""The results store: per-case scores and native-grid maps, written atomically per chunk.

Layout under a run's output folder::

    store/<dataset>/<model>/meta.json               what produced the chunks (config, code version, findings,
                                                     and ``fingerprint``: sha256 of weights / annotation files)
    store/<dataset>/<model>/chunk-00003.npz         case_ids, scores (N, C) float32, probs (N, C) float32,
                                                     maps (N, C, h, w) float16, sizes (N, 2), windows (N, 4),
                                                     skipped_ids, skipped_reasons (chunk layout below)
    store/<dataset>/<model>/chunk-00003.index.json  the chunk's size, sha256 and the digest of the inputs
                                                     (:func:`inputs_digest` of meta.json) it was made from

Cases are split into fixed chunks of ``chunk_size`` consecutive dataset rows.
A chunk file is written to a temporary name and renamed (atomic on POSIX), then
its index file likewise: a chunk counts as present only when its index exists and
its size and sha256 match, so an interrupted run loses at most the chunk in flight,
a damaged chunk (truncated, emptied, edited) is reported by name and recomputed,
and a re-run skips every intact chunk. A chunk whose index names other inputs than
``meta.json`` is refused (results of different inputs are never mixed).

Chunk layout: a zip archive (``.npz``) of ``.npy`` members in a fixed order — ``case_ids``,
``scores``, ``probs``, ``maps_shape``, ``maps_z0``, ``maps_z1`` (float32 maps: also ``maps_z2``, ``maps_z3``),
``sizes``, ``windows``, ``skipped_ids``, ``skipped_reasons``. The maps are byte-shuffled, as HDF5's / blosc's
shuffle filter does: byte plane ``k`` holds byte ``k`` (little-endian: 0 is the low byte) of every map value in
C order, N·C·h·w bytes. Member ``maps_z{k}`` is a ``uint8`` array holding plane ``k`` as one zstd frame (level
:data:`ZSTD_LEVEL`, single-threaded, with its content size and checksum); ``maps_shape`` (int64, 4) is the maps'
shape; the number of planes names the dtype (2: float16, 4: float32). One frame per plane: the low bytes of
float maps are mantissa noise that zstd keeps as raw blocks (a copy to read), the high bytes (sign, exponent,
top mantissa bits) shrink to about half. Every other member holds its array as it is, deflated with zlib at
:data:`ZLIB_LEVEL` when that shrinks its first 64 KiB below 90 % (case ids, sizes, windows), else stored; a frame
is always stored. Lossless: the stored float16 / float32 values (NaN payloads, ±inf, −0.0 included) come back bit
for bit, so tables are byte-identical. Bytes are deterministic: fixed member order, fixed zip date (1980-01-01)
and attributes, so the same arrays give the same file bytes (for given zlib and zstd builds). Sizes and read /
write times against the layouts before: docs/notes/store-compress.md, ``benchmarks/bench_store.py``,
docs/perf/store_read_cpu.json.

Layouts read (a folder may mix them; the layout describes itself, so ``STORE_VERSION`` is unchanged and a store
written before is resumed): the zstd layout above; the shuffled-zlib layout written before it (members
``maps_shape``, ``maps_b0``, ``maps_b1``, … holding the planes as plain ``uint8`` arrays, each deflated when that
pays; ``encode_chunk(..., codec="zlib")`` still writes it); and the ``np.savez`` layout before compression (one
uncompressed ``maps`` member). :func:`read_chunk_file` reads all three. ``np.load`` lists a chunk's members; a
plane is ``zstandard.ZstdDecompressor().decompress(z["maps_z1"].tobytes())``.

Reading is bounded: ``allow_pickle`` is never on; members are read by :func:`xbench.core.safe_arrays.read_npz`
(plain dtypes, CRC-checked — a zstd frame by its own checksum instead, which zstd checks); no member may declare
more bytes than ``meta.json`` allows it (``chunk_size`` × findings × grid × itemsize for the maps, see
:func:`chunk_limits`), ``maps_shape`` may not declare more values than that, and each frame must declare exactly
its plane's size, all checked before anything is decompressed — a hostile chunk cannot make the reader allocate
more.
"""
from __future__ import annotations

import io
import json
import math
import shutil
import warnings
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.atomic import atomic_write, atomic_write_bytes
from ..core.errors import FormatError, OutputError, StoreError, XBenchError, XBenchWarning
from ..core.files import contained_folder, read_regular, regular_size
from ..core.safe_arrays import max_expanded_bytes, read_npz
from .fingerprint import diff_keys, digest, file_sha256

STORE_VERSION = 2

#: meta keys not compared anywhere (they describe when / with which code, not what)
UNCOMPARED_KEYS = ("code_version", "created")
#: meta keys that name local paths: compared on resume (same machine), not between shards of other machines,
#: where the ``fingerprint`` (content hashes) stands for them
LOCAL_KEYS = ("dataset_root", "weights")
_ARRAYS = {"case_ids": "U", "scores": "f", "probs": "f", "maps": "f", "skipped_ids": "U", "skipped_reasons": "U"}

#: zlib level of every chunk member but the maps (and of the maps too in the shuffled-zlib layout that
#: :func:`encode_chunk` writes with ``codec="zlib"``): 1 writes fastest; higher levels save little on float maps
#: (docs/perf/store_cpu.json measures levels 1, 3 and 6)
ZLIB_LEVEL = 1
#: zstd level of the maps' byte planes in the chunks written now (docs/perf/store_read_cpu.json measures 1 and 3)
ZSTD_LEVEL = 1
#: codecs of the maps :func:`encode_chunk` writes: ``"zstd"`` (the store's layout) or ``"zlib"`` (the layout before,
#: still read; kept writable so that tests and ``benchmarks/bench_store.py`` can make such chunks)
MAPS_CODECS = ("zstd", "zlib")
#: longest case id / skip reason (characters) a chunk may hold: bounds the text members when reading
#: (a longer skip reason is cut when written, keeping its ``Type:`` prefix; a longer case id is refused)
MAX_TEXT_CHARS = 16384
#: most (bytes a chunk's members declare) / (the chunk file's bytes) that meta.json's sizes may ask for; float maps
#: shrink 1.3-2× (docs/notes/store-compress.md), so only degenerate maps (all equal) compress more
EXPECTED_EXPANSION = 64
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed member date: same arrays, same bytes
_MAP_DTYPES = {2: np.dtype("<f2"), 4: np.dtype("<f4")}  # number of maps_z* / maps_b* planes -> map dtype
_FRAMES = tuple(f"maps_z{k}" for k in range(4))  # members holding a zstd frame
_REDO = "delete it and run `xbench run` again to recompute it"
#: a member is deflated when zlib shrinks its first :data:`_SAMPLE` bytes below this fraction, else stored
_DEFLATE_BELOW = 0.9
_SAMPLE = 65536


def chunk_rows(chunk: int, chunk_size: int, n_cases: int) -> range:
    """The dataset rows of store chunk ``chunk``: ``chunk_size`` consecutive rows, the last chunk shorter.

    >>> list(chunk_rows(2, 8, 22))
    [16, 17, 18, 19, 20, 21]
    """
    return range(chunk * chunk_size, min((chunk + 1) * chunk_size, n_cases))


def shuffle_bytes(values: np.ndarray) -> list[np.ndarray]:
    """The byte planes of ``values`` (little-endian): plane ``k`` holds byte ``k`` of every value, in C order."""
    return list(_plane_table(values))


def _plane_table(values: np.ndarray) -> np.ndarray:
    """The byte planes of ``values`` as one C-contiguous ``uint8`` array of shape (itemsize, values.size)."""
    flat = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).reshape(-1)
    return np.ascontiguousarray(flat.view(np.uint8).reshape(-1, flat.dtype.itemsize).T)


def unshuffle_bytes(planes: list[np.ndarray] | np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`shuffle_bytes`: the ``dtype`` array of ``shape`` whose bytes the planes hold (a list of
    planes, or one (itemsize, n) array of them), built as little-endian unsigned words — ``((b[k-1] << 8 | b[k-2])
    << 8 | …) | b[0]`` — in one new array (contiguous numpy passes: 2.4× faster than interleaving the bytes with
    strided copies on 2-byte values, measured)."""
    dtype = np.dtype(dtype)
    if len(planes) != dtype.itemsize:
        raise ValueError(f"{len(planes)} byte planes do not make {dtype}")
    out = np.asarray(planes[-1]).astype(f"<u{dtype.itemsize}")
    for k in range(len(planes) - 2, -1, -1):
        out <<= 8
        out |= planes[k]
    return out.view(dtype).reshape(shape)


def _deflates(data: bytes, level: int) -> bool:
    """Whether deflating ``data`` pays: judged on its first :data:`_SAMPLE` bytes (a function of the bytes alone)."""
    sample = data[:_SAMPLE]
    return len(zlib.compress(sample, level)) < _DEFLATE_BELOW * len(sample)


def _zstd() -> Any:
    """The ``zstandard`` module (a dependency of xbench: the maps codec of the store)."""
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - installed with xbench
        raise StoreError("the results store's chunks need the 'zstandard' package (a dependency of xbench: "
                         "pip install zstandard)") from exc
    return zstandard


def encode_chunk(arrays: dict[str, np.ndarray], level: int | None = None, *, codec: str = "zstd") -> bytes:
    """The bytes of a chunk file (module docstring): ``arrays`` in their order, ``maps`` as byte planes.

    ``codec="zstd"`` (the store's layout): members ``maps_shape``, ``maps_z0``, ``maps_z1``, … — plane ``k`` in a
    zstd frame of its own (``level``, default :data:`ZSTD_LEVEL`). ``codec="zlib"``: the layout before it (members
    ``maps_shape``, ``maps_b0``, ``maps_b1``, …, each deflated at ``level``, default :data:`ZLIB_LEVEL`, when that
    pays). Every other member is deflated at :data:`ZLIB_LEVEL` (zlib: at ``level``) when that pays."""
    if codec not in MAPS_CODECS:
        raise ValueError(f"codec must be one of {MAPS_CODECS}, got {codec!r}")
    zlib_level = ZLIB_LEVEL if codec == "zstd" or level is None else level
    members: dict[str, np.ndarray] = {}
    framed: set[str] = set()  # members holding a zstd frame: stored (a frame does not deflate)
    for name, array in arrays.items():
        if name != "maps":
            members[name] = array
            continue
        members["maps_shape"] = np.asarray(array.shape, np.int64)
        planes = _plane_table(array)
        if codec == "zlib":
            members.update({f"maps_b{k}": plane for k, plane in enumerate(planes)})
            continue
        compressor = _zstd().ZstdCompressor(level=ZSTD_LEVEL if level is None else level, write_checksum=True,
                                            write_content_size=True, threads=0)
        for k, plane in enumerate(planes):  # one frame per plane: a noise plane stays raw blocks (a copy to read)
            members[f"maps_z{k}"] = np.frombuffer(compressor.compress(plane), np.uint8)
            framed.add(f"maps_z{k}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, array in members.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, array, allow_pickle=False)
            data = npy.getvalue()
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.create_system, info.external_attr = 3, 0o644 << 16
            deflate = name not in framed and _deflates(data, zlib_level)
            method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            archive.writestr(info, data, compress_type=method, compresslevel=zlib_level)
    return buf.getvalue()


def _fit_text(text: str) -> str:
    """``text``, or its start with a note of its length when longer than :data:`MAX_TEXT_CHARS`."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    note = f" … [{len(text)} characters, cut to fit the store]"
    return text[: MAX_TEXT_CHARS - len(note)] + note


def chunk_limits(meta: dict[str, Any]) -> dict[str, int] | None:
    """Most data bytes each member of a chunk of this ``meta.json`` may hold (``None``: meta lacks
    ``chunk_size``, then only the generic ``.npz`` bound applies). Maps: ``chunk_size`` × findings × grid × 4."""
    try:
        n, classes, cells = int(meta["chunk_size"]), len(meta["findings"]), math.prod(int(g) for g in meta["grid"])
    except (KeyError, TypeError, ValueError):
        return None
    text, values = n * 4 * MAX_TEXT_CHARS, n * classes * cells
    return {"case_ids": text, "skipped_ids": text, "skipped_reasons": text, "scores": n * classes * 8,
            "probs": n * classes * 8, "maps": values * 4, "maps_shape": 4 * 8, "sizes": n * 2 * 8, "windows": n * 4 * 8,
            **{f"maps_b{k}": values for k in range(4)},
            **{f"maps_z{k}": _zstd_bound(values) for k in range(4)}}


def _file_bounded(limits: dict[str, int] | None, size: int) -> dict[str, int] | None:
    """``limits`` held to what a chunk file of ``size`` bytes may expand to: :data:`EXPECTED_EXPANSION` × ``size``, or
    :func:`max_expanded_bytes` when larger (``XBENCH_MAX_EXPANSION`` / ``XBENCH_MIN_EXPANDED_BYTES`` raise it).
    ``meta.json`` is as untrusted as the chunk: a ``chunk_size`` of 10⁹ next to a 3 MB chunk allows no 3 GB of maps.
    A zstd frame is stored, so the file bounds it."""
    if limits is None:
        return None
    most = max(max_expanded_bytes(size), EXPECTED_EXPANSION * size)
    return {name: bound if name in _FRAMES else min(bound, most) for name, bound in limits.items()}


def _zstd_bound(size: int) -> int:
    """Most bytes a zstd frame of ``size`` bytes may take: zstd's ``ZSTD_compressBound`` (``size + size / 256`` and a
    margin of at most 64 bytes for small inputs) plus the frame's header and checksum (at most 22 bytes), rounded up."""
    return size + (size >> 8) + 128


def read_chunk_file(path: str | Path, meta: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The arrays of one chunk file of any layout, maps decoded (no index check: see
    :meth:`ResultStore.load_chunk`). Bounded by :func:`chunk_limits` of ``meta`` (default: the folder's
    ``meta.json`` when present); damage raises :class:`StoreError` naming the file."""
    path = Path(path)
    if meta is None and (path.parent / "meta.json").exists():
        meta = ResultStore._read_meta(path.parent / "meta.json")
    arrays, limits = _read_chunk_arrays(path, meta)
    planes = {prefix: sum(1 for name in arrays if name.startswith(prefix)) for prefix in ("maps_b", "maps_z")}
    if not planes["maps_b"] + planes["maps_z"] and "maps_shape" not in arrays:
        return arrays  # the np.savez layout (member maps), or no maps at all (ResultStore.load_chunk names it)
    arrays["maps"] = _joined_maps(path, arrays, planes, limits)
    return arrays


def _read_chunk_arrays(path: Path, meta: dict[str, Any] | None) -> tuple[dict[str, np.ndarray], dict[str, int] | None]:
    """The chunk file's members as stored, and the byte bounds they were read under (None without ``meta``)."""
    try:
        size = regular_size(path, within=path.parent)
    except FormatError as exc:
        raise StoreError(f"{exc.message}; {_REDO}") from None
    limits = _file_bounded(chunk_limits(meta), size) if meta is not None else None
    try:  # a zstd frame carries its own checksum (checked when it is decoded): its CRC-32 is not computed twice
        return read_npz(path, limits=limits, self_checked=_FRAMES), limits
    except FormatError as exc:
        raise StoreError(f"{exc.message}; {_REDO}") from None
    except OSError as exc:
        raise StoreError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc


def _joined_maps(path: Path, arrays: dict[str, np.ndarray], planes: dict[str, int],
                 limits: dict[str, int] | None) -> np.ndarray:
    """The maps from their byte planes (``maps_b<i>`` raw or ``maps_z<i>`` zstd frames, popped from ``arrays``) and
    ``maps_shape``; planes, shape and dtype that do not fit together raise :class:`StoreError` naming the file."""
    prefix = "maps_z" if planes["maps_z"] else "maps_b"
    k = planes[prefix]
    found = [arrays.pop(f"{prefix}{i}", None) for i in range(k)]
    shape = arrays.pop("maps_shape", None)
    n = _declared_values(shape)
    fits = n >= 0 and "maps" not in arrays and not (planes["maps_b"] and planes["maps_z"]) and k in _MAP_DTYPES
    if prefix == "maps_z" and fits and all(p is not None for p in found):
        most = limits["maps_b0"] if limits is not None else max_expanded_bytes(path.stat().st_size) // k
        if n > most:  # before any frame is decoded: maps_shape is as untrusted as the frames
            raise StoreError(f"{path}: maps_shape {shape.tolist()} declares {n} values; at most {most} are expected "
                             f"(meta.json's chunk_size × findings × grid, within what the file's size allows); {_REDO}")
        found = [_decode_frame(path, f"maps_z{i}.npy", frame, n) for i, frame in enumerate(found)]
    if not fits or any(p is None or p.dtype != np.uint8 or p.shape != (n,) for p in found):
        members = sorted({*(a for a in arrays if a.startswith("maps")), *(f"{prefix}{i}" for i in range(k))})
        raise StoreError(f"{path}: map members {members} / maps_shape {None if shape is None else shape.tolist()} / "
                         f"{k} byte planes do not fit together; {_REDO}")
    return unshuffle_bytes(found, _MAP_DTYPES[k], tuple(int(d) for d in shape))


def _declared_values(shape: np.ndarray | None) -> int:
    """How many values ``maps_shape`` declares: four non-negative integers multiplied, -1 when it is not that."""
    if shape is None or shape.dtype.kind not in "iu" or shape.shape != (4,) or not bool((shape >= 0).all()):
        return -1
    return math.prod(int(d) for d in shape)


def _decode_frame(path: Path, member: str, frame: np.ndarray, n: int) -> np.ndarray:
    """One byte plane of ``n`` bytes from the zstd frame of ``member``: the frame must declare exactly ``n`` bytes
    (``maps_shape``'s size, itself within the meta.json bound that :func:`read_npz` held the frame to) and carry a
    checksum, checked before anything is decompressed; zstd then checks the size and the checksum."""
    zstd = _zstd()
    where = f"{path}, field {member!r}"
    if frame.dtype != np.uint8 or frame.ndim != 1:
        raise StoreError(f"{where}: a zstd frame must be a 1-d uint8 array, not {frame.dtype} {frame.shape}; {_REDO}")
    try:
        declared, checksum = zstd.frame_content_size(frame), zstd.get_frame_parameters(frame).has_checksum
        if declared != n or not checksum:
            raise StoreError(f"{where}: the zstd frame declares {declared} bytes (-1: unknown) "
                             f"{'with' if checksum else 'without'} a checksum; maps_shape needs {n} bytes "
                             f"and a checksum; {_REDO}")
        raw = zstd.ZstdDecompressor().decompress(frame, read_across_frames=False, allow_extra_data=False)
    except zstd.ZstdError as exc:
        raise StoreError(f"{where}: not a readable zstd frame ({exc}); {_REDO}") from None
    if len(raw) != n:  # zstd checks the declared size itself; never trusted blindly
        raise StoreError(f"{where}: the zstd frame holds {len(raw)} bytes, not {n}; {_REDO}")
    return np.frombuffer(raw, np.uint8)


def inputs_digest(meta: dict[str, Any]) -> str:
    """sha256 of the parts of a ``meta.json`` that say which inputs made the results (no paths, no dates)."""
    return digest({k: v for k, v in meta.items() if k not in UNCOMPARED_KEYS + LOCAL_KEYS})


def _differences(old: dict[str, Any], new: dict[str, Any], skip: tuple[str, ...]) -> list[str]:
    keys = sorted((set(old) | set(new)) - set(skip))
    return [d for k in keys for d in diff_keys(old.get(k), new.get(k), k)]


_INDEX_BYTES = 1 << 16  #: most bytes a chunk's index may hold (it is about 250)
_META_BYTES = 16 << 20  #: most bytes a meta.json may hold (they are a few KB: options, findings, fingerprints)


def _check_meta(path: Path, meta: dict[str, Any]) -> None:
    """:class:`StoreError` naming ``path`` and the field unless the sizes of ``meta`` have their types: ``findings``
    a list of texts, ``grid`` two positive ints, ``chunk_size`` / ``n_cases`` (when present) an int > 0 / ≥ 0."""
    def bad(field: str, want: str) -> StoreError:
        value = repr(meta[field])
        value = value if len(value) <= 60 else value[:60] + "…"
        return StoreError(f"{path}, field {field!r}: {want}, not {value}")

    def count(value: Any, least: int) -> bool:
        return type(value) is int and value >= least

    findings, grid = meta["findings"], meta["grid"]
    if not isinstance(findings, list) or not all(isinstance(f, str) for f in findings):
        raise bad("findings", "must be a list of finding names")
    if not isinstance(grid, list) or len(grid) != 2 or not all(count(g, 1) for g in grid):
        raise bad("grid", "must be two positive integers")
    if "chunk_size" in meta and not count(meta["chunk_size"], 1):
        raise bad("chunk_size", "must be a positive integer")
    if "n_cases" in meta and not count(meta["n_cases"], 0):
        raise bad("n_cases", "must be a non-negative integer")


@dataclass
class StoredPredictions:
    """All chunks of one (dataset, model), concatenated in dataset row order."""

    case_ids: np.ndarray  # (N,) str
    scores: np.ndarray  # (N, C) float32, the model's raw score
    probs: np.ndarray  # (N, C) float32, probability used for F1 / accuracy
    maps: np.ndarray  # (N, C, h, w) float16, native grid
    sizes: np.ndarray  # (N, 2) int, (H, W) of each image as read
    windows: np.ndarray  # (N, 4) float, (y0, x0, y1, x1): the part of the image the model input covers
    skipped: dict[str, str]  # case_id -> reason
    meta: dict[str, Any]


class ResultStore:
    """Read/write access to ``<output_dir>/store``."""

    def __init__(self, output_dir: str | Path):
        self.root = Path(output_dir) / "store"

    def folder(self, dataset: str, model: str) -> Path:
        """``<store>/<dataset>/<model>``: both names must be safe names, and the folder stays inside the store."""
        from ..spec.names import contained

        return contained(self.root, dataset, model, kind="dataset/model")

    def writable_folder(self, dataset: str, model: str) -> Path:
        """:meth:`folder`, made if needed, where the store writes: ``store/``, ``<dataset>/`` and ``<model>/`` real
        folders (no link among them) inside the output folder's real path (:func:`xbench.core.files.contained_folder`),
        checked where the folder is made and before each chunk is written."""
        self.folder(dataset, model)  # safe names
        return contained_folder(self.root.parent, self.root.name, dataset, model)

    def chunk_path(self, dataset: str, model: str, chunk: int) -> Path:
        return self.folder(dataset, model) / f"chunk-{chunk:05d}.npz"

    @staticmethod
    def index_path(chunk_file: Path) -> Path:
        """The index file of a chunk file (``chunk-00003.npz`` → ``chunk-00003.index.json``)."""
        return chunk_file.with_name(chunk_file.stem + ".index.json")

    # -- meta --------------------------------------------------------------------------
    def prepare(self, dataset: str, model: str, meta: dict[str, Any], *, overwrite: bool = False) -> None:
        """Create the folder and write ``meta.json``; refuse to mix chunks from other inputs.

        An existing ``meta.json`` that differs (content fingerprints included) is refused naming the
        differing keys, unless ``overwrite`` (then the old chunks are deleted). A damaged ``meta.json`` is
        reported by name and rewritten; the chunks are then kept only where their index names the same inputs.
        """
        folder = self.folder(dataset, model)
        path = folder / "meta.json"
        meta = {**meta, "store_version": STORE_VERSION}
        if path.exists() and not overwrite:
            try:
                old = self._read_meta(path)
            except StoreError as exc:
                warnings.warn(f"{exc}; rewriting it (chunks are kept only where their index names the same inputs)",
                              XBenchWarning, stacklevel=2)
            else:
                keys = _differences(old, meta, UNCOMPARED_KEYS)
                if keys:
                    raise StoreError(
                        f"{folder} holds results of a different configuration or inputs (differs in {', '.join(keys)}); "
                        "use another output_dir or pass overwrite=True / --overwrite to recompute."
                    )
                return
        folder = self.writable_folder(dataset, model)
        if overwrite:
            for old_file in [*folder.glob("chunk-*.npz"), *folder.glob("chunk-*.index.json")]:
                try:
                    old_file.unlink()
                except OSError as exc:  # an immutable / read-only folder: one clear line
                    raise OutputError(old_file, exc, what="--overwrite cannot delete an old chunk") from exc
        atomic_write_bytes(path, json.dumps(meta, indent=1, sort_keys=True, default=str).encode())

    @staticmethod
    def _read_meta(path: Path) -> dict[str, Any]:
        """A folder's ``meta.json``: a regular file inside its folder (:func:`xbench.core.files.read_regular`), at
        most :data:`_META_BYTES`, an object whose sizes have their types (:func:`_check_meta`)."""
        try:
            meta = json.loads(read_regular(path, within=path.parent, limit=_META_BYTES).decode("utf-8"))
        except FileNotFoundError as exc:
            raise StoreError(f"{path} is missing (ResultStore.prepare writes it before any chunk)") from exc
        except FormatError as exc:
            raise StoreError(str(exc)) from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise StoreError(f"{path} is damaged ({type(exc).__name__}: {exc})") from None
        if not isinstance(meta, dict) or "findings" not in meta or "grid" not in meta:
            raise StoreError(f"{path} is damaged (not an object with 'findings' and 'grid')")
        _check_meta(path, meta)
        return meta

    def meta(self, dataset: str, model: str) -> dict[str, Any]:
        path = self.folder(dataset, model) / "meta.json"
        if not path.exists():
            raise XBenchError(f"No results for dataset {dataset!r} × model {model!r} under {self.root} (missing {path}).")
        try:
            return self._read_meta(path)
        except StoreError as exc:
            raise StoreError(f"{exc}; run `xbench run` again to rewrite it") from exc

    # -- chunks ------------------------------------------------------------------------
    def check_chunk(self, path: Path, meta: dict[str, Any] | None = None) -> str | None:
        """Why the chunk file ``path`` cannot be used (``None``: intact).

        Damage (no index, size or sha256 mismatch) is returned as a reason; a chunk made from other inputs
        than ``meta`` (default: the folder's ``meta.json``) raises :class:`~xbench.core.errors.StoreError`.
        """
        index = self.index_path(path)
        if not path.exists():
            return "missing"
        if not index.exists():
            return f"{path.name} has no index {index.name} (interrupted write or older store)"
        try:  # regular files inside the folder only: a FIFO, a device or a link out is refused before a byte is read
            actual = regular_size(path, within=path.parent)
            entry = json.loads(read_regular(index, within=path.parent, limit=_INDEX_BYTES).decode("utf-8"))
            size, sha, inputs = int(entry["size"]), str(entry["sha256"]), str(entry["inputs"])
        except FormatError as exc:
            raise StoreError(f"{exc}; {_REDO}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            return f"{index.name} is damaged ({type(exc).__name__}: {exc})"
        if actual != size:
            return f"{path.name} has {actual} bytes, its index says {size} (truncated or replaced)"
        if file_sha256(path) != sha:
            return f"{path.name}'s sha256 differs from its index (damaged or replaced)"
        meta = meta if meta is not None else self._read_meta(path.parent / "meta.json")
        if inputs != inputs_digest(meta):
            raise StoreError(f"{path} was made from other inputs than {path.parent / 'meta.json'} (its index's inputs "
                             "digest differs); results of different inputs are never mixed — use --overwrite")
        return None

    def indexed(self, dataset: str, model: str, chunks: int) -> bool:
        """Chunks ``0 … chunks-1`` all have their index file (written after the chunk itself): a cheap test that another
        process has finished writing them, without reading or checking them (:meth:`has_chunk` does that)."""
        return all(self.index_path(self.chunk_path(dataset, model, k)).exists() for k in range(chunks))

    def has_chunk(self, dataset: str, model: str, chunk: int) -> bool:
        """True when the chunk is present and intact; a damaged one is reported (warning naming it) and False."""
        path = self.chunk_path(dataset, model, chunk)
        if not path.exists():
            return False
        problem = self.check_chunk(path)
        if problem is not None:
            warnings.warn(f"{self.folder(dataset, model)}: {problem}; it will be recomputed", XBenchWarning, stacklevel=2)
        return problem is None

    def write_chunk(self, dataset: str, model: str, chunk: int, *, case_ids: Iterable[str], scores: np.ndarray,
                    probs: np.ndarray, maps: np.ndarray, skipped: dict[str, str], sizes: np.ndarray | None = None,
                    windows: np.ndarray | None = None) -> Path:
        """Write one chunk atomically (temporary file + rename), then its index (size, sha256, inputs digest).

        Maps are stored as float16 unless given as float32 (run config ``map_dtype: float32``).

        ``sizes`` / ``windows`` default to "unknown size, whole image" (NaN), which the
        evaluation treats as a plain resize of the whole image.
        """
        path = self.writable_folder(dataset, model) / self.chunk_path(dataset, model, chunk).name
        meta = self._read_meta(path.parent / "meta.json")
        ids = np.asarray(list(case_ids), dtype=str)
        sizes = np.full((len(ids), 2), -1, np.int64) if sizes is None else np.asarray(sizes, np.int64)
        windows = np.full((len(ids), 4), np.nan) if windows is None else np.asarray(windows, np.float64)
        arrays = dict(case_ids=ids, scores=np.asarray(scores, np.float32), probs=np.asarray(probs, np.float32),
                      maps=np.asarray(maps, np.float32 if np.asarray(maps).dtype == np.float32 else np.float16), sizes=sizes, windows=windows,
                      skipped_ids=np.asarray(list(skipped), dtype=str),
                      skipped_reasons=np.asarray([_fit_text(r) for r in skipped.values()], dtype=str))
        limits = chunk_limits(meta)
        for key, array in arrays.items():  # what is written must be readable: the reader's bounds hold
            if limits is None or (array.size <= limits["maps_b0"] if key == "maps" else array.nbytes <= limits[key]):
                continue  # maps: each byte plane holds one byte per value
            if array.dtype.kind == "U":
                raise StoreError(f"{path}: {key} holds a text longer than {MAX_TEXT_CHARS} characters "
                                 f"(longest: {max(array.tolist(), key=len)[:80]!r}…); not written")
            raise StoreError(f"{path}: {key} of shape {array.shape} exceeds what meta.json allows (chunk_size "
                             f"{meta['chunk_size']}, {len(meta['findings'])} findings, grid {meta['grid']}); not written")
        data = encode_chunk(arrays)
        self.index_path(path).unlink(missing_ok=True)  # a chunk without index counts as absent until both are written
        atomic_write_bytes(path, data)
        self._write_index(path, meta)
        return path

    def _write_index(self, path: Path, meta: dict[str, Any]) -> None:
        entry = {"file": path.name, "size": path.stat().st_size, "sha256": file_sha256(path),
                 "inputs": inputs_digest(meta)}
        atomic_write_bytes(self.index_path(path), json.dumps(entry, indent=1).encode())

    def chunks(self, dataset: str, model: str) -> list[Path]:
        return sorted(self.folder(dataset, model).glob("chunk-*.npz"))

    def load_chunk(self, path: Path, meta: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The arrays of one chunk, after checking its index; damage raises :class:`StoreError` naming the file."""
        problem = self.check_chunk(path, meta)
        if problem is not None:
            raise StoreError(f"{path.parent}: {problem}; run `xbench run` again to recompute it")
        arrays = read_chunk_file(path, meta if meta is not None else self._read_meta(path.parent / "meta.json"))
        for key, kind in _ARRAYS.items():
            if key not in arrays or arrays[key].dtype.kind != kind:
                got = "absent" if key not in arrays else f"dtype {arrays[key].dtype}"
                raise StoreError(f"{path}: array {key!r} is {got}; delete it and run `xbench run` again to recompute it")
        return arrays

    def read(self, dataset: str, model: str, *, expected_chunks: int | None = None) -> StoredPredictions:
        """Concatenate every chunk; with ``expected_chunks`` a missing chunk is an error naming it."""
        meta = self.meta(dataset, model)
        files = self.chunks(dataset, model)
        if expected_chunks is not None:
            missing = sorted(set(range(expected_chunks)) - {int(f.stem.split("-")[1]) for f in files})
            extra = sorted({int(f.stem.split("-")[1]) for f in files} - set(range(expected_chunks)))
            if extra:
                raise XBenchError(
                    f"{self.folder(dataset, model)}: chunks {extra[:10]} lie beyond the {expected_chunks} chunks of this "
                    "dataset — the store was filled with another dataset size or chunk_size; use --overwrite."
                )
            if missing:
                raise XBenchError(
                    f"{self.folder(dataset, model)}: chunks {missing[:10]} of {expected_chunks} are missing — "
                    "run the remaining shards (or `xbench run` again to resume) before computing metrics."
                )
        parts = [self.load_chunk(f, meta) for f in files]
        n_cls, grid = len(meta["findings"]), tuple(meta["grid"])
        if not parts:
            empty = np.zeros((0, n_cls), np.float32)
            return StoredPredictions(np.zeros(0, str), empty, empty, np.zeros((0, n_cls, *grid), np.float16),
                                     np.zeros((0, 2), np.int64), np.zeros((0, 4)), {}, meta)
        skipped: dict[str, str] = {}
        for p in parts:
            skipped.update(zip(p["skipped_ids"].tolist(), p["skipped_reasons"].tolist()))
        return StoredPredictions(
            case_ids=np.concatenate([p["case_ids"] for p in parts]),
            scores=np.concatenate([p["scores"] for p in parts]),
            probs=np.concatenate([p["probs"] for p in parts]),
            maps=np.concatenate([p["maps"] for p in parts]),
            sizes=np.concatenate([p["sizes"] if "sizes" in p else np.full((len(p["case_ids"]), 2), -1) for p in parts]),
            windows=np.concatenate([p["windows"] if "windows" in p else np.full((len(p["case_ids"]), 4), np.nan)
                                    for p in parts]),
            skipped=skipped,
            meta=meta,
        )

    # -- shards ------------------------------------------------------------------------
    def merge_from(self, source: str | Path) -> list[tuple[str, str]]:
        """Copy the chunks of another run folder's store (a shard) into this store; returns the pairs seen.

        Each (dataset, model) of ``source`` must have been made from the same inputs as ours: every
        ``meta.json`` key except dates and local paths (:data:`LOCAL_KEYS`), content fingerprints of
        weights and annotation files included; a difference is refused naming the keys. Source chunks
        are checked (index, sha256) before they are copied (atomically, with their index). Chunks are
        disjoint by construction; a chunk present in both must hold the same case ids and shapes.
        """
        other = ResultStore(source)
        if not other.root.exists():
            raise XBenchError(f"merge: {source} has no store/ folder")
        pairs = []
        for meta_file in sorted(other.root.glob("*/*/meta.json")):
            dataset, model = meta_file.parent.parent.name, meta_file.parent.name
            theirs = other.meta(dataset, model)
            folder = self.writable_folder(dataset, model)
            if not (folder / "meta.json").exists():
                atomic_write(folder / "meta.json", lambda tmp, src=meta_file: shutil.copyfile(src, tmp))
            ours = self.meta(dataset, model)
            differ = _differences(ours, theirs, UNCOMPARED_KEYS + LOCAL_KEYS)
            if differ:
                raise StoreError(f"merge: {meta_file} was made from other inputs than {folder / 'meta.json'} "
                                 f"(differs in {', '.join(differ)}); shards must use the same weights, data and options")
            for chunk in other.chunks(dataset, model):
                theirs_arrays = other.load_chunk(chunk, theirs)
                existing = folder / chunk.name
                if existing.exists() and self.check_chunk(existing, ours) is None:
                    mine = self.load_chunk(existing, ours)
                    if not (mine["case_ids"].tolist() == theirs_arrays["case_ids"].tolist()
                            and mine["maps"].shape == theirs_arrays["maps"].shape
                            and mine["scores"].shape == theirs_arrays["scores"].shape):
                        raise StoreError(f"merge: {chunk} and {existing} hold different cases or shapes for the same chunk")
                    continue
                atomic_write(existing, lambda tmp, src=chunk: shutil.copyfile(src, tmp))
                self._write_index(existing, ours)
            pairs.append((dataset, model))
        return pairs


def write_table(df: Any, path_stem: str | Path) -> list[Path]:
    """Write a DataFrame as ``<stem>.csv`` and ``<stem>.parquet`` (atomically); returns the paths."""
    from ..core.atomic import write_frame

    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return [write_frame(df, stem.with_suffix(suffix)) for suffix in (".csv", ".parquet")]
