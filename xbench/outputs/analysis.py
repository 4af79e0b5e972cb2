"""Cross-metric analyses of the paper: recognition vs grounding, calibration gap, lesion size.

Pure functions over the tidy metric table (one row per model × dataset × finding
× metric; columns ``model, dataset, finding, metric, value, ci_low, ci_high, n``)
and the per-pair table written by :mod:`xbench.evaluation.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ..metrics.table import is_grounding_score


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
    with the mean of every metric column and ``n_pairs`` (the pairs in the bin).
    """
    labels = [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(edges[:-1], edges[1:])]
    out = pairs.copy()
    out["size_bin"] = pd.cut(out["area_fraction"], bins=list(edges), labels=labels, include_lowest=True)
    metrics = [c for c in out.columns if is_grounding_score(c)]
    grouped = out.groupby(["model", "size_bin"], observed=False)
    res = grouped[metrics].mean()
    res["n_pairs"] = grouped.size()
    return res.reset_index()


# -- the paper's model-level views (Fig. 3, Fig. 4) and the run-vs-paper comparison ----------------------------------

#: Fewer points than this get no fitted line and no correlation (Fig. 3).
MIN_POINTS_TO_FIT = 4


def dataset_means(table: pd.DataFrame, metrics: list[str], *, models: list[str] | None = None) -> pd.DataFrame:
    """Per model: each metric's dataset-level value (mean over classes) averaged over the datasets where **every**
    one of ``metrics`` is defined (the paper's Table 1 values averaged over datasets, unweighted).

    Columns ``model``, one per metric, ``n_datasets`` and ``datasets`` (the datasets averaged).
    """
    from ..metrics import DATASET_LEVEL

    level = table[(table["finding"] == DATASET_LEVEL) & table["metric"].isin(metrics)]
    wide = level.pivot_table(index=["model", "dataset"], columns="metric", values="value", aggfunc="first")
    for m in metrics:
        if m not in wide:
            wide[m] = np.nan
    wide = wide[metrics].dropna()
    rows = []
    for model in models or list(dict.fromkeys(table["model"])):
        sub = wide.xs(model, level="model") if model in wide.index.get_level_values("model") else wide.iloc[:0]
        rows.append({"model": model, **{m: float(sub[m].mean()) if len(sub) else np.nan for m in metrics},
                     "n_datasets": len(sub), "datasets": ", ".join(map(str, sub.index))})
    return pd.DataFrame(rows)


def model_correlation(table: pd.DataFrame, *, x_metric: str = "auc", y_metric: str = "pointing",
                      models: list[str] | None = None) -> tuple[pd.DataFrame, Fit | None]:
    """Fig. 3 as the paper: one point per model (x, y = dataset means, :func:`dataset_means`), the pretraining group,
    and each model's residual from the least-squares line; the :class:`Fit` is None (and residuals NaN) with fewer
    than :data:`MIN_POINTS_TO_FIT` models."""
    from ..paper import GROUPS

    pts = dataset_means(table, [x_metric, y_metric], models=models).rename(columns={x_metric: "x", y_metric: "y"})
    pts = pts.dropna(subset=["x", "y"]).reset_index(drop=True)
    pts["group"] = pts["model"].map(GROUPS).fillna("other")
    fit = fit_line(pts["x"].to_numpy(), pts["y"].to_numpy()) if len(pts) >= MIN_POINTS_TO_FIT else None
    if fit is not None and not np.isfinite(fit.slope):
        fit = None
    pts["residual"] = pts["y"] - (fit.slope * pts["x"] + fit.intercept) if fit is not None else np.nan
    return pts, fit


def calibration_by_model(table: pd.DataFrame, fixed: str = "dice@0.5", best: str = "dice@best", *,
                         models: list[str] | None = None) -> pd.DataFrame:
    """Fig. 4 as the paper: per model the Dice at the fixed τ and at the best τ, each the dataset-level value (mean
    over classes, best τ chosen per class) averaged over the datasets where both are defined; ``delta = best − fixed``."""
    out = dataset_means(table, [fixed, best], models=models).rename(columns={fixed: "fixed", best: "best"})
    out["delta"] = out["best"] - out["fixed"]
    return out.dropna(subset=["fixed", "best"]).reset_index(drop=True)


def compare_with_paper(table: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every published cell beside this run: ``paper`` (percent as printed), ``run`` and ``run_low``/``run_high``
    (the 95 % CI, percent), ``diff = run − paper``, ``paper_in_ci`` (None without a CI or a run value), ``n_pairs`` (the
    positive pairs behind a grounding value) or ``n_cases`` (the labelled cases behind a recognition value) and the reference's ``flag``. One row per reference cell (Tables 1–5), run cells
    matched on model, dataset, finding and metric (a dataset-level Table 1 value of a single-class dataset is its
    class value)."""
    from ..paper import load_reference

    ref = load_reference() if reference is None else reference
    run = table.set_index(["model", "dataset", "finding", "metric"])[["value", "ci_low", "ci_high", "n_cases"]]
    run = run[~run.index.duplicated()]
    keys = pd.MultiIndex.from_frame(ref[["model", "dataset", "finding", "metric"]])
    got = run.reindex(keys)
    out = ref[["table", "model", "dataset", "finding", "paper_class", "metric", "value", "flag"]].rename(
        columns={"value": "paper"}).reset_index(drop=True)
    out["run"] = 100 * got["value"].to_numpy()
    out["run_low"] = 100 * got["ci_low"].to_numpy()
    out["run_high"] = 100 * got["ci_high"].to_numpy()
    from .tables import pair_counts

    pairs = pair_counts(table)
    grounding = out["metric"].map(is_grounding_score).to_numpy(dtype=bool)
    from_pairs = np.array([pairs.get(k, np.nan) for k in zip(out["model"], out["dataset"], out["finding"])], float)
    out["n_pairs"] = pd.array(np.where(grounding, from_pairs, np.nan), dtype="Int64")
    out["n_cases"] = pd.array(np.where(grounding, np.nan, got["n_cases"].to_numpy(dtype=float, na_value=np.nan)),
                              dtype="Int64")
    out["diff"] = out["run"] - out["paper"]
    has_ci = np.isfinite(out["run_low"]) & np.isfinite(out["run_high"])
    inside = (out["run_low"] - 0.005 <= out["paper"]) & (out["paper"] <= out["run_high"] + 0.005)
    out["paper_in_ci"] = pd.array([bool(i) if h else pd.NA for i, h in zip(inside, has_ci)], dtype="boolean")
    return out


def comparison_status(table: pd.DataFrame, models: pd.DataFrame | None = None, *, synthetic: bool = False) -> str:
    """One plain sentence on whether this run's values can be compared with the paper's, and why not.

    Comparable cells need one of the paper's datasets and one of its models run with trained (not random-init)
    weights; ``models`` is the run's ``models.csv`` (``weights`` column).
    """
    from ..paper import DATASETS, MODELS

    if synthetic:
        return ("Synthetic result set (drawn from the manifests' expected counts): it exercises the comparison; "
                "no value in it means anything.")
    datasets = list(dict.fromkeys(table["dataset"]))
    paper_sets = [d for d in datasets if d in DATASETS]
    run_models = list(dict.fromkeys(table["model"]))
    trained = set(run_models)
    if models is not None and "weights" in models:
        trained = set(models.loc[~models["weights"].isin(["random-init", "none"]), "model"])
    paper_models = [m for m in run_models if m in MODELS and m in trained]
    if not paper_sets or not paper_models:
        why = []
        if not paper_sets:
            why.append(f"it has none of the paper's datasets (it has {', '.join(datasets)})")
        if not paper_models:
            why.append("none of its models is one of the paper's seven with trained weights "
                       f"(it has {', '.join(run_models)}: random-init, reference or prior models)")
        return ("No comparison of values is meaningful for this run: " + "; and ".join(why) + ". The implied-"
                "denominator check below still runs, on the dataset manifests' expected counts.")
    return (f"Comparable cells: models {', '.join(paper_models)} on {', '.join(paper_sets)}. Differences also reflect "
            "the known differences of the evaluation sets (README, 'Known differences from the paper').")


def comparison_summary(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per paper table: published cells, cells with a run value, paper value inside the run's 95 % CI, mean and
    largest |run − paper| (points), and cells the reference flags as internally inconsistent."""
    g = comparison.groupby("table")
    return pd.DataFrame({"cells": g.size(), "with_run_value": g["run"].count(),
                         "paper_in_ci": g["paper_in_ci"].sum(min_count=0).astype(int),
                         "mean_abs_diff": g["diff"].apply(lambda d: d.abs().mean()).round(2),
                         "max_abs_diff": g["diff"].apply(lambda d: d.abs().max()).round(2),
                         "flagged_in_paper": g["flag"].apply(lambda f: int((f != "").sum()))})


def best_taus(table: pd.DataFrame, dataset: str) -> dict[tuple[str, str], float]:
    """``{(model, finding): best τ}`` of one dataset's classes (for Fig. 2's Dice at the class's best τ)."""
    sub = table[(table["dataset"] == dataset) & (table["metric"] == "best_tau")
                & ~table["finding"].astype(str).str.startswith("(")]
    return {(m, f): float(v) for m, f, v in zip(sub["model"], sub["finding"], sub["value"])}
