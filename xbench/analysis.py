"""Cross-metric analyses of the paper: recognition vs grounding, calibration gap, lesion size.

Pure functions over the tidy metric table (one row per model × dataset × finding
× metric; columns ``model, dataset, finding, metric, value, ci_low, ci_high, n``)
and the per-pair table written by :mod:`xbench.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats


@dataclass
class Fit:
    """Least-squares line ``y = slope·x + intercept`` with R², and Spearman ρ with a 95 % Fisher-z CI."""

    slope: float
    intercept: float
    r2: float
    spearman: float
    spearman_low: float
    spearman_high: float
    n: int


def fit_line(x: np.ndarray, y: np.ndarray) -> Fit:
    """OLS fit and Spearman correlation of paired values (NaN pairs dropped).

    Notes
    -----
    R² is the squared Pearson correlation of the OLS fit. The Spearman CI is
    ``tanh(atanh(ρ) ± 1.96 / sqrt(n − 3))`` (as cheXlocalize's regression
    utility); with ``n ≤ 3`` or |ρ| = 1 the CI is NaN. Fewer than 2 points
    give NaN everywhere; constant x gives NaN slope and R².
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    nan = float("nan")
    if n < 2 or np.ptp(x) == 0:
        return Fit(nan, nan, nan, nan, nan, nan, n)
    slope, intercept, r, _, _ = stats.linregress(x, y)
    rho = float(stats.spearmanr(x, y).statistic) if np.ptp(y) > 0 else nan
    low = high = nan
    if n > 3 and np.isfinite(rho) and abs(rho) < 1 - 1e-12:  # scipy can return 0.9999999999999999 for ρ = 1
        z, half = np.arctanh(rho), 1.96 / np.sqrt(n - 3)
        low, high = float(np.tanh(z - half)), float(np.tanh(z + half))
    return Fit(float(slope), float(intercept), float(r**2), rho, low, high, n)


def metric_pairs(table: pd.DataFrame, x_metric: str, y_metric: str, *, level: str) -> pd.DataFrame:
    """Join two metrics side by side: one row per (model, dataset, finding) with columns ``x``, ``y``.

    ``level`` selects rows by their ``finding`` column: a dataset-level constant
    (e.g. ``xbench.metrics.DATASET_LEVEL``) for one point per model × dataset,
    or ``"per-class"`` for every real class.
    """
    special = {v for v in table["finding"].unique() if str(v).startswith("(")}
    rows = table[~table["finding"].isin(special)] if level == "per-class" else table[table["finding"] == level]
    wide = rows.pivot_table(index=["model", "dataset", "finding"], columns="metric", values="value", aggfunc="first")
    for m in (x_metric, y_metric):
        if m not in wide:
            wide[m] = np.nan
    return wide[[x_metric, y_metric]].rename(columns={x_metric: "x", y_metric: "y"}).reset_index()


def calibration_gap(table: pd.DataFrame, fixed: str, best: str) -> pd.DataFrame:
    """Dice at the fixed τ vs at the best τ per (model, dataset, finding), with ``delta = best − fixed``."""
    pairs = metric_pairs(table, fixed, best, level="per-class").rename(columns={"x": "fixed", "y": "best"})
    pairs["delta"] = pairs["best"] - pairs["fixed"]
    return pairs


def size_bins(pairs: pd.DataFrame, *, edges: tuple[float, ...] = (0.0, 0.01, 0.05, 0.15, 1.0)) -> pd.DataFrame:
    """Pointing and Dice by ground-truth area (fraction of the image), per model.

    ``pairs`` is the per-pair table (columns ``model, area_fraction, pointing`` and a Dice column).
    Bins are right-closed ``(lo, hi]`` on the area fraction; returns one row per (model, bin)
    with the mean of every metric column and ``n``.
    """
    labels = [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(edges[:-1], edges[1:])]
    out = pairs.copy()
    out["size_bin"] = pd.cut(out["area_fraction"], bins=list(edges), labels=labels, include_lowest=True)
    metrics = [c for c in out.columns if c in ("pointing", "dice@best", "dice@0.5", "iou@0.5")]
    grouped = out.groupby(["model", "size_bin"], observed=False)
    res = grouped[metrics].mean()
    res["n"] = grouped.size()
    return res.reset_index()
