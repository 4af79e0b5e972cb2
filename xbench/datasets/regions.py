"""Radiologist regions → boolean masks on any grid, and the published mask encodings.

Conventions
-----------
Coordinates are pixels of the original image of size ``(H, W)``, origin at the
top-left corner of the top-left pixel, x to the right, y down; pixel ``(r, c)``
covers ``[c, c+1) × [r, r+1)`` and has its centre at ``(c + 0.5, r + 0.5)``.
A target grid ``(h, w)`` covers the same field of view (plain resize, no crop):
its pixel ``(r, c)`` covers ``[c·W/w, (c+1)·W/w) × [r·H/h, (r+1)·H/h)``.

Boxes (:class:`Box`, ``x_max``/``y_max`` exclusive)
    Rasterised exactly on the target grid: pixel ``(r, c)`` is inside iff its
    centre mapped to original coordinates, ``x = (c + 0.5)·W/w`` and
    ``y = (r + 0.5)·H/h``, satisfies ``x_min ≤ x < x_max`` and ``y_min ≤ y < y_max``.
    At original size an integer box ``(10, 20, 30, 40)`` covers columns 10–29
    and rows 20–39. A box smaller than one target pixel may cover nothing.

Polygons (:class:`Polygon`) and encoded masks (:class:`EncodedMask`)
    Polygons are drawn at original size with ``PIL.ImageDraw.polygon(points,
    outline=1, fill=1)`` — the cheXlocalize convention
    (rajpurkarlab/cheXlocalize ``annotation_to_segmentation.py``), which
    includes the outline pixels. Encoded masks are decoded at original size.
    All polygons and masks of the list are united at original size, then
    **area-resampled** to the grid (each target pixel gets the exact fraction
    of its footprint covered by the mask) and binarised at ``γ = 0.5``: a
    pixel is inside iff the covered fraction is ``≥ 0.5`` (with a 1e-9
    tolerance for floating-point error). At original size this is the
    identity.

Union
    The result is the union (logical OR) of the box part and the
    polygon/mask part. An empty region list gives an all-False mask.

Boxes that lie outside the image by more than 1 px are malformed; loaders
call :func:`validate_box` and re-raise its ``ValueError`` as a
:class:`~xbench.core.errors.FormatError` naming file and line.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

__all__ = [
    "Box",
    "Polygon",
    "EncodedMask",
    "Region",
    "rasterize",
    "box_mask",
    "polygon_mask",
    "area_resample",
    "validate_box",
    "decode_siim_rle",
    "siim_rle_runs",
    "decode_coco_rle",
    "GAMMA",
    "BOX_TOLERANCE",
]

@dataclass(frozen=True)
class Box:
    """Axis-aligned box ``(x_min, y_min, x_max, y_max)`` in original pixels (max exclusive)."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class Polygon:
    """Closed polygon; ``points`` is ``(P, 2)`` of ``(x, y)`` in original pixels."""

    points: np.ndarray


@dataclass(frozen=True)
class EncodedMask:
    """A mask decoded lazily: ``decode()`` returns a bool ``(height, width)`` array at original size."""

    decode: Callable[[], np.ndarray]
    description: str = ""


Region = Union[Box, Polygon, EncodedMask]


GAMMA = 0.5  #: coverage fraction at or above which a resampled pixel is inside
BOX_TOLERANCE = 1.0  #: how far (px) a box may stick out of the image before it is malformed
_EPS = 1e-9


def _check_size(size: Sequence[int], what: str) -> tuple[int, int]:
    if len(size) != 2 or int(size[0]) <= 0 or int(size[1]) <= 0:
        raise ValueError(f"{what} must be (height, width) with positive entries, got {tuple(size)}")
    return int(size[0]), int(size[1])


def box_mask(box: Box, size: tuple[int, int], grid: tuple[int, int] | None = None) -> np.ndarray:
    """Bool ``grid`` mask of one box by the pixel-centre rule (module docstring)."""
    height, width = _check_size(size, "size")
    h, w = _check_size(grid, "grid") if grid is not None else (height, width)
    xs = (np.arange(w) + 0.5) * width / w  # multiply first: exact for centres on integer/half boundaries
    ys = (np.arange(h) + 0.5) * height / h
    cols = (xs >= box.x_min) & (xs < box.x_max)
    rows = (ys >= box.y_min) & (ys < box.y_max)
    return rows[:, None] & cols[None, :]


def polygon_mask(points: np.ndarray | Sequence[Sequence[float]], size: tuple[int, int]) -> np.ndarray:
    """Bool ``(H, W)`` mask of a closed polygon drawn with PIL (outline and fill = 1).

    Parameters
    ----------
    points : array-like, shape (P, 2)
        ``(x, y)`` vertices in original pixels. ``P = 0`` gives an empty mask;
        one or two vertices draw a point or a line (PIL's behaviour).
    size : (int, int)
        ``(H, W)`` of the image.
    """
    return np.asarray(_polygon_canvas(points, size), dtype=bool)


def _polygon_canvas(points: np.ndarray | Sequence[Sequence[float]], size: tuple[int, int]) -> Any:
    """The PIL ``L`` image of :func:`polygon_mask` (1 inside, 0 outside), at full size."""
    from PIL import Image, ImageDraw

    height, width = _check_size(size, "size")
    pts = np.asarray(points, dtype=float).reshape(-1, 2) if len(points) else np.zeros((0, 2))
    if not np.isfinite(pts).all():
        raise ValueError("polygon has non-finite coordinates")
    canvas = Image.new("L", (width, height), 0)
    if len(pts):
        coords = [(float(x), float(y)) for x, y in pts]
        if len(coords) == 1:
            ImageDraw.Draw(canvas).point(coords, fill=1)
        else:
            ImageDraw.Draw(canvas).polygon(coords, outline=1, fill=1)
    return canvas


#: a part of a full-size mask: (bool crop, top row, left column); zero outside the crop
_Crop = tuple[np.ndarray, int, int]


def _polygon_crop(points: np.ndarray | Sequence[Sequence[float]], size: tuple[int, int]) -> _Crop | None:
    """:func:`polygon_mask` cut to the bounding box of its pixels (None when it draws none)."""
    canvas = _polygon_canvas(points, size)
    box = canvas.getbbox()  # (left, upper, right, lower) of the non-zero pixels, or None
    if box is None:
        return None
    return np.asarray(canvas.crop(box), dtype=bool), box[1], box[0]


def _crop(mask: np.ndarray) -> _Crop | None:
    """A full-size mask cut to the bounding box of its non-zero pixels (None when it has none)."""
    nonzero = mask != 0
    rows, cols = np.flatnonzero(nonzero.any(axis=1)), np.flatnonzero(nonzero.any(axis=0))
    if not len(rows):
        return None
    r0, c0 = int(rows[0]), int(cols[0])
    return mask[r0:rows[-1] + 1, c0:cols[-1] + 1], r0, c0


def _union(parts: list[_Crop]) -> _Crop:
    """The union of bool crops, on the smallest box holding them all."""
    if len(parts) == 1:
        return parts[0]
    r0, c0 = min(r for _, r, _ in parts), min(c for _, _, c in parts)
    r1, c1 = max(r + m.shape[0] for m, r, _ in parts), max(c + m.shape[1] for m, _, c in parts)
    out = np.zeros((r1 - r0, c1 - c0), bool)
    for m, r, c in parts:
        out[r - r0:r - r0 + m.shape[0], c - c0:c - c0 + m.shape[1]] |= m
    return out, r0, c0


def _resample_axis(values: np.ndarray, new: int, axis: int, old: int | None = None, lo: int = 0) -> np.ndarray:
    """Exact area average of a piecewise-constant array along ``axis`` onto ``new`` cells.

    ``values`` may be the slab ``[lo, lo + n)`` of an axis of length ``old`` that is zero outside it: the
    cumulative sums of the whole axis are 0 before the slab and constant after it, so they are read from the
    slab's own (same additions in the same order) and the result is bit for bit that of the whole axis.
    """
    n = values.shape[axis]
    old = n if old is None else old
    cum = np.concatenate([np.zeros_like(np.take(values, [0], axis=axis)), np.cumsum(values, axis=axis)], axis=axis)
    edges = np.arange(new + 1) * (old / new)
    base = np.minimum(np.floor(edges).astype(np.int64), old - 1)
    frac = edges - base
    shape = [1] * values.ndim
    shape[axis] = new + 1
    lower = np.take(cum, np.clip(base - lo, 0, n), axis=axis)
    upper = np.take(cum, np.clip(base + 1 - lo, 0, n), axis=axis)
    integral = lower + frac.reshape(shape) * (upper - lower)  # ∫ values from 0 to each edge
    return np.diff(integral, axis=axis) / (old / new)


def area_resample(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Fraction of each ``grid`` pixel's footprint covered by ``mask`` (float64, in [0, 1]).

    Exact for any ratio (down- or up-sampling): the mask is treated as
    piecewise constant over its pixels and integrated over each target
    pixel's footprint (module docstring), separably along rows then columns.
    Only the bounding box of the mask's non-zero pixels is integrated (the same
    values, bit for bit, as the whole image: see :func:`_resample_axis`), so a
    small region on a large image costs what its box costs.
    """
    h, w = _check_size(grid, "grid")
    values = np.asarray(mask)
    if values.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {values.shape}")
    if values.shape == (h, w):
        return np.asarray(values, dtype=np.float64)
    part = _crop(values)
    return np.zeros((h, w)) if part is None else _resample_crop(part, values.shape, (h, w))


def _resample_crop(part: _Crop, size: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
    """:func:`area_resample` of a ``size`` mask that is ``part`` inside its box and zero outside."""
    box, r0, c0 = part
    across = _resample_axis(np.asarray(box, dtype=np.float64), grid[0], 0, old=size[0], lo=r0)
    return np.clip(_resample_axis(across, grid[1], 1, old=size[1], lo=c0), 0.0, 1.0)


def rasterize(regions: Sequence[Region], size: tuple[int, int], grid: tuple[int, int] | None = None) -> np.ndarray:
    """Union of regions as a bool mask of shape ``grid`` (default: ``size``).

    Parameters
    ----------
    regions : sequence of Box, Polygon or EncodedMask
        Regions in original pixel coordinates (empty: all False).
    size : (int, int)
        ``(H, W)`` of the original image.
    grid : (int, int), optional
        ``(h, w)`` of the output; ``None`` keeps the original size.

    Returns
    -------
    numpy.ndarray
        ``bool``, shape ``(h, w)``. Boxes by the pixel-centre rule; polygons
        and masks united at original size, area-resampled and kept where
        coverage ≥ :data:`GAMMA` (module docstring).

    Raises
    ------
    ValueError
        Bad size/grid, a decoded mask whose shape is not ``size``, or an
        unknown region type.
    """
    height, width = _check_size(size, "size")
    target = _check_size(grid, "grid") if grid is not None else (height, width)
    out = np.zeros(target, dtype=bool)
    parts: list[_Crop] = []  # polygons and masks, each cut to the box of its pixels (exact: zero outside)
    for region in regions:
        if isinstance(region, Box):
            out |= box_mask(region, (height, width), target)
            continue
        if isinstance(region, Polygon):
            part = _polygon_crop(region.points, (height, width))
        elif isinstance(region, EncodedMask):
            full = np.asarray(region.decode(), dtype=bool)
            if full.shape != (height, width):
                raise ValueError(
                    f"decoded mask {region.description or ''} has shape {full.shape}, expected image size {(height, width)}"
                )
            part = _crop(full)
        else:
            raise ValueError(f"unknown region type {type(region).__name__}; expected Box, Polygon or EncodedMask")
        if part is not None:
            parts.append(part)
    if parts:
        fine, r0, c0 = _union(parts)
        if target == (height, width):
            out[r0:r0 + fine.shape[0], c0:c0 + fine.shape[1]] |= fine
        else:
            out |= _resample_crop((fine, r0, c0), (height, width), target) >= GAMMA - _EPS
    return out


def validate_box(box: Box, size: tuple[int, int], tolerance: float = BOX_TOLERANCE) -> None:
    """Raise ``ValueError`` unless ``box`` is finite, non-empty and inside the image.

    A box may stick out of ``[0, W] × [0, H]`` by at most ``tolerance`` pixels
    (annotation tools round); it is not clipped (rasterisation clips).
    """
    height, width = _check_size(size, "size")
    values = (box.x_min, box.y_min, box.x_max, box.y_max)
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"box has non-finite coordinates {values}")
    if box.x_max <= box.x_min or box.y_max <= box.y_min:
        raise ValueError(f"box (x_min, y_min, x_max, y_max)={values} is empty or inverted")
    if box.x_min < -tolerance or box.y_min < -tolerance or box.x_max > width + tolerance or box.y_max > height + tolerance:
        raise ValueError(
            f"box (x_min, y_min, x_max, y_max)={values} lies outside the {width}x{height} (WxH) image "
            f"by more than {tolerance:g} px"
        )


def siim_rle_runs(rle: str, height: int = 1024, width: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Parse and check a SIIM-ACR relative RLE without building the mask.

    Returns ``(starts, ends)`` of the runs as flat column-major indices
    (``end`` exclusive); both are empty for ``"-1"``. Raises ``ValueError``
    exactly when :func:`decode_siim_rle` would.
    """
    if not isinstance(rle, str) or not rle.strip():
        raise ValueError(f"RLE must be a non-empty string ('-1' for an empty mask), got {rle!r}")
    text = rle.strip()
    if text == "-1":
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    total = height * width
    tokens = text.split()
    parsed: list[int] = []
    for number, token in enumerate(tokens):
        try:
            value = int(token) if len(token) <= 20 else None
        except ValueError:
            raise ValueError(f"RLE has a non-integer token {token[:30]!r} at pair {number // 2 + 1}") from None
        if value is None or value > total:  # no run can exceed the image: bounds every later sum (no int64 overflow)
            raise ValueError(f"RLE value {token[:30]}{'...' if len(token) > 30 else ''} at pair {number // 2 + 1} is larger "
                             f"than the {height}x{width} image ({total} pixels)")
        parsed.append(value)
    if len(parsed) % 2:
        raise ValueError(f"RLE needs (offset, length) pairs, got an odd number of values ({len(parsed)})")
    values = np.array(parsed, dtype=np.int64)
    offsets, lengths = values[0::2], values[1::2]
    if (offsets < 0).any():
        raise ValueError(f"RLE has a negative offset at pair {int(np.argmax(offsets < 0)) + 1}")
    if (lengths <= 0).any():
        raise ValueError(f"RLE has a non-positive run length at pair {int(np.argmax(lengths <= 0)) + 1}")
    ends = np.cumsum(offsets + lengths)
    if ends[-1] > total:
        raise ValueError(f"RLE runs past the end of the {height}x{width} image (last run ends at {int(ends[-1])} > {total})")
    return ends - lengths, ends


def decode_siim_rle(rle: str, height: int = 1024, width: int = 1024) -> np.ndarray:
    """Decode a SIIM-ACR pneumothorax mask (relative, column-major run-length).

    The string holds pairs ``offset length``: each run starts ``offset``
    pixels after the end of the previous run (the first after position 0),
    over the image flattened **column by column** (Fortran order, the flat
    index runs down each column). ``"-1"`` means an empty mask. Surrounding
    whitespace is ignored. Reference: Kaggle ``mask_functions.py``
    ``rle2mask`` (siim-acr-pneumothorax-segmentation).

    Returns
    -------
    numpy.ndarray
        ``bool``, shape ``(height, width)``.

    Raises
    ------
    ValueError
        Empty input, non-integer tokens, an odd number of values, negative
        offsets, non-positive lengths, or a run past the last pixel.
    """
    starts, ends = siim_rle_runs(rle, height, width)
    total = height * width
    edges = np.zeros(total + 1, dtype=np.int32)
    np.add.at(edges, starts, 1)
    np.add.at(edges, ends, -1)
    flat = np.cumsum(edges[:-1]) > 0
    return flat.reshape(width, height).T.copy()


def decode_coco_rle(obj: dict) -> np.ndarray:
    """Decode a COCO run-length mask ``{"size": [h, w], "counts": ...}`` with pycocotools.

    ``counts`` is the compressed string (as cheXlocalize's
    ``gt_segmentations_*.json`` stores it) or bytes, or an uncompressed list
    of run lengths. Returns ``bool`` of shape ``(h, w)``.

    Raises
    ------
    ValueError
        Missing keys, a bad ``size``, or counts pycocotools cannot decode.
    """
    from pycocotools import mask as mask_utils

    if not isinstance(obj, dict) or "size" not in obj or "counts" not in obj:
        raise ValueError(f"COCO RLE must be a dict with 'size' and 'counts', got {type(obj).__name__} {str(obj)[:80]}")
    size = obj["size"]
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
        raise ValueError(f"COCO RLE 'size' must be [height, width] positive ints, got {size!r}")
    h, w = size
    counts = obj["counts"]
    try:
        if isinstance(counts, list):
            rle = mask_utils.frPyObjects({"size": [h, w], "counts": counts}, h, w)
        else:
            rle = {"size": [h, w], "counts": counts.encode("ascii") if isinstance(counts, str) else counts}
        with warnings.catch_warnings():  # pycocotools' numpy-2 copy= DeprecationWarning
            warnings.simplefilter("ignore", DeprecationWarning)
            decoded = mask_utils.decode(rle)
    except Exception as exc:  # pycocotools raises bare Exceptions / TypeErrors
        raise ValueError(f"COCO RLE counts cannot be decoded: {type(exc).__name__}: {exc}") from None
    if decoded.shape[:2] != (h, w):
        raise ValueError(f"COCO RLE decoded to shape {decoded.shape}, expected {(h, w)}")
    return decoded.astype(bool)
