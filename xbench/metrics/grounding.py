"""Grounding metrics: does a saliency map point at / overlap the radiologist's region?

Conventions shared by every function here (stated once, tested in
``tests/metrics/test_metrics_grounding.py``):

* **Inputs.** ``maps`` is float ``(N, h, w)`` at the model's native grid (e.g.
  14×14), NumPy or torch; it is cast to float32. ``masks`` is bool (or 0/1)
  ``(N, H, W)`` at the evaluation grid: callers rasterise the ground truth at the
  grid (default :data:`DEFAULT_GRID`, 224×224). Pair ``i`` is ``maps[i]`` with
  ``masks[i]``.
* **Resize first.** Each map is resized to ``(H, W)`` with bilinear
  interpolation, ``align_corners=False`` (:func:`upsample_maps`), before anything
  else — the cheXlocalize rule (``eval.py``/``heatmap_to_segmentation.py`` resize
  to the image with ``F.interpolate(..., 'bilinear', align_corners=False)``);
  XBench evaluates that formula as two float64 matrix products per map, each
  rounded to float32 once, which is faster than torch's CPU kernel, equal to it up
  to float32 rounding, and the same bits on every machine (below).
* **Same bits everywhere.** Upsampling, normalisation, the threshold sweep
  (integer counts), the pointing-game argmax and the best-τ choice (exact
  fractions) give identical bits whatever the CPU, the BLAS kernel and its thread
  count: no result here depends on a summation order. Values that come out of a
  network forward pass do not have this property (see the README, "What
  identical means").
* **Normalise.** Per-map min–max to [0, 1] in float32 (:func:`normalize_maps`);
  a constant map becomes all zeros.
* **Binarise.** ``B(τ) = {u : v_u ≥ τ}`` on the normalised map ``v`` with ``≥``
  (cheXlocalize uses ``>``): τ = 0 selects every pixel, τ = 1 only the maximum
  pixels of a non-constant map, and a constant map (all zeros) is fully
  selected at τ = 0 and empty for τ > 0. The comparison is exact: the float32
  value against the float64 threshold.
* **Empty ground truth.** A pair whose mask is empty is not a positive pair:
  every metric is ``NaN`` for it (never a hit, never a 0).
* **Unscorable maps (one rule).** A map is unscorable when it holds NaN or
  ±inf, a finite value beyond the float32 range (e.g. float64 ``1e300``), or
  values whose range ``max - min`` overflows float32 (e.g. float32 ``±3e38``).
  With ``nonfinite="raise"`` (default) any of these raises ``ValueError``
  naming the pair (``case_ids``/``findings`` name it in the message); with
  ``nonfinite="skip"`` the pair scores ``NaN`` and one
  :class:`~xbench.core.errors.XBenchWarning` gives the number of skipped pairs.

References
----------
XBench, arXiv:2510.19599 (pointing game, Dice/IoU at τ = 0.5 and at the best τ
over [0, 1] in steps of 0.01). Saporta et al., "Benchmarking saliency methods
for chest X-ray interpretation", Nat. Mach. Intell. 2022 (cheXlocalize).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.errors import XBenchWarning
from . import _sweep
from ._sweep import CHUNK_SIZE

__all__ = [
    "DEFAULT_GRID",
    "THRESHOLDS",
    "upsample_maps",
    "normalize_maps",
    "pointing_game",
    "pointing_game_tolerance",
    "pointing_metric_name",
    "dice",
    "iou",
    "dice_iou_curves",
    "ThresholdChoice",
    "best_threshold",
    "oracle_threshold",
    "GroundingScores",
    "grounding_scores",
]

#: Default evaluation grid ``(H, W)``: ground truth is rasterised and maps resized to it.
DEFAULT_GRID: tuple[int, int] = (224, 224)

#: The threshold grid 0.00, 0.01, …, 1.00 (101 values, both ends included;
#: ``np.arange(0, 1, 0.01)`` would stop at 0.99).
THRESHOLDS: np.ndarray = np.round(np.linspace(0.0, 1.0, 101), 2)
THRESHOLDS.flags.writeable = False


def upsample_maps(maps, size: tuple[int, int] = DEFAULT_GRID) -> np.ndarray:
    """Resize maps to the evaluation grid with bilinear interpolation.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
        Saliency maps at the model's native grid; cast to float32.
    size : tuple of int, default=DEFAULT_GRID
        Target ``(H, W)``.

    Returns
    -------
    numpy.ndarray of shape (N, H, W), float32

    Notes
    -----
    Bilinear interpolation with ``align_corners=False`` (half-pixel centres)
    and border clamping — the ``torch.nn.functional.interpolate(mode="bilinear",
    align_corners=False)`` formula that cheXlocalize uses — computed as a
    separable linear map: ``out[i] = fl32(Wy @ fl32(maps[i] @ Wx.T))`` with the
    products in float64, where
    ``Wy`` ``(H, h)`` and ``Wx`` ``(W, w)`` hold the 1-D interpolation weights
    (:func:`xbench.metrics._sweep.bilinear_weights`: at most two non-zeros per
    row, ``1 − λ`` and ``λ``, with source positions and ``λ`` rounded as torch
    rounds them). This is the library's single definition of the resize: every
    metric, and the brute-force references in the tests and the benchmark, go
    through it. Results may differ from torch's own kernel by float32 rounding
    (a few ulps; ≤ 1.2e-7 on maps in [0, 1] in the tests). The bits do not depend
    on the machine, the BLAS kernel or its threads, nor on the other maps passed
    with it: every float64 product is exact and each output sums at most two of
    them (:func:`xbench.metrics._sweep.upsample_chunk` gives the argument). When ``(h, w)`` already equals
    ``size`` the maps are returned unchanged (a copy). A map that is constant on
    its native grid is returned exactly constant (the float32 weights of a row
    need not sum to exactly 1). When resized, a map holding any NaN or inf is
    returned all NaN (the metric functions reject or skip such maps first).

    Examples
    --------
    >>> upsample_maps([[[1.0, 2.0], [3.0, 4.0]]], size=(4, 4))[0, 0]
    array([1.  , 1.25, 1.75, 2.  ], dtype=float32)
    """
    arr = _sweep.as_maps(maps)
    size = _as_size(size)
    out = np.empty((len(arr), *size), np.float32)
    with _sweep.single_threaded():  # chunks of CHUNK_SIZE maps, written in place: cache-sized, one thread
        for s in range(0, len(arr), CHUNK_SIZE):
            _sweep.upsample_chunk(arr[s : s + CHUNK_SIZE], size, out=out[s : s + CHUNK_SIZE])
    return out


def normalize_maps(
    maps,
    *,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
) -> np.ndarray:
    """Per-map min–max normalisation to [0, 1].

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, H, W)
        Maps (usually after :func:`upsample_maps`); cast to float32.
    nonfinite : {"raise", "skip"}, default="raise"
        What to do with a map holding NaN or inf (or whose ``max - min``
        overflows float32): raise ``ValueError`` naming it, or return it as all
        NaN and report the count with an :class:`~xbench.core.errors.XBenchWarning`.
    case_ids, findings : sequence of length N, optional
        Names used in error and warning messages.

    Returns
    -------
    numpy.ndarray of shape (N, H, W), float32, values in [0, 1]

    Notes
    -----
    ``v = (m - min m) / (max m - min m)``, computed in float32. The maximum maps
    to exactly 1.0 and the minimum to exactly 0.0. A constant map (``max ==
    min``) becomes all zeros rather than 0/0. Normalisation is per map, never
    over the batch (Quantus' default normalises over the whole batch).

    Examples
    --------
    >>> normalize_maps([[[1.0, 3.0], [2.0, 5.0]], [[7.0, 7.0], [7.0, 7.0]]])
    array([[[0.  , 0.5 ],
            [0.25, 1.  ]],
    <BLANKLINE>
           [[0.  , 0.  ],
            [0.  , 0.  ]]], dtype=float32)
    """
    arr = _sweep.as_maps(_float32_maps(maps, case_ids, findings, nonfinite)).copy()
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"nonfinite must be 'raise' or 'skip'; got {nonfinite!r}")
    n = len(arr)
    _sweep.check_names(n, case_ids, findings)
    flat = arr.reshape(n, -1)
    lo = flat.min(axis=1)  # NaN and ±inf show up in the min or the max
    hi = flat.max(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        span = hi - lo
    valid = np.isfinite(span)
    if not valid.all():
        i = int(np.flatnonzero(~valid)[0])
        if nonfinite == "raise":
            raise ValueError(
                f"{_sweep.pair_name(i, case_ids, findings)}: map contains NaN or inf (or max - min overflows "
                "float32); pass nonfinite='skip' to score such maps as NaN"
            )
        warnings.warn(
            f"{int((~valid).sum())} of {n} maps are non-finite and were returned as NaN (nonfinite='skip')",
            XBenchWarning,
            stacklevel=2,
        )
    lo[~valid], span[~valid] = 0.0, 1.0
    span[span == 0] = 1.0
    np.subtract(flat, lo[:, None], out=flat)
    np.divide(flat, span[:, None], out=flat)
    flat[~valid] = np.nan
    return arr


def pointing_game(
    maps,
    masks,
    *,
    ties: str = "first",
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> np.ndarray:
    """Pointing game: does the map's maximum fall inside the ground-truth region?

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
        Saliency maps at the native grid.
    masks : array-like of shape (N, H, W), bool
        Ground-truth regions at the evaluation grid.
    ties : {"first", "any"}, default="first"
        ``"first"``: the first maximum in row-major order (top-most, then
        left-most; ``np.argmax``) is the point — the cheXlocalize rule.
        ``"any"``: a hit if any pixel equal to the maximum lies in the mask —
        the Quantus / MedKLIP rule.
    nonfinite : {"raise", "skip"}, default="raise"
    case_ids, findings : sequence of length N, optional
        Names used in error and warning messages.
    chunk_size : int, default=16
        Pairs processed at a time.

    Returns
    -------
    numpy.ndarray of shape (N,), float64
        1.0 for a hit, 0.0 for a miss, NaN when the mask is empty (or the map
        was skipped).

    Notes
    -----
    The argmax is taken on the *upsampled* map (bilinear, ``align_corners=False``,
    to the mask grid), before normalisation, as cheXlocalize does. ``"any"``
    compares each pixel with the maximum by exact equality. A constant map has
    every pixel tied: ``"first"`` points at pixel (0, 0), ``"any"`` is a hit
    whenever the mask is non-empty. An empty mask is never a hit: NaN (Quantus
    0.6.0 stores True there, see peers.md).

    Examples
    --------
    >>> maps = [[[0.0, 1.0], [1.0, 0.0]]]
    >>> masks = [[[False, False], [True, False]]]
    >>> pointing_game(maps, masks), pointing_game(maps, masks, ties="any")
    (array([0.]), array([1.]))
    """
    counts = _sweep.count_pairs(
        _float32_maps(maps, case_ids, findings, nonfinite), masks, ties=ties, nonfinite=nonfinite, case_ids=case_ids, findings=findings, chunk_size=chunk_size
    )
    return counts.hit


def pointing_metric_name(margin: int = 0) -> str:
    """Name of the pointing metric at a tolerance margin: ``"pointing"`` (m = 0) or ``"pointing@15px"``.

    Every table that uses a margin carries it in the metric name.

    Examples
    --------
    >>> pointing_metric_name(0), pointing_metric_name(15)
    ('pointing', 'pointing@15px')
    """
    return "pointing" if _as_margin(margin) == 0 else f"pointing@{_as_margin(margin)}px"


def pointing_game_tolerance(
    maps,
    masks,
    margin: int = 0,
    *,
    ties: str = "first",
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> np.ndarray:
    """Pointing game with a tolerance margin: a hit if the map's maximum lies within ``margin`` pixels of the region.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
        Saliency maps at the native grid.
    masks : array-like of shape (N, H, W), bool
        Ground-truth regions at the evaluation grid.
    margin : int, default=0
        ``m`` in pixels **of the evaluation grid** (``(H, W)`` of ``masks``), ≥ 0.
        ``m = 0`` is :func:`pointing_game` exactly.
    ties, nonfinite, case_ids, findings, chunk_size
        As in :func:`pointing_game`.

    Returns
    -------
    numpy.ndarray of shape (N,), float64
        1.0 hit, 0.0 miss, NaN for an empty mask (or a skipped map).

    Notes
    -----
    A grid pixel is within ``m`` of the region when the Euclidean distance
    between its centre and the centre of some region pixel is ``≤ m`` — the
    region dilated by a disc of radius ``m`` (the TorchRay pointing game's
    tolerance, 15 px at 224×224 there). The point is the one of
    :func:`pointing_game` (argmax of the upsampled map, ``ties`` as there), so
    the hit is the pointing game against the dilated region. Dilation never
    reaches outside the grid and an empty mask stays empty (NaN).

    Examples
    --------
    >>> maps = [[[0.0, 0.0, 0.0, 1.0]]]          # argmax at column 3
    >>> masks = [[[True, False, False, False]]]   # region at column 0
    >>> [float(pointing_game_tolerance(maps, masks, m)[0]) for m in (0, 2, 3)]
    [0.0, 0.0, 1.0]
    """
    masks_arr = _sweep.as_numpy(masks, "masks")
    return pointing_game(maps, _dilate(masks_arr, margin), ties=ties, nonfinite=nonfinite, case_ids=case_ids,
                         findings=findings, chunk_size=chunk_size)


def _as_margin(margin) -> int:
    m = int(margin)
    if m != margin or m < 0:
        raise ValueError(f"margin must be a non-negative whole number of grid pixels; got {margin!r}")
    return m


def _dilate(masks: np.ndarray, margin: int) -> np.ndarray:
    """Masks ``(N, H, W)`` dilated by a disc of radius ``margin`` (centre distance ≤ margin); margin 0: unchanged."""
    m = _as_margin(margin)
    masks = np.asarray(masks).astype(bool)
    if m == 0 or masks.size == 0:
        return masks
    if masks.ndim != 3:
        raise ValueError(f"masks must have shape (N, H, W); got {masks.shape}")
    out = masks.copy()
    n, height, width = masks.shape
    for dy in range(-m, m + 1):
        reach = int(np.floor(np.sqrt(m * m - dy * dy)))
        # rows shifted by dy, then OR-ed over the horizontal offsets of this row of the disc
        rows = np.zeros_like(masks)
        if dy >= 0:
            rows[:, dy:] = masks[:, : height - dy] if dy < height else False
        else:
            rows[:, : height + dy] = masks[:, -dy:] if -dy < height else False
        for dx in range(-reach, reach + 1):
            if dx >= 0 and dx < width:
                out[:, :, dx:] |= rows[:, :, : width - dx]
            elif dx < 0 and -dx < width:
                out[:, :, : width + dx] |= rows[:, :, -dx:]
    return out


def _overlap(counts: _sweep.Counts, inter: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dice and IoU from counts; NaN where the mask is empty or the pair was skipped."""
    gt = counts.gt_area.reshape((-1,) + (1,) * (inter.ndim - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = 2.0 * inter / (pred + gt)
        j = inter / (pred + gt - inter)
    undefined = (counts.gt_area == 0) | ~counts.valid
    d[undefined] = np.nan
    j[undefined] = np.nan
    return d, j


def _fixed_threshold(threshold) -> float:
    """τ of the fixed-threshold metrics: finite, like every τ of a curve (:func:`_sweep.as_thresholds`)."""
    value = float(threshold)
    if not np.isfinite(value):
        raise ValueError(f"threshold must be finite; got {threshold!r}")
    return value


def _float32_maps(maps, case_ids, findings, nonfinite="raise"):
    """Maps ready for the float32 cast. A finite value the cast would turn into ±inf makes its map unscorable, like
    NaN / inf and a float32 range overflow (the module's one rule): ``"raise"`` names the pair (and the value),
    ``"skip"`` returns that map as all-NaN, so it is scored NaN and counted with the other skipped pairs."""
    arr = _sweep.as_numpy(maps, "maps")
    if arr.dtype.kind == "f" and arr.dtype.itemsize > 4 and arr.ndim == 3 and arr.size:
        with np.errstate(invalid="ignore"):
            big = np.isfinite(arr) & (np.abs(arr) > np.finfo(np.float32).max)
        if big.any():
            rows = big.reshape(len(arr), -1).any(axis=1)
            if nonfinite == "skip":
                arr = np.array(arr, copy=True)
                arr[rows] = np.nan
                return arr
            i = int(np.flatnonzero(rows)[0])
            value = float(arr[i][big[i]][0])
            raise ValueError(f"{_sweep.pair_name(i, case_ids, findings)}: map value {value:g} overflows float32 "
                             f"(|v| > {np.finfo(np.float32).max:g}); rescale the map before scoring")
    return arr


def _fixed(maps, masks, threshold, nonfinite, case_ids, findings, chunk_size):
    counts = _sweep.count_pairs(
        _float32_maps(maps, case_ids, findings, nonfinite), masks, fixed=_fixed_threshold(threshold), nonfinite=nonfinite, case_ids=case_ids, findings=findings,
        chunk_size=chunk_size,
    )
    return _overlap(counts, counts.fixed_inter.astype(np.float64), counts.fixed_pred.astype(np.float64))


def dice(
    maps,
    masks,
    *,
    threshold: float = 0.5,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> np.ndarray:
    """Dice coefficient between the binarised map and the ground truth.

    ``Dice = 2 |B ∩ G| / (|B| + |G|)`` with ``B = {u : v_u ≥ threshold}`` on the
    upsampled, min–max-normalised map ``v``.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
    masks : array-like of shape (N, H, W), bool
    threshold : float, default=0.5
        τ on the normalised map, compared with ``≥``.
    nonfinite : {"raise", "skip"}, default="raise"
    case_ids, findings : sequence of length N, optional
    chunk_size : int, default=16

    Returns
    -------
    numpy.ndarray of shape (N,), float64

    Notes
    -----
    Empty prediction with a non-empty mask → 0. Empty mask → NaN (excluded from
    means), whether or not the prediction is empty (the empty-mask rule wins).
    ``threshold=0`` selects every pixel; ``threshold=1`` selects only the maximum
    pixels of a non-constant map and nothing of a constant map.

    Examples
    --------
    >>> maps = [[[0.0, 0.2], [0.6, 1.0]]]
    >>> masks = [[[False, False], [True, False]]]
    >>> dice(maps, masks)  # B = {0.6, 1.0}: 2·1 / (2 + 1)
    array([0.66666667])
    """
    return _fixed(maps, masks, threshold, nonfinite, case_ids, findings, chunk_size)[0]


def iou(
    maps,
    masks,
    *,
    threshold: float = 0.5,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> np.ndarray:
    """Intersection over union between the binarised map and the ground truth.

    ``IoU = |B ∩ G| / |B ∪ G|`` with ``B`` as in :func:`dice`.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
    masks : array-like of shape (N, H, W), bool
    threshold : float, default=0.5
    nonfinite : {"raise", "skip"}, default="raise"
    case_ids, findings : sequence of length N, optional
    chunk_size : int, default=16

    Returns
    -------
    numpy.ndarray of shape (N,), float64

    Notes
    -----
    Same edge cases as :func:`dice`: empty prediction with a non-empty mask → 0
    (cheXlocalize's default ``true_pos_only=True`` would exclude it instead);
    empty mask → NaN.

    Examples
    --------
    >>> maps = [[[0.0, 0.2], [0.6, 1.0]]]
    >>> masks = [[[False, False], [True, False]]]
    >>> iou(maps, masks)  # |B ∩ G| = 1, |B ∪ G| = 2
    array([0.5])
    """
    return _fixed(maps, masks, threshold, nonfinite, case_ids, findings, chunk_size)[1]


def dice_iou_curves(
    maps,
    masks,
    thresholds=THRESHOLDS,
    *,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """Dice and IoU of every pair at every threshold of a grid, in one pass.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
        Saliency maps at the native grid (upsampled and normalised chunk by chunk).
    masks : array-like of shape (N, H, W), bool
    thresholds : array-like of shape (T,), default=THRESHOLDS
        Strictly increasing, finite.
    nonfinite : {"raise", "skip"}, default="raise"
    case_ids, findings : sequence of length N, optional
    chunk_size : int, default=16
        Pairs upsampled and counted at a time; memory is ``O(chunk_size · H · W)``.

    Returns
    -------
    dice : numpy.ndarray of shape (N, T), float64
    iou : numpy.ndarray of shape (N, T), float64
        Rows of NaN for pairs with an empty mask or a skipped map.

    Notes
    -----
    Equal, bit for bit, to looping ``B = v >= t`` over ``thresholds`` and
    applying :func:`dice`/:func:`iou`: each normalised value is binned once
    against the grid (exactly, see :mod:`xbench.metrics._sweep`), pixels are
    counted per bin inside and outside the mask, and a cumulative sum from the
    top gives ``|B(τ) ∩ G|`` and ``|B(τ)|`` for all τ at once. Edge cases as in
    :func:`dice`; at τ = 0 every pixel is selected, so Dice = 2|G| / (HW + |G|).

    Examples
    --------
    >>> maps = [[[0.0, 0.2], [0.6, 1.0]]]
    >>> masks = [[[False, False], [True, False]]]
    >>> d, j = dice_iou_curves(maps, masks, thresholds=[0.0, 0.5, 0.7])
    >>> d, j
    (array([[0.4       , 0.66666667, 0.        ]]), array([[0.25, 0.5 , 0.  ]]))
    """
    t = _sweep.as_thresholds(thresholds)
    counts = _sweep.count_pairs(
        _float32_maps(maps, case_ids, findings, nonfinite), masks, thresholds=t, nonfinite=nonfinite, case_ids=case_ids, findings=findings, chunk_size=chunk_size
    )
    return _overlap(counts, counts.inter.astype(np.float64), counts.pred.astype(np.float64))


@dataclass(frozen=True)
class ThresholdChoice:
    """A threshold choice and the mean Dice / IoU it gives.

    Attributes
    ----------
    tau : float or numpy.ndarray
        The chosen τ (:func:`best_threshold`), or each pair's own τ, NaN for
        excluded pairs (:func:`oracle_threshold`).
    dice, iou : float
        Mean Dice / IoU over the pairs at that choice (``iou`` is NaN when no IoU
        curves were given).
    n : int
        Number of pairs averaged (rows with a finite curve).
    """

    tau: float | np.ndarray
    dice: float
    iou: float
    n: int


def _curves(curves_dice, curves_iou, thresholds) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    d = np.asarray(_sweep.as_numpy(curves_dice, "curves_dice"), dtype=np.float64)
    t = _sweep.as_thresholds(thresholds)
    if d.ndim != 2 or d.shape[1] != t.size:
        raise ValueError(f"curves_dice must have shape (N, {t.size}) to match thresholds; got {d.shape}")
    j = None
    if curves_iou is not None:
        j = np.asarray(_sweep.as_numpy(curves_iou, "curves_iou"), dtype=np.float64)
        if j.shape != d.shape:
            raise ValueError(f"curves_iou must have the shape of curves_dice {d.shape}; got {j.shape}")
    rows = ~np.isnan(d).all(axis=1)
    return d, j, t, rows


def best_threshold(curves_dice, curves_iou=None, thresholds=THRESHOLDS) -> ThresholdChoice:
    """The single τ that maximises the mean Dice over the pairs given.

    Parameters
    ----------
    curves_dice : array-like of shape (N, T)
        Per-pair Dice curves (:func:`dice_iou_curves`); callers pass the
        positive pairs of one (model, dataset, class).
    curves_iou : array-like of shape (N, T), optional
        Matching IoU curves; the mean IoU is reported at the chosen τ.
    thresholds : array-like of shape (T,), default=THRESHOLDS
        Strictly increasing.

    Returns
    -------
    ThresholdChoice
        ``tau`` (float), mean Dice and mean IoU at it, and ``n``.

    Notes
    -----
    The mean at each τ is NaN-skipping over pairs (all-NaN rows — empty masks,
    skipped maps — are excluded). Ties between thresholds go to the **smallest**
    τ (first maximum of the mean curve). With no finite row the result is NaN
    with ``n = 0`` and an :class:`~xbench.core.errors.XBenchWarning`. τ is selected
    on the same pairs it is evaluated on, so the value is optimistic; the
    bootstrap in :mod:`xbench.metrics.stats` re-selects τ in every replicate.

    Examples
    --------
    >>> best_threshold([[0.2, 0.6, 0.6], [0.4, 0.8, 0.8]], thresholds=[0.0, 0.5, 1.0])
    ThresholdChoice(tau=0.5, dice=0.7, iou=nan, n=2)
    """
    d, j, t, rows = _curves(curves_dice, curves_iou, thresholds)
    n = int(rows.sum())
    if n == 0:
        warnings.warn("best_threshold: no pair with a defined Dice curve; returning NaN", XBenchWarning, stacklevel=2)
        return ThresholdChoice(np.nan, np.nan, np.nan, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean_d = np.nanmean(d[rows], axis=0)
    a = _first_exact_max(d[rows], mean_d)
    mean_j = float(np.nanmean(j[rows, a])) if j is not None else np.nan
    return ThresholdChoice(float(t[a]), float(mean_d[a]), mean_j, n)


#: Largest denominator of a per-pair Dice ``2|B∩G| / (|B| + |G|)`` recovered exactly from its float64 value
#: (:func:`_first_exact_max`): grids up to 5 million pixels.
_MAX_DICE_DENOMINATOR = 10**7


def _first_exact_max(d: np.ndarray, mean: np.ndarray) -> int:
    """The first column whose NaN-skipping mean is the maximum, decided on exact quantities.

    Columns within float noise of the best float mean are compared exactly: identical columns are equal; other
    candidates get their mean as a :class:`fractions.Fraction` of the pairs' exact Dice ratios (each recovered
    from its correctly rounded float64 value, whose denominator ``|B| + |G|`` is at most
    :data:`_MAX_DICE_DENOMINATOR`). So the smallest τ wins every exact tie, whatever the summation order."""
    from fractions import Fraction

    top = float(np.nanmax(mean))
    candidates = np.flatnonzero(mean >= top - 1e-9 * max(1.0, abs(top)))
    if candidates.size == 1:
        return int(candidates[0])
    distinct: list[int] = []
    for c in candidates:
        if not any(np.array_equal(d[:, c], d[:, k], equal_nan=True) for k in distinct):
            distinct.append(int(c))
    if len(distinct) == 1:
        return distinct[0]

    def exact(c: int) -> Fraction:
        col = d[:, c][~np.isnan(d[:, c])]
        total = sum((Fraction(float(x)).limit_denominator(_MAX_DICE_DENOMINATOR) for x in col), Fraction(0))
        return total / len(col)

    means = {c: exact(c) for c in distinct}
    best = max(means.values())
    return min(c for c, m in means.items() if m == best)


def oracle_threshold(curves_dice, curves_iou=None, thresholds=THRESHOLDS) -> ThresholdChoice:
    """Per-pair best τ (an upper bound): mean over pairs of each pair's maximum Dice.

    Parameters
    ----------
    curves_dice : array-like of shape (N, T)
    curves_iou : array-like of shape (N, T), optional
        IoU is read at each pair's own best-Dice τ.
    thresholds : array-like of shape (T,), default=THRESHOLDS

    Returns
    -------
    ThresholdChoice
        ``tau`` is an ``(N,)`` array (NaN for excluded pairs); ``dice`` and
        ``iou`` are means over the included pairs.

    Notes
    -----
    Each pair's τ is the smallest one reaching its maximum Dice. Rows that are
    all NaN are excluded (and get ``tau`` NaN).

    Examples
    --------
    >>> oracle_threshold([[0.2, 0.6, 0.6], [0.9, 0.8, 0.8]], thresholds=[0.0, 0.5, 1.0])
    ThresholdChoice(tau=array([0.5, 0. ]), dice=0.75, iou=nan, n=2)
    """
    d, j, t, rows = _curves(curves_dice, curves_iou, thresholds)
    taus = np.full(len(d), np.nan)
    n = int(rows.sum())
    if n == 0:
        warnings.warn("oracle_threshold: no pair with a defined Dice curve; returning NaN", XBenchWarning, stacklevel=2)
        return ThresholdChoice(taus, np.nan, np.nan, 0)
    a = np.nanargmax(d[rows], axis=1)
    taus[rows] = t[a]
    best = d[rows][np.arange(n), a]
    mean_j = float(np.nanmean(j[rows][np.arange(n), a])) if j is not None else np.nan
    return ThresholdChoice(taus, float(np.mean(best)), mean_j, n)


@dataclass
class GroundingScores:
    """Per-pair grounding results of :func:`grounding_scores`.

    Attributes
    ----------
    pointing, dice, iou : numpy.ndarray of shape (N,)
        Pointing hit and Dice / IoU at ``threshold`` (NaN for empty masks and
        skipped maps).
    dice_curves, iou_curves : numpy.ndarray of shape (N, T)
        Dice / IoU at every τ of ``thresholds``.
    thresholds : numpy.ndarray of shape (T,)
    threshold : float
        The fixed τ of ``dice`` / ``iou``.
    gt_area : numpy.ndarray of shape (N,)
        ``|G|`` in pixels of the evaluation grid.
    n_skipped : int
        Pairs skipped for a non-finite map.
    """

    pointing: np.ndarray
    dice: np.ndarray
    iou: np.ndarray
    dice_curves: np.ndarray
    iou_curves: np.ndarray
    thresholds: np.ndarray
    threshold: float
    gt_area: np.ndarray
    n_skipped: int
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # registered per-pair metrics (metrics.table)

    def to_frame(self, case_id: Sequence, finding: Sequence | str) -> pd.DataFrame:
        """The per-pair table :func:`xbench.metrics.score_table` reads.

        Columns ``case_id, finding, pointing, dice_fixed, iou_fixed``, one per registered per-pair metric
        (:data:`xbench.metrics.table.METRIC_TABLE`), ``gt_area, dice_curve, iou_curve`` (the curves are one
        ``(T,)`` array per row).
        ``finding`` may be one name for all pairs.
        """
        n = len(self.pointing)
        if isinstance(finding, str):
            finding = [finding] * n
        if len(case_id) != n or len(finding) != n:
            raise ValueError(f"case_id and finding need {n} entries; got {len(case_id)} and {len(finding)}")
        return pd.DataFrame(
            {
                "case_id": list(case_id),
                "finding": list(finding),
                "pointing": self.pointing,
                "dice_fixed": self.dice,
                "iou_fixed": self.iou,
                **self.extra,
                "gt_area": self.gt_area,
                "dice_curve": list(self.dice_curves),
                "iou_curve": list(self.iou_curves),
            }
        )


def grounding_scores(
    maps,
    masks,
    *,
    grid: tuple[int, int] | None = None,
    threshold: float = 0.5,
    ties: str = "first",
    thresholds=THRESHOLDS,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> GroundingScores:
    """Every grounding metric of every pair, from one pass over the maps.

    Parameters
    ----------
    maps : array-like or torch.Tensor of shape (N, h, w)
        Saliency maps at the native grid.
    masks : array-like of shape (N, H, W), bool
        Ground truth rasterised at the evaluation grid.
    grid : tuple of int, optional
        The evaluation grid; when given it must equal ``(H, W)`` of ``masks``
        (a guard: XBench never resizes ground truth). None: ``(H, W)``.
    threshold : float, default=0.5
        The fixed τ of ``dice`` / ``iou``.
    ties : {"first", "any"}, default="first"
        Pointing-game tie rule (:func:`pointing_game`).
    thresholds : array-like of shape (T,), default=THRESHOLDS
        Grid of the Dice / IoU curves.
    nonfinite : {"raise", "skip"}, default="raise"
    case_ids, findings : sequence of length N, optional
        Names used in error and warning messages.
    chunk_size : int, default=16

    Returns
    -------
    GroundingScores
        Same values as :func:`pointing_game`, :func:`dice`, :func:`iou` and
        :func:`dice_iou_curves` called separately; ``.to_frame(...)`` gives the
        per-pair table.

    Examples
    --------
    >>> s = grounding_scores([[[0.0, 0.2], [0.6, 1.0]]], [[[False, False], [True, False]]])
    >>> s.pointing, s.dice, s.dice_curves.shape
    (array([0.]), array([0.66666667]), (1, 101))
    """
    masks_arr = _sweep.as_numpy(masks, "masks")
    if grid is not None and tuple(masks_arr.shape[1:]) != _as_size(grid):
        raise ValueError(
            f"masks are {tuple(masks_arr.shape[1:])} but grid={tuple(grid)}: rasterise the ground truth at the grid"
        )
    t = _sweep.as_thresholds(thresholds)
    counts = _sweep.count_pairs(
        _float32_maps(maps, case_ids, findings, nonfinite), masks_arr, thresholds=t, fixed=_fixed_threshold(threshold), ties=ties, nonfinite=nonfinite,
        case_ids=case_ids, findings=findings, chunk_size=chunk_size,
    )
    d, j = _overlap(counts, counts.fixed_inter.astype(np.float64), counts.fixed_pred.astype(np.float64))
    dc, jc = _overlap(counts, counts.inter.astype(np.float64), counts.pred.astype(np.float64))
    return GroundingScores(
        pointing=counts.hit, dice=d, iou=j, dice_curves=dc, iou_curves=jc, thresholds=t,
        threshold=float(threshold), gt_area=counts.gt_area, n_skipped=counts.n_skipped,
        extra=_registered_pair_metrics(maps, masks_arr, counts.valid & (counts.gt_area > 0), chunk_size),
    )


def _registered_pair_metrics(maps, masks: np.ndarray, defined: np.ndarray, chunk_size: int) -> dict[str, np.ndarray]:
    """Values of the per-pair functions of :data:`~xbench.metrics.table.METRIC_TABLE` (maps upsampled to the
    grid and min–max normalised, chunk by chunk), NaN for empty masks and non-finite maps."""
    from .table import pair_column, per_pair_metrics

    functions = [(pair_column(m), m.per_pair) for m in per_pair_metrics() if m.per_pair is not None]
    if not functions:
        return {}
    arr = _sweep.as_numpy(maps, "maps")
    out = {name: np.full(len(masks), np.nan) for name, _ in functions}
    for s in range(0, len(masks), chunk_size):
        rows = np.flatnonzero(defined[s:s + chunk_size]) + s
        if rows.size:
            norm = normalize_maps(upsample_maps(arr[rows], tuple(masks.shape[1:])))
            for name, fn in functions:
                out[name][rows] = np.asarray(fn(norm, masks[rows]), dtype=np.float64)
    return out


def _as_size(size) -> tuple[int, int]:
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"size must be (H, W) with positive entries; got {size}")
    return size
