"""Aggregation over pairs and classes, paired bootstrap CIs, and the tidy results table.

Levels of aggregation (XBench Table 1 is the dataset level, Tables 3–5 the class level):

* **class** — the mean over that class's positive pairs (NaN-skipping); for
  recognition metrics, the class's AUC / AUPRC / F1 / accuracy;
* **dataset** (:data:`DATASET_LEVEL`) — the unweighted mean over the classes
  whose value is defined;
* **pooled** (:data:`POOLED`, grounding only) — the micro mean over all pairs
  of the dataset, and one best τ chosen over all pairs.

Confidence intervals are 95 % percentile bootstrap intervals around the **point
estimate** (the value on the original data, not the mean of the replicates as
cheXlocalize reports). Resampling is paired: one resample of the dataset's
cases (images) per replicate, shared by every class and metric of a
(model, dataset), so CIs of different metrics and classes come from the same
replicates (cheXlocalize ``eval.bootstrap_metric`` does the same over CXRs).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..core.errors import XBenchWarning
from ._sweep import as_thresholds
from .grounding import THRESHOLDS, best_threshold
from .recognition import recognition_scores, weighted_auc_ap, weighted_f1_accuracy
from .table import (  # metric names: defined with the metric table
    ACCURACY,
    AUC,
    AUPRC,
    BEST_TAU,
    DICE_BEST,
    F1,
    HAMMING_ACCURACY,
    IOU_BEST,
    POINTING,
    pair_column,
    per_pair_metrics,
)

__all__ = [
    "DATASET_LEVEL",
    "POOLED",
    "TIDY_COLUMNS",
    "COUNT_COLUMNS",
    "PAIR_COLUMNS",
    "POINTING",
    "DICE_BEST",
    "IOU_BEST",
    "BEST_TAU",
    "AUC",
    "AUPRC",
    "F1",
    "ACCURACY",
    "HAMMING_ACCURACY",
    "dice_at",
    "iou_at",
    "BootstrapCI",
    "bootstrap_ci",
    "score_table",
    "ScoredTable",
    "scored_table",
    "PreparedScore",
    "prepare_score",
    "bootstrap_batches",
    "batch_weights",
]

#: ``finding`` of rows that average the per-class values of a dataset (unweighted).
DATASET_LEVEL = "(mean over classes)"
#: ``finding`` of rows that average all pairs of a dataset together (micro mean).
POOLED = "(pooled)"


#: The count columns of the tidy table, each with one meaning (empty where it does not apply):
#: ``n_pairs`` positive (case, class) pairs with a defined value behind a grounding value;
#: ``n_cases`` cases with a known label behind a recognition value;
#: ``n_labels`` known (case, class) label entries behind ``hamming_accuracy``;
#: ``n_classes`` classes averaged into a :data:`DATASET_LEVEL` value.
COUNT_COLUMNS = ("n_pairs", "n_cases", "n_labels", "n_classes")
#: Columns of :func:`score_table`'s output, in order.
TIDY_COLUMNS = ("model", "dataset", "finding", "metric", "value", "ci_low", "ci_high", *COUNT_COLUMNS)
#: Columns :func:`score_table` needs in its per-pair table.
PAIR_COLUMNS = ("case_id", "finding", "pointing", "dice_fixed", "iou_fixed", "dice_curve", "iou_curve")


def dice_at(threshold: float) -> str:
    """Metric name of Dice at a fixed τ: ``dice_at(0.5) == "dice@0.5"``."""
    return f"dice@{threshold:g}"


def iou_at(threshold: float) -> str:
    """Metric name of IoU at a fixed τ: ``iou_at(0.5) == "iou@0.5"``."""
    return f"iou@{threshold:g}"


@dataclass
class BootstrapCI:
    """Result of :func:`bootstrap_ci` for ``K`` statistics.

    Attributes
    ----------
    value : numpy.ndarray of shape (K,)
        Point estimates.
    low, high : numpy.ndarray of shape (K,)
        Percentile bounds (NaN when no replicate is defined or ``n_boot == 0``).
    n_dropped : numpy.ndarray of shape (K,), int
        Replicates whose statistic was NaN (undefined) and were left out.
    n_boot : int
    replicates : numpy.ndarray of shape (n_boot, K), optional
        The replicates themselves (NaN = undefined), for paired comparisons
        (:mod:`xbench.metrics.compare`); None when ``n_boot == 0``.
    """

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_dropped: np.ndarray
    n_boot: int
    replicates: np.ndarray | None = None


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def bootstrap_ci(
    statistic: Callable[[np.ndarray], np.ndarray],
    n_cases: int,
    *,
    point: np.ndarray | None = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int | np.random.Generator | None = 0,
    batch_size: int = 100,
) -> BootstrapCI:
    """Percentile bootstrap of statistics computed from case weights.

    Parameters
    ----------
    statistic : callable
        ``statistic(weights) -> (B, K)``, where ``weights`` is ``(B, n_cases)``
        float64: each row gives how many times each case is drawn in one
        replicate. A statistic that computes several metrics from the same
        ``weights`` gets *paired* replicates. NaN marks an undefined replicate.
    n_cases : int
        Number of resampled units (images).
    point : array-like of shape (K,), optional
        Point estimates; default ``statistic(ones((1, n_cases)))[0]``.
    n_boot : int, default=1000
        Replicates; 0 gives NaN bounds.
    level : float, default=0.95
    seed : int, numpy.random.Generator or None, default=0
        Seeds a fresh ``numpy.random.default_rng`` (no global state).
    batch_size : int, default=100
        Replicates evaluated per call of ``statistic`` (bounds memory).

    Returns
    -------
    BootstrapCI

    Notes
    -----
    Each replicate draws ``n_cases`` cases uniformly with replacement. Bounds
    are ``np.percentile`` at ``100·(1 − level)/2`` and ``100·(1 + level)/2`` (2.5
    and 97.5 by default, linear interpolation) of the defined replicates; NaN
    replicates are dropped and counted in ``n_dropped``. The point estimate is
    not recentred, so with a skewed bootstrap distribution it need not be the
    midpoint; it can even fall outside the bounds for a statistic that is
    biased under resampling (e.g. a maximum over thresholds).

    Examples
    --------
    >>> x = np.array([0.0, 1.0, 1.0, 1.0])
    >>> ci = bootstrap_ci(lambda w: (w @ x / w.sum(1))[:, None], 4, n_boot=200, seed=1)
    >>> float(ci.value[0]), bool(ci.low[0] <= 0.75 <= ci.high[0])
    (0.75, True)
    """
    if n_cases < 1:
        raise ValueError(f"n_cases must be ≥ 1; got {n_cases}")
    _check_bootstrap(n_boot, level)
    value = (
        np.atleast_1d(np.asarray(statistic(np.ones((1, n_cases))), dtype=np.float64)[0])
        if point is None
        else np.atleast_1d(np.asarray(point, dtype=np.float64))
    )
    k = value.size
    if n_boot == 0:
        nan = np.full(k, np.nan)
        return BootstrapCI(value, nan, nan.copy(), np.zeros(k, int), 0)
    rng = _rng(seed)
    reps = np.empty((n_boot, k))
    for s, b in bootstrap_batches(n_boot, batch_size):
        reps[s : s + b] = _batch_replicates(statistic, _draw_weights(rng, b, n_cases), k)
    return _summarise(value, reps, level)


def _check_bootstrap(n_boot: int, level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be ≥ 0; got {n_boot}")


def bootstrap_batches(n_boot: int, batch_size: int = 100) -> list[tuple[int, int]]:
    """``(first replicate, replicates)`` of each call of the statistic in :func:`bootstrap_ci`, in order.

    Examples
    --------
    >>> bootstrap_batches(250, 100)
    [(0, 100), (100, 100), (200, 50)]
    """
    return [(s, min(batch_size, n_boot - s)) for s in range(0, n_boot, batch_size)]


def _draw_weights(rng: np.random.Generator, b: int, n_cases: int) -> np.ndarray:
    """``(b, n_cases)`` float64 case weights of ``b`` replicates: counts of ``n_cases`` uniform draws each."""
    draws = rng.integers(0, n_cases, size=(b, n_cases))
    flat = (draws + (np.arange(b) * n_cases)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n_cases).reshape(b, n_cases).astype(np.float64)


def batch_weights(seed: int, n_cases: int, n_boot: int, batch: int, batch_size: int = 100) -> np.ndarray:
    """The case weights of batch ``batch`` of :func:`bootstrap_ci` with an integer ``seed``, drawn anew (the
    earlier batches' draws replayed): a batch computed by itself, e.g. in another process, gets the same
    replicates as in the whole loop.

    Examples
    --------
    >>> rng = np.random.default_rng(7)
    >>> whole = [_draw_weights(rng, b, 5) for _, b in bootstrap_batches(30, 10)]
    >>> bool((batch_weights(7, 5, 30, 2, 10) == whole[2]).all())
    True
    """
    rng = np.random.default_rng(seed)
    batches = bootstrap_batches(n_boot, batch_size)
    for _, b in batches[:batch]:
        rng.integers(0, n_cases, size=(b, n_cases))  # the earlier batches' draws, discarded
    return _draw_weights(rng, batches[batch][1], n_cases)


def _batch_replicates(statistic: Callable[[np.ndarray], np.ndarray], weights: np.ndarray, k: int) -> np.ndarray:
    out = np.asarray(statistic(weights), dtype=np.float64).reshape(len(weights), -1)
    if out.shape[1] != k:
        raise ValueError(f"statistic returned {out.shape[1]} values per replicate but the point estimate has {k}")
    return out


def _summarise(value: np.ndarray, reps: np.ndarray, level: float) -> BootstrapCI:
    """Percentile bounds and dropped counts of replicates ``reps`` (n_boot, K) around ``value`` (K,)."""
    n_dropped = np.isnan(reps).sum(axis=0)
    q = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns → NaN bounds
        low, high = np.nanpercentile(reps, [q, 100 - q], axis=0)
    return BootstrapCI(value, low, high, n_dropped, len(reps), reps)


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=-1)


def _choose(num: np.ndarray, den: np.ndarray, t: np.ndarray,
            blocks: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From weighted Dice sums ``num`` (B, T) and weight totals ``den`` (B,): per row the
    τ index maximising the mean, that mean, and the rows with ``den > 0``.

    Ties go to the **smallest τ by the point value's exact rule** (:func:`~xbench.metrics.grounding.best_threshold`):
    a row whose float means have more than one column within float noise of its maximum is decided on the pairs
    it weights, ``blocks`` = ``(weights (B, P), Dice curves (P, T))`` (integer weights = repeated pairs), by the
    same exact comparison as the point value. Without ``blocks`` the first float maximum is taken."""
    ok = den > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = num / den[:, None]
    filled = np.where(ok[:, None], mean, -np.inf)
    a = np.argmax(filled, axis=1)
    if blocks:
        top = filled[np.arange(len(a)), a]
        near = filled >= (top - 1e-9 * np.maximum(1.0, np.abs(top)))[:, None]
        for b in np.flatnonzero(ok & (near.sum(axis=1) > 1)):
            a[b] = _exact_row_choice(b, blocks, mean[b])
    a = np.where(ok, a, 0)
    return a, mean[np.arange(len(a)), a], ok


def _exact_row_choice(row: int, blocks: Sequence[tuple[np.ndarray, np.ndarray]], mean: np.ndarray) -> int:
    """The point rule (:func:`~xbench.metrics.grounding._first_exact_max`) on replicate ``row``'s resampled pairs:
    each pair repeated by its (integer) weight."""
    from .grounding import _first_exact_max

    parts = []
    for w, d in blocks:
        counts = w[row]
        if np.any(counts != np.round(counts)) or np.any(counts < 0):
            raise ValueError("exact best-τ ties need non-negative integer case weights (bootstrap counts)")
        parts.append(np.repeat(d, counts.astype(np.int64), axis=0))
    return _first_exact_max(np.concatenate(parts), mean)


def _iou_at(ws: Sequence[np.ndarray], js: Sequence[np.ndarray], a: np.ndarray) -> np.ndarray:
    """Σ_p w[b, p] · j[p, a_b] summed over (weights, IoU curves) blocks: (B,)."""
    return sum(np.einsum("bp,pb->b", w, j[:, a]) for w, j in zip(ws, js))


def _best_weighted(w: np.ndarray, d: np.ndarray, j: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(B, 3) dice@best, iou@best, τ with τ re-chosen per row of weights (ties → smallest τ)."""
    den = w.sum(axis=1)
    a, dice_best, ok = _choose(w @ d, den, t, [(w, d)])
    out = np.stack([dice_best, _iou_at([w], [j], a) / np.where(ok, den, 1.0), t[a]], axis=1)
    out[~ok] = np.nan
    return out


# -- score_table, section by section ------------------------------------------------------
# Each section holds the rows it contributes to the tidy table (point values and counts) and
# recomputes them from a (B, n_cases) matrix of bootstrap case weights, all replicates at once.


@dataclass
class _Rows:
    """Rows of the tidy table, in output order: ``(finding, metric)``, point value, counts.

    ``counts`` holds one ``{column: count}`` per row, its keys from :data:`COUNT_COLUMNS`
    (columns left out are empty in the table).
    """

    specs: list[tuple[object, str]]
    values: list[float]
    counts: list[dict[str, int]]

    @classmethod
    def empty(cls) -> _Rows:
        return cls([], [], [])

    def add(self, finding, metric: str, value: float, **counts: int) -> None:
        unknown = set(counts) - set(COUNT_COLUMNS)
        if unknown:
            raise ValueError(f"unknown count columns {sorted(unknown)}; known: {COUNT_COLUMNS}")
        self.specs.append((finding, metric))
        self.values.append(value)
        self.counts.append({k: int(v) for k, v in counts.items()})

    def __add__(self, other: _Rows) -> _Rows:
        return _Rows(self.specs + other.specs, self.values + other.values, self.counts + other.counts)


def _class_order(findings: Sequence | None, pairs: pd.DataFrame | None, labels: pd.DataFrame | None) -> list:
    """Row order of the classes: ``findings``, else first appearance in ``pairs`` then ``labels``."""
    if findings is not None:
        order = list(findings)
    else:
        order = list(dict.fromkeys(pairs["finding"])) if pairs is not None else []
        if labels is not None:
            order += [c for c in labels.columns if c not in order]
    if pairs is not None:
        unknown = sorted(set(pairs["finding"]) - set(order), key=str)
        if unknown:
            raise ValueError(f"pairs hold findings {unknown} that are not in findings={order}")
    return order


def _case_index(pairs: pd.DataFrame | None, labels: pd.DataFrame | None) -> pd.Index:
    """The resampled units: case ids of ``pairs`` then of ``labels``, each once, in order of appearance."""
    keys = [pd.Index(pairs["case_id"])] if pairs is not None else []
    if labels is not None:
        keys.append(pd.Index(labels.index))
    if not keys:
        raise ValueError("nothing to score: pass pairs and/or labels with scores")
    return pd.Index(pd.unique(pd.concat([k.to_series() for k in keys], ignore_index=True)))


class _Grounding:
    """Per-pair means (the table's per-pair metrics: pointing, Dice / IoU at the fixed τ, registered ones)
    and the best-τ rows, per class and pooled over all pairs.

    Per-pair values and curves are read once; a replicate is a weighted sum of
    them (one matrix product per class for the curves), with τ re-chosen per row.
    """

    def __init__(self, pairs: pd.DataFrame, cases: pd.Index, order: list, t: np.ndarray, threshold: float):
        self.t, self.n_cases = t, len(cases)
        per_pair = per_pair_metrics()
        self.k = k = len(per_pair)
        self.names = (*(m.at(threshold) for m in per_pair), DICE_BEST, IOU_BEST, BEST_TAU)
        present = set(pairs["finding"])
        self.classes = [f for f in order if f in present]
        self.pair_case = cases.get_indexer(pairs["case_id"])
        pair_cls = pd.Index(self.classes).get_indexer(pairs["finding"])
        x = pairs[[pair_column(m) for m in per_pair]].to_numpy(dtype=np.float64)
        dc = np.stack([np.asarray(a, dtype=np.float64) for a in pairs["dice_curve"]])
        ic = np.stack([np.asarray(a, dtype=np.float64) for a in pairs["iou_curve"]])
        if dc.shape[1] != t.size or ic.shape != dc.shape:
            raise ValueError(f"dice_curve / iou_curve must have {t.size} values (the thresholds); got {dc.shape[1]}")
        finite = ~np.isnan(x)
        curve_rows = ~np.isnan(dc).all(axis=1)
        nc, rows = len(self.classes), np.arange(len(x))
        # class means of the k per-pair metrics as (weights @ sums) / (weights @ counts)
        self.sums = np.zeros((len(x), k * nc))
        self.defined = np.zeros((len(x), k * nc))
        for m in range(k):
            self.sums[rows, m * nc + pair_cls] = np.where(finite[:, m], x[:, m], 0.0)
            self.defined[rows, m * nc + pair_cls] = finite[:, m]
        self.pooled_sums = [np.where(finite[:, m], x[:, m], 0.0) for m in range(k)]
        self.pooled_defined = [finite[:, m].astype(float) for m in range(k)]
        cls_rows = [np.flatnonzero((pair_cls == c) & curve_rows) for c in range(nc)]
        self.cls_case = [self.pair_case[r] for r in cls_rows]
        self.cls_d = [dc[r] for r in cls_rows]
        self.cls_j = [ic[r] for r in cls_rows]

        self.class_rows = _Rows.empty()
        for c, f in enumerate(self.classes):
            sel = pair_cls == c
            point, n = np.full(k + 3, np.nan), np.zeros(k + 3, int)
            for m in range(k):
                n[m] = int(finite[sel, m].sum())
                point[m] = x[sel, m][finite[sel, m]].mean() if n[m] else np.nan
            if cls_rows[c].size:
                point[k:] = self._best(dc[cls_rows[c]], ic[cls_rows[c]])
            n[k:] = cls_rows[c].size
            for m, name in enumerate(self.names):
                self.class_rows.add(f, name, point[m], n_pairs=n[m])

        self.pooled_rows = _Rows.empty()
        for m in range(k):
            any_ = finite[:, m].any()
            self.pooled_rows.add(POOLED, self.names[m], float(x[finite[:, m], m].mean()) if any_ else np.nan,
                                 n_pairs=int(finite[:, m].sum()))
        all_rows = np.flatnonzero(curve_rows)
        best = self._best(dc[all_rows], ic[all_rows]) if all_rows.size else (np.nan,) * 3
        for name, v in zip(self.names[k:], best):
            self.pooled_rows.add(POOLED, name, float(v), n_pairs=int(all_rows.size))

    def paired(self, other: _Grounding) -> _Grounding:
        """This section over ``2n`` cases: its pairs, then ``other``'s with case indices shifted by ``n``
        (:meth:`_Statistic.paired`)."""
        if self.classes != other.classes or self.k != other.k or not np.array_equal(self.t, other.t):
            raise ValueError(f"paired grounding sections need the same classes and thresholds; got {self.classes} "
                             f"and {other.classes}")
        out = object.__new__(_Grounding)
        out.t, out.k, out.names, out.classes = self.t, self.k, self.names, self.classes
        out.n_cases = 2 * self.n_cases
        shift = self.n_cases
        out.pair_case = np.concatenate([self.pair_case, other.pair_case + shift])
        out.sums, out.defined = np.vstack([self.sums, other.sums]), np.vstack([self.defined, other.defined])
        out.pooled_sums = [np.concatenate(p) for p in zip(self.pooled_sums, other.pooled_sums)]
        out.pooled_defined = [np.concatenate(p) for p in zip(self.pooled_defined, other.pooled_defined)]
        out.cls_case = [np.concatenate([a, b + shift]) for a, b in zip(self.cls_case, other.cls_case)]
        out.cls_d = [np.vstack(p) for p in zip(self.cls_d, other.cls_d)]
        out.cls_j = [np.vstack(p) for p in zip(self.cls_j, other.cls_j)]
        return out

    def _best(self, d: np.ndarray, j: np.ndarray) -> tuple[float, float, float]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            best = best_threshold(d, j, self.t)
        return best.dice, best.iou, best.tau

    def replicates(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Class columns ``(B, (k+3)·nc)`` in :attr:`class_rows` order and pooled columns ``(B, k+3)``."""
        b, nc, t, k = len(w), len(self.classes), self.t, self.k
        wp = w[:, self.pair_case]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (wp @ self.sums) / (wp @ self.defined)  # (B, k·nc)
        cols = np.empty((b, nc, k + 3))
        cols[:, :, :k] = means.reshape(b, k, nc).transpose(0, 2, 1)
        ws = [w[:, idx] for idx in self.cls_case]
        nums = [wc @ d for wc, d in zip(ws, self.cls_d)]  # (B, T) weighted Dice sums per class
        dens = [wc.sum(axis=1) for wc in ws]
        for c in range(nc):
            a, best, ok = _choose(nums[c], dens[c], t, [(ws[c], self.cls_d[c])])
            iou_best = _iou_at([ws[c]], [self.cls_j[c]], a) / np.where(ok, dens[c], 1.0)
            cols[:, c, k:] = np.stack([best, iou_best, t[a]], axis=1)
            cols[~ok, c, k:] = np.nan
        pooled = np.empty((b, k + 3))
        with np.errstate(invalid="ignore", divide="ignore"):
            for m in range(k):
                pooled[:, m] = (wp @ self.pooled_sums[m]) / (wp @ self.pooled_defined[m])
        # the classes partition the pairs, so the pooled sums are sums of class sums
        den = np.sum(dens, axis=0)
        a, best, ok = _choose(np.sum(nums, axis=0), den, t, list(zip(ws, self.cls_d)))
        pooled[:, k:] = np.stack([best, _iou_at(ws, self.cls_j, a) / np.where(ok, den, 1.0), t[a]], axis=1)
        pooled[~ok, k:] = np.nan
        return cols.reshape(b, nc * (k + 3)), pooled


class _Recognition:
    """AUC, AUPRC, F1 and accuracy rows per class, and the dataset's Hamming accuracy."""

    names = (AUC, AUPRC, F1, ACCURACY)

    def __init__(self, labels: pd.DataFrame, scores: pd.DataFrame, cases: pd.Index, order: list, prob_threshold: float):
        self.prob_threshold, self.n_cases = prob_threshold, len(cases)
        self.classes = [f for f in order if f in set(labels.columns)]
        y = labels[self.classes].to_numpy(dtype=np.float64)
        s = scores[self.classes].to_numpy(dtype=np.float64)
        rec = recognition_scores(y, s, threshold=prob_threshold, class_names=self.classes)
        label_case = cases.get_indexer(labels.index)
        known = ~np.isnan(y)
        self.class_rows = _Rows.empty()
        for c, f in enumerate(self.classes):
            for name in self.names:
                self.class_rows.add(f, name, float(getattr(rec, name)[c]), n_cases=int(known[:, c].sum()))
        self.cols = [self._column(label_case[known[:, c]], y[known[:, c], c], s[known[:, c], c]) if rec.defined[c]
                     else None for c in range(len(self.classes))]
        self.correct = np.zeros(len(cases))
        self.n_known = np.zeros(len(cases))
        np.add.at(self.correct, label_case, (((s >= prob_threshold) == (y == 1)) & known).sum(axis=1))
        np.add.at(self.n_known, label_case, known.sum(axis=1))
        self.hamming_rows = _Rows.empty()
        self.hamming_rows.add(DATASET_LEVEL, HAMMING_ACCURACY, rec.hamming_accuracy, n_labels=int(known.sum()),
                              n_cases=int(known.any(axis=1).sum()))

    def paired(self, other: _Recognition) -> _Recognition:
        """This section over ``2n`` cases: its cases, then ``other``'s shifted by ``n`` (:meth:`_Statistic.paired`)."""
        if self.classes != other.classes or self.n_cases != other.n_cases:
            raise ValueError(f"paired recognition sections need the same classes and cases; got {self.classes} "
                             f"and {other.classes}")
        out = object.__new__(_Recognition)
        out.prob_threshold, out.n_cases, out.classes = self.prob_threshold, 2 * self.n_cases, self.classes
        out.cols = []
        for a, b in zip(self.cols, other.cols):
            if a is None or b is None:
                out.cols.append(None)
                continue
            out.cols.append(self._column(np.concatenate([a[0], b[0] + self.n_cases]), np.concatenate([a[1], b[1]]),
                                         np.concatenate([a[2], b[2]])))
        out.correct = np.concatenate([self.correct, other.correct])
        out.n_known = np.concatenate([self.n_known, other.n_known])
        return out

    @staticmethod
    def _column(case: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One class's known cases sorted by decreasing score (stable), the order ``weighted_auc_ap``
        sorts into: it then finds them sorted, and the weights are gathered once per batch, not twice."""
        order = np.argsort(-s, kind="stable")
        return case[order], y[order], s[order]

    def replicates(self, w: np.ndarray) -> np.ndarray:
        """Class columns ``(B, 4·nc)`` in :attr:`class_rows` order (NaN for undefined classes)."""
        out = np.full((len(w), len(self.classes), 4), np.nan)
        for c, col in enumerate(self.cols):
            if col is not None:
                idx, yc, sc = col
                wc = w[:, idx]
                out[:, c, 0], out[:, c, 1] = weighted_auc_ap(yc, sc, wc)
                out[:, c, 2], out[:, c, 3] = weighted_f1_accuracy(yc, sc, wc, self.prob_threshold)
        return out.reshape(len(w), -1)

    def hamming(self, w: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ self.correct) / (w @ self.n_known)


class _DatasetLevel:
    """Unweighted means over classes of each metric, over the classes whose point value is defined."""

    def __init__(self, class_rows: _Rows, metrics: Sequence[str]):
        values = np.array(class_rows.values)
        self.metrics = list(metrics)
        self.members = {
            m: [i for i, (_, name) in enumerate(class_rows.specs) if name == m and np.isfinite(values[i])]
            for m in self.metrics
        }
        self.rows = _Rows.empty()
        for m in self.metrics:
            idx = self.members[m]
            # pairs add up over classes (each pair belongs to one class); cases do not (a case has many labels)
            pairs = [class_rows.counts[i].get("n_pairs") for i in idx]
            extra = {"n_pairs": sum(pairs)} if pairs and None not in pairs else {}
            self.rows.add(DATASET_LEVEL, m, float(values[idx].mean()) if idx else np.nan, n_classes=len(idx), **extra)

    def replicates(self, cls: np.ndarray) -> list[np.ndarray]:
        """One ``(B,)`` column per metric from the class columns ``cls`` (B, K)."""
        nan = np.full(len(cls), np.nan)
        return [_nanmean_rows(cls[:, self.members[m]]) if self.members[m] else nan for m in self.metrics]


def _dropped_message(rows: _Rows, ci: BootstrapCI, model: str, dataset: str, n_boot: int) -> str | None:
    """One short warning text naming the rows (with a defined point value) that lost replicates: per finding one
    count when all its metrics lost the same number (the usual case: a resample without a positive of the class),
    else ``metric count`` for each; None when no such row lost any."""
    by_finding: dict[object, dict[str, int]] = {}
    for (finding, metric), d, v in zip(rows.specs, ci.n_dropped, ci.value):
        if d and np.isfinite(v):
            by_finding.setdefault(finding, {})[metric] = int(d)
    parts = []
    for finding, counts in by_finding.items():
        values = set(counts.values())
        parts.append(f"{finding!r} {values.pop()}" if len(values) == 1 else
                     f"{finding!r} (" + ", ".join(f"{m} {d}" for m, d in counts.items()) + ")")
    if not parts:
        return None
    return (f"score_table({model!r}, {dataset!r}): undefined bootstrap replicates dropped (of {n_boot}, per class, "
            "every metric alike unless listed): " + ", ".join(parts))


def score_table(
    pairs: pd.DataFrame | None,
    *,
    model: str,
    dataset: str,
    labels: pd.DataFrame | None = None,
    scores: pd.DataFrame | None = None,
    findings: Sequence[str] | None = None,
    threshold: float = 0.5,
    thresholds=THRESHOLDS,
    prob_threshold: float = 0.5,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int | np.random.Generator | None = 0,
) -> pd.DataFrame:
    """Tidy results of one (model, dataset): every metric per class, per dataset and pooled, with CIs.

    Parameters
    ----------
    pairs : pandas.DataFrame or None
        One row per positive (case, finding) pair with columns
        :data:`PAIR_COLUMNS`: ``case_id``, ``finding``, ``pointing``,
        ``dice_fixed``, ``iou_fixed`` (floats, NaN = undefined) and
        ``dice_curve``, ``iou_curve`` (a ``(T,)`` array per row, over
        ``thresholds``) — e.g. ``GroundingScores.to_frame(...)`` concatenated over
        findings. Extra columns are ignored. None: recognition only.
    model, dataset : str
        Copied into the ``model`` / ``dataset`` columns.
    labels : pandas.DataFrame, optional
        Index = case ids, columns = findings, values 1 / 0 / NaN (unknown).
    scores : pandas.DataFrame, optional
        Probabilities with the index and columns of ``labels`` (required with
        ``labels``; reindexed to it).
    findings : sequence of str, optional
        Row order of the classes; default: order of first appearance in
        ``pairs``, then the remaining ``labels`` columns.
    threshold : float, default=0.5
        The fixed τ behind ``dice_fixed`` / ``iou_fixed``; names the metrics
        (``dice@0.5``).
    thresholds : array-like, default=THRESHOLDS
        Grid of the curves.
    prob_threshold : float, default=0.5
        F1 / accuracy predict positive when ``score ≥ prob_threshold``.
    n_boot : int, default=1000
        Bootstrap replicates (0: no CIs, bounds NaN).
    level : float, default=0.95
    seed : int, numpy.random.Generator or None, default=0

    Returns
    -------
    pandas.DataFrame
        Columns :data:`TIDY_COLUMNS`, one row per (finding, metric):

        * per finding (from ``pairs``): ``pointing``, ``dice@τ``, ``iou@τ``,
          ``dice@best``, ``iou@best``, ``best_tau``; (from ``labels``):
          ``auc``, ``auprc``, ``f1``, ``accuracy``;
        * ``finding ==`` :data:`DATASET_LEVEL`: the same metrics averaged over
          classes, plus ``hamming_accuracy``;
        * ``finding ==`` :data:`POOLED`: the grounding metrics over all pairs.

        Counts (:data:`COUNT_COLUMNS`, nullable integers, empty where a count
        does not apply), one meaning per column:

        * ``n_pairs`` — positive (case, class) pairs with a defined value:
          grounding rows per class and pooled; a :data:`DATASET_LEVEL`
          grounding row gives the sum over the classes it averages;
        * ``n_cases`` — cases with a known label: recognition rows per class;
          for ``hamming_accuracy``, cases with at least one known label;
        * ``n_labels`` — known (case, class) label entries (``hamming_accuracy``);
        * ``n_classes`` — classes with a defined value averaged into a
          :data:`DATASET_LEVEL` row (empty on every other row).

        A recognition :data:`DATASET_LEVEL` row has no ``n_cases``: its
        classes may be labelled on different cases.

    Notes
    -----
    * ``dice@best`` of a class uses the single τ maximising that class's mean
      Dice (:func:`~xbench.metrics.best_threshold`, ties → smallest τ); the
      dataset-level ``dice@best`` averages the class values (each at its own
      τ), and its ``best_tau`` is the mean of the class τ values. The pooled
      row chooses one τ over all pairs.
    * In every bootstrap replicate τ is **re-chosen** on the resampled pairs,
      so the CI includes the uncertainty of the selection.
    * Replicates where a value is undefined (a class with no resampled pair, a
      resample with a single label value for AUC, …) are dropped; the counts
      are reported in one :class:`~xbench.core.errors.XBenchWarning`.
    * Recognition metrics follow :func:`~xbench.metrics.recognition_scores`
      (classes without both label values are NaN and not averaged).

    Examples
    --------
    >>> from xbench.metrics import grounding_scores
    >>> g = grounding_scores([[[0.0, 1.0], [0.2, 0.4]]] * 2, [[[False, True], [False, False]]] * 2)
    >>> t = score_table(g.to_frame(["a", "b"], "Nodule"), model="m", dataset="d", n_boot=0)
    >>> t.loc[t.finding == "Nodule", ["metric", "value"]].head(3).to_dict("list")
    {'metric': ['pointing', 'dice@0.5', 'iou@0.5'], 'value': [1.0, 1.0, 1.0]}
    >>> t.loc[(t.finding == DATASET_LEVEL) & (t.metric == "pointing"), ["n_pairs", "n_classes"]].iloc[0].tolist()
    [2, 1]
    """
    return _scored_table(pairs, model=model, dataset=dataset, labels=labels, scores=scores, findings=findings,
                         threshold=threshold, thresholds=thresholds, prob_threshold=prob_threshold, n_boot=n_boot,
                         level=level, seed=seed, cases=None, stacklevel=4).table


class ScoredTable(NamedTuple):
    """:func:`scored_table`'s result: the tidy table and the bootstrap replicates behind its CIs."""

    table: pd.DataFrame  # score_table's output (TIDY_COLUMNS)
    replicates: np.ndarray | None  # (n_boot, len(table)): replicate b of row k; None when n_boot == 0
    cases: pd.Index  # the resampled units (case ids), in the order the replicates' weights index them
    #: every row's value from case weights over ``cases`` (for permutation tests, :mod:`xbench.metrics.compare`);
    #: None when the table was finished without it (:meth:`PreparedScore.without_statistic`)
    statistic: _Statistic | None = None


def scored_table(
    pairs: pd.DataFrame | None,
    *,
    model: str,
    dataset: str,
    labels: pd.DataFrame | None = None,
    scores: pd.DataFrame | None = None,
    findings: Sequence[str] | None = None,
    threshold: float = 0.5,
    thresholds=THRESHOLDS,
    prob_threshold: float = 0.5,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int | np.random.Generator | None = 0,
    cases: Sequence | None = None,
) -> ScoredTable:
    """:func:`score_table` that also returns its bootstrap replicates (for paired model comparisons).

    ``cases``, when given, fixes the resampled units and their order (pairs and label rows of other
    cases are left out): two calls with the same ``cases``, ``n_boot`` and integer ``seed`` draw the
    same resamples, so their replicates are paired (:mod:`xbench.metrics.compare`). By default the
    units are the case ids of ``pairs`` then of ``labels``, in order of appearance.
    """
    return _scored_table(pairs, model=model, dataset=dataset, labels=labels, scores=scores, findings=findings,
                         threshold=threshold, thresholds=thresholds, prob_threshold=prob_threshold, n_boot=n_boot,
                         level=level, seed=seed, cases=cases, stacklevel=4)


def _scored_table(pairs, *, model, dataset, labels, scores, findings, threshold, thresholds, prob_threshold, n_boot,
                  level, seed, cases, stacklevel: int) -> ScoredTable:
    """The body of :func:`score_table` / :func:`scored_table`; ``stacklevel`` points warnings at their caller."""
    prepared = prepare_score(pairs, model=model, dataset=dataset, labels=labels, scores=scores, findings=findings,
                             threshold=threshold, thresholds=thresholds, prob_threshold=prob_threshold, n_boot=n_boot,
                             level=level, seed=seed, cases=cases)
    scored, message = prepared.finish(prepared.all_replicates())
    if message is not None:
        warnings.warn(message, XBenchWarning, stacklevel=stacklevel)
    return scored


def prepare_score(
    pairs: pd.DataFrame | None,
    *,
    model: str,
    dataset: str,
    labels: pd.DataFrame | None = None,
    scores: pd.DataFrame | None = None,
    findings: Sequence[str] | None = None,
    threshold: float = 0.5,
    thresholds=THRESHOLDS,
    prob_threshold: float = 0.5,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int | np.random.Generator | None = 0,
    cases: Sequence | None = None,
) -> PreparedScore:
    """:func:`scored_table` (the same arguments) up to its bootstrap: the rows, their point values and the
    statistic, for replicates computed batch by batch (:class:`PreparedScore`).

    Examples
    --------
    >>> labels = pd.DataFrame({"Nodule": [1, 0, 1, 0]}, index=list("abcd"))
    >>> scores = pd.DataFrame({"Nodule": [0.9, 0.2, 0.6, 0.4]}, index=list("abcd"))
    >>> p = prepare_score(None, model="m", dataset="d", labels=labels, scores=scores, n_boot=250, seed=3)
    >>> reps = np.concatenate([p.replicates(i) for i in range(len(p.batches()))])  # each batch by itself
    >>> whole = scored_table(None, model="m", dataset="d", labels=labels, scores=scores, n_boot=250, seed=3)
    >>> p.finish(reps)[0].table.equals(whole.table)
    True
    """
    t = as_thresholds(thresholds)
    _check_bootstrap(n_boot, level)
    if pairs is not None:
        needed = [*PAIR_COLUMNS, *(c for c in map(pair_column, per_pair_metrics()) if c not in PAIR_COLUMNS)]
        missing = [c for c in needed if c not in pairs.columns]
        if missing:
            raise ValueError(f"pairs lacks columns {missing}; it needs {needed}")
        if len(pairs) == 0:
            pairs = None
    if (labels is None) != (scores is None):
        raise ValueError("labels and scores go together: pass both or neither")
    if labels is not None:
        if not labels.index.is_unique:
            raise ValueError("labels must have one row per case (its index holds duplicate case ids)")
        scores = scores.reindex(index=labels.index, columns=labels.columns)

    if cases is not None:
        cases = pd.Index(cases)
        if not cases.is_unique or len(cases) == 0:
            raise ValueError("cases must be a non-empty sequence of distinct case ids")
        if pairs is not None:
            pairs = pairs[pairs["case_id"].isin(cases)]
            pairs = pairs if len(pairs) else None
        if labels is not None:
            labels, scores = labels[labels.index.isin(cases)], scores[scores.index.isin(cases)]
    prepared = _prepare(pairs, labels, scores, findings, t, threshold, prob_threshold, cases)
    if len(prepared.cases) < 1:
        raise ValueError(f"n_cases must be ≥ 1; got {len(prepared.cases)}")
    return dataclasses.replace(prepared, model=model, dataset=dataset, n_boot=n_boot, level=level, seed=seed)


def _prepare(pairs, labels, scores, findings, t, threshold, prob_threshold, cases) -> PreparedScore:
    """The rows of the table and their statistic (inputs checked by :func:`_scored_table`)."""
    order = _class_order(findings, pairs, labels)
    cases = _case_index(pairs, labels) if cases is None else cases
    grounding = _Grounding(pairs, cases, order, t, threshold) if pairs is not None else None
    recognition = _Recognition(labels, scores, cases, order, prob_threshold) if labels is not None else None

    class_rows, level_metrics = _Rows.empty(), []
    if grounding is not None:
        class_rows += grounding.class_rows
        level_metrics += grounding.names
    if recognition is not None:
        class_rows += recognition.class_rows
        level_metrics += recognition.names
    over_classes = _DatasetLevel(class_rows, level_metrics)
    rows = class_rows + over_classes.rows
    if recognition is not None:
        rows += recognition.hamming_rows
    if grounding is not None:
        rows += grounding.pooled_rows
    return PreparedScore(rows, cases, "", "", 0, 0.95, None, _Statistic(grounding, recognition, over_classes))


class _Statistic:
    """Every row of a :class:`PreparedScore` for each row of case weights, in row order (picklable)."""

    def __init__(self, grounding: _Grounding | None, recognition: _Recognition | None, over_classes: _DatasetLevel):
        self.grounding, self.recognition, self.over_classes = grounding, recognition, over_classes

    def paired(self, other: _Statistic) -> _Statistic:
        """The statistic over ``2n`` cases: this model's ``n`` cases, then ``other``'s (the same cases, another
        model, built with the same classes). Weights ``[1 − s, s]`` give the model that takes image ``i`` from
        ``other`` where ``s_i = 1``: the swap of a paired permutation test (:mod:`xbench.metrics.compare`)."""
        if (self.grounding is None) != (other.grounding is None) or (self.recognition is None) != (
                other.recognition is None):
            raise ValueError("paired statistics need the same sections (grounding / recognition) in both models")
        g = self.grounding.paired(other.grounding) if self.grounding is not None else None
        r = self.recognition.paired(other.recognition) if self.recognition is not None else None
        return _Statistic(g, r, self.over_classes)

    def __call__(self, w: np.ndarray) -> np.ndarray:
        parts, pooled = [], None
        if self.grounding is not None:
            g_cols, pooled = self.grounding.replicates(w)
            parts.append(g_cols)
        if self.recognition is not None:
            parts.append(self.recognition.replicates(w))
        cls = np.concatenate(parts, axis=1)
        extra = self.over_classes.replicates(cls)
        if self.recognition is not None:
            extra.append(self.recognition.hamming(w))
        if pooled is not None:
            extra.extend(pooled.T)
        return np.concatenate([cls, np.stack(extra, axis=1)], axis=1)


@dataclass
class PreparedScore:
    """:func:`scored_table` up to its bootstrap: the rows with their point values, and the statistic that
    computes their replicates from case weights (:func:`prepare_score`).

    The replicates can be computed batch by batch, each where it suits (:meth:`replicates`, e.g. in other
    processes), and gathered in batch order into :meth:`finish`: with an integer seed the table is then the same
    bytes as :func:`scored_table`'s. :meth:`without_statistic` drops the statistic's arrays (what :meth:`finish`
    needs is small).
    """

    rows: _Rows
    cases: pd.Index
    model: str
    dataset: str
    n_boot: int
    level: float
    seed: int | np.random.Generator | None
    statistic: _Statistic | None
    batch_size: int = 100

    def batches(self) -> list[tuple[int, int]]:
        """``(first replicate, replicates)`` of each batch (:func:`bootstrap_batches`)."""
        return bootstrap_batches(self.n_boot, self.batch_size)

    @property
    def splittable(self) -> bool:
        """Whether batches can be computed apart (an integer seed: each batch's draws can be replayed)."""
        return isinstance(self.seed, (int, np.integer)) and not isinstance(self.seed, bool)

    def replicates(self, batch: int) -> np.ndarray:
        """``(b, rows)`` replicates of batch ``batch``, its weights drawn anew (:func:`batch_weights`)."""
        if not self.splittable or self.statistic is None:
            raise ValueError("batches apart need an integer seed and the statistic")
        weights = batch_weights(int(self.seed), len(self.cases), self.n_boot, batch, self.batch_size)
        return _batch_replicates(self.statistic, weights, len(self.rows.values))

    def all_replicates(self) -> np.ndarray | None:
        """Every batch in turn from one generator (None when ``n_boot == 0``)."""
        if self.n_boot == 0:
            return None
        rng, k = _rng(self.seed), len(self.rows.values)
        return np.concatenate([_batch_replicates(self.statistic, _draw_weights(rng, b, len(self.cases)), k)
                               for _, b in self.batches()])

    def without_statistic(self) -> PreparedScore:
        return dataclasses.replace(self, statistic=None)

    def finish(self, reps: np.ndarray | None) -> tuple[ScoredTable, str | None]:
        """The table from the replicates of every batch in order (None when ``n_boot == 0``), and the text of the
        warning about dropped replicates (None when none was dropped)."""
        value = np.array(self.rows.values, dtype=np.float64)
        if reps is None:
            nan = np.full(value.size, np.nan)
            ci = BootstrapCI(value, nan, nan.copy(), np.zeros(value.size, int), 0)
        else:
            ci = _summarise(value, reps, self.level)
        rows = self.rows
        table = pd.DataFrame(
            {
                "model": self.model,
                "dataset": self.dataset,
                "finding": [f for f, _ in rows.specs],
                "metric": [m for _, m in rows.specs],
                "value": ci.value,
                "ci_low": ci.low,
                "ci_high": ci.high,
                **{c: pd.array([k.get(c) for k in rows.counts], dtype="Int64") for c in COUNT_COLUMNS},
            },
            columns=list(TIDY_COLUMNS),
        )
        return (ScoredTable(table, ci.replicates, self.cases, self.statistic),
                _dropped_message(rows, ci, self.model, self.dataset, self.n_boot))
