"""Which differences are real: paired model comparisons and rank confidence from bootstrap replicates.

Conventions (docs/metrics.md: the conventions table and "Which differences are real"):

* **Paired resampling.** Every model of a dataset is bootstrapped on the *same* resamples of the
  cases (images) shared by all of them: replicate ``b`` of model A and replicate ``b`` of model B
  weight the same images (:func:`~xbench.metrics.stats.scored_table` with one ``cases`` order,
  ``n_boot`` and seed). A difference's replicate is the difference of the two models' replicates,
  so image-to-image variation common to both models cancels (cheXlocalize, Saporta et al. 2022,
  compares saliency methods with radiologists the same way). τ of ``dice@best`` / ``iou@best`` is
  re-chosen per model and replicate, as for the CIs of the metric table.
* **Difference and CI.** ``difference = value_a − value_b`` on the original data; the 95 % CI is
  the percentile interval of the replicate differences (as :func:`~xbench.metrics.bootstrap_ci`).
* **p-value.** Two-sided, from a **paired permutation test** (default ``test="permutation"``): under "the two
  models are exchangeable on each image", swapping the two models' outputs of an image leaves the distribution
  unchanged. A permuted model takes each image from A or B by a fair coin (the same coins for every row of the
  table); every row of the table is computed for the permuted models (the table's statistic,
  :meth:`ScoredTable.statistic <xbench.metrics.stats.ScoredTable>`, swapped in closed form by
  :mod:`xbench.metrics._swaps`: matrix products of the swaps with per-image sums and Dice curves, one sort of both
  models' scores per class), so for the per-pair means (pointing, Dice / IoU at τ) it is the sign-flip test of the
  per-image differences, for AUC / AUPRC the permutation of the model labels per image, and for ``dice@best`` /
  ``iou@best`` τ is re-chosen for each permuted model by the table's exact rule (ties → smallest τ).
  ``p = (1 + #{|T*| ≥ |T|}) / (1 + P)`` over ``P = n_perm`` seeded draws (exact enumeration of all ``2^n`` swaps
  when ``2^n ≤ n_perm``, then ``p = #{|T*| ≥ |T|} / 2^n``), so ``P(p ≤ α) ≤ α`` at every ``n`` (a randomisation
  test; ties of ``|T*|`` with ``|T|`` count as extreme). The paired bootstrap's Wald p (``test="bootstrap"``, ``2·Φ(−|difference| / se)``) rests on a normal
  approximation that need not hold at small ``n`` (liberal there: docs/statistics.md); it is kept for tables
  without their statistic and used by runs (``xbench.evaluation.comparisons.RUN_TEST``: the permutation test costs
  2.3–2.5× the whole evaluation at the paper's scale); there ``se = 0`` gives p = 1 for a zero difference and
  ``1 / (B + 1)`` otherwise (every replicate on one side of 0: the smallest p ``B`` replicates can show, not p = 0). The percentile CI stays the
  bootstrap's, so near α the CI and the test can disagree; ``significant`` follows the test. The null simulation
  ``benchmarks/bench_significance.py`` measures the level and the power (docs/statistics.md).
* **Correction.** Holm–Bonferroni over one **family = the model pairs of one (dataset, finding,
  metric)** (a column of a table: "which orderings of this column are real"); metrics, classes and
  datasets are separate families (they answer separate questions). ``significant`` is
  ``p_holm < α`` (α = 0.05).
* **Rank confidence.** In every replicate the models are ranked per (dataset, finding, metric)
  (1 = best, ties share the smaller rank; higher is better for every compared metric); a replicate
  where any model's value is undefined is left out. ``rank_low`` / ``rank_high`` are the 2.5 and
  97.5 % quantiles of a model's ranks (``inverted_cdf``: always ranks that occurred).

The bootstrap replicates are those the metric table's CIs already used; the permutation test evaluates
``n_perm`` swaps per model pair, the same swaps for every pair of a call (benchmarks/bench_evaluate.py
``--compare --test permutation`` measures its cost). ``scipy.stats.permutation_test`` does not fit: it permutes
one statistic of raw arrays, whereas here each permuted model re-chooses τ per class and averages classes. Holm is
written out (6 lines) because scipy has no Holm correction (``false_discovery_control`` is
Benjamini–Hochberg) and statsmodels would be a dependency for one function.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import norm, rankdata

from ..core.errors import XBenchError
from ._swaps import SwapCache, SwappedPair, shared_reads
from .stats import AUC, AUPRC, BEST_TAU, DICE_BEST, IOU_BEST, POINTING, ScoredTable, dice_at, iou_at

__all__ = [
    "ALPHA",
    "COMPARISON_COLUMNS",
    "RANK_COLUMNS",
    "compared_metrics",
    "bootstrap_p_value",
    "holm",
    "paired_differences",
    "permutation_p_values",
    "rank_intervals",
    "compare_models",
]

#: Significance level of ``significant`` (after the Holm correction).
ALPHA = 0.05
#: Default number of random swaps of the permutation test (its smallest p is 1 / (N_PERM + 1) ≈ 0.0005, below
#: Holm's 0.05 / 21 for the 21 pairs of 7 models).
N_PERM = 2000
#: Columns of :func:`compare_models`' comparisons table, in order.
COMPARISON_COLUMNS = ("dataset", "finding", "metric", "model_a", "model_b", "value_a", "value_b", "difference",
                      "ci_low", "ci_high", "p_value", "p_holm", "significant", "family_size", "n_cases", "n_boot",
                      "n_dropped")
#: Columns of :func:`compare_models`' ranks table, in order.
RANK_COLUMNS = ("dataset", "finding", "metric", "model", "value", "rank", "rank_low", "rank_high", "mean_rank",
                "p_first", "n_models", "n_boot", "n_dropped")


def compared_metrics(threshold: float = 0.5) -> tuple[str, ...]:
    """Metrics compared between models: pointing, Dice / IoU at ``threshold`` and at the best τ, AUC, AUPRC.

    Examples
    --------
    >>> compared_metrics(0.5)
    ('pointing', 'dice@0.5', 'iou@0.5', 'dice@best', 'iou@best', 'auc', 'auprc')
    """
    return (POINTING, dice_at(threshold), iou_at(threshold), DICE_BEST, IOU_BEST, AUC, AUPRC)


def bootstrap_p_value(diffs: np.ndarray, difference: np.ndarray | float, axis: int = 0, *,
                      method: str = "normal") -> np.ndarray:
    """Two-sided p-value of "no difference" from the replicate differences of a paired bootstrap.

    Parameters
    ----------
    diffs : numpy.ndarray
        Replicate differences along ``axis``; NaN (undefined replicate) is left out.
    difference : numpy.ndarray or float
        The difference on the original data (shape of ``diffs`` without ``axis``).
    axis : int, default=0
    method : {"normal", "percentile"}, default="normal"
        ``"normal"``: ``2·Φ(−|difference| / se)`` with ``se`` the standard deviation of the
        defined replicates (``scipy.stats.norm``); ``se = 0`` gives 1 when the difference is 0
        (identical models) and otherwise ``1 / (B + 1)``, the smallest p that ``B`` replicates, all on one side of 0,
        can show (not p = 0: a zero-variance bootstrap says the difference never changed sign, no more). ``"percentile"``: the inverted percentile interval,
        ``min(1, 2·min((1 + #{d ≤ 0}), (1 + #{d ≥ 0})) / (B + 1))``, which cannot go below
        ``2 / (B + 1)`` — too coarse for Holm over many pairs (21 pairs need p < 0.0024).

    Returns
    -------
    numpy.ndarray
        NaN where fewer than two replicates are defined.

    Examples
    --------
    >>> float(bootstrap_p_value(np.zeros(999), 0.0)[()])  # identical models
    1.0
    >>> round(float(bootstrap_p_value(np.array([0.0, 0.2] * 50), 0.1)[()]), 2)  # difference / se ≈ 1
    0.32
    >>> float(bootstrap_p_value(np.full(999, 0.1), 0.1)[()])  # se = 0 with a difference: 1 / (B + 1), not 0
    0.001
    >>> float(bootstrap_p_value(np.full(999, 0.1), 0.1, method="percentile")[()])  # smallest p of 999 replicates
    0.002
    """
    d = np.moveaxis(np.asarray(diffs, dtype=np.float64), axis, 0)
    difference = np.asarray(difference, dtype=np.float64)
    defined = ~np.isnan(d)
    b = defined.sum(axis=0)
    if method == "normal":
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            se = np.nanstd(d, axis=0, ddof=1)
            z = np.abs(difference) / se
        p = np.where(se > 0, 2 * norm.sf(z), np.where(difference == 0, 1.0, 1.0 / (b + 1)))
        return np.where((b > 1) & np.isfinite(difference), p, np.nan)
    if method == "percentile":
        below = (defined & (d <= 0)).sum(axis=0)
        above = (defined & (d >= 0)).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.minimum(1.0, 2 * np.minimum(below + 1, above + 1) / (b + 1))
        return np.where(b > 1, p, np.nan)
    raise ValueError(f"method must be 'normal' or 'percentile'; got {method!r}")


def holm(p_values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values of each family along ``axis`` (NaN entries are not in the family).

    Parameters
    ----------
    p_values : numpy.ndarray
        Raw p-values; the family is the slice along ``axis``.
    axis : int, default=-1

    Returns
    -------
    numpy.ndarray
        ``p_(i) ← max_{j ≤ i} min(1, (m − j + 1) · p_(j))`` over the ``m`` defined p-values sorted
        ascending; rejecting ``adjusted < α`` controls the family-wise error rate at α.

    Examples
    --------
    >>> holm(np.array([0.01, 0.04, 0.03])).round(2).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.moveaxis(np.asarray(p_values, dtype=np.float64), axis, -1)
    m = (~np.isnan(p)).sum(axis=-1, keepdims=True)
    order = np.argsort(np.where(np.isnan(p), np.inf, p), axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    factor = m - np.arange(p.shape[-1])  # m, m − 1, …; NaN entries sort last
    adjusted = np.fmax.accumulate(np.minimum(1.0, factor * sorted_p), axis=-1)
    out = np.empty_like(p)
    np.put_along_axis(out, order, np.where(np.isnan(sorted_p), np.nan, adjusted), axis=-1)
    return np.moveaxis(out, -1, axis)


def paired_differences(point_a: np.ndarray, point_b: np.ndarray, reps_a: np.ndarray, reps_b: np.ndarray, *,
                       level: float = 0.95) -> dict[str, np.ndarray]:
    """Difference A − B with percentile CI and bootstrap p-value, from paired replicates (vectorised).

    Parameters
    ----------
    point_a, point_b : numpy.ndarray of shape (...,)
        Values on the original data (any trailing shape ``S``).
    reps_a, reps_b : numpy.ndarray of shape (B, ...)
        Replicates of the same resamples (row ``b`` of both weights the same cases).
    level : float, default=0.95

    Returns
    -------
    dict of numpy.ndarray of shape S
        ``difference``, ``ci_low``, ``ci_high``, ``p_value`` and ``n_dropped`` (replicates where
        either value is undefined).

    Examples
    --------
    >>> r = paired_differences(np.array([0.6]), np.array([0.6]), np.full((50, 1), 0.6), np.full((50, 1), 0.6))
    >>> [float(r[k][0]) for k in ("difference", "ci_low", "ci_high", "p_value")]
    [0.0, 0.0, 0.0, 1.0]
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    ra, rb = np.asarray(reps_a, dtype=np.float64), np.asarray(reps_b, dtype=np.float64)
    if ra.shape != rb.shape:
        raise ValueError(f"replicates of A and B must have the same shape (same resamples); got {ra.shape}, {rb.shape}")
    d = ra - rb
    q = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices → NaN bounds
        low, high = np.nanpercentile(d, [q, 100 - q], axis=0) if d.size else (np.full(d.shape[1:], np.nan),) * 2
    difference = np.asarray(point_a, dtype=np.float64) - np.asarray(point_b, dtype=np.float64)
    return {"difference": difference, "ci_low": low, "ci_high": high,
            "p_value": bootstrap_p_value(d, difference, axis=0) if d.size else np.full(d.shape[1:], np.nan),
            "n_dropped": np.isnan(d).sum(axis=0)}


def permutation_p_values(a: ScoredTable, b: ScoredTable, rows: np.ndarray, *, n_perm: int = N_PERM,
                         seed: int = 0, batch_size: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Observed differences A − B of table rows ``rows`` and their paired permutation p-values (module docstring).

    Parameters
    ----------
    a, b : ScoredTable
        Two models' :func:`~xbench.metrics.stats.scored_table` results on the same ``cases``, each with its
        ``statistic``.
    rows : numpy.ndarray of int
        Positions of the compared rows in the tables (the same rows in both).
    n_perm : int, default=N_PERM
        Random swaps (all ``2^n`` when ``2^n ≤ n_perm``: the exact test).
    seed : int, default=0
        Seeds the swaps: the same seed, cases and ``n_perm`` give the same p-values.
    batch_size : int, default=100
        Swaps drawn per call of the generator (part of the seed rule: ``batch_size × n`` coins at a time).

    Returns
    -------
    (difference, p_value) : tuple of numpy.ndarray of shape (len(rows),)
        NaN p where the observed difference is undefined.

    Notes
    -----
    A swap's rows are computed from per-image sums, curves and one sort of both models' scores
    (:mod:`xbench.metrics._swaps`), not by recomputing the table: the same values as the paired statistic
    ``a.statistic.paired(b.statistic)`` with weights ``[1 − s, s]`` (its definition) up to float summation order.

    Examples
    --------
    >>> from xbench.metrics import scored_table
    >>> labels = pd.DataFrame({"A": [1, 0] * 6}, index=[f"c{i}" for i in range(12)])
    >>> good = scored_table(None, model="g", dataset="d", labels=labels, scores=labels * 0.8 + 0.1, n_boot=0)
    >>> flat = scored_table(None, model="f", dataset="d", labels=labels, scores=labels * 0 + 0.5, n_boot=0)
    >>> diff, p = permutation_p_values(good, flat, np.array([0]))  # row 0: AUC of class A; 2^12 > 2000 swaps
    >>> float(diff[0]), bool(p[0] < 0.01)
    (0.5, True)
    """
    _check_permutable(a, b)
    if n_perm < 1:
        raise ValueError(f"n_perm must be ≥ 1; got {n_perm}")
    swaps, exact = _swaps(len(a.cases), n_perm, seed, batch_size)
    return _permutation([a, b], [(0, 1)], np.asarray(rows, dtype=int), swaps, exact)[0]


def _check_permutable(a: ScoredTable, b: ScoredTable) -> None:
    if a.statistic is None or b.statistic is None:
        raise XBenchError("the permutation test needs each table's statistic (scored_table keeps it; a table "
                          "finished without it cannot be permuted): rescore it, or pass test='bootstrap'")
    if not a.cases.equals(b.cases):
        raise XBenchError("a permutation test pairs the same images: the two tables have different cases")


def _swaps(n: int, n_perm: int, seed: int, batch_size: int) -> tuple[np.ndarray, bool]:
    """The swaps (int8, one row per swap, 1 = the image's two models exchanged) and whether they are all ``2^n``
    (``2^n ≤ n_perm``: the exact test); otherwise ``n_perm`` rows drawn ``batch_size`` at a time from
    ``numpy.random.default_rng(seed)`` (the same swaps for every model pair of a call)."""
    exact = n < 63 and 2 ** n <= n_perm
    total = 2 ** n if exact else n_perm
    rng = np.random.default_rng(seed)
    parts = []
    for start in range(0, total, batch_size):
        m = min(batch_size, total - start)
        if exact:
            parts.append(((np.arange(start, start + m)[:, None] >> np.arange(n)) & 1).astype(np.int8))
        else:
            parts.append(rng.integers(0, 2, size=(m, n)).astype(np.int8))
    return np.concatenate(parts), exact


def _permutation(tables: Sequence[ScoredTable], pairs: Sequence[tuple[int, int]], rows: np.ndarray,
                 swaps: np.ndarray, exact: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`permutation_p_values` of each pair ``(i, j)`` of ``tables`` on the given swaps, batch by batch (each
    batch's per-model counts shared by the pairs, :class:`~xbench.metrics._swaps.SwapCache`): ``p = #extreme / 2^n``
    (exact) or ``(1 + #extreme) / (1 + #defined)``, ``|T*| ≥ |T|`` up to 1e-12 relative (ties count as extreme)."""
    n = len(tables[0].cases)
    metrics = set(tables[0].table["metric"].to_numpy()[rows]) if len(rows) else set()
    curves, ranks = bool(metrics & {DICE_BEST, IOU_BEST, BEST_TAU}), bool(metrics & {AUC, AUPRC})
    engines = [SwappedPair(tables[i].statistic, tables[j].statistic, n, curves=curves, ranks=ranks) for i, j in pairs]

    def diff(engine: SwappedPair, cache: SwapCache) -> np.ndarray:
        ta, tb = engine(cache.s, cache)
        return ta[:, rows] - tb[:, rows]

    reads = shared_reads(engines)
    held = sum(len(rows_all) + len(rows_pos) for _, rows_all, rows_pos in reads.values())
    chunk = max(1, min(len(swaps), _CHUNK // max(n, 1), _CACHE // max(held, 1)))
    out = []
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        zero = SwapCache(np.zeros((1, n)))
        observed = [diff(e, zero)[0] for e in engines]
        extreme = [np.zeros(len(rows)) for _ in engines]
        defined = [np.zeros(len(rows)) for _ in engines]
        tol = [1e-12 * np.maximum(1.0, np.abs(o)) for o in observed]
        for start in range(0, len(swaps), chunk):
            cache = SwapCache(swaps[start:start + chunk], reads)
            for e, engine in enumerate(engines):
                t = diff(engine, cache)
                ok = ~np.isnan(t)
                extreme[e] += (ok & (np.abs(t) >= np.abs(observed[e]) - tol[e])).sum(axis=0)
                defined[e] += ok.sum(axis=0)
        for o, x, d in zip(observed, extreme, defined):
            p = x / d if exact else (1 + x) / (1 + d)
            out.append((o, np.where(np.isnan(o), np.nan, np.minimum(p, 1.0))))
    return out


#: Swap × image cells computed together (bounds memory: a few arrays of this many values).
_CHUNK = 2_000_000
#: Swap × count cells of a batch's shared counts (int32 each).
_CACHE = 60_000_000


def rank_intervals(point: np.ndarray, reps: np.ndarray, *, level: float = 0.95) -> dict[str, np.ndarray]:
    """Ranks of ``M`` models (1 = highest value) on the data and their distribution over replicates.

    Parameters
    ----------
    point : numpy.ndarray of shape (M, ...)
        Values on the original data.
    reps : numpy.ndarray of shape (M, B, ...)
        Paired replicates of the same models.
    level : float, default=0.95

    Returns
    -------
    dict of numpy.ndarray
        ``rank`` (M, ...) on the data (NaN where a model's value is undefined; ties share the smaller
        rank, ``scipy.stats.rankdata(method="min")``), ``rank_low`` / ``rank_high`` (the
        ``(1 ± level)/2`` quantiles of the replicate ranks, ``inverted_cdf``), ``mean_rank``,
        ``p_first`` (share of replicates ranking the model first) and ``n_dropped`` (...) —
        replicates left out because some model's value is undefined in them.

    Examples
    --------
    >>> r = rank_intervals(np.array([0.9, 0.1]), np.array([[0.9, 0.8], [0.1, 0.2]]))
    >>> r["rank"].tolist(), r["rank_low"].tolist(), r["rank_high"].tolist()
    ([1.0, 2.0], [1.0, 2.0], [1.0, 2.0])
    """
    point, reps = np.asarray(point, dtype=np.float64), np.asarray(reps, dtype=np.float64)
    if reps.shape[1] == 0:  # no bootstrap: ranks on the data only
        reps = np.full((point.shape[0], 1, *point.shape[1:]), np.nan)
    with np.errstate(invalid="ignore"):
        rank = rankdata(-point, axis=0, method="min", nan_policy="omit")
    rank = np.where(np.isnan(point), np.nan, rank)
    r = rankdata(-reps, axis=0, method="min", nan_policy="propagate")  # a replicate with any NaN → all NaN
    r = np.where(np.isnan(reps).any(axis=0, keepdims=True), np.nan, r)
    n_dropped = np.isnan(r[0]).sum(axis=0) if len(r) else np.zeros(point.shape[1:], int)
    q = (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanquantile(r, [q, 1 - q], axis=1, method="inverted_cdf")
        mean = np.nanmean(r, axis=1)
        first = np.nanmean(np.where(np.isnan(r), np.nan, r == 1), axis=1)
    return {"rank": rank, "rank_low": low, "rank_high": high, "mean_rank": mean, "p_first": first,
            "n_dropped": n_dropped}


def _aligned(results: Mapping[str, ScoredTable], metrics: Sequence[str]
             ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """Rows (finding, metric) compared, values (M, K) and replicates (M, B, K) of every model in those rows, and
    the rows' positions (M, K) in each model's table (the columns of its statistic)."""
    names = list(results)
    first = results[names[0]]
    for name in names[1:]:
        other = results[name]
        if not other.cases.equals(first.cases):
            raise XBenchError(f"models {names[0]!r} and {name!r} were not resampled on the same cases: paired "
                              "comparisons need one resample of the cases shared by all models (pass the same `cases`)")
        if (other.replicates is None) != (first.replicates is None) or (
                other.replicates is not None and len(other.replicates) != len(first.replicates)):
            raise XBenchError(f"models {names[0]!r} and {name!r} have different numbers of bootstrap replicates")
    keys = first.table.loc[first.table["metric"].isin(metrics), ["finding", "metric"]]
    indexes = {n: _index(results[n]) for n in names}
    keys = keys[[all(((r.finding, r.metric) in indexes[n]) for n in names) for r in keys.itertuples()]]
    keys = keys.reset_index(drop=True)
    values, reps, positions = [], [], []
    for name in names:
        where = indexes[name]
        idx = np.array([where[(f, m)] for f, m in zip(keys["finding"], keys["metric"])], dtype=int)
        values.append(results[name].table["value"].to_numpy(dtype=np.float64)[idx])
        r = results[name].replicates
        reps.append(np.empty((0, len(idx))) if r is None else r[:, idx])
        positions.append(idx)
    return keys, np.stack(values), np.stack(reps), np.stack(positions) if positions else np.empty((0, 0), int)


def _index(result: ScoredTable) -> dict[tuple, int]:
    t = result.table
    return {(f, m): i for i, (f, m) in enumerate(zip(t["finding"], t["metric"]))}


def compare_models(results: Mapping[str, ScoredTable], *, dataset: str, metrics: Sequence[str] | None = None,
                   level: float = 0.95, alpha: float = ALPHA, test: str = "permutation", n_perm: int = N_PERM,
                   seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Paired differences between every pair of models and rank intervals, for one dataset.

    Parameters
    ----------
    results : mapping of model name → :class:`~xbench.metrics.stats.ScoredTable`
        Each model's :func:`~xbench.metrics.stats.scored_table` on the **same** ``cases`` with the
        same ``n_boot`` and seed (checked: the case order must be equal), in the order wanted for
        ``model_a`` / ``model_b`` (A is the earlier model).
    dataset : str
        Copied into the ``dataset`` column.
    metrics : sequence of str, optional
        Metric names compared (default :func:`compared_metrics` at τ = 0.5); every finding row
        (classes, :data:`~xbench.metrics.DATASET_LEVEL`, :data:`~xbench.metrics.POOLED`) that all
        models have is compared.
    level : float, default=0.95
    alpha : float, default=ALPHA
        ``significant = p_holm < alpha``.
    test : {"permutation", "bootstrap"}, default="permutation"
        The p-value (module docstring): the paired permutation test (needs each table's ``statistic``) or the
        bootstrap's Wald test (liberal at small n; for tables without their statistic).
    n_perm, seed : int
        Swaps of the permutation test and their seed (:func:`permutation_p_values`).

    Returns
    -------
    comparisons : pandas.DataFrame
        Columns :data:`COMPARISON_COLUMNS`, one row per (finding, metric, model pair). ``n_cases``
        is the number of resampled (shared) cases; ``family_size`` the number of defined p-values
        Holm corrected together (the pairs of that finding and metric).
    ranks : pandas.DataFrame
        Columns :data:`RANK_COLUMNS`, one row per (finding, metric, model).

    Examples
    --------
    >>> from xbench.metrics import scored_table
    >>> labels = pd.DataFrame({"A": [1, 0, 1, 0, 1, 0, 1, 0]}, index=list("abcdefgh"))
    >>> good, bad = labels * 0.8 + 0.1, pd.DataFrame({"A": np.linspace(0, 1, 8)}, index=labels.index)
    >>> res = {m: scored_table(None, model=m, dataset="d", labels=labels, scores=s, n_boot=200, cases=labels.index)
    ...        for m, s in [("good", good), ("bad", bad)]}
    >>> comp, ranks = compare_models(res, dataset="d", metrics=["auc"])
    >>> row = comp.iloc[0]
    >>> row["model_a"], row["model_b"], round(float(row["difference"]), 3), bool(row["ci_low"] <= 0.625 <= row["ci_high"])
    ('good', 'bad', 0.625, True)
    >>> ranks.loc[ranks.finding == "A", ["model", "rank"]].to_dict("list")
    {'model': ['good', 'bad'], 'rank': [1.0, 2.0]}
    """
    names = list(results)
    metrics = list(compared_metrics() if metrics is None else metrics)
    if not names:
        raise ValueError("compare_models needs at least one model")
    if BEST_TAU in metrics:
        raise ValueError(f"{BEST_TAU!r} is a setting, not a score (no direction): it is not compared or ranked")
    if test not in ("permutation", "bootstrap"):
        raise ValueError(f"test must be 'permutation' or 'bootstrap'; got {test!r}")
    keys, values, reps, rows = _aligned(results, metrics)
    m, k = values.shape
    n_cases, n_boot = len(results[names[0]].cases), reps.shape[1]
    ia, ib = np.triu_indices(m, 1)
    diff = paired_differences(values[ia], values[ib], reps[ia].transpose(1, 0, 2), reps[ib].transpose(1, 0, 2),
                              level=level)
    if test == "permutation" and k and len(ia):  # one model: no pair to test
        if (rows != rows[0]).any():
            raise XBenchError(f"models {names} hold the compared rows at different places of their tables (scored "
                              "with different classes or metrics): their statistics cannot be paired")
        rows = rows[0]
        for name in names:
            _check_permutable(results[names[0]], results[name])
        if n_perm < 1:
            raise ValueError(f"n_perm must be ≥ 1; got {n_perm}")
        swaps, exact = _swaps(n_cases, n_perm, seed, 100)  # the same swaps for every pair (permutation_p_values)
        tested = _permutation([results[name] for name in names], list(zip(ia, ib)), rows, swaps, exact)
        diff["p_value"] = np.stack([p for _, p in tested])
    p_holm = holm(diff["p_value"], axis=0)  # family: the pairs of one (finding, metric)
    family = (~np.isnan(diff["p_value"])).sum(axis=0)
    pair = np.repeat(np.arange(len(ia)), k)
    col = np.tile(np.arange(k), len(ia))
    comparisons = pd.DataFrame({
        "dataset": dataset,
        "finding": keys["finding"].to_numpy()[col] if k else [],
        "metric": keys["metric"].to_numpy()[col] if k else [],
        "model_a": np.array(names, dtype=object)[ia[pair]],
        "model_b": np.array(names, dtype=object)[ib[pair]],
        "value_a": values[ia[pair], col],
        "value_b": values[ib[pair], col],
        "difference": diff["difference"].ravel(),
        "ci_low": diff["ci_low"].ravel(),
        "ci_high": diff["ci_high"].ravel(),
        "p_value": diff["p_value"].ravel(),
        "p_holm": p_holm.ravel(),
        "significant": p_holm.ravel() < alpha,
        "family_size": family[col],
        "n_cases": n_cases,
        "n_boot": n_boot,
        "n_dropped": diff["n_dropped"].ravel(),
    }, columns=list(COMPARISON_COLUMNS))
    r = rank_intervals(values, reps, level=level)
    model = np.repeat(np.arange(m), k)
    col = np.tile(np.arange(k), m)
    ranks = pd.DataFrame({
        "dataset": dataset,
        "finding": keys["finding"].to_numpy()[col] if k else [],
        "metric": keys["metric"].to_numpy()[col] if k else [],
        "model": np.array(names, dtype=object)[model],
        "value": values.ravel(),
        "rank": r["rank"].ravel(),
        "rank_low": r["rank_low"].ravel(),
        "rank_high": r["rank_high"].ravel(),
        "mean_rank": r["mean_rank"].ravel(),
        "p_first": r["p_first"].ravel(),
        "n_models": (~np.isnan(values)).sum(axis=0)[col],
        "n_boot": n_boot,
        "n_dropped": np.broadcast_to(r["n_dropped"], (m, k)).ravel(),
    }, columns=list(RANK_COLUMNS))
    return comparisons, ranks
