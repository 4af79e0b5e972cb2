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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import XBenchWarning
from ._sweep import as_thresholds
from .grounding import THRESHOLDS, best_threshold
from .recognition import recognition_scores, weighted_auc_ap, weighted_f1_accuracy

__all__ = [
    "DATASET_LEVEL",
    "POOLED",
    "TIDY_COLUMNS",
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
]

#: ``finding`` of rows that average the per-class values of a dataset (unweighted).
DATASET_LEVEL = "(mean over classes)"
#: ``finding`` of rows that average all pairs of a dataset together (micro mean).
POOLED = "(pooled)"

POINTING = "pointing"
DICE_BEST = "dice@best"
IOU_BEST = "iou@best"
BEST_TAU = "best_tau"
AUC = "auc"
AUPRC = "auprc"
F1 = "f1"
ACCURACY = "accuracy"
HAMMING_ACCURACY = "hamming_accuracy"

#: Columns of :func:`score_table`'s output, in order.
TIDY_COLUMNS = ("model", "dataset", "finding", "metric", "value", "ci_low", "ci_high", "n")
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
    """

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_dropped: np.ndarray
    n_boot: int


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
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be ≥ 0; got {n_boot}")
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
    for s in range(0, n_boot, batch_size):
        b = min(batch_size, n_boot - s)
        draws = rng.integers(0, n_cases, size=(b, n_cases))
        flat = (draws + (np.arange(b) * n_cases)[:, None]).ravel()
        weights = np.bincount(flat, minlength=b * n_cases).reshape(b, n_cases).astype(np.float64)
        out = np.asarray(statistic(weights), dtype=np.float64).reshape(b, -1)
        if out.shape[1] != k:
            raise ValueError(f"statistic returned {out.shape[1]} values per replicate but the point estimate has {k}")
        reps[s : s + b] = out
    n_dropped = np.isnan(reps).sum(axis=0)
    q = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns → NaN bounds
        low, high = np.nanpercentile(reps, [q, 100 - q], axis=0)
    return BootstrapCI(value, low, high, n_dropped, n_boot)


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=-1)


def _choose(num: np.ndarray, den: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From weighted Dice sums ``num`` (B, T) and weight totals ``den`` (B,): per row the
    first τ index maximising the mean (ties → smallest τ), that mean, and the rows with ``den > 0``."""
    ok = den > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = num / den[:, None]
    a = np.argmax(np.where(ok[:, None], mean, 0.0), axis=1)
    return a, mean[np.arange(len(a)), a], ok


def _iou_at(ws: Sequence[np.ndarray], js: Sequence[np.ndarray], a: np.ndarray) -> np.ndarray:
    """Σ_p w[b, p] · j[p, a_b] summed over (weights, IoU curves) blocks: (B,)."""
    return sum(np.einsum("bp,pb->b", w, j[:, a]) for w, j in zip(ws, js))


def _best_weighted(w: np.ndarray, d: np.ndarray, j: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(B, 3) dice@best, iou@best, τ with τ re-chosen per row of weights (ties → smallest τ)."""
    den = w.sum(axis=1)
    a, dice_best, ok = _choose(w @ d, den, t)
    out = np.stack([dice_best, _iou_at([w], [j], a) / np.where(ok, den, 1.0), t[a]], axis=1)
    out[~ok] = np.nan
    return out


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

        ``n`` is the number of pairs with a defined value (grounding), of cases
        with a known label (recognition), of known label entries
        (``hamming_accuracy``), or of classes averaged (:data:`DATASET_LEVEL`).

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
      are reported in one :class:`~xbench.errors.XBenchWarning`.
    * Recognition metrics follow :func:`~xbench.metrics.recognition_scores`
      (classes without both label values are NaN and not averaged).

    Examples
    --------
    >>> from xbench.metrics import grounding_scores
    >>> g = grounding_scores([[[0.0, 1.0], [0.2, 0.4]]] * 2, [[[False, True], [False, False]]] * 2)
    >>> t = score_table(g.to_frame(["a", "b"], "Nodule"), model="m", dataset="d", n_boot=0)
    >>> t.loc[t.finding == "Nodule", ["metric", "value"]].head(3).to_dict("list")
    {'metric': ['pointing', 'dice@0.5', 'iou@0.5'], 'value': [1.0, 1.0, 1.0]}
    """
    t = as_thresholds(thresholds)
    has_pairs = pairs is not None and len(pairs) > 0
    if pairs is not None:
        missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
        if missing:
            raise ValueError(f"pairs lacks columns {missing}; it needs {list(PAIR_COLUMNS)}")
    if (labels is None) != (scores is None):
        raise ValueError("labels and scores go together: pass both or neither")
    if labels is not None:
        if not labels.index.is_unique:
            raise ValueError("labels must have one row per case (its index holds duplicate case ids)")
        scores = scores.reindex(index=labels.index, columns=labels.columns)

    # classes and cases, in a fixed order
    order: list = list(findings) if findings is not None else []
    if findings is None:
        if has_pairs:
            order += list(dict.fromkeys(pairs["finding"]))
        if labels is not None:
            order += [c for c in labels.columns if c not in order]
    if has_pairs:
        unknown = sorted(set(pairs["finding"]) - set(order), key=str)
        if unknown:
            raise ValueError(f"pairs hold findings {unknown} that are not in findings={order}")
    case_keys = []
    if has_pairs:
        case_keys.append(pd.Index(pairs["case_id"]))
    if labels is not None:
        case_keys.append(pd.Index(labels.index))
    if not case_keys:
        raise ValueError("nothing to score: pass pairs and/or labels with scores")
    cases = pd.Index(pd.unique(pd.concat([k.to_series() for k in case_keys], ignore_index=True)))
    n_cases = len(cases)
    fixed_names = (dice_at(threshold), iou_at(threshold))

    specs: list[tuple[str, str]] = []  # (finding, metric), in output order
    values: list[float] = []
    counts: list[int] = []

    # -- grounding -----------------------------------------------------------------
    g_classes: list = []
    if has_pairs:
        g_classes = [f for f in order if f in set(pairs["finding"])]
        pair_case = cases.get_indexer(pairs["case_id"])
        pair_cls = pd.Index(g_classes).get_indexer(pairs["finding"])
        x = pairs[["pointing", "dice_fixed", "iou_fixed"]].to_numpy(dtype=np.float64)
        dc = np.stack([np.asarray(a, dtype=np.float64) for a in pairs["dice_curve"]])
        ic = np.stack([np.asarray(a, dtype=np.float64) for a in pairs["iou_curve"]])
        if dc.shape[1] != t.size or ic.shape != dc.shape:
            raise ValueError(f"dice_curve / iou_curve must have {t.size} values (the thresholds); got {dc.shape[1]}")
        finite_x = ~np.isnan(x)
        curve_rows = ~np.isnan(dc).all(axis=1)
        nc = len(g_classes)
        a_mat = np.zeros((len(x), 3 * nc))
        d_mat = np.zeros((len(x), 3 * nc))
        for m in range(3):
            a_mat[np.arange(len(x)), m * nc + pair_cls] = np.where(finite_x[:, m], x[:, m], 0.0)
            d_mat[np.arange(len(x)), m * nc + pair_cls] = finite_x[:, m]
        cls_rows = [np.flatnonzero((pair_cls == c) & curve_rows) for c in range(nc)]
        all_rows = np.flatnonzero(curve_rows)

        g_point = np.full((nc, 6), np.nan)  # pointing, dice@τ, iou@τ, dice@best, iou@best, τ
        g_n = np.zeros((nc, 6), int)
        for c in range(nc):
            sel = pair_cls == c
            for m in range(3):
                g_n[c, m] = int(finite_x[sel, m].sum())
                g_point[c, m] = x[sel, m][finite_x[sel, m]].mean() if g_n[c, m] else np.nan
            if cls_rows[c].size:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", XBenchWarning)
                    best = best_threshold(dc[cls_rows[c]], ic[cls_rows[c]], t)
                g_point[c, 3:] = best.dice, best.iou, best.tau
            g_n[c, 3:] = cls_rows[c].size
        names = [POINTING, *fixed_names, DICE_BEST, IOU_BEST, BEST_TAU]
        for c, f in enumerate(g_classes):
            for m, name in enumerate(names):
                specs.append((f, name))
                values.append(g_point[c, m])
                counts.append(g_n[c, m])

        cls_case = [pair_case[r] for r in cls_rows]
        cls_d = [dc[r] for r in cls_rows]
        cls_j = [ic[r] for r in cls_rows]

        def grounding_stat(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """Per-class columns (B, 6·nc) and the pooled dice@best, iou@best, τ (B, 3)."""
            wp = w[:, pair_case]
            with np.errstate(invalid="ignore", divide="ignore"):
                means = (wp @ a_mat) / (wp @ d_mat)  # (B, 3·nc)
            cols = np.empty((len(w), nc, 6))
            cols[:, :, :3] = means.reshape(len(w), 3, nc).transpose(0, 2, 1)
            ws = [w[:, idx] for idx in cls_case]
            nums = [wc @ d for wc, d in zip(ws, cls_d)]
            dens = [wc.sum(axis=1) for wc in ws]
            for c in range(nc):
                a, best, ok = _choose(nums[c], dens[c], t)
                iou_best = _iou_at([ws[c]], [cls_j[c]], a) / np.where(ok, dens[c], 1.0)
                cols[:, c, 3:] = np.stack([best, iou_best, t[a]], axis=1)
                cols[~ok, c, 3:] = np.nan
            # pooled: the classes partition the pairs, so the pooled sums are sums of class sums
            den = np.sum(dens, axis=0)
            a, best, ok = _choose(np.sum(nums, axis=0), den, t)
            pooled = np.stack([best, _iou_at(ws, cls_j, a) / np.where(ok, den, 1.0), t[a]], axis=1)
            pooled[~ok] = np.nan
            return cols.reshape(len(w), nc * 6), pooled


    # -- recognition ---------------------------------------------------------------
    r_classes: list = []
    if labels is not None:
        r_classes = [f for f in order if f in set(labels.columns)]
        y = labels[r_classes].to_numpy(dtype=np.float64)
        s = scores[r_classes].to_numpy(dtype=np.float64)
        rec = recognition_scores(y, s, threshold=prob_threshold, class_names=r_classes)
        label_case = cases.get_indexer(labels.index)
        known = ~np.isnan(y)
        for c, f in enumerate(r_classes):
            for name in (AUC, AUPRC, F1, ACCURACY):
                specs.append((f, name))
                values.append(float(getattr(rec, name)[c]))
                counts.append(int(known[:, c].sum()))
        rec_cols = [
            (label_case[known[:, c]], y[known[:, c], c], s[known[:, c], c]) if rec.defined[c] else None
            for c in range(len(r_classes))
        ]
        correct = np.zeros(n_cases)
        n_known = np.zeros(n_cases)
        np.add.at(correct, label_case, (((s >= prob_threshold) == (y == 1)) & known).sum(axis=1))
        np.add.at(n_known, label_case, known.sum(axis=1))

        def recognition_stat(w: np.ndarray) -> np.ndarray:
            out = np.full((len(w), len(r_classes), 4), np.nan)
            for c, col in enumerate(rec_cols):
                if col is not None:
                    idx, yc, sc = col
                    out[:, c, 0], out[:, c, 1] = weighted_auc_ap(yc, sc, w[:, idx])
                    out[:, c, 2], out[:, c, 3] = weighted_f1_accuracy(yc, sc, w[:, idx], prob_threshold)
            return out.reshape(len(w), -1)


    # -- dataset level and pooled: functions of the columns above / of all pairs ----
    level_metrics: list[str] = []
    if has_pairs:
        level_metrics += [POINTING, *fixed_names, DICE_BEST, IOU_BEST, BEST_TAU]
    if labels is not None:
        level_metrics += [AUC, AUPRC, F1, ACCURACY]
    class_values = np.array(values)
    members = {
        m: [i for i, (_, name) in enumerate(specs) if name == m and np.isfinite(class_values[i])]
        for m in level_metrics
    }
    for m in level_metrics:
        specs.append((DATASET_LEVEL, m))
        values.append(float(class_values[members[m]].mean()) if members[m] else np.nan)
        counts.append(len(members[m]))
    if labels is not None:
        specs.append((DATASET_LEVEL, HAMMING_ACCURACY))
        values.append(rec.hamming_accuracy)
        counts.append(int(known.sum()))
    if has_pairs:
        for m in range(3):
            specs.append((POOLED, [POINTING, *fixed_names][m]))
            values.append(float(x[finite_x[:, m], m].mean()) if finite_x[:, m].any() else np.nan)
            counts.append(int(finite_x[:, m].sum()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            best = best_threshold(dc[all_rows], ic[all_rows], t) if all_rows.size else None
        for name, v in zip((DICE_BEST, IOU_BEST, BEST_TAU), ("dice", "iou", "tau")):
            specs.append((POOLED, name))
            values.append(float(getattr(best, v)) if best is not None else np.nan)
            counts.append(int(all_rows.size))

    def statistic(w: np.ndarray) -> np.ndarray:
        """All values of ``specs`` for each row of case weights, in ``specs`` order."""
        parts = []
        if has_pairs:
            g_cols, g_pooled = grounding_stat(w)
            parts.append(g_cols)
        if labels is not None:
            parts.append(recognition_stat(w))
        cls = np.concatenate(parts, axis=1)
        extra = [_nanmean_rows(cls[:, members[m]]) if members[m] else np.full(len(w), np.nan) for m in level_metrics]
        if labels is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                extra.append((w @ correct) / (w @ n_known))
        if has_pairs:
            wp = w[:, pair_case]
            with np.errstate(invalid="ignore", divide="ignore"):
                for m in range(3):
                    extra.append((wp @ np.where(finite_x[:, m], x[:, m], 0.0)) / (wp @ finite_x[:, m].astype(float)))
            extra.extend(g_pooled.T)
        return np.concatenate([cls, np.stack(extra, axis=1)], axis=1)

    ci = bootstrap_ci(statistic, n_cases, point=np.array(values, dtype=np.float64), n_boot=n_boot, level=level, seed=seed)
    dropped = [
        f"{metric}/{finding!r}: {int(d)}"
        for (finding, metric), d, v in zip(specs, ci.n_dropped, ci.value)
        if d and np.isfinite(v)
    ]
    if dropped:
        warnings.warn(
            f"score_table({model!r}, {dataset!r}): undefined bootstrap replicates dropped (of {n_boot}): "
            + ", ".join(dropped),
            XBenchWarning,
            stacklevel=2,
        )
    return pd.DataFrame(
        {
            "model": model,
            "dataset": dataset,
            "finding": [f for f, _ in specs],
            "metric": [m for _, m in specs],
            "value": ci.value,
            "ci_low": ci.low,
            "ci_high": ci.high,
            "n": np.array(counts, dtype=np.int64),
        },
        columns=list(TIDY_COLUMNS),
    )
