"""Read chest X-ray images (PNG, JPEG, DICOM) as float32 grey arrays in [0, 1].

Conventions
-----------
Every reader returns a ``float32`` array of shape ``(height, width)`` at the
original size of the file (no resize, no crop), bright = dense (bone white).

PNG / JPEG (Pillow)
    * 8-bit grey (mode ``L``): ``value / 255``.
    * 16-bit grey (modes ``I;16``, ``I;16B``, ``I;16L``, and ``I`` as Pillow
      opens some 16-bit PNGs): ``value / 65535``; an ``I`` image with values
      outside ``[0, 65535]`` is rejected.
    * Everything else (``RGB``, ``RGBA``, ``LA``, ``P``, ``1``, ``CMYK``, ...):
      Pillow's ``convert("L")``, i.e. ITU-R 601-2 luma
      ``L = R*299/1000 + G*587/1000 + B*114/1000`` with alpha dropped, then
      ``/ 255``.
    * Floating-point images (mode ``F``) are rejected: their range is unknown.

DICOM (pydicom)
    1. ``pixel_array`` (single frame, one sample per pixel).
    2. ``pydicom.pixels.apply_modality_lut`` (Rescale Slope/Intercept or
       Modality LUT).
    3. ``pydicom.pixels.apply_voi_lut`` (the first VOI LUT, preferring a VOI
       LUT Sequence over Window Center/Width, as pydicom does).
    4. Min-max scaling of the **VOI output range** to [0, 1]:
       with a window, the range is the window's output range ``[y_min, y_max]``
       as pydicom defines it (from Bits Stored, Pixel Representation and the
       rescale), so values clipped by the window land on exactly 0 or 1;
       with a VOI LUT Sequence, the range is ``[min, max]`` of the LUT data;
       with neither, the range is the image's own ``[min, max]`` after the
       modality LUT (a constant image gives all zeros).
    5. ``MONOCHROME1`` (low values are bright) is inverted: ``1 - x``.

A missing file raises :class:`~xbench.core.errors.MissingFileError`; a file that
cannot be decoded raises :class:`~xbench.core.errors.FormatError` naming it.

Bounded decoding: before any pixel data is decoded, the pixel count the header
claims (PNG/JPEG: width × height; DICOM: Rows × Columns × NumberOfFrames ×
SamplesPerPixel) is checked against ``max_pixels`` (default :data:`MAX_PIXELS`
= 100 million, e.g. 10000²; the environment variable ``XBENCH_MAX_PIXELS``
overrides it). A larger claim (a decompression bomb) raises
:class:`~xbench.core.errors.FormatError`, which the runner counts as a skip under
``on_missing_image: skip``. A deflated DICOM (transfer syntax 1.2.840.10008.1.2.1.99) is inflated in pieces and
counted before pydicom reads it (:func:`_check_deflated`). A PNG's text chunks (``tEXt``, ``zTXt``, ``iTXt``,
inflated) may hold :data:`MAX_PNG_TEXT` = 1 MiB of text in all (a chest X-ray carries a few dates or a short
comment; Pillow's own total is 64 MiB): more is a ``FormatError`` as well (:func:`_pillow`). Any other decoder
failure (a forged chunk length, ...) is a ``FormatError`` too.
A file is read as DICOM when its suffix is ``.dcm`` / ``.dicom`` or it has the
``DICM`` marker at byte 128; otherwise with Pillow.

The file's own integers (:func:`read_source`)
---------------------------------------------
Every rule above maps each stored integer to one float, pixel by pixel. :func:`read_source` keeps the
integers (``uint8``/``uint16`` indices, :class:`SourceImage`) and the float of each index (``levels``), so
``levels[values]`` is :func:`read_image`'s array **bit for bit** (the same numpy operations, elementwise, on the
index domain instead of the image) without making a float copy of a full-size image. DICOM levels are computed on
the stored values present in the image (the no-window min-max rule uses their min and max); a DICOM whose stored
values span more than 65,536 integers, or a VOI function other than linear (``SIGMOID`` uses ``exp``), is read
with :func:`read_image` and wrapped as it is (:meth:`SourceImage.from_image`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import FormatError, MissingFileError

__all__ = ["read_image", "read_source", "read_mask", "SourceImage", "image_size", "is_dicom", "ImageFolder",
           "MAX_PIXELS", "MAX_PNG_TEXT", "max_pixels"]

MAX_PIXELS = 100_000_000  #: default bound on the pixels a header may claim (``XBENCH_MAX_PIXELS`` overrides)
MAX_PNG_TEXT = 1 << 20  #: characters of PNG text (``tEXt``/``zTXt``/``iTXt``, inflated) one image may carry in all

_DICOM_SUFFIXES = {".dcm", ".dicom"}
_SIXTEEN_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N", "I"}


def is_dicom(path: str | Path) -> bool:
    """True when ``path`` has a DICOM suffix or the ``DICM`` marker at byte 128."""
    path = Path(path)
    if path.suffix.lower() in _DICOM_SUFFIXES:
        return True
    with open(path, "rb") as handle:
        head = handle.read(132)
    return len(head) == 132 and head[128:132] == b"DICM"


def max_pixels() -> int:
    """The pixel bound in force: ``$XBENCH_MAX_PIXELS`` if set, else :data:`MAX_PIXELS`."""
    text = os.environ.get("XBENCH_MAX_PIXELS")
    try:
        return int(text) if text else MAX_PIXELS
    except ValueError:
        raise ValueError(f"XBENCH_MAX_PIXELS must be an integer pixel count, got {text!r}") from None


def _check_pixels(path: Path, claimed: int, what: str, limit: int | None) -> None:
    limit = max_pixels() if limit is None else int(limit)
    if claimed > limit:
        raise FormatError(path, f"header claims {what} = {claimed:,} pixels, above the bound of {limit:,} "
                          "(max_pixels / XBENCH_MAX_PIXELS); not decoded")


def _require(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(path, "image")
    return path


def read_image(path: str | Path, max_pixels: int | None = None) -> np.ndarray:
    """Read an image as float32 ``(height, width)`` in [0, 1] at original size.

    Parameters
    ----------
    path : str or Path
        PNG / JPEG (anything Pillow opens) or DICOM file.
    max_pixels : int, optional
        Bound on the pixel count the header claims (module docstring); default :func:`max_pixels`.

    Returns
    -------
    numpy.ndarray
        ``float32``, shape ``(height, width)``, values in ``[0, 1]``; see the
        module docstring for the exact scaling rule of each format.

    Raises
    ------
    MissingFileError
        The file does not exist.
    FormatError
        The file cannot be decoded, is multi-frame / colour DICOM, has an
        unsupported pixel mode, or claims more pixels than ``max_pixels``.
    """
    path = _require(path)
    if is_dicom(path):
        return _read_dicom(path, max_pixels)
    return _read_pillow(path, max_pixels)


@dataclass(frozen=True)
class SourceImage:
    """An image as its file's integers: ``values`` (``uint8``/``uint16`` ``(H, W)`` indices) and ``levels``
    (``float32``, the float each index reads as), so :meth:`image` is ``levels[values]``.

    ``levels`` is None for an image held as floats only (:meth:`from_image`); ``values`` is then that float image.
    """

    values: np.ndarray
    levels: np.ndarray | None
    occurring: np.ndarray | None = field(default=None, repr=False, compare=False)  # present(), when the reader knew it

    @classmethod
    def from_image(cls, image: np.ndarray) -> "SourceImage":
        """Wrap a float image (a custom reader, a DICOM outside the integer rule)."""
        return cls(np.asarray(image, dtype=np.float32), None)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.values.shape[0]), int(self.values.shape[1]))

    def image(self) -> np.ndarray:
        """The float32 image of :func:`read_image` (same bytes)."""
        if self.levels is None:
            return self.values
        return self.levels[self.values]

    def present(self) -> np.ndarray:
        """Indices of the levels that occur in the image (sorted)."""
        if self.levels is None:
            raise ValueError("a float-only SourceImage has no levels")
        if self.occurring is not None:
            return self.occurring
        return occurring(self.values, len(self.levels))


def occurring(values: np.ndarray, n: int) -> np.ndarray:
    """Sorted integers that occur in ``values`` (``uint8``/``uint16``, each < ``n``): ``flatnonzero(bincount)``.

    Counted by ``torch.bincount`` where the values fit ``int16``/``uint8`` (one pass, ~3x faster than numpy's, which
    first widens a 3,000² image to 72 MB of int64), else by ``np.bincount``; both give the same counts.
    """
    flat = values.reshape(-1)
    small = flat.dtype == np.uint8 or (flat.dtype == np.uint16 and n <= 1 << 15)
    if small and flat.flags.writeable and flat.size:
        import torch

        counts = torch.bincount(torch.from_numpy(flat.view(np.int16) if flat.dtype == np.uint16 else flat),
                                minlength=n).numpy()
    else:
        counts = np.bincount(flat, minlength=n)
    return np.flatnonzero(counts)


_LEVELS8 = np.arange(256, dtype=np.float32) / np.float32(255.0)
_LEVELS16 = (np.arange(65536, dtype=np.float64) / 65535.0).astype(np.float32)


def read_source(path: str | Path, max_pixels: int | None = None) -> SourceImage:
    """Read an image as its integers and their floats (module docstring); ``.image()`` equals :func:`read_image`.

    Same checks and errors as :func:`read_image`.
    """
    path = _require(path)
    if is_dicom(path):
        return _read_dicom(path, max_pixels, source=True)
    return _read_pillow(path, max_pixels, source=True)


def image_size(path: str | Path) -> tuple[int, int]:
    """``(height, width)`` of an image, reading only its header.

    Pillow opens lazily (no pixel decoding); DICOM is read with
    ``stop_before_pixels=True`` and the size is ``(Rows, Columns)``. A header
    claiming more than :func:`max_pixels` pixels raises :class:`FormatError`.
    """
    path = _require(path)
    if is_dicom(path):
        import pydicom

        try:
            _check_deflated(path, None)
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            _check_dicom_pixels(path, ds, None)
            return int(ds.Rows), int(ds.Columns)
        except FormatError:
            raise
        except Exception as exc:  # pydicom raises many types for broken headers
            raise FormatError(path, f"cannot read DICOM header Rows/Columns: {exc}") from exc
    from PIL import UnidentifiedImageError

    Image = _pillow()
    try:
        with Image.open(path) as img:
            width, height = img.size
    except Image.DecompressionBombError as exc:
        raise _bomb(path, exc, None) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise FormatError(path, f"not a readable image: {exc}") from exc
    except Exception as exc:  # Pillow's text-chunk limits (ValueError), forged chunk lengths, ...
        raise FormatError(path, f"not a readable image ({type(exc).__name__}: {exc})") from exc
    _check_pixels(path, width * height, f"{width} x {height}", None)
    return int(height), int(width)


def read_mask(path: str | Path) -> np.ndarray:
    """A mask image's stored values as Pillow decodes them (``np.asarray(img)``: no conversion, no scaling), under
    the bounds of :func:`read_image` (pixel count, PNG text): a file that cannot be read within them is a
    :class:`FormatError` naming it."""
    path = _require(path)
    Image = _pillow()
    try:
        with Image.open(path) as img:
            _check_pixels(path, img.width * img.height, f"{img.width} x {img.height}", None)
            return np.asarray(img)
    except FormatError:
        raise
    except Image.DecompressionBombError as exc:
        raise _bomb(path, exc, None) from exc
    except Exception as exc:  # Pillow's errors of any kind (OSError, text bound ValueError, forged lengths, ...)
        raise FormatError(path, f"not a readable image ({type(exc).__name__}: {exc})") from exc


class ImageFolder:
    """Find image files by file name under a folder: flat first, else a recursive index.

    Sources ship images either flat (``images/<name>``) or in nested folders
    (NIH's ``images_001/images/<name>``, SIIM's ``<study>/<series>/<name>``).
    :meth:`locate` returns ``folder / name`` when it exists; otherwise it
    walks ``folder`` once (on first need), indexes every file by name, and
    looks the name up there. Nothing is read before an image is asked for.

    Parameters
    ----------
    folder : path
        Top folder of the images.
    source : str, optional
        Official download page, named in :class:`MissingFileError`.
    """

    def __init__(self, folder: str | Path, source: str | None = None):
        self.folder = Path(folder)
        self.source = source
        self._index: dict[str, Path] | None = None

    def locate(self, name: str) -> Path:
        """Path of the image called ``name`` (a file name, no folders)."""
        flat = self.folder / name
        if flat.is_file():
            return flat
        if self._index is None:
            self._index = {}
            if self.folder.is_dir():
                for path in sorted(self.folder.rglob("*")):
                    if path.is_file():
                        self._index.setdefault(path.name, path)
        if name not in self._index:
            raise MissingFileError(flat, f"image (searched {self.folder} and its subfolders)", self.source)
        return self._index[name]

    def read(self, path: str | Path) -> np.ndarray:
        """:func:`read_image` of the file named like ``path`` (usable as ``Sample.reader``)."""
        return read_image(self.locate(Path(path).name))

    def read_source(self, path: str | Path) -> SourceImage:
        """:func:`read_source` of the file named like ``path``."""
        return read_source(self.locate(Path(path).name))


def _pillow() -> Any:
    """``PIL.Image``, with the total of a PNG's text chunks bounded by :data:`MAX_PNG_TEXT` (Pillow raises
    ``ValueError`` beyond it, which the readers turn into :class:`FormatError`).

    Pillow offers that bound only as a module global (``PIL.PngImagePlugin.MAX_TEXT_MEMORY``, read while a PNG's
    header is parsed), so it is set here, where XBench opens images, and holds for the whole process from the first
    image XBench reads: it is lowered, never raised (a smaller value set by other code is kept), and not restored.
    Pillow's per-chunk bound on inflated text (``MAX_TEXT_CHUNK``, 1 MiB) is left as it is.
    """
    from PIL import Image, PngImagePlugin

    if PngImagePlugin.MAX_TEXT_MEMORY > MAX_PNG_TEXT:
        PngImagePlugin.MAX_TEXT_MEMORY = MAX_PNG_TEXT
    return Image


def _read_pillow(path: Path, limit: int | None = None, source: bool = False) -> Any:
    from PIL import UnidentifiedImageError

    Image = _pillow()
    try:
        with Image.open(path) as img:  # reads the header only
            _check_pixels(path, img.width * img.height, f"{img.width} x {img.height}", limit)
            img.load()
            mode = img.mode
            if mode in _SIXTEEN_BIT_MODES:
                arr = np.asarray(img)
                if mode == "I" and arr.size and (arr.min() < 0 or arr.max() > 65535):
                    raise FormatError(path, f"32-bit integer image with values outside [0, 65535] ({arr.min()}..{arr.max()})")
                if source:
                    return SourceImage(arr.astype(np.uint16), _LEVELS16)
                return (arr.astype(np.float64) / 65535.0).astype(np.float32)
            if mode == "F":
                raise FormatError(path, "floating-point (mode 'F') images have no defined range; save as 8- or 16-bit")
            grey = img if mode == "L" else img.convert("L")
            if source:
                return SourceImage(np.array(grey, dtype=np.uint8), _LEVELS8)
            return np.asarray(grey, dtype=np.float32) / np.float32(255.0)
    except FormatError:
        raise
    except Image.DecompressionBombError as exc:
        raise _bomb(path, exc, limit) from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise FormatError(path, f"not a readable image: {exc}") from exc
    except Exception as exc:  # any other decoder failure: Pillow's text-chunk limits (ValueError), a forged chunk
        # length (MemoryError, struct.error, ...) — the file is unreadable, never the run
        raise FormatError(path, f"not a readable image ({type(exc).__name__}: {exc})") from exc


def _bomb(path: Path, exc: Exception, limit: int | None) -> FormatError:
    """Pillow refused the header itself (beyond twice its own limit): above our bound too."""
    limit = max_pixels() if limit is None else int(limit)
    return FormatError(path, f"header claims too many pixels ({exc}), above the bound of {limit:,} "
                       "(max_pixels / XBENCH_MAX_PIXELS); not decoded")


def _check_dicom_pixels(path: Path, ds, limit: int | None) -> None:
    """Bound Rows × Columns × NumberOfFrames × SamplesPerPixel from the header, before any decoding."""
    rows, cols = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    frames, samples = int(ds.get("NumberOfFrames", 1) or 1), int(ds.get("SamplesPerPixel", 1) or 1)
    _check_pixels(path, rows * cols * frames * samples,
                  f"Rows x Columns x NumberOfFrames x SamplesPerPixel = {rows} x {cols} x {frames} x {samples}", limit)


#: Bytes a deflated DICOM dataset may inflate to beyond 8 bytes per pixel of the bound (its other elements).
DEFLATED_OVERHEAD = 16 * 2**20


def _check_deflated(path: Path, limit: int | None) -> None:
    """A DICOM with the Deflated Explicit VR Little Endian transfer syntax: pydicom inflates the whole dataset (pixel
    data included) into memory before a header can be read, so the stream is first inflated here in 4 MiB pieces,
    counted and dropped; more than 8 bytes a pixel of the bound + :data:`DEFLATED_OVERHEAD` is a
    :class:`FormatError` before pydicom sees the file."""
    import zlib

    from pydicom.filereader import _read_file_meta_info, read_preamble
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    with open(path, "rb") as fh:
        try:
            read_preamble(fh, force=True)
            meta = _read_file_meta_info(fh)
        except Exception:  # not a DICOM with file meta: pydicom's own reading reports it
            return
        if meta.get("TransferSyntaxUID") != DeflatedExplicitVRLittleEndian:
            return
        bound = 8 * (max_pixels() if limit is None else int(limit)) + DEFLATED_OVERHEAD
        inflate, total = zlib.decompressobj(-zlib.MAX_WBITS), 0
        while not inflate.eof and (data := fh.read(2**20)):
            while data and not inflate.eof:
                total += len(inflate.decompress(data, 4 * 2**20))
                if total > bound:
                    raise FormatError(path, f"the deflated dataset inflates to more than {bound:,} bytes (8 bytes a "
                                            "pixel of the bound max_pixels / XBENCH_MAX_PIXELS, + 16 MiB); not decoded")
                data = inflate.unconsumed_tail


def _voi_range(arr: np.ndarray, ds) -> tuple[float, float]:
    """Output range of the VOI step that ``apply_voi_lut`` applies (see module docstring)."""
    from pydicom.pixels import apply_voi_lut

    seq = ds.get("VOILUTSequence")
    if seq and seq[0].get("LUTDescriptor") is not None and seq[0].get("LUTData") is not None:
        entries, first_mapped = int(seq[0].LUTDescriptor[0]) or 2**16, int(seq[0].LUTDescriptor[1])
        lut = apply_voi_lut(np.arange(first_mapped, first_mapped + entries), ds)  # every LUT entry once
        return float(lut.min()), float(lut.max())
    if ds.get("WindowCenter") is not None and ds.get("WindowWidth") is not None:
        with np.errstate(over="ignore"):
            ends = apply_voi_lut(np.array([-1e12, 1e12]), ds)
        return float(ends.min()), float(ends.max())
    return float(arr.min()), float(arr.max())


_SOURCE_SPAN = 1 << 16  # stored values a DICOM may span to be read as integers (uint16 indices)


def _linear_voi(ds) -> bool:
    """The VOI step is elementwise arithmetic (a LUT, a linear window, or none): the integer rule is exact."""
    function = str(ds.get("VOILUTFunction", "LINEAR") or "LINEAR").strip().upper()
    return function in ("LINEAR", "LINEAR_EXACT")


def _read_dicom(path: Path, limit: int | None = None, source: bool = False) -> Any:
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    try:
        _check_deflated(path, limit)
        ds = pydicom.dcmread(path)  # pixel data stays encoded until pixel_array
        _check_dicom_pixels(path, ds, limit)
        samples = int(ds.get("SamplesPerPixel", 1))
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        if samples != 1 or frames != 1:
            raise FormatError(path, f"expected a single-frame monochrome image, got SamplesPerPixel={samples}, NumberOfFrames={frames}")
        raw = ds.pixel_array
        domain = index = None
        if source and raw.dtype.kind in "ui" and raw.size and _linear_voi(ds):
            lo, hi = int(raw.min()), int(raw.max())
            if hi - lo < _SOURCE_SPAN:  # the rules below run on the stored values present, not on every pixel
                index = (raw.astype(np.int64) - lo if raw.dtype.itemsize > 2 or raw.dtype.kind == "i" else raw - raw.dtype.type(lo))
                index = index.astype(np.uint8 if hi - lo < 256 else np.uint16)
                domain = np.arange(lo, hi + 1, dtype=raw.dtype)
                present = occurring(index, hi - lo + 1)
                raw = domain
        modality = apply_modality_lut(raw, ds)
        voi = apply_voi_lut(modality, ds)
        low, high = _voi_range(modality if domain is None else modality[present], ds)
    except FormatError:
        raise
    except Exception as exc:  # InvalidDicomError, truncated pixel data, missing decoder, bad VR ...
        raise FormatError(path, f"cannot decode DICOM pixels: {type(exc).__name__}: {exc}") from exc
    voi = np.asarray(voi, dtype=np.float64)
    if high > low:
        out = np.clip((voi - low) / (high - low), 0.0, 1.0)
    else:
        out = np.zeros_like(voi)
    if str(ds.get("PhotometricInterpretation", "")).strip() == "MONOCHROME1":
        out = 1.0 - out
    out = out.astype(np.float32)
    if not source:
        return out
    return SourceImage.from_image(out) if domain is None else SourceImage(index, out, present)
