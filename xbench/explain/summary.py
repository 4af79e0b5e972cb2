"""Plausibility against faithfulness, per model variant, with bootstrap CIs; the figure notebook 11 and the report show.

:func:`faithfulness_summary` turns :func:`~xbench.explain.faithfulness.faithfulness_table` rows into one row per
model variant: the mean of each faithfulness column with a 95 % percentile bootstrap CI over cases
(:func:`~xbench.metrics.stats.bootstrap_ci`, a case's rows resampled together), and ``faithfulness`` =
``insertion_auc - deletion_auc`` (higher: removing what the map points at hurts the score more than adding it
back helps). :func:`plausibility_vs_faithfulness` joins it with the run's pooled plausibility (pointing, Dice)
and its CIs from the tidy metrics table; :func:`plausibility_faithfulness_figure` plots the two with error bars.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..metrics.stats import POOLED, bootstrap_ci

FAITHFULNESS_METRICS = ("faithfulness", "deletion_auc", "insertion_auc", "road_gap", "randomisation_similarity")


def faithfulness_summary(table: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Tidy rows ``model, metric, value, ci_low, ci_high, n_cases`` (the model's cases) of
    :data:`FAITHFULNESS_METRICS`.

    Examples
    --------
    >>> t = pd.DataFrame({"model": "m", "case_id": ["a", "b"], "deletion_auc": [0.2, 0.4],
    ...                   "insertion_auc": [0.8, 0.6], "road_gap": np.nan, "randomisation_similarity": [0.1, 0.3]})
    >>> s = faithfulness_summary(t, n_boot=50).set_index("metric")
    >>> round(float(s.loc["faithfulness", "value"]), 3), int(s.loc["faithfulness", "n_cases"])
    (0.4, 2)
    """
    rows = []
    table = table.assign(faithfulness=table["insertion_auc"] - table["deletion_auc"])
    for model, sub in table.groupby("model", sort=False):
        cases = pd.factorize(sub["case_id"])[0]
        n_cases = int(cases.max()) + 1
        for metric in FAITHFULNESS_METRICS:
            values = sub[metric].to_numpy(dtype=float)
            ok = np.isfinite(values)
            if not ok.any():
                continue
            onehot = np.zeros((n_cases, ok.sum()))
            onehot[cases[ok], np.arange(ok.sum())] = 1.0

            def mean(w: np.ndarray, v: np.ndarray = values[ok], m: np.ndarray = onehot) -> np.ndarray:
                rw = w @ m  # each row's weight = its case's draw count
                with np.errstate(invalid="ignore", divide="ignore"):
                    return ((rw @ v) / rw.sum(1))[:, None]

            ci = bootstrap_ci(mean, n_cases, n_boot=n_boot, seed=seed)
            rows.append({"model": model, "metric": metric, "value": float(ci.value[0]), "ci_low": float(ci.low[0]),
                         "ci_high": float(ci.high[0]), "n_cases": n_cases})
    return pd.DataFrame(rows, columns=["model", "metric", "value", "ci_low", "ci_high", "n_cases"])


def plausibility_vs_faithfulness(tidy: pd.DataFrame, summary: pd.DataFrame, *, dataset: str,
                                 plausibility: tuple[str, ...] = ("pointing", "dice@best")) -> pd.DataFrame:
    """One row per model variant: pooled plausibility metrics of ``dataset`` (value and CI) beside the
    faithfulness summary, wide (``<metric>``, ``<metric>_low``, ``<metric>_high``)."""
    plaus = tidy[(tidy["dataset"] == dataset) & (tidy["finding"] == POOLED) & tidy["metric"].isin(plausibility)]
    both = pd.concat([plaus[["model", "metric", "value", "ci_low", "ci_high"]],
                      summary[["model", "metric", "value", "ci_low", "ci_high"]]], ignore_index=True)
    wide = both.pivot_table(index="model", columns="metric", values=["value", "ci_low", "ci_high"], sort=False)
    out = pd.DataFrame(index=wide.index)
    for metric in both["metric"].unique():
        out[metric] = wide[("value", metric)]
        out[f"{metric}_low"] = wide[("ci_low", metric)]
        out[f"{metric}_high"] = wide[("ci_high", metric)]
    return out.reset_index()


def plausibility_faithfulness_figure(frame: pd.DataFrame, *, x: str = "pointing", y: str = "faithfulness",
                                     title: str = "") -> plt.Figure:
    """Scatter of plausibility ``x`` against faithfulness ``y`` per model variant, with 95 % CI bars."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    frame = frame.dropna(subset=[x, y])
    for _, row in frame.iterrows():
        ax.errorbar(row[x], row[y], xerr=[[row[x] - row[f"{x}_low"]], [row[f"{x}_high"] - row[x]]],
                    yerr=[[row[y] - row[f"{y}_low"]], [row[f"{y}_high"] - row[y]]], fmt="o", capsize=3,
                    label=row["model"])
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"plausibility: {x} (pooled)")
    ax.set_ylabel(f"{y}: insertion AUC − deletion AUC" if y == "faithfulness" else y)
    ax.set_title(title or "plausibility vs faithfulness (95 % bootstrap CIs)", fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    return fig
