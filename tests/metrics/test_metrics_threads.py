"""The sweep runs on one thread whatever the caller's settings, leaves them as they were, and gives the same counts."""
from __future__ import annotations

import numpy as np
import torch
from threadpoolctl import threadpool_info

from xbench.metrics import dice_iou_curves, grounding_scores, upsample_maps
from xbench.metrics._sweep import single_threaded


def blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_single_threaded_sets_one_thread_inside_and_restores_after():
    before_torch, before_blas = torch.get_num_threads(), blas_threads()
    torch.set_num_threads(2)
    try:
        with single_threaded():
            assert torch.get_num_threads() == 1
            assert all(n == 1 for n in blas_threads())
        assert torch.get_num_threads() == 2 and blas_threads() == before_blas
    finally:
        torch.set_num_threads(before_torch)


def test_results_do_not_depend_on_the_callers_thread_count():
    rng = np.random.default_rng(4)
    maps = rng.random((40, 14, 14)).astype(np.float32)
    masks = rng.random((40, 56, 56)) < 0.2
    before = torch.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            out[n] = (dice_iou_curves(maps, masks), grounding_scores(maps, masks).pointing, upsample_maps(maps, (56, 56)))
            assert torch.get_num_threads() == n
        for a, b in zip(out[1][0], out[2][0]):  # Dice and IoU curves
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(out[1][1], out[2][1])
        np.testing.assert_array_equal(out[1][2], out[2][2])
    finally:
        torch.set_num_threads(before)
