"""Cross-metric analyses: fit_line (hand values, numpy/scipy, Fisher-z CI, NaN and degenerate inputs),
metric_pairs / calibration_gap on a hand-built tidy table, size_bins edges."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from xbench.outputs.analysis import calibration_gap, fit_line, metric_pairs, size_bins
from xbench.metrics import DATASET_LEVEL, POOLED


# -- fit_line -----------------------------------------------------------------------------------------
def test_fit_line_hand_values():
    # x̄ = 3, ȳ = 4, Sxy = 6, Sxx = 10, Syy = 6: slope 0.6, intercept 2.2, R² = 36 / 60 = 0.6.
    # Ranks of y = (1, 2.5, 4.5, 2.5, 4.5): ρ = 7 / sqrt(10 · 9).
    x, y = np.array([1, 2, 3, 4, 5.0]), np.array([2, 4, 5, 4, 5.0])
    fit = fit_line(x, y)
    assert fit.slope == pytest.approx(0.6) and fit.intercept == pytest.approx(2.2)
    assert fit.r2 == pytest.approx(0.6) and fit.n == 5
    rho = 7 / math.sqrt(90)
    assert fit.spearman == pytest.approx(rho)
    half = 1.96 / math.sqrt(5 - 3)
    assert fit.spearman_low == pytest.approx(math.tanh(math.atanh(rho) - half))
    assert fit.spearman_high == pytest.approx(math.tanh(math.atanh(rho) + half))
    assert fit.spearman_low == pytest.approx(-0.4138, abs=1e-4) and fit.spearman_high == pytest.approx(0.9813, abs=1e-4)


def test_fit_line_matches_numpy_and_scipy():
    rng = np.random.default_rng(3)
    x = rng.random(40)
    y = 0.7 * x + rng.normal(0, 0.2, 40)
    fit = fit_line(x, y)
    slope, intercept = np.polyfit(x, y, 1)
    assert fit.slope == pytest.approx(slope) and fit.intercept == pytest.approx(intercept)
    assert fit.r2 == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    rho = stats.spearmanr(x, y).statistic
    assert fit.spearman == pytest.approx(rho)
    z, se = np.arctanh(rho), 1.0 / np.sqrt(40 - 3)
    assert (fit.spearman_low, fit.spearman_high) == pytest.approx((np.tanh(z - 1.96 * se), np.tanh(z + 1.96 * se)))
    assert fit.spearman_low < fit.spearman < fit.spearman_high


def test_fit_line_drops_nan_and_inf_pairs():
    x = np.array([1, 2, np.nan, 3, 4, 5, 6.0])
    y = np.array([2, 4, 1.0, 5, np.inf, 4, 5.0])
    fit = fit_line(x, y)
    ref = fit_line(np.array([1, 2, 3, 5, 6.0]), np.array([2, 4, 5, 4, 5.0]))
    assert fit.n == 5 and fit == ref


def test_fit_line_degenerate_inputs():
    one = fit_line([1.0, np.nan], [2.0, 3.0])
    assert one.n == 1 and all(math.isnan(v) for v in (one.slope, one.intercept, one.r2, one.spearman))
    const_x = fit_line([2.0, 2.0, 2.0, 2.0], [1.0, 2.0, 3.0, 4.0])
    assert math.isnan(const_x.slope) and math.isnan(const_x.r2) and const_x.n == 4
    const_y = fit_line([1.0, 2.0, 3.0, 4.0, 5.0], [3.0] * 5)
    assert const_y.slope == 0.0 and math.isnan(const_y.spearman) and math.isnan(const_y.spearman_low)
    three = fit_line([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert three.spearman == pytest.approx(0.5) and math.isnan(three.spearman_low) and math.isnan(three.spearman_high)
    perfect = fit_line([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 4.0, 9.0, 16.0, 25.0])
    assert perfect.spearman == pytest.approx(1.0) and math.isnan(perfect.spearman_low)
    assert math.isnan(perfect.spearman_high)
    reversed_ = fit_line([1.0, 2.0, 3.0, 4.0, 5.0], [9.0, 7.0, 5.0, 2.0, 0.0])
    assert reversed_.spearman == pytest.approx(-1.0) and math.isnan(reversed_.spearman_low)


# -- metric_pairs / calibration_gap ---------------------------------------------------------------------
def tidy() -> pd.DataFrame:
    rows = []
    values = {  # (model, finding) → {metric: value}
        ("a", "Nodule"): {"auc": 0.9, "pointing": 0.2, "dice@0.5": 0.1, "dice@best": 0.3},
        ("a", "Effusion"): {"auc": 0.8, "pointing": 0.6, "dice@0.5": 0.4, "dice@best": 0.45},
        ("a", DATASET_LEVEL): {"auc": 0.85, "pointing": 0.4, "dice@0.5": 0.25, "dice@best": 0.375},
        ("a", POOLED): {"pointing": 0.5},
        ("b", "Nodule"): {"auc": 0.7, "pointing": 0.1, "dice@0.5": 0.05, "dice@best": 0.2},
        ("b", "Effusion"): {"auc": 0.6, "dice@0.5": 0.3, "dice@best": 0.3},
        ("b", DATASET_LEVEL): {"auc": 0.65, "pointing": 0.1, "dice@0.5": 0.175, "dice@best": 0.25},
    }
    for (model, finding), metrics in values.items():
        for metric, v in metrics.items():
            rows.append({"model": model, "dataset": "d", "finding": finding, "metric": metric, "value": v,
                         "ci_low": np.nan, "ci_high": np.nan,
                         "n_cases" if metric == "auc" else "n_pairs": 5})
    return pd.DataFrame(rows)


def test_metric_pairs_dataset_level():
    pts = metric_pairs(tidy(), "auc", "pointing", level=DATASET_LEVEL)
    assert list(pts.columns) == ["model", "dataset", "finding", "x", "y"]
    assert pts[["model", "x", "y"]].values.tolist() == [["a", 0.85, 0.4], ["b", 0.65, 0.1]]


def test_metric_pairs_per_class_skips_aggregate_rows_and_keeps_missing_as_nan():
    pts = metric_pairs(tidy(), "auc", "pointing", level="per-class").set_index(["model", "finding"])
    assert sorted(pts.index) == [("a", "Effusion"), ("a", "Nodule"), ("b", "Effusion"), ("b", "Nodule")]
    assert pts.loc[("a", "Nodule"), "x"] == 0.9 and pts.loc[("a", "Nodule"), "y"] == 0.2
    assert math.isnan(pts.loc[("b", "Effusion"), "y"])  # b has no pointing for Effusion


def test_metric_pairs_absent_metric_is_a_nan_column():
    pts = metric_pairs(tidy(), "auc", "iou@best", level=DATASET_LEVEL)
    assert len(pts) == 2 and pts["y"].isna().all()


def test_calibration_gap_is_best_minus_fixed():
    gap = calibration_gap(tidy(), "dice@0.5", "dice@best").set_index(["model", "finding"])
    assert len(gap) == 4
    assert gap.loc[("a", "Nodule"), "delta"] == pytest.approx(0.2)
    assert gap.loc[("b", "Effusion"), "delta"] == pytest.approx(0.0)
    np.testing.assert_allclose(gap["delta"], gap["best"] - gap["fixed"])


# -- size_bins ------------------------------------------------------------------------------------------
def test_size_bins_right_closed_edges_and_means():
    pairs = pd.DataFrame({
        "model": ["m"] * 6 + ["n"],
        "area_fraction": [0.0, 0.01, 0.0100001, 0.05, 0.2, 1.0, 0.03],
        "pointing": [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0],
        "dice@best": [0.1, 0.3, 0.5, 0.7, 0.2, 0.4, 0.9],
        "gt_area": [0, 1, 2, 3, 4, 5, 6],  # not a metric column: not averaged
    })
    bins = size_bins(pairs)
    labels = ["0%–1%", "1%–5%", "5%–15%", "15%–100%"]
    assert bins["size_bin"].astype(str).tolist() == labels * 2
    assert list(bins.columns) == ["model", "size_bin", "pointing", "dice@best", "n_pairs"]
    m = bins[bins["model"] == "m"].set_index("size_bin")
    # 0.0 (lowest edge included) and 0.01 (right-closed) fall in the first bin; 0.0100001 and 0.05 in the second
    assert m["n_pairs"].tolist() == [2, 2, 0, 2]
    assert m.loc["0%–1%", "pointing"] == pytest.approx(0.5) and m.loc["0%–1%", "dice@best"] == pytest.approx(0.2)
    assert m.loc["1%–5%", "dice@best"] == pytest.approx(0.6)
    assert math.isnan(m.loc["5%–15%", "pointing"])  # empty bin: NaN mean, n = 0
    assert m.loc["15%–100%", "pointing"] == pytest.approx(0.5)
    n = bins[bins["model"] == "n"].set_index("size_bin")
    assert n["n_pairs"].tolist() == [0, 1, 0, 0]


def test_size_bins_custom_edges():
    pairs = pd.DataFrame({"model": ["m"] * 3, "area_fraction": [0.1, 0.5, 0.9], "pointing": [1.0, 0.0, 1.0]})
    bins = size_bins(pairs, edges=(0.0, 0.5, 1.0))
    assert bins["size_bin"].astype(str).tolist() == ["0%–50%", "50%–100%"]
    assert bins["n_pairs"].tolist() == [2, 1] and bins["pointing"].tolist() == [0.5, 1.0]
