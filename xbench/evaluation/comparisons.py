"""Paired model comparisons of an evaluated run: ``tables/comparisons.csv``, ``tables/ranks.csv`` and their report section.

:func:`compare_dataset` takes the evaluations of one dataset (every model's tidy table with the
bootstrap replicates behind its CIs) and calls :func:`xbench.metrics.compare.compare_models`.
The replicates are reused as they are when every model was resampled on the same cases (the
usual case: the same case order, replicate count and seed give the same resamples); when the
models' evaluated cases differ (cases skipped at inference for one model only), every model is
bootstrapped again on the cases all of them share, so the comparison stays paired.

Conventions (paired resampling, permutation p-value, Holm family, rank intervals): see
:mod:`xbench.metrics.compare`.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core.atomic import write_frame
from ..core.errors import XBenchError, XBenchWarning
from ..metrics import DATASET_LEVEL, ScoredTable
from ..metrics.compare import ALPHA, COMPARISON_COLUMNS, RANK_COLUMNS, compare_models, compared_metrics

__all__ = ["COMPARISONS_FILE", "RANKS_FILE", "compare_dataset", "for_comparison", "write_comparisons", "load_comparisons",
           "pairwise_matrix", "plot_pairwise", "comparisons_blocks"]

COMPARISONS_FILE = "comparisons.csv"
RANKS_FILE = "ranks.csv"


RUN_TEST = "permutation"
"""The p-value of a run's ``comparisons.csv`` and its tables' marks: the paired permutation test
(:func:`~xbench.metrics.compare.permutation_p_values`, swaps in closed form by :mod:`xbench.metrics._swaps`), which
keeps its level at every n, where the bootstrap's Wald test (``"bootstrap"``) is liberal at small n
(docs/statistics.md). Its cost at the paper's scale on 2 CPU cores: 52.0 s against 22.2 s of CPU for the tables and
comparisons, 318 s against 127 s of wall time with ground truth (``benchmarks/bench_evaluate.py --models 7 --compare
--test permutation|bootstrap``); ``compare_models(..., test="bootstrap")`` gives the Wald test on scored tables."""


def compare_dataset(dataset: str, evaluated: Mapping[str, Any], *, threshold: float = 0.5,
                    metrics: Sequence[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Comparisons and ranks of one dataset from its per-model evaluations.

    Parameters
    ----------
    dataset : str
    evaluated : mapping of model → :class:`xbench.evaluation.evaluate.PairEvaluation`
        In run order. Each needs ``scored`` (table + replicates) and ``rescore`` (the same
        ``scored_table`` call, taking ``cases=``).
    threshold : float, default=0.5
        The run's fixed τ (names ``dice@τ`` / ``iou@τ``).
    metrics : sequence of str, optional
        Default :func:`~xbench.metrics.compare.compared_metrics` at ``threshold``.

    Returns
    -------
    (comparisons, ranks) : tuple of pandas.DataFrame
        See :func:`~xbench.metrics.compare.compare_models`.
    """
    names = list(evaluated)
    scored: dict[str, ScoredTable] = {n: evaluated[n].scored for n in names}
    first = scored[names[0]].cases
    if not all(scored[n].cases.equals(first) for n in names[1:]):
        common = set(first).intersection(*(set(scored[n].cases) for n in names[1:]))
        shared = pd.Index([c for c in first if c in common])
        if not len(shared):
            raise XBenchError(f"{dataset}: the models {names} share no evaluated case, so they cannot be compared "
                              "on the same images")
        with warnings.catch_warnings():  # dropped replicates were already reported for the metric table
            warnings.simplefilter("ignore", XBenchWarning)
            scored = {n: evaluated[n].rescore(cases=shared) for n in names}
    if RUN_TEST == "permutation":
        scored = {n: _with_statistic(s, evaluated[n]) for n, s in scored.items()}
    return compare_models(scored, dataset=dataset, metrics=metrics or compared_metrics(threshold), test=RUN_TEST)


def _with_statistic(scored: ScoredTable, evaluation: Any) -> ScoredTable:
    """``scored`` with its statistic (the permutation test's input), rebuilt without a bootstrap by ``rescore``
    when the table was finished without it (worker processes drop it)."""
    if scored.statistic is not None or getattr(evaluation, "rescore", None) is None:
        return scored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return scored._replace(statistic=evaluation.rescore(cases=scored.cases, n_boot=0).statistic)


def for_comparison(evaluated: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`compare_dataset` reads of each evaluation, to ship to a worker: its ``scored`` table and its
    ``rescore`` (the permutation test recomputes the statistic from the per-pair rows and curves it holds). The
    rest (per-pair rows of the report, curves at the best τ) is left out."""
    return {n: _ForComparison(evaluated[n].scored, evaluated[n].rescore) for n in evaluated}


class _ForComparison(NamedTuple):
    scored: ScoredTable
    rescore: Any


def write_comparisons(parts: Sequence[tuple[pd.DataFrame, pd.DataFrame]], folder: str | Path) -> list[Path]:
    """Write the concatenated comparisons and ranks of every dataset to ``folder``/(comparisons|ranks).csv."""
    folder = Path(folder)
    comparisons = pd.concat([c for c, _ in parts if len(c)] or [pd.DataFrame(columns=list(COMPARISON_COLUMNS))],
                            ignore_index=True)
    ranks = pd.concat([r for _, r in parts if len(r)] or [pd.DataFrame(columns=list(RANK_COLUMNS))], ignore_index=True)
    write_frame(comparisons, folder / COMPARISONS_FILE)
    write_frame(ranks, folder / RANKS_FILE)
    return [folder / COMPARISONS_FILE, folder / RANKS_FILE]


def load_comparisons(output_dir: str | Path, *, required: bool = False) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """``(comparisons, ranks)`` of an evaluated run, or None when it was evaluated before comparisons existed
    (``required=True``: an XBenchError saying how to make them)."""
    folder = Path(output_dir) / "tables"
    if not (folder / COMPARISONS_FILE).exists() or not (folder / RANKS_FILE).exists():
        if required:
            raise XBenchError(f"{folder} has no {COMPARISONS_FILE} / {RANKS_FILE}: the run was evaluated before paired "
                              "comparisons existed; run `xbench evaluate --config <its config>` again (no inference)")
        return None
    return pd.read_csv(folder / COMPARISONS_FILE), pd.read_csv(folder / RANKS_FILE)


def pairwise_matrix(comparisons: pd.DataFrame, *, dataset: str, metric: str, finding: str = DATASET_LEVEL,
                    models: Sequence[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Row model − column model differences and their Holm-adjusted p-values as two square DataFrames.

    Both orientations are filled (``D[b, a] = −D[a, b]``, same p); the diagonal is 0 / NaN.

    Examples
    --------
    >>> c = pd.DataFrame({"dataset": "d", "finding": DATASET_LEVEL, "metric": "auc", "model_a": ["x"],
    ...                   "model_b": ["y"], "difference": [0.25], "p_holm": [0.01]})
    >>> d, p = pairwise_matrix(c, dataset="d", metric="auc")
    >>> d.loc["y", "x"], p.loc["y", "x"]
    (np.float64(-0.25), np.float64(0.01))
    """
    sel = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)
                      & (comparisons["finding"].astype(str) == str(finding))]
    names = list(models) if models is not None else list(dict.fromkeys([*sel["model_a"], *sel["model_b"]]))
    diff = pd.DataFrame(np.nan, index=names, columns=names)
    p = diff.copy()
    for r in sel.itertuples():
        if r.model_a in diff.index and r.model_b in diff.index:
            diff.at[r.model_a, r.model_b], diff.at[r.model_b, r.model_a] = r.difference, -r.difference
            p.at[r.model_a, r.model_b] = p.at[r.model_b, r.model_a] = r.p_holm
    for n in names:
        diff.at[n, n] = 0.0
    return diff, p


def plot_pairwise(comparisons: pd.DataFrame, *, dataset: str, metrics: Sequence[str] | None = None,
                  finding: str = DATASET_LEVEL, models: Sequence[str] | None = None, alpha: float = ALPHA) -> Any:
    """One heatmap per metric of the row model − column model differences on ``dataset``; ``*`` marks
    ``p_holm < alpha``. Returns the matplotlib Figure.

    ``metrics`` default: those of the comparisons in their order; ``finding`` default: the dataset level.
    """
    import matplotlib.pyplot as plt

    sel = comparisons[comparisons["dataset"] == dataset]
    metrics = list(metrics) if metrics is not None else list(dict.fromkeys(sel["metric"]))
    if not metrics or sel.empty:
        raise XBenchError(f"no comparisons for dataset {dataset!r}: it needs at least two evaluated models")
    cols = min(4, len(metrics))
    rows = -(-len(metrics) // cols)
    names = list(models) if models is not None else list(dict.fromkeys([*sel["model_a"], *sel["model_b"]]))
    size = 0.55 * len(names) + 1.5
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        diff, p = pairwise_matrix(sel, dataset=dataset, metric=metric, finding=finding, models=names)
        limit = float(np.nanmax(np.abs(diff.to_numpy()))) or 1.0
        image = ax.imshow(diff.to_numpy(dtype=float), cmap="RdBu", vmin=-limit, vmax=limit)
        for i in range(len(names)):
            for j in range(len(names)):
                d, pv = diff.iat[i, j], p.iat[i, j]
                if i != j and np.isfinite(d):
                    ax.text(j, i, f"{d:+.2f}" + ("*" if pv < alpha else ""), ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_title(metric, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.suptitle(f"{dataset} ({finding}): row − column, * = Holm-corrected p < {alpha:g}", fontsize=10)
    fig.tight_layout()
    return fig


def _cell(v: float, text: str, ci: str = "") -> dict[str, str]:
    """A cell of the report's sortable tables: sort key ``v``, ``text`` and ``ci`` (escaped by the template)."""
    return {"v": repr(float(v)) if np.isfinite(v) else "", "text": text, "ci": ci}


def comparisons_blocks(run_dir: str | Path) -> list[dict]:
    """The "Which differences are real" section of the HTML report as template blocks (the report's Jinja2
    template escapes every string): per dataset, the rank intervals and the significant pairs at the dataset level
    (mean over classes); a note when the run has no comparisons."""
    loaded = load_comparisons(run_dir)
    if loaded is None:
        return [{"kind": "p", "text": "No tables/comparisons.csv: this run was evaluated before paired comparisons "
                                      "existed; `xbench evaluate` writes them."}]
    comparisons, ranks = loaded
    blocks: list[dict] = [{"kind": "p", "text": (
        "Paired bootstrap over the images shared by all models (the replicates of the CIs); difference = A − B with "
        "95 % percentile CI; p-values Holm–Bonferroni corrected over the model pairs of each dataset × metric × "
        f"finding; listed: the significant ones (Holm-corrected p < {ALPHA}). Rank interval: 2.5–97.5 % quantiles "
        "of each model's rank over replicates (1 = best). Full tables: tables/comparisons.csv, tables/ranks.csv.")}]
    level_c = comparisons[comparisons["finding"].astype(str) == DATASET_LEVEL]
    level_r = ranks[ranks["finding"].astype(str) == DATASET_LEVEL]
    for ds in dict.fromkeys(level_r["dataset"]):
        r = level_r[level_r["dataset"] == ds]
        metrics = [str(m) for m in dict.fromkeys(r["metric"])]
        rows = []
        for model in dict.fromkeys(r["model"]):
            cells = []
            for metric in metrics:
                x = r[(r["model"] == model) & (r["metric"] == metric)].iloc[0]
                rank = float(x["rank"])
                interval = (f"[{x['rank_low']:.0f}–{x['rank_high']:.0f}]"
                            if np.isfinite(rank) and np.isfinite(x["rank_low"]) else "")
                cells.append(_cell(rank, f"{rank:.0f}" if np.isfinite(rank) else "–", interval))
            rows.append((str(model), cells))
        blocks += [{"kind": "h3", "text": f"{ds}: rank [95 % interval], mean over classes"},
                   {"kind": "table", "table_kind": "ranks", "columns": ["model", *metrics], "rows": rows}]
        c = level_c[level_c["dataset"] == ds]
        sig = c[c["significant"].astype(bool)]
        blocks.append({"kind": "p", "text": f"{len(sig)} of {len(c)} differences significant at the dataset level."})
        if len(sig):
            rows = [(str(x.metric), [_cell(np.nan, f"{x.model_a} − {x.model_b}"),
                                     _cell(x.difference, f"{x.difference:+.3f}",
                                           f"[{x.ci_low:+.3f}, {x.ci_high:+.3f}]" if np.isfinite(x.ci_low) else ""),
                                     _cell(x.p_holm, f"{x.p_holm:.3g}")])
                    for x in sig.itertuples()]
            blocks.append({"kind": "table", "table_kind": "differences",
                           "columns": ["metric", "A − B", "difference [95 % CI]", "Holm-corrected p"], "rows": rows})
    return blocks
