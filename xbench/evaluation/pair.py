"""One (dataset, model) of a run: its metric tables from the stored predictions and the dataset's ground truth.

:func:`evaluate_pair` computes them in one call; a run's pool computes it as one job (:func:`_evaluate_pair_job`) or,
for a large pair, in steps (:mod:`xbench.evaluation.steps`) made of the functions here: the same bytes either way.
Conventions of the tables: :mod:`xbench.evaluation.evaluate`.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core.errors import XBenchError, XBenchWarning
from ..core.workers import round_trips
from ..datasets import BaseDataset
from ..metrics import BEST_TAU, THRESHOLDS, PreparedScore, ScoredTable, grounding_scores, prepare_score, scored_table
from ..models.windows import is_whole_image, place_maps
from ..spec.config import RunConfig
from ..store.results import ResultStore
from .ground_truth import GroundTruth, load_cache, unpack_cache
from .worker_state import State, apply_state

__all__ = ["PairEvaluation", "PairError", "DatasetView", "check_annotations", "evaluate_pair"]


class DatasetView(NamedTuple):
    """What a pair's metrics read of its dataset: a small record, shipped to each step of a pair evaluated in steps
    instead of the dataset (whose case table may weigh megabytes)."""

    name: str
    findings: list[str]
    case_ids: np.ndarray  # the case ids as text, in the dataset's case order
    labels: np.ndarray  # (cases, findings): 1 / 0 / NaN (unknown)

    @classmethod
    def of(cls, dataset: BaseDataset) -> DatasetView:
        return cls(dataset.name, list(dataset.findings), dataset.cases["case_id"].astype(str).to_numpy(),
                   dataset.labels())

    @property
    def n_cases(self) -> int:
        return len(self.case_ids)


class PairEvaluation(NamedTuple):
    """Tables of one (dataset, model) from :func:`evaluate_pair`."""

    tidy: pd.DataFrame  # score_table output (TIDY_COLUMNS)
    pairs: pd.DataFrame  # one row per evaluated positive pair (no curves), with dice@best
    curves: pd.DataFrame  # mean Dice / IoU per τ per finding
    counts: dict[str, Any]  # pairs evaluated / excluded and why (evaluation_log.json)
    scored: ScoredTable | None = None  # tidy + its bootstrap replicates (paired model comparisons)
    rescore: Callable[..., ScoredTable] | None = None  # scored_table of these inputs; `cases=` restricts / orders


def check_annotations(dataset: BaseDataset, model: str, meta: dict) -> None:
    """Refuse to evaluate a store against annotation files other than those it was made with.

    The store's ``meta.json`` records the sha256 of each annotation file (``fingerprint.annotations``); they are
    hashed again here (at ``evaluate`` and at ``merge``, not only at resume). A file whose bytes changed (or
    that appeared / vanished) → :class:`~xbench.core.errors.XBenchError` naming it; metrics are never computed from
    a mix. Stores without a fingerprint (``xbench score`` of user maps) have nothing to compare.
    """
    from ..store.fingerprint import dataset_fingerprint
    from ..spec.manifests import file_entries

    stored = (meta.get("fingerprint") or {}).get("annotations")
    if stored is None:
        return
    now = dataset_fingerprint(dataset)
    changed = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    if changed:
        entries = file_entries(dataset.manifest, dataset.split)
        files = ", ".join(f"{k} ({Path(dataset.root) / entries[k]['path'] if k in entries else k})" for k in changed)
        raise XBenchError(f"{dataset.name} × {model}: annotation file(s) changed since the maps were stored: {files} "
                          f"(sha256 in store/{dataset.name}/{model}/meta.json differs). Refusing to compute metrics "
                          "from a mix: restore the file, or re-run with --overwrite to rebuild the store.")


def evaluate_pair(cfg: RunConfig, dataset: BaseDataset, model: str, gt: dict[str, GroundTruth],
                  store: ResultStore) -> PairEvaluation:
    """Tidy metrics, per-pair rows, τ curves and counts of one (dataset, model).

    Curves are over :data:`xbench.metrics.THRESHOLDS` (the grid :func:`~xbench.metrics.score_table` chooses τ on).
    A run's pool may compute the same in steps (:func:`xbench.evaluation.steps.pair_steps`: grounding by groups of findings, bootstrap
    by batches of replicates), with the same bytes.
    """
    view = DatasetView.of(dataset)
    preds = read_predictions(cfg, view, model, store, dataset=dataset)
    counts = pair_counts(view, model, preds)
    pairs, counts["pairs"] = ground_rows(cfg, view, preds, gt, range(len(view.findings)))
    head, prepared = scored_head(cfg, view, model, preds, pairs, counts)
    result, message = with_replicates(head, prepared, prepared.all_replicates())
    if message is not None:
        warnings.warn_explicit(message, XBenchWarning, *_DROPPED_AT, module=__name__, registry=_registry())
    return result


#: where the warning about dropped bootstrap replicates points, computed here or in steps (the same place)
_DROPPED_AT = (__file__, evaluate_pair.__code__.co_firstlineno)


def _registry() -> dict:
    """This module's warning registry (``warnings.warn`` keeps one per module the same way)."""
    return globals().setdefault("__warningregistry__", {})


def read_predictions(cfg: RunConfig, view: DatasetView, model: str, store: ResultStore, *,
                     dataset: BaseDataset | None = None) -> Any:
    """The stored predictions of one pair, checked against the dataset's findings, and against its annotation
    files when ``dataset`` is given (:func:`check_annotations`)."""
    preds = store.read(view.name, model, expected_chunks=math.ceil(view.n_cases / cfg.chunk_size))
    if dataset is not None:
        check_annotations(dataset, model, preds.meta)
    if preds.meta["findings"] != view.findings:
        raise XBenchError(f"store for {view.name} × {model} was made with findings {preds.meta['findings']}, "
                          f"the dataset now has {view.findings}; re-run with --overwrite")
    return preds


def pair_counts(view: DatasetView, model: str, preds: Any) -> dict[str, Any]:
    return {"dataset": view.name, "model": model, "cases": view.n_cases,
            "cases_skipped_at_inference": len(preds.skipped),
            "skip_reasons": dict(Counter(r.split(":")[0] for r in preds.skipped.values())), "pairs": {}}


def ground_rows(cfg: RunConfig, view: DatasetView, preds: Any, gt: dict[str, GroundTruth],
                findings: Iterable[int]) -> tuple[pd.DataFrame | None, dict[str, dict[str, int]]]:
    """Grounding rows (one per positive pair with a region and a prediction) of the findings with indices
    ``findings``, in their order, and each finding's pair counts (``gt`` needs these findings only)."""
    case_ids = view.case_ids
    position = {cid: i for i, cid in enumerate(preds.case_ids.tolist())}
    frames, counts = [], {}
    for c in findings:
        finding = view.findings[c]
        if finding not in gt:
            continue
        rows, masks, no_region = gt[finding]
        keep = np.array([case_ids[r] in position for r in rows], bool)
        counts[finding] = {"evaluated": int(keep.sum()), "missing_prediction": int((~keep).sum()),
                           "positive_without_region": no_region}
        if not keep.any():
            continue
        ids = case_ids[rows[keep]]
        at = [position[i] for i in ids]
        maps = preds.maps[at, c].astype(np.float32)
        windows, sizes = preds.windows[at], preds.sizes[at]
        cropped = np.isfinite(windows).all(axis=1) & ~is_whole_image(np.nan_to_num(windows), sizes)
        if cropped.any():  # the model saw only part of these images: place their maps (xbench.models.windows)
            maps = place_maps(maps, np.where(cropped[:, None], windows, np.c_[np.zeros((len(at), 2)), sizes]), sizes,
                              cfg.grid)
        scores = grounding_scores(maps, masks[keep], grid=cfg.grid, threshold=cfg.fixed_threshold,
                                  ties=cfg.pointing_ties, case_ids=list(ids), findings=[finding] * len(ids))
        frame = scores.to_frame(list(ids), finding)
        frame["area_fraction"] = frame["gt_area"] / float(cfg.grid[0] * cfg.grid[1])
        frames.append(frame)
    return (pd.concat(frames, ignore_index=True) if frames else None), counts


def prepared_score(cfg: RunConfig, view: DatasetView, model: str, preds: Any,
                   pairs: pd.DataFrame | None) -> tuple[PreparedScore, Callable[..., ScoredTable]]:
    """The pair's score table up to its bootstrap, and ``rescore`` (the same :func:`~xbench.metrics.scored_table`
    call, taking ``cases=``); the cases the runner skipped are left out."""
    case_ids = view.case_ids
    position = {cid: i for i, cid in enumerate(preds.case_ids.tolist())}
    inferred = np.array([cid in position for cid in case_ids], bool)
    if not inferred.any():
        reasons = sorted({r.split(":")[0] for r in preds.skipped.values()})
        first = next(iter(preds.skipped.values()), "no chunk holds a prediction")
        raise XBenchError(f"{view.name} × {model}: no case can be evaluated — {len(preds.skipped)} of {view.n_cases} "
                          f"cases were skipped at inference ({', '.join(reasons) or 'none recorded'}; first: {first}). "
                          "Place the missing files and run again: only the skipped cases are inferred.")
    labels = pd.DataFrame(view.labels[inferred], index=case_ids[inferred], columns=view.findings)
    probs = pd.DataFrame(preds.probs[[position[i] for i in case_ids[inferred]]], index=labels.index, columns=view.findings)
    args = dict(model=model, dataset=view.name, labels=labels, scores=probs, findings=view.findings,
                threshold=cfg.fixed_threshold, n_boot=cfg.bootstrap_replicates, seed=cfg.bootstrap_seed)
    return prepare_score(pairs, **args), functools.partial(scored_table, pairs, **args)


def scored_head(cfg: RunConfig, view: DatasetView, model: str, preds: Any, pairs: pd.DataFrame | None,
                counts: dict[str, Any]) -> tuple[PairEvaluation, PreparedScore]:
    """Everything of a pair but its bootstrap: the evaluation without ``tidy`` / ``scored`` (per-pair rows and
    curves at each class's best τ, counts, ``rescore``), and the prepared score table."""
    prepared, rescore = prepared_score(cfg, view, model, preds, pairs)
    curves, pair_rows = [], pd.DataFrame()
    if pairs is not None:
        taus = {f: v for (f, m), v in zip(prepared.rows.specs, prepared.rows.values) if m == BEST_TAU}
        thresholds = THRESHOLDS
        for finding, sub in pairs.groupby("finding", sort=False):
            dc, ic = np.stack(sub["dice_curve"].to_numpy()), np.stack(sub["iou_curve"].to_numpy())
            curves.append(pd.DataFrame({"model": model, "dataset": view.name, "finding": finding, "tau": thresholds,
                                        "mean_dice": np.nanmean(dc, axis=0), "mean_iou": np.nanmean(ic, axis=0),
                                        "n_pairs": len(sub)}))
        best_idx = pairs["finding"].map(lambda f: int(np.argmin(np.abs(thresholds - taus.get(f, np.nan))))
                                        if np.isfinite(taus.get(f, np.nan)) else -1)
        pair_rows = pairs.drop(columns=["dice_curve", "iou_curve"]).rename(columns={"dice_fixed": f"dice@{cfg.fixed_threshold:g}",
                                                                                   "iou_fixed": f"iou@{cfg.fixed_threshold:g}"})
        pair_rows["dice@best"] = [d[i] if i >= 0 else np.nan for d, i in zip(pairs["dice_curve"], best_idx)]
        pair_rows.insert(0, "model", model)
        pair_rows.insert(1, "dataset", view.name)
    head = PairEvaluation(pd.DataFrame(), pair_rows, pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
                          counts, None, rescore)
    return head, prepared


def with_replicates(head: PairEvaluation, prepared: PreparedScore,
                     reps: np.ndarray | None) -> tuple[PairEvaluation, str | None]:
    """The pair's evaluation completed by its bootstrap replicates (every batch, in order), and the warning text
    about dropped replicates (None when none)."""
    scored, message = prepared.finish(reps)
    return head._replace(tidy=scored.table, scored=scored), message


class PairError(XBenchError):
    """An error raised while a worker process evaluated one (dataset, model): the message names both.

    ``original`` is the name of the error's type in the worker; its traceback is chained (``__cause__``).
    """

    def __init__(self, dataset: str, model: str, message: str, original: str = ""):
        super().__init__(message)
        self.dataset, self.model, self.message, self.original = dataset, model, message, original

    def __reduce__(self):  # rebuilt from its fields on the other side of the process boundary
        return (PairError, (self.dataset, self.model, self.message, self.original))


_GT_MEMO: dict[str, tuple[str, dict[str, np.ndarray], dict[str, GroundTruth]]] = {}  # worker: the last file read


def worker_ground_truth(path: Path, key: dict[str, Any], findings: Iterable[str] | None = None) -> dict[str, GroundTruth]:
    """The ground truth cached at ``path`` (checked against ``key``) of ``findings`` (default: all), kept in memory
    for the next job of the same dataset in this worker process (one file at a time; findings unpacked once, when
    first asked for)."""
    text = json.dumps(key, sort_keys=True, default=str)
    memo = _GT_MEMO.get(str(path))
    if memo is None or memo[0] != text:
        _GT_MEMO.clear()
        memo = _GT_MEMO[str(path)] = (text, load_cache(path, key), {})
    _, data, unpacked = memo
    names = data["findings"].tolist() if findings is None else list(findings)
    missing = [f for f in names if f not in unpacked]
    if missing:
        unpacked.update(unpack_cache(data, key, missing))
    return {f: unpacked[f] for f in names if f in unpacked}


def _evaluate_pair_job(state: State, dataset: BaseDataset, cfg: RunConfig, name: str, model: str, gt_file: Path,
                       gt_key: dict[str, Any]) -> tuple[PairEvaluation, dict[str, Any]]:
    """:func:`evaluate_pair` in a worker process (ground truth read from the run's cache), with the model's
    ``model_info``; errors name the pair (:func:`naming_the_pair`). The parent's ``state`` is installed first
    (:mod:`xbench.evaluation.worker_state`)."""
    with naming_the_pair(name, model):
        apply_state(state)
        store = ResultStore(cfg.output_dir)
        result = evaluate_pair(cfg, dataset, model, worker_ground_truth(gt_file, gt_key), store)
        return result, store.meta(dataset.name, model)["model_info"]


@contextlib.contextmanager
def naming_the_pair(name: str, model: str) -> Iterator[None]:
    """A worker job's error comes back naming the pair: as itself when it is an :class:`XBenchError` whose message
    names both dataset and model and that crosses the process boundary intact, else as a :class:`PairError`."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if isinstance(exc, XBenchError) and name in text and model in text and round_trips(exc):
            raise
        raise PairError(name, model, f"{name} × {model}: {type(exc).__name__}: {text}", type(exc).__name__) from exc
