"""Maps of models whose input covers only part of the image, placed on the evaluation grid.

Some official transforms crop (CLIP, BiomedCLIP: shorter side + centre crop;
CARZero: longest side to 256, pad, centre crop 224), so their native map covers a
*window* of the original image (:meth:`xbench.models.Adapter.input_window`),
not all of it. Before scoring, such a map is resampled onto the evaluation grid
(which always spans the whole image, like the rasterised ground truth) inside its
window, bilinearly with ``align_corners=False`` semantics and border clamping —
for a whole-image window this equals :func:`xbench.metrics.upsample_maps` —
and grid pixels outside the window take the map's minimum, so after min–max
normalisation they are 0: never the argmax of a non-constant map and outside
``B(τ)`` for every τ > 0.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def is_whole_image(windows: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(N,) bool: window ``(y0, x0, y1, x1)`` equals ``(0, 0, H, W)`` for each case."""
    windows, sizes = np.asarray(windows, np.float64), np.asarray(sizes, np.float64)
    full = np.concatenate([np.zeros_like(sizes), sizes], axis=1)
    return np.all(np.abs(windows - full) < 1e-6, axis=1)


def place_maps(maps: np.ndarray, windows: np.ndarray, sizes: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Native maps ``(N, h, w)`` → ``(N, *grid)`` float32 covering each whole image.

    Parameters
    ----------
    maps : array of shape (N, h, w)
        Native-grid maps.
    windows : array of shape (N, 4)
        ``(y0, x0, y1, x1)`` in original pixels of the region each map covers.
    sizes : array of shape (N, 2)
        ``(H, W)`` of each original image.
    grid : (int, int)
        Evaluation grid ``(gh, gw)`` spanning the whole image.
    """
    maps_t = torch.as_tensor(np.asarray(maps, np.float32))
    n, gh, gw = len(maps_t), int(grid[0]), int(grid[1])
    if n == 0:
        return np.zeros((0, gh, gw), np.float32)
    win = torch.as_tensor(np.asarray(windows, np.float64))
    size = torch.as_tensor(np.asarray(sizes, np.float64))
    rows = (torch.arange(gh, dtype=torch.float64) + 0.5) / gh  # grid pixel centres as fractions of the image
    cols = (torch.arange(gw, dtype=torch.float64) + 0.5) / gw
    y = rows[None, :] * size[:, :1]  # (N, gh) original pixels
    x = cols[None, :] * size[:, 1:]
    ny = 2 * (y - win[:, :1]) / (win[:, 2:3] - win[:, :1]) - 1  # normalised window coordinates in [-1, 1]
    nx = 2 * (x - win[:, 1:2]) / (win[:, 3:4] - win[:, 1:2]) - 1
    sample = torch.stack([nx[:, None, :].expand(n, gh, gw), ny[:, :, None].expand(n, gh, gw)], dim=-1)
    out = F.grid_sample(maps_t[:, None], sample.float(), mode="bilinear", padding_mode="border", align_corners=False)[:, 0]
    inside = (ny.abs() <= 1)[:, :, None] & (nx.abs() <= 1)[:, None, :]
    low = maps_t.flatten(1).min(dim=1).values[:, None, None].expand(n, gh, gw)
    return torch.where(inside, out, low).numpy()
