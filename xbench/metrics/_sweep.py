"""Chunked engine behind the grounding metrics: upsample, normalise, count.

Bilinear resizing is ``Wy @ map @ Wx.T`` with cached 1-D weight matrices
(:func:`bilinear_weights`, :func:`upsample_chunk`), taken in float64 so that the
result is the same bits under every BLAS kernel and thread count. One pass over each
(map, mask) pair gives every count the public functions in
:mod:`xbench.metrics.grounding` need: the pointing-game hit, ``|B(τ) ∩ G|`` and
``|B(τ)|`` for a whole threshold grid, and ``|G|``. Pairs are processed
``chunk_size`` at a time, so memory stays bounded whatever ``N`` is, and the
chunk buffers stay in cache.

Threshold sweep without 101 passes
----------------------------------
``B(τ) = {u : v_u ≥ τ}`` where ``v`` is the float32 normalised map and ``τ`` a
float64 threshold, compared exactly (as ``v >= τ`` does in NumPy for a float32
array and a float64 scalar). For a strictly increasing grid ``t_0 < … < t_{T-1}``
let ``k(v) = #{i : t_i ≤ v}``; then ``v ≥ t_i ⟺ i < k(v)``, so a histogram of
``k`` per pair (inside and outside the mask) and a suffix sum give
``|B(t_i) ∩ G|`` and ``|B(t_i)|`` for all ``i`` at once.

* Default grid ``t_i = fl64(i / 100)``: ``k(v) = ⌊100 · v⌋ + 1`` exactly, with
  the product taken in float64. A float32 ``v`` has a 24-bit significand and 100
  a 7-bit one, so ``100 · v`` is exact in float64; ``100 · t_i`` differs from
  the integer ``i`` by at most ~1e-14, far less than the spacing of the values
  ``100 · v`` near ``i`` (≥ 2**-31), and ``100 · v`` can equal an integer ``i``
  only when ``i / 100`` is dyadic (i ∈ {0, 25, 50, 75, 100}), where
  ``t_i = i / 100`` exactly. So ``⌊100 v⌋ ≥ i ⟺ v ≥ t_i`` for every float32
  ``v`` in [0, 1] (also checked exhaustively over all float32 in [0, 1]).
* Any other grid: ``k = searchsorted(c, v, side="right")`` where ``c_i`` is the
  smallest float32 ≥ ``t_i``; for float32 ``v``, ``v ≥ t_i ⟺ v ≥ c_i``.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from ..core.errors import XBenchWarning

#: Pairs per chunk: small enough that a chunk's buffers (~0.4 MB per 224×224 map) stay in cache.
CHUNK_SIZE = 16

_DEFAULT_GRID_VALUES = np.round(np.linspace(0.0, 1.0, 101), 2)  # = grounding.THRESHOLDS; the floor(100 v) shortcut holds for this grid
_MASK_BIT = np.uint8(128)  # key = bin | 128·[in mask]; default-grid bins are 0…100 < 128


def as_numpy(x, name: str) -> np.ndarray:
    """``np.ndarray`` view of an array-like or a (CPU or GPU) torch tensor."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} must be array-like; got {type(x).__name__}: {exc}") from exc


def pair_name(i: int, case_ids: Sequence | None, findings: Sequence | None) -> str:
    """``"pair 3 (case 'a.png', finding 'Nodule')"`` for error and warning messages."""
    parts = []
    if case_ids is not None:
        parts.append(f"case {case_ids[i]!r}")
    if findings is not None:
        parts.append(f"finding {findings[i]!r}")
    return f"pair {i}" + (f" ({', '.join(parts)})" if parts else "")


def check_names(n: int, case_ids: Sequence | None, findings: Sequence | None) -> None:
    for label, seq in (("case_ids", case_ids), ("findings", findings)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{label} has {len(seq)} entries but there are {n} maps")


def as_maps(maps, name: str = "maps") -> np.ndarray:
    """Maps as C-contiguous float32 ``(N, h, w)``; a single ``(h, w)`` map is not accepted."""
    arr = as_numpy(maps, name)
    if arr.ndim != 3:
        raise ValueError(f"{name} must have shape (N, h, w); got shape {arr.shape}")
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be numeric; got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def as_masks(masks, n: int) -> np.ndarray:
    """Masks as C-contiguous bool ``(N, H, W)``; integer masks must hold only 0 and 1."""
    arr = as_numpy(masks, "masks")
    if arr.ndim != 3:
        raise ValueError(f"masks must have shape (N, H, W); got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"maps and masks must pair up: {n} maps but {arr.shape[0]} masks (shape {arr.shape})")
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in "fiu" or not np.isin(arr, (0, 1)).all():
            raise ValueError(f"masks must be boolean or hold only 0/1; got dtype {arr.dtype} with other values")
        arr = arr.astype(bool)
    return np.ascontiguousarray(arr)


def as_thresholds(thresholds) -> np.ndarray:
    """Thresholds as a strictly increasing, finite float64 ``(T,)`` array."""
    t = np.asarray(as_numpy(thresholds, "thresholds"), dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"thresholds must be a non-empty 1-D sequence; got shape {t.shape}")
    if not np.isfinite(t).all():
        raise ValueError("thresholds must be finite")
    if t.size > 1 and not (np.diff(t) > 0).all():
        raise ValueError("thresholds must be strictly increasing")
    return t


def float32_ceil(t: np.ndarray) -> np.ndarray:
    """Smallest float32 ``c_i ≥ t_i``: for float32 ``v``, ``v ≥ t_i ⟺ v ≥ c_i``."""
    with np.errstate(over="ignore"):
        c = np.asarray(t, dtype=np.float64).astype(np.float32)
    low = c.astype(np.float64) < t
    c[low] = np.nextafter(c[low], np.float32(np.inf))
    return c


@functools.lru_cache(maxsize=32)
def bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` float32 matrix of 1-D linear interpolation, ``align_corners=False``.

    Row ``o`` samples the source at ``s = max((o + ½) · n_in / n_out − ½, 0)``
    (half-pixel centres; positions before the first centre clamp to it) and puts
    weight ``1 − λ`` on ``i0 = ⌊s⌋`` and ``λ = s − i0`` on ``i1 = min(i0 + 1,
    n_in − 1)`` (past the last centre both land on the last pixel, whose weight
    is then their sum). The arithmetic follows torch's CPU kernel of
    ``interpolate(mode="bilinear", align_corners=False)`` (``UpSample.h``:
    ``area_pixel_compute_source_index``, ``guard_index_and_lambda``): float32
    ``scale = n_in / n_out``, ``s`` rounded to float32 once from the exact
    ``scale · (o + ½) − ½`` (torch's fused multiply–add), ``λ`` and ``1 − λ`` in
    float32. Each row sums to 1 up to the float32 rounding of ``1 − λ``
    (exactly 1 for power-of-two ratios such as 14 → 224). Cached, read-only.
    """
    f32 = np.float32
    scale = f32(n_in) / f32(n_out)
    # float32 × float32 is exact in float64, so this rounds once, like an FMA
    src = (np.float64(scale) * (np.arange(n_out) + 0.5) - 0.5).astype(f32)
    src = np.maximum(src, f32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0.astype(f32), f32(0.0), f32(1.0))
    rows = np.arange(n_out)
    w = np.zeros((n_out, n_in))
    np.add.at(w, (rows, i0), (f32(1.0) - lam).astype(np.float64))
    np.add.at(w, (rows, np.minimum(i0 + 1, n_in - 1)), lam.astype(np.float64))
    w = w.astype(f32)
    w.flags.writeable = False
    return w


@functools.lru_cache(maxsize=32)
def _weights64(n_in: int, n_out: int) -> np.ndarray:
    """:func:`bilinear_weights` as float64 (the same values: every float32 is a float64), read-only."""
    w = bilinear_weights(n_in, n_out).astype(np.float64)
    w.flags.writeable = False
    return w


def upsample_chunk(x: np.ndarray, size: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray:
    """Bilinear (``align_corners=False``) resize of float32 ``(k, h, w)`` to ``(k, H, W)``.

    ``out[i] = fl32(Wy @ fl32(x[i] @ Wx.T))`` with ``Wy = bilinear_weights(h, H)`` and
    ``Wx = bilinear_weights(w, W)``, both products taken in **float64** and each rounded
    to float32 once. The result is the same bits on every machine, whatever the BLAS
    kernel (Haswell, SkylakeX, …), its thread count or its blocking, by construction:
    both factors of every product are float32 values, so each product is exact in
    float64 (24 + 24 significand bits ≤ 53), and every output sums at most two non-zero
    products (a row of ``W`` has at most two non-zeros), so any summation order, any
    fused multiply–add and any number of added exact zeros give one correctly rounded
    float64 sum. A float32 matrix product has neither property (its products round,
    and kernels differ in FMA use and order), which made results depend on the BLAS
    configuration by up to 2.4e-7. The same holds per map, so a map's result does not
    depend on the chunk it is in.

    Identity (a copy) when the size already matches. A map constant on its native grid
    is returned exactly constant (the float32 weights of a row need not sum to exactly 1,
    and min–max normalisation would blow up ulp-level ripples); a resized map holding
    NaN or inf is all NaN. ``out``, if given, is a C-contiguous float32 ``(k, H, W)``
    buffer to fill.
    """
    if x.shape[1:] == tuple(size):
        if out is None:
            return x.copy()
        out[...] = x
        return out
    flat = x.reshape(len(x), -1)
    lo = flat.min(axis=1)  # NaN and ±inf show up in the min or the max
    hi = flat.max(axis=1)
    bad = ~(np.isfinite(lo) & np.isfinite(hi))
    if bad.any():
        x = np.where(bad[:, None, None], np.float32(0.0), x)  # no 0 · inf in the products
    wy = _weights64(x.shape[1], size[0])
    wx = _weights64(x.shape[2], size[1])
    # each output is a convex combination of finite inputs: no inf, no NaN
    half = np.matmul(x.astype(np.float64), wx.T).astype(np.float32).astype(np.float64)  # exact float32 values
    if out is None:
        out = np.empty((len(x), *size), np.float32)
    out[...] = np.matmul(wy, half)  # the one rounding to float32
    const = lo == hi
    if const.any():
        out[const] = lo[const, None, None]
    if bad.any():
        out[bad] = np.nan
    return out


@functools.lru_cache(maxsize=1)
def _blas() -> ThreadpoolController:
    return ThreadpoolController().select(user_api="blas")


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the chunk loop on one thread: torch intra-op threads and BLAS threads set to 1, restored after.

    Every call in the loop is tiny (one chunk), so extra threads cannot help, and on a
    loaded machine they cost: a parallel region waits, spinning, for threads that are not
    scheduled. Measured on 2 cores at load average ~11: ``torch.bincount`` of one
    224×224 uint8 map took 2.5 ms CPU / 10 ms wall with 2 torch threads against
    0.05 ms / 0.17 ms with 1 (``benchmarks/bench_threshold_sweep.py`` reports both).
    Not thread-safe: torch's thread count is process-wide.
    """
    n = torch.get_num_threads()
    if n != 1:
        torch.set_num_threads(1)
    try:
        with _blas().limit(limits=1):
            yield
    finally:
        if n != 1:
            torch.set_num_threads(n)


@dataclass
class Counts:
    """What one pass over the pairs yields (``NaN``/``-1`` rows for skipped pairs)."""

    gt_area: np.ndarray  # (N,) int64, |G|
    valid: np.ndarray  # (N,) bool, False for pairs skipped because of a non-finite map
    hit: np.ndarray | None = None  # (N,) float64 pointing hit (NaN: empty G or skipped)
    fixed_inter: np.ndarray | None = None  # (N,) int64 |B(τ) ∩ G|
    fixed_pred: np.ndarray | None = None  # (N,) int64 |B(τ)|
    inter: np.ndarray | None = None  # (N, T) int64 |B(t_i) ∩ G|
    pred: np.ndarray | None = None  # (N, T) int64 |B(t_i)|

    @property
    def n_skipped(self) -> int:
        return int((~self.valid).sum())


def _nonfinite(i: int, why: str, policy: str, case_ids, findings) -> None:
    if policy == "raise":
        raise ValueError(
            f"{pair_name(i, case_ids, findings)}: {why}; pass nonfinite='skip' to score such pairs as NaN"
        )


def count_pairs(
    maps,
    masks,
    *,
    thresholds: np.ndarray | None = None,
    fixed: float | None = None,
    ties: str | None = None,
    nonfinite: str = "raise",
    case_ids: Sequence | None = None,
    findings: Sequence | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> Counts:
    """Upsample + normalise each map and count, chunk by chunk (see the module docstring).

    ``ties`` (``"first"``/``"any"``) requests pointing hits, ``fixed`` the counts at
    one threshold, ``thresholds`` the counts for a grid. A ``fixed`` τ that is a
    point of ``thresholds`` is read from the grid's counts (``v ≥ τ`` is the same
    test). Runs on one thread (:func:`single_threaded`). Emits one
    :class:`~xbench.core.errors.XBenchWarning` with the number of skipped pairs.
    """
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"nonfinite must be 'raise' or 'skip'; got {nonfinite!r}")
    if ties not in (None, "first", "any"):
        raise ValueError(f"ties must be 'first' or 'any'; got {ties!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1; got {chunk_size}")
    maps = as_maps(maps)
    n = len(maps)
    masks = as_masks(masks, n)
    check_names(n, case_ids, findings)
    valid = np.isfinite(maps).all(axis=(1, 2))
    if nonfinite == "raise" and not valid.all():
        _nonfinite(int(np.flatnonzero(~valid)[0]), "map contains NaN or inf", "raise", case_ids, findings)

    sweep = _Sweep(n, masks, valid, thresholds, fixed, ties, min(chunk_size, n))
    with single_threaded():  # tiny calls: extra threads only spin (see single_threaded)
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            overflow = sweep.chunk(s, maps[s:e])
            if overflow is not None:
                _nonfinite(overflow, "map range max - min overflows float32", nonfinite, case_ids, findings)
    out = sweep.result()
    if out.n_skipped:
        warnings.warn(
            f"{out.n_skipped} of {n} pairs have a non-finite map and were scored NaN (nonfinite='skip')",
            XBenchWarning,
            stacklevel=3,
        )
    return out


class _Sweep:
    """Buffers and per-pair results of :func:`count_pairs`; :meth:`chunk` processes pairs ``s:s+k``."""

    def __init__(self, n: int, masks: np.ndarray, valid: np.ndarray, thresholds, fixed, ties, k: int):
        self.size = masks.shape[1:]
        self.n_pix = self.size[0] * self.size[1]
        self.masks = masks.reshape(n, self.n_pix)
        self.valid, self.ties = valid, ties
        self.up_buf = np.empty((k, *self.size), np.float32)
        self.hit = np.full(n, np.nan) if ties is not None else None
        self.t = as_thresholds(thresholds) if thresholds is not None else None
        self.fixed_at = None  # index of the fixed τ in the grid, when it is a grid point
        if fixed is not None and self.t is not None and np.any(self.t == float(fixed)):
            self.fixed_at = int(np.flatnonzero(self.t == float(fixed))[0])
        self.fixed_c = None
        if fixed is not None and self.fixed_at is None:
            self.fixed_c = float32_ceil(np.array([fixed], dtype=np.float64))[0]
            self.fixed_inter = np.zeros(n, np.int64)
            self.fixed_pred = np.zeros(n, np.int64)
        self.fixed = fixed
        if self.t is not None:
            t = self.t
            self.default_grid = t.shape == _DEFAULT_GRID_VALUES.shape and np.array_equal(t, _DEFAULT_GRID_VALUES)
            self.n_bins = t.size + 1  # k ∈ 0…T
            self.ceil = float32_ceil(t)
            self.hist = np.zeros((n, 2, self.n_bins), np.int64)  # [:, 0] outside G, [:, 1] inside G
            self.key8 = np.empty((k, self.n_pix), np.uint8)
            self.m8 = np.empty((k, self.n_pix), np.uint8)

    def chunk(self, s: int, x: np.ndarray) -> int | None:
        """Count pairs ``s : s + len(x)``; returns the index of a pair whose range overflows, else None."""
        e = s + len(x)
        ok = self.valid[s:e]
        if not ok.all():
            x = x.copy()
            x[~ok] = 0.0
        up = upsample_chunk(x, self.size, out=self.up_buf[: e - s]).reshape(e - s, self.n_pix)
        g = self.masks[s:e]

        lo = up.min(axis=1)
        hi = up.max(axis=1)
        if self.ties == "first":
            first = np.argmax(up, axis=1)
            self.hit[s:e] = g[np.arange(e - s), first]
        elif self.ties == "any":
            self.hit[s:e] = ((up == hi[:, None]) & g).any(axis=1)

        # per-map min–max in float32: v = (x - min) / (max - min); a constant map → 0
        with np.errstate(over="ignore", invalid="ignore"):
            span = hi - lo
        overflow = ok & ~np.isfinite(span)
        first_overflow = None
        if overflow.any():
            first_overflow = s + int(np.flatnonzero(overflow)[0])
            self.valid[s:e] &= ~overflow
            up[overflow] = 0.0
            lo[overflow] = 0.0
            span[overflow] = 0.0
        span[span == 0] = 1.0
        np.subtract(up, lo[:, None], out=up)
        np.divide(up, span[:, None], out=up)

        if self.fixed_c is not None:
            sel = up >= self.fixed_c
            self.fixed_pred[s:e] = np.count_nonzero(sel, axis=1)
            self.fixed_inter[s:e] = np.count_nonzero(sel & g, axis=1)
        if self.t is not None:
            self.hist[s:e] = self._histogram(up, g)
        return first_overflow

    def _histogram(self, up: np.ndarray, g: np.ndarray) -> np.ndarray:
        """``(k, 2, T + 1)`` counts of ``k(v)`` outside / inside the mask per pair."""
        rows, n_bins = len(up), self.n_bins
        if self.default_grid:  # k - 1 = floor(100 v), exact in float64 (module docstring)
            key8, m8 = self.key8[:rows], self.m8[:rows]
            # float64 product, cast to uint8 in the same ufunc loop (truncation = floor for v ≥ 0)
            np.multiply(up, 100.0, dtype=np.float64, out=key8, casting="unsafe")
            np.multiply(g.view(np.uint8), _MASK_BIT, out=m8)
            np.bitwise_or(key8, m8, out=key8)
            keys = torch.from_numpy(key8)
            h = torch.stack([torch.bincount(keys[r], minlength=256) for r in range(rows)]).numpy()
            out = np.zeros((rows, 2, n_bins), np.int64)
            out[:, 0, 1:] = h[:, :101]
            out[:, 1, 1:] = h[:, 128:229]
            return out
        kk = np.searchsorted(self.ceil, up, side="right")
        kk += g * n_bins
        kk += (np.arange(rows) * (2 * n_bins))[:, None]
        return np.bincount(kk.ravel(), minlength=rows * 2 * n_bins).reshape(rows, 2, n_bins)

    def result(self) -> Counts:
        if self.t is not None:
            gt_area = self.hist[:, 1].sum(axis=1)  # |G| from the histograms (saves a pass over the masks)
        else:
            gt_area = np.count_nonzero(self.masks, axis=1).astype(np.int64)
        out = Counts(gt_area=gt_area, valid=self.valid, hit=self.hit)
        if out.hit is not None:
            out.hit[(gt_area == 0) | ~self.valid] = np.nan
        if self.t is not None:
            # |B(t_i) ∩ G| = #{k > i} inside G; |B(t_i)| = #{k > i} anywhere
            suffix = np.cumsum(self.hist[:, :, ::-1], axis=2)[:, :, ::-1]
            out.inter = suffix[:, 1, 1:]
            out.pred = suffix[:, 0, 1:] + out.inter
        if self.fixed_at is not None:
            out.fixed_inter = out.inter[:, self.fixed_at].copy()
            out.fixed_pred = out.pred[:, self.fixed_at].copy()
        elif self.fixed is not None:
            out.fixed_inter, out.fixed_pred = self.fixed_inter, self.fixed_pred
        return out
