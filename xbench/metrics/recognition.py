"""Recognition metrics per class: AUC, AUPRC, F1, accuracy, Hamming accuracy.

Conventions (tested in ``tests/metrics/test_metrics_recognition.py``):

* ``y_true`` is ``(N, C)`` with 1 = positive, 0 = negative, NaN = unknown (not
  annotated); ``y_score`` is ``(N, C)`` float. A 1-D pair of arrays is one class.
  NumPy, pandas or torch inputs are accepted.
* Per class, cases with an unknown label are dropped for that class; their
  score may be NaN. A known label with a non-finite score raises ``ValueError``.
* A class is **defined** when its known labels hold at least one positive and
  one negative. For an undefined class every per-class metric (AUC, AUPRC, F1,
  accuracy) is NaN, and the class is counted in ``n_skipped`` and reported
  with one :class:`~xbench.core.errors.XBenchWarning`; macro means run over the
  defined classes only.
* F1 and accuracy binarise with ``y_score ≥ threshold`` (default 0.5, ``≥``):
  ``y_score`` must then be a probability (an adapter's ``to_probability``).
  AUC and AUPRC only use the ranking.
* Values equal scikit-learn's (``roc_auc_score``, ``average_precision_score``,
  ``f1_score``, ``accuracy_score`` on the class's known cases) on **defined**
  classes; AUC and AUPRC are computed by scikit-learn. On an undefined class
  (single-class labels) XBench's convention above applies even where
  scikit-learn returns a number: ``f1_score`` and ``accuracy_score`` are defined
  for single-class labels (e.g. accuracy 1.0 for all-negative labels and
  all-negative predictions), XBench gives NaN there, so every per-class metric
  is undefined on the same classes and the macro means average the same set.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

from ..core.errors import XBenchWarning
from ._sweep import as_numpy

__all__ = ["auc", "auprc", "f1", "accuracy", "hamming_accuracy", "RecognitionScores", "recognition_scores"]


def _labels_scores(y_true, y_score) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(as_numpy(y_true, "y_true"), dtype=np.float64)
    s = np.asarray(as_numpy(y_score, "y_score"), dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    if s.ndim == 1:
        s = s[:, None]
    if y.ndim != 2 or y.shape != s.shape:
        raise ValueError(f"y_true and y_score must both be (N, C) (or (N,)); got {y.shape} and {s.shape}")
    known = ~np.isnan(y)
    if not np.isin(y[known], (0.0, 1.0)).all():
        raise ValueError("y_true must hold only 1 (positive), 0 (negative) or NaN (unknown)")
    bad = known & ~np.isfinite(s)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"y_score[{r}, {c}] is {s[r, c]} but its label is known; scores of labelled cases must be finite")
    return y, s


def _defined(y: np.ndarray) -> np.ndarray:
    """(C,) bool: the class has a known positive and a known negative."""
    return (y == 1).any(axis=0) & (y == 0).any(axis=0)


def _warn_skipped(defined: np.ndarray, class_names: Sequence | None, what: str) -> None:
    skipped = np.flatnonzero(~defined)
    if skipped.size:
        names = [repr(class_names[i]) if class_names is not None else str(i) for i in skipped]
        warnings.warn(
            f"{what}: {skipped.size} of {defined.size} classes lack a positive or a negative label and score NaN "
            f"(classes {', '.join(names)})",
            XBenchWarning,
            stacklevel=3,
        )


def _per_class(y: np.ndarray, s: np.ndarray, fn, defined: np.ndarray) -> np.ndarray:
    out = np.full(y.shape[1], np.nan)
    for c in np.flatnonzero(defined):
        k = ~np.isnan(y[:, c])
        out[c] = fn(y[k, c], s[k, c])
    return out


def _f1(y: np.ndarray, s: np.ndarray, threshold: float) -> float:
    pred = s >= threshold
    pos = y == 1
    tp = np.count_nonzero(pred & pos)
    return 2.0 * tp / (2.0 * tp + np.count_nonzero(pred & ~pos) + np.count_nonzero(~pred & pos))


def _accuracy(y: np.ndarray, s: np.ndarray, threshold: float) -> float:
    return float(np.mean((s >= threshold) == (y == 1)))


def auc(y_true, y_score, *, class_names: Sequence | None = None) -> np.ndarray:
    """Area under the ROC curve per class.

    Parameters
    ----------
    y_true : array-like of shape (N, C)
        1 / 0 / NaN (unknown).
    y_score : array-like of shape (N, C)
        Any monotone score (probability or logit).
    class_names : sequence of length C, optional
        Names used in the warning about undefined classes.

    Returns
    -------
    numpy.ndarray of shape (C,)
        NaN for classes without both a positive and a negative.

    Notes
    -----
    ``sklearn.metrics.roc_auc_score`` on the class's known cases; tied scores
    count one half.

    Examples
    --------
    >>> auc([[1, 0], [0, 1], [1, np.nan], [0, 0]], [[0.9, 0.2], [0.1, 0.8], [0.4, 0.5], [0.4, 0.3]])
    array([0.875, 1.   ])
    """
    y, s = _labels_scores(y_true, y_score)
    defined = _defined(y)
    _warn_skipped(defined, class_names, "auc")
    return _per_class(y, s, roc_auc_score, defined)


def auprc(y_true, y_score, *, class_names: Sequence | None = None) -> np.ndarray:
    """Area under the precision–recall curve (average precision) per class.

    Parameters
    ----------
    y_true : array-like of shape (N, C)
    y_score : array-like of shape (N, C)
    class_names : sequence of length C, optional

    Returns
    -------
    numpy.ndarray of shape (C,)

    Notes
    -----
    ``sklearn.metrics.average_precision_score`` (step-wise, no interpolation):
    ``Σ_k (R_k − R_{k−1}) P_k`` over the distinct scores in decreasing order.
    NaN for classes without both a positive and a negative (scikit-learn would
    return 1.0 with no negatives).

    Examples
    --------
    >>> auprc([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
    array([0.83333333])
    """
    y, s = _labels_scores(y_true, y_score)
    defined = _defined(y)
    _warn_skipped(defined, class_names, "auprc")
    return _per_class(y, s, average_precision_score, defined)


def f1(y_true, y_score, *, threshold: float = 0.5, class_names: Sequence | None = None) -> np.ndarray:
    """F1 score per class with the prediction ``y_score ≥ threshold``.

    Parameters
    ----------
    y_true : array-like of shape (N, C)
    y_score : array-like of shape (N, C)
        Probabilities.
    threshold : float, default=0.5
    class_names : sequence of length C, optional

    Returns
    -------
    numpy.ndarray of shape (C,)

    Notes
    -----
    ``F1 = 2 TP / (2 TP + FP + FN)`` (= ``sklearn.metrics.f1_score``). No
    predicted positive on a defined class gives 0. NaN for undefined classes.

    Examples
    --------
    >>> f1([1, 1, 0, 0], [0.5, 0.2, 0.7, 0.1])  # TP 1, FP 1, FN 1
    array([0.5])
    """
    y, s = _labels_scores(y_true, y_score)
    defined = _defined(y)
    _warn_skipped(defined, class_names, "f1")
    return _per_class(y, s, lambda a, b: _f1(a, b, threshold), defined)


def accuracy(y_true, y_score, *, threshold: float = 0.5, class_names: Sequence | None = None) -> np.ndarray:
    """Accuracy per class with the prediction ``y_score ≥ threshold``.

    Parameters
    ----------
    y_true : array-like of shape (N, C)
    y_score : array-like of shape (N, C)
        Probabilities.
    threshold : float, default=0.5
    class_names : sequence of length C, optional

    Returns
    -------
    numpy.ndarray of shape (C,)

    Notes
    -----
    Fraction of the class's known cases predicted correctly (=
    ``sklearn.metrics.accuracy_score``). NaN for undefined classes, for
    consistency with the other per-class metrics.

    Examples
    --------
    >>> accuracy([1, 1, 0, 0], [0.5, 0.2, 0.7, 0.1])
    array([0.5])
    """
    y, s = _labels_scores(y_true, y_score)
    defined = _defined(y)
    _warn_skipped(defined, class_names, "accuracy")
    return _per_class(y, s, lambda a, b: _accuracy(a, b, threshold), defined)


def hamming_accuracy(y_true, y_score, *, threshold: float = 0.5) -> float:
    """Fraction of known entries of the label matrix predicted correctly.

    Parameters
    ----------
    y_true : array-like of shape (N, C)
    y_score : array-like of shape (N, C)
        Probabilities.
    threshold : float, default=0.5

    Returns
    -------
    float
        ``mean over known (i, c) of [(y_score ≥ threshold) == y_true]``; NaN if
        no entry is known.

    Notes
    -----
    ``1 − sklearn.metrics.hamming_loss`` when every label is known. Unknown
    (NaN) entries are left out; classes without both label values are kept
    (every known entry counts).

    Examples
    --------
    >>> hamming_accuracy([[1, 0], [0, np.nan]], [[0.7, 0.6], [0.2, 0.9]])
    0.6666666666666666
    """
    y, s = _labels_scores(y_true, y_score)
    known = ~np.isnan(y)
    if not known.any():
        return np.nan
    return float(np.mean(((s >= threshold) == (y == 1))[known]))


@dataclass
class RecognitionScores:
    """Per-class recognition results of :func:`recognition_scores`.

    Attributes
    ----------
    auc, auprc, f1, accuracy : numpy.ndarray of shape (C,)
        NaN for undefined classes.
    hamming_accuracy : float
    defined : numpy.ndarray of shape (C,), bool
        Classes with a known positive and a known negative.
    n_skipped : int
        Undefined classes.
    class_names : list or None
    """

    auc: np.ndarray
    auprc: np.ndarray
    f1: np.ndarray
    accuracy: np.ndarray
    hamming_accuracy: float
    defined: np.ndarray
    n_skipped: int
    class_names: list | None = None

    @property
    def macro(self) -> dict[str, float]:
        """Unweighted mean over defined classes of each per-class metric (NaN if none)."""
        if not self.defined.any():
            return {k: np.nan for k in ("auc", "auprc", "f1", "accuracy")}
        return {k: float(np.mean(getattr(self, k)[self.defined])) for k in ("auc", "auprc", "f1", "accuracy")}


def recognition_scores(
    y_true, y_score, *, threshold: float = 0.5, class_names: Sequence | None = None
) -> RecognitionScores:
    """All recognition metrics at once (one warning for undefined classes).

    Parameters
    ----------
    y_true : array-like of shape (N, C)
        1 / 0 / NaN (unknown).
    y_score : array-like of shape (N, C)
        Probabilities (needed for F1, accuracy and Hamming accuracy).
    threshold : float, default=0.5
        Predicted positive when ``y_score ≥ threshold``.
    class_names : sequence of length C, optional

    Returns
    -------
    RecognitionScores
        Same values as :func:`auc`, :func:`auprc`, :func:`f1`, :func:`accuracy`
        and :func:`hamming_accuracy`; ``.macro`` averages defined classes.

    Examples
    --------
    >>> r = recognition_scores([[1, 0], [0, 0], [1, 0]], [[0.8, 0.1], [0.3, 0.2], [0.6, 0.7]])
    >>> r.auc, r.n_skipped
    (array([ 1., nan]), 1)
    """
    y, s = _labels_scores(y_true, y_score)
    if class_names is not None and len(class_names) != y.shape[1]:
        raise ValueError(f"class_names has {len(class_names)} entries for {y.shape[1]} classes")
    defined = _defined(y)
    _warn_skipped(defined, class_names, "recognition_scores")
    known = ~np.isnan(y)
    return RecognitionScores(
        auc=_per_class(y, s, roc_auc_score, defined),
        auprc=_per_class(y, s, average_precision_score, defined),
        f1=_per_class(y, s, lambda a, b: _f1(a, b, threshold), defined),
        accuracy=_per_class(y, s, lambda a, b: _accuracy(a, b, threshold), defined),
        hamming_accuracy=float(np.mean(((s >= threshold) == (y == 1))[known])) if known.any() else np.nan,
        defined=defined,
        n_skipped=int((~defined).sum()),
        class_names=list(class_names) if class_names is not None else None,
    )


# -- weighted versions for the bootstrap (weights = resampling counts, (B, n)) -------------


def _group_starts(sorted_scores: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])


def weighted_auc_ap(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC AUC and average precision of one class for each row of case weights.

    ``y`` (n,) 0/1, ``s`` (n,) scores, ``w`` (B, n) non-negative weights (bootstrap
    counts). Equal to scikit-learn with ``sample_weight=w[b]`` (integer weights =
    duplicated cases). NaN where a row has no positive or no negative weight.
    """
    order = np.argsort(-s, kind="stable")  # decreasing score
    ys, ws = y[order], w[:, order]
    starts = _group_starts(s[order])
    pos = np.add.reduceat(ws * ys, starts, axis=1)  # (B, G) positive weight per distinct score
    neg = np.add.reduceat(ws * (1 - ys), starts, axis=1)
    tp, fp = np.cumsum(pos, axis=1), np.cumsum(neg, axis=1)
    total_p, total_n = tp[:, -1], fp[:, -1]
    ok = (total_p > 0) & (total_n > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # AUC: each positive beats the negatives with a lower score, ties count 1/2
        below = total_n[:, None] - fp  # negatives strictly below the group
        auc_ = (pos * (below + 0.5 * neg)).sum(axis=1) / (total_p * total_n)
        precision = np.divide(tp, tp + fp, out=np.zeros_like(tp), where=(tp + fp) > 0)
        ap = (pos * precision).sum(axis=1) / total_p
    auc_[~ok], ap[~ok] = np.nan, np.nan
    return auc_, ap


def weighted_f1_accuracy(y: np.ndarray, s: np.ndarray, w: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """F1 and accuracy of one class for each row of case weights (NaN without both label values)."""
    pred = (s >= threshold).astype(np.float64)
    pos = y.astype(np.float64)
    tp = w @ (pred * pos)
    fp = w @ (pred * (1 - pos))
    fn = w @ ((1 - pred) * pos)
    total_p, total = w @ pos, w.sum(axis=1)
    ok = (total_p > 0) & (total_p < total)
    with np.errstate(divide="ignore", invalid="ignore"):
        f1_ = 2 * tp / (2 * tp + fp + fn)
        acc = (total - fp - fn) / total
    f1_[~ok], acc[~ok] = np.nan, np.nan
    return f1_, acc
