"""Benchmark: Dice/IoU over the 101-threshold grid, fast one-pass sweep vs a brute-force loop.

Seeded random 14×14 maps and 224×224 masks (random boxes and ellipses, some
empty, some constant maps). Pairs are processed in blocks so memory stays far
below 3 GB. For every block, in the same run:

* **fast** — ``xbench.metrics.dice_iou_curves(native_maps, masks)`` (upsample,
  normalise and sweep, chunk by chunk);
* **brute** — ``upsample_maps`` + ``normalize_maps`` once, then 101 passes of
  ``v >= t`` with Dice / IoU from the counts, 256 maps at a time;
* **fast (sweep only)** — ``dice_iou_curves`` on the already normalised
  224×224 maps (no resize; normalising a normalised map is the identity),
  against the brute-force 101 passes alone.

Prints the times, the ratios and the largest absolute difference between the
two results (must be 0: the fast path is exact), then best-τ Dice/IoU.

Usage::

    python benchmarks/bench_threshold_sweep.py --pairs 20000
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from xbench.metrics import THRESHOLDS, best_threshold, dice_iou_curves, normalize_maps, upsample_maps

GRID = (224, 224)
NATIVE = (14, 14)
BRUTE_CHUNK = 256


def make_block(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random maps (14×14, float32) and masks (224×224 bool): boxes, ellipses, ~3 % empty."""
    maps = rng.random((n, *NATIVE), dtype=np.float32)
    maps[rng.random(n) < 0.02] = 0.5  # a few constant maps
    yy, xx = np.mgrid[: GRID[0], : GRID[1]]
    masks = np.zeros((n, *GRID), bool)
    kind = rng.random(n)
    for i in range(n):
        if kind[i] < 0.03:
            continue  # empty ground truth
        cy, cx = rng.integers(0, GRID[0]), rng.integers(0, GRID[1])
        hy, hx = rng.integers(4, 60), rng.integers(4, 60)
        if kind[i] < 0.5:
            masks[i, max(cy - hy, 0) : cy + hy, max(cx - hx, 0) : cx + hx] = True
        else:
            masks[i] = ((yy - cy) / hy) ** 2 + ((xx - cx) / hx) ** 2 <= 1.0
    return maps, masks


def brute_sweep(norm: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference: for each τ, ``B = v >= τ``; Dice and IoU from counts (NaN for empty masks)."""
    n = len(norm)
    v = norm.reshape(n, -1)
    g = masks.reshape(n, -1)
    gt = np.count_nonzero(g, axis=1).astype(np.float64)
    inter = np.empty((n, THRESHOLDS.size))
    pred = np.empty((n, THRESHOLDS.size))
    for i, t in enumerate(THRESHOLDS):
        b = v >= t
        pred[:, i] = np.count_nonzero(b, axis=1)
        inter[:, i] = np.count_nonzero(b & g, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = 2.0 * inter / (pred + gt[:, None])
        j = inter / (pred + gt[:, None] - inter)
    d[gt == 0] = np.nan
    j[gt == 0] = np.nan
    return d, j


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf")
    ok = ~np.isnan(a)
    return float(np.abs(a[ok] - b[ok]).max(initial=0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000, help="number of (map, mask) pairs (default 20000)")
    parser.add_argument("--block", type=int, default=1024, help="pairs generated and timed at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)

    t_fast = t_fast_sweep = t_prep = t_loop = 0.0
    diff = 0.0
    dice_fast, iou_fast = [], []
    for start in range(0, args.pairs, args.block):
        maps, masks = make_block(rng, min(args.block, args.pairs - start))

        t0 = time.perf_counter()
        d_fast, j_fast = dice_iou_curves(maps, masks)
        t_fast += time.perf_counter() - t0

        d_brute, j_brute = np.empty_like(d_fast), np.empty_like(j_fast)
        norms = []
        for s in range(0, len(maps), BRUTE_CHUNK):
            t0 = time.perf_counter()
            norm = normalize_maps(upsample_maps(maps[s : s + BRUTE_CHUNK], GRID))
            t1 = time.perf_counter()
            d_brute[s : s + BRUTE_CHUNK], j_brute[s : s + BRUTE_CHUNK] = brute_sweep(norm, masks[s : s + BRUTE_CHUNK])
            t2 = time.perf_counter()
            t_prep += t1 - t0
            t_loop += t2 - t1
            norms.append(norm)
        norm = np.concatenate(norms)

        t0 = time.perf_counter()
        d_sweep, j_sweep = dice_iou_curves(norm, masks)
        t_fast_sweep += time.perf_counter() - t0

        diff = max(diff, max_abs_diff(d_fast, d_brute), max_abs_diff(j_fast, j_brute))
        diff = max(diff, max_abs_diff(d_sweep, d_brute), max_abs_diff(j_sweep, j_brute))
        dice_fast.append(d_fast)
        iou_fast.append(j_fast)

    best = best_threshold(np.concatenate(dice_fast), np.concatenate(iou_fast))
    t_brute = t_prep + t_loop
    print(f"pairs: {args.pairs}, maps {NATIVE[0]}x{NATIVE[1]} -> grid {GRID[0]}x{GRID[1]}, {THRESHOLDS.size} thresholds")
    print(f"brute force  (upsample+normalise {t_prep:.2f} s + 101 passes {t_loop:.2f} s): {t_brute:.2f} s")
    print(f"fast path    (upsample+normalise+sweep, from native maps):      {t_fast:.2f} s")
    print(f"ratio end-to-end:                                              {t_brute / t_fast:.1f}x")
    print(f"fast sweep on normalised 224x224 maps:                         {t_fast_sweep:.2f} s")
    print(f"ratio sweep only (101 passes / fast sweep):                    {t_loop / t_fast_sweep:.1f}x")
    print(f"max |fast - brute| over Dice and IoU:                          {diff}")
    print(f"best tau {best.tau:.2f}: mean Dice {best.dice:.4f}, mean IoU {best.iou:.4f} over {best.n} pairs")


if __name__ == "__main__":
    main()
