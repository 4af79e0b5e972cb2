"""XBench metrics: pure functions on NumPy arrays (torch tensors are accepted and converted).

* :mod:`~xbench.metrics.grounding` — pointing game, Dice / IoU at a fixed τ and
  over the τ grid, best and oracle τ (maps at any native grid, masks at the
  evaluation grid);
* :mod:`~xbench.metrics.recognition` — AUC, AUPRC, F1, accuracy per class,
  Hamming accuracy;
* :mod:`~xbench.metrics.stats` — class / dataset / pooled aggregation, paired
  bootstrap CIs and the tidy results table (:func:`score_table`);
* :mod:`~xbench.metrics.compare` — paired differences between models, Holm
  correction and rank intervals from the same bootstrap replicates.

:data:`METRICS` lists every metric name of the tidy table with its direction
(``higher_is_better``; None for ``best_tau``, which is a setting, not a score)
and a one-line description.
"""
from __future__ import annotations

from typing import NamedTuple

from .grounding import (
    DEFAULT_GRID,
    THRESHOLDS,
    GroundingScores,
    ThresholdChoice,
    best_threshold,
    dice,
    dice_iou_curves,
    grounding_scores,
    iou,
    normalize_maps,
    oracle_threshold,
    pointing_game,
    pointing_game_tolerance,
    pointing_metric_name,
    upsample_maps,
)
from .recognition import (
    RecognitionScores,
    accuracy,
    auc,
    auprc,
    f1,
    hamming_accuracy,
    recognition_scores,
)
from .stats import (
    ACCURACY,
    AUC,
    AUPRC,
    BEST_TAU,
    DATASET_LEVEL,
    DICE_BEST,
    F1,
    HAMMING_ACCURACY,
    IOU_BEST,
    PAIR_COLUMNS,
    POINTING,
    POOLED,
    TIDY_COLUMNS,
    BootstrapCI,
    bootstrap_ci,
    dice_at,
    ScoredTable,
    iou_at,
    score_table,
    scored_table,
)
from .compare import compare_models


class MetricInfo(NamedTuple):
    """Direction and meaning of a metric of the tidy table."""

    higher_is_better: bool | None
    description: str


#: Metric name → :class:`MetricInfo`. Fixed-τ names follow the threshold (``dice_at(0.3)``
#: is ``"dice@0.3"``); the rows here are for the default τ = 0.5.
METRICS: dict[str, MetricInfo] = {
    POINTING: MetricInfo(True, "Pointing game: the map's maximum (first in row-major order) lies in the region"),
    dice_at(0.5): MetricInfo(True, "Dice of the normalised map binarised at v ≥ 0.5 with the region"),
    iou_at(0.5): MetricInfo(True, "IoU of the normalised map binarised at v ≥ 0.5 with the region"),
    DICE_BEST: MetricInfo(True, "Mean Dice at the single τ in {0, 0.01, …, 1} that maximises it (per class)"),
    IOU_BEST: MetricInfo(True, "Mean IoU at the τ chosen for dice@best"),
    BEST_TAU: MetricInfo(None, "The τ chosen for dice@best (a setting, not a score)"),
    AUC: MetricInfo(True, "Area under the ROC curve"),
    AUPRC: MetricInfo(True, "Area under the precision–recall curve (average precision)"),
    F1: MetricInfo(True, "F1 score with score ≥ 0.5 predicted positive"),
    ACCURACY: MetricInfo(True, "Accuracy with score ≥ 0.5 predicted positive"),
    HAMMING_ACCURACY: MetricInfo(True, "Fraction of known label-matrix entries predicted correctly"),
}

__all__ = [
    # grounding
    "DEFAULT_GRID",
    "THRESHOLDS",
    "upsample_maps",
    "normalize_maps",
    "pointing_game",
    "pointing_game_tolerance",
    "pointing_metric_name",
    "dice",
    "iou",
    "dice_iou_curves",
    "ThresholdChoice",
    "best_threshold",
    "oracle_threshold",
    "GroundingScores",
    "grounding_scores",
    # recognition
    "auc",
    "auprc",
    "f1",
    "accuracy",
    "hamming_accuracy",
    "RecognitionScores",
    "recognition_scores",
    # aggregation and tables
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
    "ScoredTable",
    "scored_table",
    # paired model comparisons
    "compare_models",
    # table of metrics
    "MetricInfo",
    "METRICS",
]
