"""Hand-computed cases for every convention of xbench.metrics.grounding."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from xbench.core.errors import XBenchWarning
from xbench.metrics import (
    DEFAULT_GRID,
    THRESHOLDS,
    best_threshold,
    dice,
    dice_iou_curves,
    grounding_scores,
    iou,
    normalize_maps,
    oracle_threshold,
    pointing_game,
    upsample_maps,
)
from xbench.metrics._sweep import bilinear_weights, float32_ceil, upsample_chunk


def m(*rows) -> np.ndarray:
    """One (1, H, W) float32 map from rows."""
    return np.array([rows], dtype=np.float32)


def g(*rows) -> np.ndarray:
    """One (1, H, W) bool mask from rows of 0/1."""
    return np.array([rows], dtype=bool)


# -- constants -------------------------------------------------------------------------


def test_threshold_grid_has_101_values_from_0_to_1():
    assert THRESHOLDS.shape == (101,)
    assert THRESHOLDS[0] == 0.0 and THRESHOLDS[-1] == 1.0
    assert THRESHOLDS[29] == 0.29 and THRESHOLDS[50] == 0.5
    assert np.arange(0, 1, 0.01).size == 100  # why the grid is not built with arange
    assert DEFAULT_GRID == (224, 224)
    with pytest.raises(ValueError):
        THRESHOLDS[0] = 1.0  # read-only


# -- upsampling ------------------------------------------------------------------------


def test_upsample_2x2_to_4x4_matches_bilinear_half_pixel_rule_by_hand():
    out = upsample_maps(m([1.0, 2.0], [3.0, 4.0]), size=(4, 4))[0]
    # output pixel (1, 2): source y = (1 + 0.5) / 2 - 0.5 = 0.25, x = (2 + 0.5) / 2 - 0.5 = 0.75
    # top row: 1·0.25 + 2·0.75 = 1.75; bottom: 3·0.25 + 4·0.75 = 3.75; then 0.75·1.75 + 0.25·3.75 = 2.25
    assert out[1, 2] == 2.25
    # pixel (0, 0): source (-0.25, -0.25) is clamped to the corner → 1
    assert out[0, 0] == 1.0 and out[3, 3] == 4.0
    ref = torch.nn.functional.interpolate(
        torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]), size=(4, 4), mode="bilinear", align_corners=False
    )[0, 0].numpy()
    np.testing.assert_array_equal(out, ref)


def test_upsample_accepts_torch_keeps_constant_maps_and_same_size_is_identity():
    rng = np.random.default_rng(0)
    x = rng.random((3, 5, 7)).astype(np.float32)
    np.testing.assert_array_equal(upsample_maps(torch.from_numpy(x), size=(5, 7)), x)
    const = np.full((2, 14, 14), 0.1, np.float32)
    up = upsample_maps(const, size=(224, 224))
    assert up.shape == (2, 224, 224) and (up == np.float32(0.1)).all()
    with pytest.raises(ValueError, match=r"\(N, h, w\)"):
        upsample_maps(x[0])


def test_bilinear_weights_by_hand():
    # 2 → 4: source positions max((o + 0.5) / 2 - 0.5, 0) = 0, 0.25, 0.75, 1.25 (the last clamps to pixel 1)
    np.testing.assert_array_equal(
        bilinear_weights(2, 4), [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]
    )
    w = bilinear_weights(14, 224)
    assert w.shape == (224, 14) and w.dtype == np.float32 and not w.flags.writeable
    assert ((w != 0).sum(axis=1) <= 2).all() and (w >= 0).all()
    assert (w.astype(np.float64).sum(axis=1) == 1.0).all()  # power-of-two ratio: exact
    w = bilinear_weights(13, 224)
    np.testing.assert_allclose(w.astype(np.float64).sum(axis=1), 1.0, rtol=0, atol=2**-23)
    # downsampling 5 → 2: positions 0.75 and 3.25
    np.testing.assert_allclose(bilinear_weights(5, 2), [[0.25, 0.75, 0, 0, 0], [0, 0, 0, 0.75, 0.25]])


@pytest.mark.parametrize(
    "native, size",
    [((14, 14), (224, 224)), ((13, 13), (224, 224)), ((16, 16), (224, 224)), ((7, 9), (224, 300)),
     ((37, 19), (224, 500)), ((14, 14), (100, 77)), ((30, 20), (7, 5)), ((1, 4), (3, 9)), ((14, 14), (14, 224))],
)
def test_upsample_matches_torch_interpolate_on_random_maps(native, size):
    rng = np.random.default_rng(sum(native) + sum(size))
    x = rng.random((8, *native), dtype=np.float32)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(x)[:, None], size=size, mode="bilinear", align_corners=False
    )[:, 0].numpy()
    out = upsample_maps(x, size=size)
    assert out.shape == (8, *size) and out.dtype == np.float32
    assert np.abs(out - ref).max() <= 1e-6


def test_upsample_of_a_map_does_not_depend_on_its_chunk():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(11, 14, 14)).astype(np.float32)
    whole = upsample_maps(x, size=(224, 224))
    one_by_one = np.concatenate([upsample_chunk(x[i : i + 1], (224, 224)) for i in range(11)])
    by_three = np.concatenate([upsample_chunk(x[i : i + 3], (224, 224)) for i in range(0, 11, 3)])
    np.testing.assert_array_equal(one_by_one, whole)
    np.testing.assert_array_equal(by_three, whole)


def test_upsample_constant_maps_stay_exact_and_nonfinite_maps_become_nan():
    x = np.full((3, 13, 13), 0.1, np.float32)  # 13 → 224: float32 weights need not sum to 1
    x[1] = 7.3
    x[2, 4, 5] = np.inf
    up = upsample_maps(x, size=(224, 224))
    assert (up[0] == np.float32(0.1)).all() and (up[1] == np.float32(7.3)).all()
    assert np.isnan(up[2]).all()
    assert (normalize_maps(up[:2]) == 0).all()


# -- normalisation ---------------------------------------------------------------------


def test_normalize_min_max_and_constant_map_becomes_zeros():
    out = normalize_maps(np.stack([m([-1.0, 1.0], [0.0, 3.0])[0], m([2.0, 2.0], [2.0, 2.0])[0]]))
    np.testing.assert_array_equal(out[0], [[0.0, 0.5], [0.25, 1.0]])
    np.testing.assert_array_equal(out[1], np.zeros((2, 2)))
    assert out.dtype == np.float32


def test_normalize_nonfinite_raises_with_case_name_or_skips_with_count():
    maps = np.stack([m([0.0, 1.0])[0], m([np.nan, 1.0])[0], m([np.inf, 0.0])[0]])
    with pytest.raises(ValueError, match=r"pair 1 \(case 'b'\)"):
        normalize_maps(maps, case_ids=["a", "b", "c"])
    with pytest.warns(XBenchWarning, match="2 of 3 maps"):
        out = normalize_maps(maps, nonfinite="skip")
    assert np.isnan(out[1:]).all() and (out[0] == [[0.0, 1.0]]).all()


# -- pointing game ---------------------------------------------------------------------


def test_pointing_ties_first_row_major_vs_any():
    maps = m([0.0, 1.0], [1.0, 0.0])  # maxima at (0, 1) and (1, 0); first in row-major order is (0, 1)
    in_second = g([0, 0], [1, 0])
    in_first = g([0, 1], [0, 0])
    assert pointing_game(maps, in_second)[0] == 0.0
    assert pointing_game(maps, in_second, ties="any")[0] == 1.0
    assert pointing_game(maps, in_first)[0] == 1.0


def test_pointing_empty_mask_is_nan_never_a_hit():
    maps = np.stack([m([0.0, 1.0])[0]] * 2)
    masks = np.array([[[False, False]], [[False, True]]])
    for ties in ("first", "any"):
        out = pointing_game(maps, masks, ties=ties)
        assert np.isnan(out[0]) and out[1] == 1.0


def test_pointing_constant_map_first_points_at_origin_any_hits_nonempty_mask():
    maps = m([0.3, 0.3], [0.3, 0.3])
    assert pointing_game(maps, g([1, 0], [0, 0]))[0] == 1.0
    assert pointing_game(maps, g([0, 0], [0, 1]))[0] == 0.0
    assert pointing_game(maps, g([0, 0], [0, 1]), ties="any")[0] == 1.0


def test_pointing_argmax_is_taken_on_the_upsampled_map():
    maps = m([1.0, 2.0], [3.0, 4.0])  # upsampled to 4x4 the maximum 4.0 is only at (3, 3)
    corner = np.zeros((1, 4, 4), bool)
    corner[0, 3, 3] = True
    inner = np.zeros((1, 4, 4), bool)
    inner[0, 2, 2] = True  # value 3.25 after upsampling
    assert pointing_game(maps, corner)[0] == 1.0
    assert pointing_game(maps, inner)[0] == 0.0


def test_pointing_any_uses_exact_equality_of_the_maximum():
    below = np.nextafter(np.float32(1.0), np.float32(0.0))
    maps = m([1.0, below])
    assert pointing_game(maps, g([0, 1]), ties="any")[0] == 0.0


def test_nonfinite_map_raises_naming_case_and_finding_or_is_skipped():
    maps = np.stack([m([0.0, 1.0])[0], m([np.nan, 1.0])[0]])
    masks = np.ones((2, 1, 2), bool)
    with pytest.raises(ValueError, match=r"pair 1 \(case 'x2', finding 'Nodule'\).*NaN"):
        pointing_game(maps, masks, case_ids=["x1", "x2"], findings=["Nodule", "Nodule"])
    with pytest.warns(XBenchWarning, match="1 of 2 pairs"):
        out = dice(maps, masks, nonfinite="skip")
    assert out[0] == pytest.approx(2 * 1 / (1 + 2)) and np.isnan(out[1])


# -- Dice / IoU at a fixed threshold ---------------------------------------------------


MAP = m([0.0, 0.25], [0.5, 1.0])  # already normalised
MASK = g([0, 1], [1, 0])


def test_dice_iou_value_exactly_on_threshold_is_selected():
    # τ = 0.5: B = {0.5, 1.0}; B ∩ G = {0.5}
    assert dice(MAP, MASK)[0] == pytest.approx(2 * 1 / (2 + 2))
    assert iou(MAP, MASK)[0] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "tau, d, j",
    [
        (0.0, 2 * 2 / (4 + 2), 2 / 4),  # τ = 0 selects every pixel
        (1.0, 0.0, 0.0),  # τ = 1 selects only the maximum, outside G
        (0.25, 2 * 2 / (3 + 2), 2 / 3),
        (0.26, 2 * 1 / (2 + 2), 1 / 3),
    ],
)
def test_dice_iou_threshold_edges(tau, d, j):
    assert dice(MAP, MASK, threshold=tau)[0] == pytest.approx(d)
    assert iou(MAP, MASK, threshold=tau)[0] == pytest.approx(j)


def test_dice_iou_empty_prediction_is_zero_empty_gt_is_nan():
    const = m([0.7, 0.7], [0.7, 0.7])  # → all zeros: nothing selected for τ > 0
    assert dice(const, MASK)[0] == 0.0 and iou(const, MASK)[0] == 0.0
    # at τ = 0 a constant map selects everything
    assert dice(const, MASK, threshold=0.0)[0] == pytest.approx(2 * 2 / (4 + 2))
    empty = np.zeros_like(MASK)
    assert np.isnan(dice(MAP, empty)[0]) and np.isnan(iou(MAP, empty)[0])
    assert np.isnan(dice(const, empty)[0])  # both empty: the empty-GT rule wins


def test_float_values_on_grid_points_compare_exactly_as_float32_vs_float64():
    # float32(0.29) < 0.29, float32(0.01) < 0.01, float32(0.3) > 0.3, float32(0.5) == 0.5
    vals = np.array([0.0, 0.29, 0.01, 0.3, 0.5, 1.0], np.float32)
    v64 = vals.astype(np.float64)  # (a float32 compared with a Python float is compared in float32)
    assert v64[1] < 0.29 and v64[2] < 0.01 and v64[3] > 0.3 and v64[4] == 0.5
    maps = vals.reshape(1, 1, 6)
    masks = np.ones((1, 1, 6), bool)

    def n_selected(tau):  # Dice with G = everything is 2|B| / (|B| + 6)
        dv = dice(maps, masks, threshold=tau)[0]
        return round(6 * dv / (2 - dv))

    assert n_selected(0.29) == 3  # 0.3, 0.5, 1.0 (not float32(0.29))
    assert n_selected(0.28) == 4
    assert n_selected(0.01) == 4  # 0.29, 0.3, 0.5, 1.0: not float32(0.01)
    assert n_selected(0.009) == 5 and n_selected(0.0) == 6
    assert n_selected(0.3) == 3  # float32(0.3) > 0.3
    assert n_selected(0.5) == 2
    d, _ = dice_iou_curves(maps, masks)
    for tau in (0.01, 0.28, 0.29, 0.3, 0.5):
        i = int(np.flatnonzero(THRESHOLDS == tau)[0])
        assert d[0, i] == dice(maps, masks, threshold=tau)[0]


def test_float32_ceil_is_the_smallest_float32_not_below():
    t = np.array([0.29, 0.5, 0.3, 0.0, 1.0])
    c = float32_ceil(t)
    assert (c.astype(np.float64) >= t).all()
    below = np.nextafter(c, np.float32(-1))
    assert (below.astype(np.float64) < t).all()


# -- curves ----------------------------------------------------------------------------


def test_curves_columns_equal_fixed_threshold_functions_and_handle_edges():
    rng = np.random.default_rng(3)
    maps = rng.random((6, 3, 3)).astype(np.float32)
    masks = rng.random((6, 12, 12)) < 0.3
    masks[2] = False
    d, j = dice_iou_curves(maps, masks)
    assert d.shape == j.shape == (6, 101)
    assert np.isnan(d[2]).all() and np.isnan(j[2]).all()
    for tau in (0.0, 0.37, 0.5, 1.0):
        i = int(np.flatnonzero(THRESHOLDS == tau)[0])
        np.testing.assert_array_equal(d[:, i], dice(maps, masks, threshold=tau))
        np.testing.assert_array_equal(j[:, i], iou(maps, masks, threshold=tau))
    gt = masks.reshape(6, -1).sum(1)
    ok = gt > 0
    np.testing.assert_allclose(d[ok, 0], 2 * gt[ok] / (144 + gt[ok]))  # τ = 0: everything selected


def test_chunk_size_does_not_change_results_and_torch_inputs_work():
    rng = np.random.default_rng(4)
    maps = rng.random((7, 4, 4)).astype(np.float32)
    masks = rng.random((7, 8, 8)) < 0.4
    ref = dice_iou_curves(maps, masks)
    for cs in (1, 3, 100):
        out = dice_iou_curves(torch.from_numpy(maps), torch.from_numpy(masks), chunk_size=cs)
        np.testing.assert_array_equal(out[0], ref[0])
        np.testing.assert_array_equal(out[1], ref[1])


def test_input_validation_messages():
    with pytest.raises(ValueError, match="2 maps but 1 masks"):
        dice(np.zeros((2, 2, 2)), np.zeros((1, 2, 2), bool))
    with pytest.raises(ValueError, match="0/1"):
        dice(np.zeros((1, 2, 2)), np.full((1, 2, 2), 2))
    with pytest.raises(ValueError, match="strictly increasing"):
        dice_iou_curves(np.zeros((1, 2, 2)), np.ones((1, 2, 2), bool), thresholds=[0.5, 0.2])
    with pytest.raises(ValueError, match="ties"):
        pointing_game(np.zeros((1, 2, 2)), np.ones((1, 2, 2), bool), ties="random")
    with pytest.raises(ValueError, match="case_ids has 1"):
        dice(np.zeros((2, 2, 2)), np.ones((2, 2, 2), bool), case_ids=["a"])


# -- threshold selection ---------------------------------------------------------------


def test_best_threshold_maximises_mean_dice_ties_go_to_smallest_tau():
    t = [0.1, 0.2, 0.3, 0.4]
    d = np.array([[0.2, 0.5, 0.5, 0.1], [0.4, 0.7, 0.7, 0.9], [np.nan] * 4])
    j = np.array([[0.1, 0.3, 0.4, 0.0], [0.2, 0.6, 0.5, 0.8], [np.nan] * 4])
    best = best_threshold(d, j, thresholds=t)
    assert best.tau == 0.2  # means 0.3, 0.6, 0.6, 0.5: tie between 0.2 and 0.3
    assert best.dice == pytest.approx(0.6) and best.iou == pytest.approx(0.45) and best.n == 2


def test_best_threshold_without_defined_pairs_warns_and_returns_nan():
    with pytest.warns(XBenchWarning, match="no pair"):
        best = best_threshold(np.full((2, 3), np.nan), thresholds=[0.0, 0.5, 1.0])
    assert np.isnan(best.tau) and np.isnan(best.dice) and best.n == 0
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        best_threshold(np.zeros((2, 4)), thresholds=[0.0, 0.5, 1.0])


def test_oracle_threshold_is_per_pair_best_and_bounds_best_threshold():
    t = [0.1, 0.2, 0.3]
    d = np.array([[0.2, 0.5, 0.5], [0.9, 0.7, 0.1], [np.nan] * 3])
    j = np.array([[0.1, 0.3, 0.4], [0.8, 0.6, 0.0], [np.nan] * 3])
    o = oracle_threshold(d, j, thresholds=t)
    np.testing.assert_array_equal(o.tau, [0.2, 0.1, np.nan])
    assert o.dice == pytest.approx(0.7) and o.iou == pytest.approx(0.55) and o.n == 2
    assert o.dice >= best_threshold(d, j, thresholds=t).dice


# -- grounding_scores ------------------------------------------------------------------


def test_grounding_scores_equals_the_separate_functions_and_builds_the_pair_table():
    rng = np.random.default_rng(5)
    maps = rng.random((5, 4, 4)).astype(np.float32)
    masks = rng.random((5, 16, 16)) < 0.3
    masks[1] = False
    s = grounding_scores(maps, masks, threshold=0.4, ties="any")
    np.testing.assert_array_equal(s.pointing, pointing_game(maps, masks, ties="any"))
    np.testing.assert_array_equal(s.dice, dice(maps, masks, threshold=0.4))
    np.testing.assert_array_equal(s.iou, iou(maps, masks, threshold=0.4))
    d, j = dice_iou_curves(maps, masks)
    np.testing.assert_array_equal(s.dice_curves, d)
    np.testing.assert_array_equal(s.iou_curves, j)
    assert s.n_skipped == 0 and list(s.gt_area) == list(masks.reshape(5, -1).sum(1))
    frame = s.to_frame([f"c{i}" for i in range(5)], "Nodule")
    assert list(frame.columns[:5]) == ["case_id", "finding", "pointing", "dice_fixed", "iou_fixed"]
    assert frame["dice_curve"].iloc[0].shape == (101,) and (frame["finding"] == "Nodule").all()
    with pytest.raises(ValueError, match="rasterise"):
        grounding_scores(maps, masks, grid=(224, 224))


def test_no_warning_on_clean_input():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grounding_scores(np.random.default_rng(0).random((2, 3, 3)), np.ones((2, 6, 6), bool))
