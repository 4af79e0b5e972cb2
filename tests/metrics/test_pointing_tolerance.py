"""Pointing game with a tolerance margin: equals a brute-force distance check on random cases; m = 0 is today's rule."""
from __future__ import annotations

import numpy as np
import pytest

from xbench.metrics import pointing_game, pointing_game_tolerance, pointing_metric_name, upsample_maps


def brute_force(maps: np.ndarray, masks: np.ndarray, margin: int, ties: str) -> np.ndarray:
    """Per pair: points = first argmax (or every tied maximum) of the upsampled map; hit if some point has a
    region pixel whose centre lies at Euclidean distance ≤ margin."""
    up = upsample_maps(maps, masks.shape[1:])
    out = np.full(len(maps), np.nan)
    for i in range(len(maps)):
        region = np.argwhere(masks[i])
        if len(region) == 0:
            continue
        if ties == "first":
            points = [np.unravel_index(np.argmax(up[i]), up[i].shape)]
        else:
            points = np.argwhere(up[i] == up[i].max())
        out[i] = float(any(np.sqrt(((region - np.asarray(p)) ** 2).sum(axis=1)).min() <= margin for p in points))
    return out


def random_cases(seed: int, n: int = 40, native: int = 7, grid: tuple[int, int] = (28, 33)):
    rng = np.random.default_rng(seed)
    maps = rng.random((n, native, native)).astype(np.float32)
    maps[::5] = np.round(maps[::5] * 3) / 3  # coarse values: ties of the maximum
    maps[min(3, n - 1)] = 0.5  # a constant map: every pixel tied
    masks = np.zeros((n, *grid), bool)
    for i in range(n):
        if i % 7 == 6:
            continue  # empty ground truth
        for _ in range(rng.integers(1, 3)):
            y, x = rng.integers(0, grid[0]), rng.integers(0, grid[1])
            h, w = rng.integers(1, 6, size=2)
            masks[i, y:y + h, x:x + w] = True
    return maps, masks


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", ["first", "any"])
@pytest.mark.parametrize("margin", [0, 1, 2, 5, 15, 40])
def test_equals_brute_force(seed, ties, margin):
    maps, masks = random_cases(seed)
    got = pointing_game_tolerance(maps, masks, margin, ties=ties)
    want = brute_force(maps, masks, margin, ties)
    np.testing.assert_array_equal(got, want)


def test_margin_zero_is_the_pointing_game_exactly():
    maps, masks = random_cases(7, n=60)
    for ties in ("first", "any"):
        np.testing.assert_array_equal(pointing_game_tolerance(maps, masks, 0, ties=ties), pointing_game(maps, masks, ties=ties))


def test_hits_grow_with_the_margin_and_empty_masks_stay_nan():
    maps, masks = random_cases(3, n=60)
    previous = None
    for m in range(0, 30, 3):
        hits = pointing_game_tolerance(maps, masks, m)
        assert np.isnan(hits[~masks.any(axis=(1, 2))]).all()
        if previous is not None:
            assert (np.nan_to_num(hits) >= np.nan_to_num(previous)).all()
        previous = hits
    assert np.nansum(previous) > np.nansum(pointing_game_tolerance(maps, masks, 0))


def test_bad_margin_and_name():
    maps, masks = random_cases(0, n=2)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="margin"):
            pointing_game_tolerance(maps, masks, bad)
    assert pointing_metric_name(0) == "pointing" and pointing_metric_name(15) == "pointing@15px"
