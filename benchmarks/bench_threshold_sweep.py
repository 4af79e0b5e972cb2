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

Both paths resize with the same separable bilinear product
(:func:`xbench.metrics.upsample_maps`); the time of the fast path's resize step
alone (chunks into one reused buffer) is reported too. Prints the CPU, the thread settings (torch intra-op threads and
BLAS threads as the caller left them; the fast path itself runs on one thread,
see ``xbench.metrics._sweep.single_threaded``), the machine load at start and
end, wall and CPU (process) times, the ratios measured in this run, and the
largest absolute difference between the two results (must be 0: the fast path
is exact), then best-τ Dice/IoU.

Usage::

    python benchmarks/bench_threshold_sweep.py --pairs 20000
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from threadpoolctl import threadpool_info

from xbench.metrics import (
    THRESHOLDS,
    best_threshold,
    dice_iou_curves,
    normalize_maps,
    upsample_maps,
)
from xbench.metrics._sweep import CHUNK_SIZE, single_threaded, upsample_chunk

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


class Clock:
    """Accumulates wall-clock and CPU (process) time of the blocks it wraps."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:  # noqa: PYI034
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c

    def __str__(self) -> str:
        return f"{self.wall:8.2f} s wall {self.cpu:8.2f} s CPU"


def ratio(a: Clock, b: Clock) -> str:
    return f"{a.wall / b.wall:6.1f}x wall {a.cpu / b.cpu:6.1f}x CPU"


def upsample_like_the_fast_path(maps: np.ndarray) -> None:
    """The fast path's resize step alone: chunks of CHUNK_SIZE maps into one reused buffer, one thread."""
    buf = np.empty((CHUNK_SIZE, *GRID), np.float32)
    with single_threaded():
        for s in range(0, len(maps), CHUNK_SIZE):
            upsample_chunk(maps[s : s + CHUNK_SIZE], GRID, out=buf[: len(maps[s : s + CHUNK_SIZE])])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def thread_settings() -> str:
    """torch intra-op / inter-op threads, each BLAS / OpenMP library's threads, and the *_NUM_THREADS variables."""
    libs = ", ".join(f"{i['internal_api']} {i['num_threads']}" + (f" ({i['architecture']})" if i.get("architecture") else "")
                     for i in threadpool_info())
    env = {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
    return (f"torch intra-op {torch.get_num_threads()}, inter-op {torch.get_num_interop_threads()}; {libs}; "
            f"env {env or 'none'}; the fast path runs single-threaded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000, help="number of (map, mask) pairs (default 20000)")
    parser.add_argument("--block", type=int, default=1024, help="pairs generated and timed at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads to set before timing (default: leave torch's default)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    load_start = os.getloadavg()

    fast, fast_sweep, prep, loop, resize = Clock(), Clock(), Clock(), Clock(), Clock()
    diff = 0.0
    dice_fast, iou_fast = [], []
    for start in range(0, args.pairs, args.block):
        maps, masks = make_block(rng, min(args.block, args.pairs - start))

        with fast:
            d_fast, j_fast = dice_iou_curves(maps, masks)
        with resize:
            upsample_like_the_fast_path(maps)

        d_brute, j_brute = np.empty_like(d_fast), np.empty_like(j_fast)
        norms = []
        for s in range(0, len(maps), BRUTE_CHUNK):
            with prep:
                norm = normalize_maps(upsample_maps(maps[s : s + BRUTE_CHUNK], GRID))
            with loop:
                d_brute[s : s + BRUTE_CHUNK], j_brute[s : s + BRUTE_CHUNK] = brute_sweep(norm, masks[s : s + BRUTE_CHUNK])
            norms.append(norm)
        norm = np.concatenate(norms)

        with fast_sweep:
            d_sweep, j_sweep = dice_iou_curves(norm, masks)

        for a, b in ((d_fast, d_brute), (j_fast, j_brute), (d_sweep, d_brute), (j_sweep, j_brute)):
            diff = max(diff, max_abs_diff(a, b))
        dice_fast.append(d_fast)
        iou_fast.append(j_fast)

    brute = Clock()
    brute.wall, brute.cpu = prep.wall + loop.wall, prep.cpu + loop.cpu
    best = best_threshold(np.concatenate(dice_fast), np.concatenate(iou_fast))
    load_end = os.getloadavg()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); torch {torch.__version__}, numpy {np.__version__}")
    print(f"threads: {thread_settings()}")
    print(f"load average (1/5/15 min) at start {load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f}, "
          f"at end {load_end[0]:.2f}/{load_end[1]:.2f}/{load_end[2]:.2f}")
    print(f"pairs: {args.pairs}, maps {NATIVE[0]}x{NATIVE[1]} -> grid {GRID[0]}x{GRID[1]}, "
          f"{THRESHOLDS.size} thresholds")
    print(f"brute: upsample+normalise once      {prep}")
    print(f"brute: 101 passes of v >= t         {loop}")
    print(f"brute: total                        {brute}")
    print(f"fast:  dice_iou_curves(native maps) {fast}")
    print(f"fast:  dice_iou_curves(normalised)  {fast_sweep}")
    print(f"       of which upsampling          {resize}  (share of the fast path: "
          f"{resize.cpu / fast.cpu:.0%} of its CPU)")
    print(f"ratio end-to-end (brute total / fast native):     {ratio(brute, fast)}")
    print(f"ratio sweep only (101 passes / fast normalised):  {ratio(loop, fast_sweep)}")
    print(f"max |fast - brute| over Dice and IoU: {diff}")
    print(f"best tau {best.tau:.2f}: mean Dice {best.dice:.4f}, mean IoU {best.iou:.4f} over {best.n} pairs")


if __name__ == "__main__":
    main()
