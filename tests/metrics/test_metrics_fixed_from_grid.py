"""Dice/IoU at the fixed τ are read from the sweep's counts when τ is a grid point: same values as a direct binarisation."""
from __future__ import annotations

import numpy as np
import pytest

from xbench.metrics import dice, grounding_scores, iou


@pytest.mark.parametrize("tau", [0.0, 0.25, 0.37, 0.5, 0.505, 1.0])
@pytest.mark.parametrize("grid", [None, np.array([0.0, 0.37, 0.5, 0.9])])
def test_fixed_threshold_equals_direct_dice_and_iou(tau, grid):
    rng = np.random.default_rng(7)
    maps = rng.random((30, 7, 7)).astype(np.float32)
    maps[0] = 0.25  # constant map
    maps[1, 3, 3] = 2.0  # one strong peak
    masks = rng.random((30, 28, 28)) < 0.25
    masks[2] = False  # empty ground truth → NaN
    kwargs = {} if grid is None else {"thresholds": grid}
    s = grounding_scores(maps, masks, threshold=tau, **kwargs)
    np.testing.assert_array_equal(s.dice, dice(maps, masks, threshold=tau))
    np.testing.assert_array_equal(s.iou, iou(maps, masks, threshold=tau))
