"""Issue 20 exactness defects: the export's τ mask compares as the metrics do, exact τ ties go to the smallest τ, and
one stated rule for unscorable maps.

On a7aa795: ``xbench export`` compared ``v >= tau`` in float32 (NumPy 2 promotion), so ``v = fl32(0.7)`` counted
as ≥ 0.7 against the metrics' exact rule; two τ whose per-pair Dice were the same multiset in another order could
pick the larger τ through float summation order."""
from __future__ import annotations

import numpy as np
import pytest

from xbench.core.errors import XBenchWarning
from xbench.outputs.exports import tau_mask
from xbench.metrics import best_threshold, grounding_scores, normalize_maps


def test_export_mask_agrees_with_the_exact_rule():
    v = np.array([np.float32(0.7), np.nextafter(np.float32(0.7), np.float32(1)), np.float32(0.3)], np.float32)
    assert tau_mask(v, 0.7).tolist() == [False, True, False]  # fl32(0.7) = 0.69999998... < 0.7
    grid = np.float32(np.arange(0, 101) / 100)
    for tau in np.round(np.linspace(0, 1, 101), 2):
        exact = np.array([float(x) >= float(tau) for x in grid])
        assert np.array_equal(tau_mask(grid, float(tau)), exact), tau


def test_exact_ties_go_to_the_smallest_tau():
    """Columns τ=0.2 and τ=0.3 hold the same per-pair Dice values (exact ratios of integer counts) in another pair
    order: their exact means tie, so τ=0.2 must win for every order (float means may differ in the last bit)."""
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 500, size=(5000, 3))
    col = np.array([2 * min(i, p, g) / (p + g) for i, p, g in counts])
    larger = 0
    for seed in range(8):
        perm = np.random.default_rng(seed).permutation(len(col))
        curves = np.stack([col * 0.5, col, col[perm], col * 0.25], axis=1)
        larger += np.nanmean(curves[:, 2]) > np.nanmean(curves[:, 1])
        assert best_threshold(curves, thresholds=[0.1, 0.2, 0.3, 0.4]).tau == 0.2, seed
    assert larger > 0  # float summation order alone would have picked τ = 0.3 for some orders


@pytest.mark.parametrize("kind", ["nan", "float64 beyond float32", "float32 range overflow"])
def test_one_rule_for_unscorable_maps(kind):
    """NaN/inf, a float64 value beyond float32 and a float32 range overflow: all raise with 'raise', all are NaN and
    counted with 'skip' (a7aa795 raised on the float64 1e300 map even with 'skip')."""
    dtype = np.float32 if kind == "float32 range overflow" else np.float64
    maps = np.zeros((2, 4, 4), dtype)
    if kind == "nan":
        maps[0, 0, 0] = np.nan
    elif kind == "float64 beyond float32":
        maps[0, 0, 0] = 1e300
    else:
        maps[0, 0, 0], maps[0, 0, 1] = 3e38, -3e38
    maps[1, 1, 1] = 1.0
    masks = np.zeros((2, 4, 4), bool)
    masks[:, 1, 1] = True
    with pytest.raises(ValueError, match="pair 0"):
        grounding_scores(maps, masks, case_ids=None)
    with pytest.warns(XBenchWarning, match="1 of 2"):
        scores = grounding_scores(maps, masks, nonfinite="skip")
    assert np.isnan(scores.pointing[0]) and scores.pointing[1] == 1.0
    with pytest.warns(XBenchWarning, match="1 of 2"):
        assert np.isnan(normalize_maps(maps, nonfinite="skip")[0]).all()
