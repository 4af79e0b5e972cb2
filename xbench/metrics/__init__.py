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

:data:`METRIC_TABLE` (:mod:`~xbench.metrics.table`) is the one table of metrics: name, kind
(grounding / recognition), per-pair function, display name, direction (``higher_is_better``; None
for ``best_tau``, which is a setting, not a score), format and a one-line description. Evaluation,
tables, report, analysis and figures read their metric names from it; :data:`METRICS` is the same
rows keyed by tidy-table name.
"""
from __future__ import annotations

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
    COUNT_COLUMNS,
    TIDY_COLUMNS,
    BootstrapCI,
    bootstrap_ci,
    dice_at,
    ScoredTable,
    iou_at,
    score_table,
    scored_table,
    PreparedScore,
    prepare_score,
)
from .compare import compare_models
from .table import METRIC_TABLE, Metric


#: Metric name → its row of :data:`~xbench.metrics.table.METRIC_TABLE` (``higher_is_better``, ``description``,
#: ``display``, ``fmt``, ``kind``) at the default τ = 0.5 (``dice_at(0.3)`` is ``"dice@0.3"``). A view of the
#: table as it is at import; :func:`xbench.metrics.table.metric` looks a name up in the live table.
METRICS: dict[str, Metric] = {m.at(0.5): m for m in METRIC_TABLE}

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
    "COUNT_COLUMNS",
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
    "PreparedScore",
    "prepare_score",
    # paired model comparisons
    "compare_models",
    # table of metrics
    "Metric",
    "METRIC_TABLE",
    "METRICS",
]
