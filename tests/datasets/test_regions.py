"""Rasterisation conventions (box centre rule, area resampling at γ = 0.5) and mask decoders."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from conftest import shared_path
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools import mask as mask_utils

from xbench.datasets.base import Box, EncodedMask, Polygon
from xbench.datasets.regions import (
    _resample_axis,
    area_resample,
    decode_coco_rle,
    decode_siim_rle,
    polygon_mask,
    rasterize,
    validate_box,
)


def encoded(mask: np.ndarray) -> EncodedMask:
    return EncodedMask(lambda: mask, "test mask")


def bounds(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.nonzero(mask)
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())


def test_box_at_original_size_is_half_open():
    mask = rasterize([Box(10, 20, 30, 40)], (100, 100))
    assert bounds(mask) == (20, 39, 10, 29) and mask.sum() == 400


def test_box_centre_rule_on_a_coarser_grid():
    # grid 50x50 of a 100x100 image: centre of cell c is 2c + 1; inside iff 10 <= 2c+1 < 30 → c = 5..14
    mask = rasterize([Box(10, 20, 30, 40)], (100, 100), (50, 50))
    assert bounds(mask) == (10, 19, 5, 14)
    # a box edge through a centre: x_min = 11 → centre 11 (c=5) is inside; x_max = 11 → it is outside
    assert rasterize([Box(11, 0, 13, 100)], (100, 100), (50, 50))[0].nonzero()[0].tolist() == [5]
    assert rasterize([Box(9, 0, 11, 100)], (100, 100), (50, 50))[0].nonzero()[0].tolist() == [4]


def test_box_smaller_than_a_cell_can_vanish():
    assert not rasterize([Box(0.1, 0.1, 0.9, 0.9)], (10, 10), (5, 5)).any()  # centre of cell 0 is at (1, 1)


def test_area_resampling_fractions_and_gamma():
    fine = np.zeros((4, 4), dtype=bool)
    fine[:2, :2] = True
    np.testing.assert_allclose(area_resample(fine, (3, 3)), [[1, 0.5, 0], [0.5, 0.25, 0], [0, 0, 0]])
    # γ = 0.5 keeps the half-covered cells, drops the quarter-covered one
    assert rasterize([encoded(fine)], (4, 4), (3, 3)).tolist() == [[True, True, False], [True, False, False], [False] * 3]
    assert rasterize([encoded(fine)], (4, 4), (2, 2)).tolist() == [[True, False], [False, False]]
    # upsampling 2x: each fine pixel becomes a 2x2 block
    assert rasterize([encoded(fine)], (4, 4), (8, 8)).sum() == 16


def test_masks_are_united_before_resampling():
    left, right = np.zeros((2, 2), dtype=bool), np.zeros((2, 2), dtype=bool)
    left[:, 0], right[:, 1] = True, True  # each covers half of the single target pixel
    assert rasterize([encoded(left)], (2, 2), (1, 1)).tolist() == [[True]]  # 0.5 ≥ γ
    top = np.zeros((2, 2), dtype=bool)
    top[0, 0] = True
    assert rasterize([encoded(top)], (2, 2), (1, 1)).tolist() == [[False]]  # 0.25
    assert rasterize([encoded(top), encoded(right)], (2, 2), (1, 1)).tolist() == [[True]]  # union covers 0.75


def test_polygon_includes_outline_like_cheXlocalize():
    mask = polygon_mask([[1, 1], [5, 1], [5, 5]], (8, 8))
    expected = np.zeros((8, 8), dtype=bool)
    for row in range(1, 6):  # right triangle, outline included: row r covers columns r..5
        expected[row, row:6] = True
    assert (mask == expected).all()
    assert polygon_mask([], (3, 3)).sum() == 0
    assert polygon_mask([[1, 1]], (3, 3)).sum() == 1


def test_union_of_box_and_polygon_and_empty():
    mask = rasterize([Box(0, 0, 2, 2), Polygon(np.array([[6, 6], [7, 6], [7, 7], [6, 7]]))], (8, 8))
    assert mask.sum() == 4 + 4 and mask[0, 0] and mask[7, 7]
    assert rasterize([], (8, 8), (4, 4)).shape == (4, 4) and not rasterize([], (8, 8), (4, 4)).any()


def test_rasterize_rejects_wrong_mask_shape_and_types():
    with pytest.raises(ValueError, match=r"shape \(3, 3\), expected image size \(4, 4\)"):
        rasterize([encoded(np.zeros((3, 3), dtype=bool))], (4, 4))
    with pytest.raises(ValueError, match="unknown region type"):
        rasterize(["box"], (4, 4))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="grid"):
        rasterize([], (4, 4), (0, 4))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.integers(1, 30), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_area_resampling_preserves_covered_area(h, w, gh, gw, seed):
    fine = np.random.default_rng(seed).random((h, w)) < 0.4
    frac = area_resample(fine, (gh, gw))
    assert frac.min() >= 0 and frac.max() <= 1
    assert frac.mean() == pytest.approx(fine.mean(), abs=1e-9)


def _whole_image_resample(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """The area resampling integrated over the whole image (no bounding box): the reference of the fast path."""
    return np.clip(_resample_axis(_resample_axis(np.asarray(mask, np.float64), grid[0], 0), grid[1], 1), 0.0, 1.0)


def test_bounding_box_resampling_is_bit_identical_to_the_whole_image():
    """Only the mask's bounding box is integrated; the result is the whole image's, bit for bit: 400 random
    masks (blobs, polygons, touching edges / corners, single pixels, fractional values, empty), 1–3,000 px,
    down- and up-scaled, square and not."""
    rng = np.random.default_rng(22)
    for i in range(400):
        h, w = (int(v) for v in rng.integers(1, 3000 if i % 50 == 0 else 400, size=2))
        gh, gw = (int(v) for v in rng.integers(1, 300, size=2))
        mask = np.zeros((h, w), bool)
        kind = i % 5
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        y1, x1 = int(rng.integers(y0, h)) + 1, int(rng.integers(x0, w)) + 1
        if kind == 0:  # random blob inside a random box
            mask[y0:y1, x0:x1] = rng.random((y1 - y0, x1 - x0)) < 0.6
        elif kind == 1:  # a polygon, possibly clipped by the image edges
            pts = np.c_[rng.uniform(-0.2 * w, 1.2 * w, 8), rng.uniform(-0.2 * h, 1.2 * h, 8)]
            mask = polygon_mask(pts, (h, w))
        elif kind == 2:  # touching two edges
            mask[y0:, :x1] = True
        elif kind == 3:  # one pixel
            mask[y0, x0] = True
        grid = (gh, gw)
        fast, whole = area_resample(mask, grid), _whole_image_resample(mask, grid)
        assert fast.dtype == whole.dtype == np.float64 and fast.shape == whole.shape == grid
        assert np.array_equal(fast.view(np.uint64), whole.view(np.uint64)), (i, kind, (h, w), grid)
        values = mask * rng.random((h, w))  # fractional coverage
        assert np.array_equal(area_resample(values, grid).view(np.uint64),
                              _whole_image_resample(values, grid).view(np.uint64)), (i, "float")


def test_rasterize_on_bounding_boxes_equals_the_whole_image_union():
    """rasterize cuts every polygon / mask to the box of its pixels before the union and the resampling: the
    masks equal, bit for bit, the union at full size resampled over the whole image (the definition), for 300
    random mixes of polygons (partly outside the image, degenerate, empty), encoded masks and boxes."""
    from xbench.datasets.regions import GAMMA

    rng = np.random.default_rng(7)
    for i in range(300):
        h, w = (int(v) for v in rng.integers(8, 1200 if i % 30 == 0 else 300, size=2))
        grid = (h, w) if i % 10 == 0 else tuple(int(v) for v in rng.integers(1, 120, size=2))
        regions, fine, boxes = [], np.zeros((h, w), bool), np.zeros(grid, bool)
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(0, 4))
            if kind == 0:
                n = int(rng.integers(0, 7))  # 0: empty, 1: a point, 2: a line
                pts = np.c_[rng.uniform(-0.3 * w, 1.3 * w, n), rng.uniform(-0.3 * h, 1.3 * h, n)]
                regions.append(Polygon(pts))
                fine |= polygon_mask(pts, (h, w))
            elif kind == 1:
                m = np.zeros((h, w), bool)
                y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
                m[y0:y0 + int(rng.integers(1, h)), x0:x0 + int(rng.integers(1, w))] = rng.random() < 0.9
                regions.append(encoded(m))
                fine |= m
            else:
                x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
                box = Box(x0, y0, x0 + rng.uniform(0, w), y0 + rng.uniform(0, h))
                regions.append(box)
                boxes |= rasterize([box], (h, w), grid)
        whole = fine if grid == (h, w) else _whole_image_resample(fine, grid) >= GAMMA - 1e-9
        assert np.array_equal(rasterize(regions, (h, w), grid), whole | boxes), (i, (h, w), grid)


@settings(max_examples=40, deadline=None)
@given(st.floats(0, 60), st.floats(0, 60), st.floats(1, 40), st.floats(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_box_rule_matches_brute_force(x, y, bw, bh, gh, gw):
    box, size = Box(x, y, x + bw, y + bh), (64, 64)
    mask = rasterize([box], size, (gh, gw))
    for r in range(gh):
        for c in range(gw):
            cx, cy = (c + 0.5) * 64 / gw, (r + 0.5) * 64 / gh
            assert mask[r, c] == (x <= cx < x + bw and y <= cy < y + bh)


def test_validate_box():
    validate_box(Box(-1, -0.5, 1025, 1024), (1024, 1024))  # within the 1 px tolerance
    with pytest.raises(ValueError, match="outside the 1024x1024"):
        validate_box(Box(10, 10, 1026, 20), (1024, 1024))
    with pytest.raises(ValueError, match="outside"):
        validate_box(Box(-2, 10, 20, 20), (1024, 1024))
    with pytest.raises(ValueError, match="empty or inverted"):
        validate_box(Box(30, 10, 20, 20), (1024, 1024))
    with pytest.raises(ValueError, match="non-finite"):
        validate_box(Box(float("nan"), 10, 20, 20), (1024, 1024))


def test_siim_rle_by_hand():
    # 3 rows x 2 cols, column-major: run 1 = flat 1..2 → (1,0),(2,0); run 2 starts 1 after → flat 4 → (1,1)
    assert decode_siim_rle("1 2 1 1", height=3, width=2).astype(int).tolist() == [[0, 0], [1, 1], [1, 0]]
    assert not decode_siim_rle(" -1 ", 3, 2).any()
    assert decode_siim_rle("0 6", 3, 2).all()


@pytest.mark.parametrize("bad, message", [
    ("1 2 3", "odd number"),
    ("1 x", "non-integer"),
    ("5 2", "past the end"),
    ("-1 2", "negative offset"),
    ("1 0", "non-positive run length"),
    ("", "non-empty string"),
])
def test_siim_rle_malformed(bad, message):
    with pytest.raises(ValueError, match=message):
        decode_siim_rle(bad, 3, 2)


def test_siim_first_positive_real_row_and_kaggle_reference():
    path = shared_path("annotations", "siim_acr_pneumothorax", "siim-pneumothorax-train-rle.csv")
    with open(path, newline="") as handle:
        rows = [r for r in csv.reader(handle)][1:]
    positives = [r[1] for r in rows if r[1].strip() != "-1"]
    mask = decode_siim_rle(positives[0])
    assert bounds(mask) == (125, 390, 544, 795)  # y 125–390, x 544–795 (issue)
    assert mask.sum() == 30859
    for rle in positives[:5]:  # Kaggle mask_functions.rle2mask, written as a plain loop
        flat = np.zeros(1024 * 1024, dtype=bool)
        values, pos = [int(v) for v in rle.split()], 0
        for start, length in zip(values[0::2], values[1::2]):
            pos += start
            flat[pos:pos + length] = True
            pos += length
        assert (decode_siim_rle(rle) == flat.reshape(1024, 1024).T).all()


def test_coco_rle_round_trip_and_errors():
    mask = np.zeros((5, 7), dtype=np.uint8)
    mask[1:4, 2:6] = 1
    rle = mask_utils.encode(np.asfortranarray(mask))
    obj = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}  # as cheXlocalize stores it
    assert (decode_coco_rle(obj) == mask.astype(bool)).all()
    # uncompressed counts (column-major runs starting with zeros): 1 zero, 2 ones, 1 zero
    assert decode_coco_rle({"size": [2, 2], "counts": [1, 2, 1]}).tolist() == [[False, True], [True, False]]
    with pytest.raises(ValueError, match="'size' and 'counts'"):
        decode_coco_rle({"counts": "abc"})
    with pytest.raises(ValueError, match="size"):
        decode_coco_rle({"size": [0, 3], "counts": "abc"})
