"""Maps of cropping models are placed in the part of the image their input covers."""
from __future__ import annotations

import numpy as np
import pytest

from xbench.metrics import upsample_maps
from xbench.models.base import resize_crop_window
from xbench.models.carzero import CARZeroAdapter, crop_size
from xbench.models.windows import is_whole_image, place_maps


def test_whole_image_window_equals_plain_upsampling():
    maps = np.random.default_rng(0).random((4, 14, 14)).astype(np.float32)
    sizes = np.array([[512, 512]] * 4)
    windows = np.c_[np.zeros((4, 2)), sizes]
    assert is_whole_image(windows, sizes).all()
    np.testing.assert_allclose(place_maps(maps, windows, sizes, (224, 224)), upsample_maps(maps, (224, 224)), atol=1e-6)


def test_map_covering_the_right_half_leaves_the_left_half_at_the_minimum():
    maps = np.array([[[1.0, 2.0], [3.0, 4.0]]], np.float32)
    placed = place_maps(maps, np.array([[0, 50, 100, 100]]), np.array([[100, 100]]), (4, 4))
    assert (placed[0, :, :2] == 1.0).all()  # outside the window: the map's minimum
    np.testing.assert_allclose(placed[0, :, 2:], upsample_maps(maps, (4, 2))[0], atol=1e-6)


def test_window_reaching_into_padding_samples_only_the_image_part():
    maps = np.array([[[0.0, 1.0]]], np.float32)  # (1, 1, 2): left half 0, right half 1
    # the window is twice as wide as the image and centred: the image sees the middle half of the map
    placed = place_maps(maps, np.array([[0, -50, 100, 150]]), np.array([[100, 100]]), (1, 2))
    np.testing.assert_allclose(placed[0, 0], [0.25, 0.75], atol=1e-6)


def test_resize_crop_windows_by_hand():
    assert resize_crop_window((512, 512), 224) == (0.0, 0.0, 512.0, 512.0)
    # 1024x800, shorter side to 224: resized height int(224*1024/800) = 286, crop top round(31) = 31 px
    y0, x0, y1, x1 = resize_crop_window((1024, 800), 224)
    assert (x0, x1) == (0.0, 800.0)
    assert y0 == pytest.approx(31 * 1024 / 286) and y1 - y0 == pytest.approx(800.0)
    assert resize_crop_window((600, 400), 224, "squash") == (0.0, 0.0, 600.0, 400.0)


def test_carzero_window_is_the_central_seven_eighths():
    adapter = object.__new__(CARZeroAdapter)  # the window needs no weights, only the YAML's crop (input_size)
    adapter.input_size = crop_size()
    assert adapter.input_window((512, 512)) == pytest.approx((32.0, 32.0, 480.0, 480.0))
    # 1024 x 512: width 512 -> 128 px, padded by 64 each side; crop starts 16 px into the padded square
    y0, x0, y1, x1 = adapter.input_window((1024, 512))
    assert (y0, y1) == pytest.approx((64.0, 960.0))
    assert (x0, x1) == pytest.approx(((16 - 64) * 4.0, (16 - 64 + 224) * 4.0))
