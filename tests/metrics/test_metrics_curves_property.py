"""Property tests: the one-pass Dice/IoU curves equal the brute-force threshold loop, bit for bit."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from xbench.metrics import THRESHOLDS, dice_iou_curves, grounding_scores, normalize_maps, upsample_maps

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _dice_iou_curves_bruteforce(maps, masks, thresholds):
    """Reference: upsample + normalise once, then ``v >= t`` for each float64 threshold."""
    masks = np.asarray(masks, bool)
    v = normalize_maps(upsample_maps(maps, size=masks.shape[1:]))
    gt = masks.sum(axis=(1, 2)).astype(np.float64)
    d = np.empty((len(v), len(thresholds)))
    j = np.empty_like(d)
    for i, t in enumerate(np.asarray(thresholds, np.float64)):
        b = v >= t
        inter = (b & masks).sum(axis=(1, 2)).astype(np.float64)
        pred = b.sum(axis=(1, 2)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            d[:, i] = 2.0 * inter / (pred + gt)
            j[:, i] = inter / (pred + gt - inter)
    d[gt == 0] = np.nan
    j[gt == 0] = np.nan
    return d, j


def _assert_same(fast, brute):
    for a, b in zip(fast, brute):
        assert a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=True), np.nanmax(np.abs(a - b))


@st.composite
def grid_valued_pairs(draw):
    """Maps at the mask grid whose values are grid points (0 and 1 included → normalisation is exact)."""
    n = draw(st.integers(1, 5))
    h, w = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    idx = draw(hnp.arrays(np.int64, (n, h, w), elements=st.integers(0, 100)))
    maps = THRESHOLDS[idx].astype(np.float32)
    maps[:, 0, 0], maps[:, -1, -1] = 0.0, 1.0
    masks = draw(hnp.arrays(np.bool_, (n, h, w)))
    if draw(st.booleans()):
        masks[0] = False  # an empty ground truth
    return maps, masks


@st.composite
def native_pairs(draw):
    """Small native maps (random floats, some constant) upsampled to a different grid."""
    n = draw(st.integers(1, 5))
    h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    big = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    elements = st.floats(-5, 5, width=32, allow_nan=False) | st.sampled_from([0.0, 0.5, 0.29, 1.0])
    maps = draw(hnp.arrays(np.float32, (n, h, w), elements=elements))
    masks = draw(hnp.arrays(np.bool_, (n, *big)))
    return maps, masks


thresholds_st = st.one_of(
    st.just(THRESHOLDS),
    st.lists(st.sampled_from(list(THRESHOLDS)), min_size=1, max_size=12, unique=True).map(sorted).map(np.array),
    st.lists(st.floats(-0.5, 1.5, width=32), min_size=1, max_size=8, unique=True).map(sorted).map(np.array),
)


@SETTINGS
@given(pair=grid_valued_pairs(), thresholds=thresholds_st)
def test_curves_equal_bruteforce_on_grid_valued_maps(pair, thresholds):
    maps, masks = pair
    _assert_same(dice_iou_curves(maps, masks, thresholds), _dice_iou_curves_bruteforce(maps, masks, thresholds))


@SETTINGS
@given(pair=native_pairs(), thresholds=thresholds_st, chunk=st.integers(1, 4))
def test_curves_equal_bruteforce_after_upsampling(pair, thresholds, chunk):
    maps, masks = pair
    fast = dice_iou_curves(maps, masks, thresholds, chunk_size=chunk)
    _assert_same(fast, _dice_iou_curves_bruteforce(maps, masks, thresholds))
    scores = grounding_scores(maps, masks, thresholds=thresholds, chunk_size=chunk)
    _assert_same((scores.dice_curves, scores.iou_curves), fast)


def test_bins_are_exact_within_64_ulps_of_every_grid_point():
    # all float32 within 64 ulps of each threshold, on a map with 0 and 1 so v == value
    near = [THRESHOLDS.astype(np.float32)]
    up = down = THRESHOLDS.astype(np.float32)
    for _ in range(64):
        up = np.nextafter(up, np.float32(2))
        down = np.nextafter(down, np.float32(-1))
        near += [up, down]
    vals = np.unique(np.clip(np.concatenate(near), 0, 1))
    maps = np.concatenate([[0.0, 1.0], vals]).astype(np.float32)[None, None, :]
    masks = (np.arange(maps.size) % 3 == 0)[None, None, :]
    _assert_same(dice_iou_curves(maps, masks), _dice_iou_curves_bruteforce(maps, masks, THRESHOLDS))
