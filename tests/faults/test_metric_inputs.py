"""Issue 12 item 11: a NaN threshold is rejected by dice / iou as by the curve functions, and a float64 map whose
values overflow float32 is named as such (old main: dice returned 0 for every pair; the error blamed
"NaN or inf in the map")."""
from __future__ import annotations

import numpy as np
import pytest

from xbench.metrics import dice, dice_iou_curves, grounding_scores, iou, pointing_game

MAPS = np.array([[[0.0, 0.2], [0.6, 1.0]]])
MASKS = np.array([[[False, False], [True, False]]])


@pytest.mark.parametrize("fn", [dice, iou])
@pytest.mark.parametrize("tau", [np.nan, np.inf])
def test_non_finite_threshold_raises_like_the_curves(fn, tau):
    with pytest.raises(ValueError, match="finite"):
        dice_iou_curves(MAPS, MASKS, thresholds=[tau])
    with pytest.raises(ValueError, match="threshold must be finite"):
        fn(MAPS, MASKS, threshold=tau)


@pytest.mark.parametrize("fn", [dice, iou, pointing_game, dice_iou_curves, grounding_scores])
def test_float64_value_beyond_float32_is_named(fn):
    maps = MAPS.copy()
    maps[0, 0, 1] = 1e300
    with pytest.raises(ValueError, match=r"pair 0 \(case 'a'\): map value 1e\+300 overflows float32") as err:
        fn(maps, MASKS, case_ids=["a"])
    assert "NaN or inf" not in str(err.value)
