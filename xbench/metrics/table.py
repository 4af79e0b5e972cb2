"""The one table of metrics: name, kind, per-pair function, display name, direction and format.

Every reader takes its metric names from here: the per-pair columns :func:`~xbench.metrics.score_table`
aggregates (``_Grounding``), the extra per-pair values :func:`~xbench.metrics.grounding_scores` computes,
the ranked / display names of :mod:`xbench.outputs.tables`, the summary of :mod:`xbench.outputs.report`, the grounding
metrics of :mod:`xbench.outputs.analysis` and the short labels of :mod:`xbench.outputs.figures`.

A **grounding** metric with a ``per_pair`` function is a per-pair mean: the function gets the maps of N
pairs upsampled to the evaluation grid and min–max normalised to [0, 1] (``float32 (N, H, W)``) and the
masks (``bool (N, H, W)``, never empty) and returns ``(N,)`` values (NaN = undefined, left out of the
mean). Its class value is the mean over the class's pairs, the dataset value the mean over classes,
the pooled value the mean over all pairs, each with the paired bootstrap CI. The three built-in
per-pair metrics (``pointing``, ``dice@τ``, ``iou@τ``) come from the one counting pass over the maps
(``per_pair`` None, ``column`` names their per-pair column); ``dice@best``, ``iou@best`` and
``best_tau`` are chosen over the τ curves. Recognition metrics are computed per class from labels and
scores (:mod:`xbench.metrics.recognition`).

:func:`register` adds a metric (docs/extending.md, "Add a metric").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

POINTING = "pointing"
DICE_BEST = "dice@best"
IOU_BEST = "iou@best"
BEST_TAU = "best_tau"
AUC = "auc"
AUPRC = "auprc"
F1 = "f1"
ACCURACY = "accuracy"
HAMMING_ACCURACY = "hamming_accuracy"

__all__ = ["Metric", "METRIC_TABLE", "register", "metric", "per_pair_metrics", "names", "display", "is_ranked", "is_grounding_score", "pair_column"]

PairFunction = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Metric:
    """One metric of the tidy table.

    Attributes
    ----------
    name : str
        The ``metric`` value in the tidy table; ``"dice@τ"`` / ``"iou@τ"`` stand for the run's fixed τ.
    kind : {"grounding", "recognition"}
    display : str
        Short column label of tables and figures.
    higher_is_better : bool or None
        None: a setting, not a score (``best_tau``): never ranked.
    fmt : str
        Format spec of a value in text tables (``format(v, fmt)``).
    description : str
    per_pair : callable or None
        Grounding per-pair function ``(maps, masks) -> (N,)`` (see the module docstring); None for the
        built-ins of the counting pass and for metrics chosen over curves.
    column : str or None
        The per-pair column :func:`~xbench.metrics.score_table` averages (default: ``name``); None: not a
        per-pair mean.
    """

    name: str
    kind: Literal["grounding", "recognition"]
    display: str
    higher_is_better: bool | None
    fmt: str = ".3f"
    description: str = ""
    per_pair: PairFunction | None = None
    column: str | None = None

    def at(self, threshold: float) -> str:
        """The tidy-table name at the run's fixed τ (``"dice@τ"`` → ``"dice@0.5"``)."""
        return self.name.replace("τ", f"{threshold:g}")


#: Every metric, in the order of the tidy table's rows.
METRIC_TABLE: list[Metric] = [
    Metric(POINTING, "grounding", "Point", True, description="Pointing game: the map's maximum (first in row-major "
           "order) lies in the region", column="pointing"),
    Metric("dice@τ", "grounding", "Dice@τ", True, description="Dice of the normalised map binarised at v ≥ τ with the "
           "region", column="dice_fixed"),
    Metric("iou@τ", "grounding", "IoU@τ", True, description="IoU of the normalised map binarised at v ≥ τ with the region",
           column="iou_fixed"),
    Metric(DICE_BEST, "grounding", "Dice", True, description="Mean Dice at the single τ in {0, 0.01, …, 1} that "
           "maximises it (per class)"),
    Metric(IOU_BEST, "grounding", "IoU", True, description="Mean IoU at the τ chosen for dice@best"),
    Metric(BEST_TAU, "grounding", "τ*", None, ".2f", "The τ chosen for dice@best (a setting, not a score)"),
    Metric(AUC, "recognition", "AUC", True, description="Area under the ROC curve"),
    Metric(AUPRC, "recognition", "AUPRC", True, description="Area under the precision–recall curve (average precision)"),
    Metric(F1, "recognition", "F1", True, description="F1 score with score ≥ 0.5 predicted positive"),
    Metric(ACCURACY, "recognition", "Acc", True, description="Accuracy with score ≥ 0.5 predicted positive"),
    Metric(HAMMING_ACCURACY, "recognition", "Hamming", True, description="Fraction of known label-matrix entries "
           "predicted correctly"),
]

_CURVE_CHOSEN = (DICE_BEST, IOU_BEST, BEST_TAU)


def register(new: Metric) -> Metric:
    """Add a metric to :data:`METRIC_TABLE` (a per-pair grounding metric goes after the other per-pair
    ones, so the tidy table keeps its order); a name already there is an error."""
    if new.name in names():
        raise ValueError(f"metric {new.name!r} is already in the table")
    if new.kind == "grounding" and new.per_pair is not None:
        at = max(i for i, m in enumerate(METRIC_TABLE) if m.kind == "grounding" and (m.column or m.per_pair)) + 1
        METRIC_TABLE.insert(at, new)
    else:
        METRIC_TABLE.append(new)
    return new


def names(kind: str | None = None, threshold: float = 0.5) -> list[str]:
    """Tidy-table names of the metrics (of one ``kind``), fixed-τ names at ``threshold``."""
    return [m.at(threshold) for m in METRIC_TABLE if kind is None or m.kind == kind]


def metric(name: str) -> Metric:
    """The table row of a tidy-table name (``"dice@0.3"`` → the ``dice@τ`` row); KeyError if unknown."""
    for m in METRIC_TABLE:
        if m.name == name or ("τ" in m.name and name.startswith(m.name.split("τ")[0]) and name != m.name
                              and name.split("@")[-1].replace(".", "", 1).isdigit()):
            return m
    raise KeyError(name)


def per_pair_metrics() -> list[Metric]:
    """Grounding metrics averaged over pairs (the counting pass's and registered ones), in table order."""
    return [m for m in METRIC_TABLE if m.kind == "grounding" and m.name not in _CURVE_CHOSEN]


def pair_column(m: Metric) -> str:
    """The per-pair column of a per-pair metric."""
    return m.column or m.name


def display(name: str) -> str:
    """Short label of a tidy-table name (``dice@0.3`` → ``Dice@0.3``); the name itself when unknown."""
    try:
        m = metric(name)
    except KeyError:
        return name
    return m.display.replace("τ", name.split("@")[-1]) if "τ" in m.display else m.display


def is_grounding_score(name: str) -> bool:
    """A grounding score of the table (``pointing``, ``dice@0.5``, ``dice@best``, a registered per-pair metric;
    not ``best_tau``, a setting); False for names not in the table."""
    try:
        m = metric(name)
    except KeyError:
        return False
    return m.kind == "grounding" and m.higher_is_better is not None


def is_ranked(name: str) -> bool:
    """Whether tables rank a metric (False for settings such as ``best_tau``; unknown names are ranked)."""
    try:
        return metric(name).higher_is_better is not None
    except KeyError:
        return True
