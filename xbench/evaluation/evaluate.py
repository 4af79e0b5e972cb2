"""Metric tables of a run, computed from the results store alone (no inference).

For every (dataset, model) of a run config:

* ground truth of each positive (case, finding) pair is rasterised at the
  evaluation grid (``grid``, default 224×224) once per dataset and cached
  (:mod:`xbench.evaluation.ground_truth`: ``<output_dir>/cache/ground_truth/``); positives without
  a drawn region (e.g. CheXlocalize classes that are recognition-only) and
  negatives take no part in grounding; cases the runner skipped (missing image)
  are left out of every metric and counted;
* maps of models whose official transform crops are first placed in the part of
  the image they cover (:mod:`xbench.models.windows`);
* stored native-grid maps go through :func:`xbench.metrics.grounding_scores`
  (bilinear upsampling, per-map min–max, pointing, Dice/IoU at the fixed τ and
  over the τ grid) and :func:`xbench.metrics.score_table` (class / dataset /
  pooled values, best τ per class, paired bootstrap CIs);
* recognition uses the stored probabilities against the dataset labels.

Written under ``<output_dir>/tables/``: ``metrics.{csv,parquet}`` (tidy: one row
per model × dataset × finding × metric), ``pairs.parquet`` (one row per model ×
positive pair, with GT area and Dice at the class's best τ), ``curves.csv`` (mean
Dice / IoU per τ per class), ``models.csv`` (model metadata) and
``evaluation_log.json`` (counts of pairs evaluated and excluded, and why), and the paired model
comparisons ``comparisons.csv`` / ``ranks.csv`` (:mod:`xbench.evaluation.comparisons`: differences with CIs and
Holm-corrected p-values, rank intervals, from the same bootstrap replicates as the CIs).

The (dataset, model) pairs run in ``eval_workers`` processes (:func:`evaluate_run`); the tables are byte-identical
to the serial evaluation's.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write_bytes, write_frame
from ..spec.config import RunConfig
from ..datasets import BaseDataset, open_dataset
from ..datasets.base import largest_first
from ..core.errors import XBenchError, XBenchWarning
from ..core.logs import progress_bar
from ..core.workers import capture_warnings, one_blas_thread, process_pool, replay_warnings, resolve_workers, round_trips
from ..metrics import BEST_TAU, THRESHOLDS, PreparedScore, ScoredTable, grounding_scores, prepare_score, scored_table
from ..store.results import ResultStore, write_table
from ..models.windows import is_whole_image, place_maps
from .ground_truth import GroundTruth, cached_ground_truth, ground_truth, read_cache, shippable
from .worker_state import State, apply_state

__all__ = ["GroundTruth", "PairEvaluation", "PairError", "ground_truth", "check_annotations", "evaluate_pair",
           "evaluate_run", "RunEvaluation", "load_tables"]


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
    A run's pool may compute the same in steps (:func:`_pair_steps`: grounding by groups of findings, bootstrap
    by batches of replicates), with the same bytes.
    """
    preds = _predictions(cfg, dataset, model, store)
    counts = _counts(dataset, model, preds)
    pairs, counts["pairs"] = _ground(cfg, dataset, preds, gt, range(len(dataset.findings)))
    head, prepared = _scored_head(cfg, dataset, model, preds, pairs, counts)
    result, message = _with_replicates(head, prepared, prepared.all_replicates())
    if message is not None:
        warnings.warn_explicit(message, XBenchWarning, *_DROPPED_AT, module=__name__, registry=_registry())
    return result


#: where the warning about dropped bootstrap replicates points, computed here or in steps (the same place)
_DROPPED_AT = (__file__, evaluate_pair.__code__.co_firstlineno)


def _registry() -> dict:
    """This module's warning registry (``warnings.warn`` keeps one per module the same way)."""
    return globals().setdefault("__warningregistry__", {})


def _predictions(cfg: RunConfig, dataset: BaseDataset, model: str, store: ResultStore) -> Any:
    """The stored predictions of one pair, checked against the dataset's annotation files and findings."""
    preds = store.read(dataset.name, model, expected_chunks=math.ceil(len(dataset) / cfg.chunk_size))
    check_annotations(dataset, model, preds.meta)
    if preds.meta["findings"] != dataset.findings:
        raise XBenchError(f"store for {dataset.name} × {model} was made with findings {preds.meta['findings']}, "
                          f"the dataset now has {dataset.findings}; re-run with --overwrite")
    return preds


def _counts(dataset: BaseDataset, model: str, preds: Any) -> dict[str, Any]:
    return {"dataset": dataset.name, "model": model, "cases": len(dataset),
            "cases_skipped_at_inference": len(preds.skipped),
            "skip_reasons": dict(Counter(r.split(":")[0] for r in preds.skipped.values())), "pairs": {}}


def _ground(cfg: RunConfig, dataset: BaseDataset, preds: Any, gt: dict[str, GroundTruth],
            findings: Iterable[int]) -> tuple[pd.DataFrame | None, dict[str, dict[str, int]]]:
    """Grounding rows (one per positive pair with a region and a prediction) of the findings with indices
    ``findings``, in their order, and each finding's pair counts."""
    case_ids = dataset.cases["case_id"].astype(str).to_numpy()
    position = {cid: i for i, cid in enumerate(preds.case_ids.tolist())}
    frames, counts = [], {}
    for c in findings:
        finding = dataset.findings[c]
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


def _scored_head(cfg: RunConfig, dataset: BaseDataset, model: str, preds: Any, pairs: pd.DataFrame | None,
                 counts: dict[str, Any]) -> tuple[PairEvaluation, PreparedScore]:
    """Everything of a pair but its bootstrap: the evaluation without ``tidy`` / ``scored`` (per-pair rows and
    curves at each class's best τ, counts, ``rescore``), and the prepared score table."""
    case_ids = dataset.cases["case_id"].astype(str).to_numpy()
    position = {cid: i for i, cid in enumerate(preds.case_ids.tolist())}
    inferred = np.array([cid in position for cid in case_ids], bool)
    if not inferred.any():
        reasons = sorted({r.split(":")[0] for r in preds.skipped.values()})
        first = next(iter(preds.skipped.values()), "no chunk holds a prediction")
        raise XBenchError(f"{dataset.name} × {model}: no case can be evaluated — {len(preds.skipped)} of {len(dataset)} "
                          f"cases were skipped at inference ({', '.join(reasons) or 'none recorded'}; first: {first}). "
                          "Place the missing files and run again: only the skipped cases are inferred.")
    labels = pd.DataFrame(dataset.labels()[inferred], index=case_ids[inferred], columns=dataset.findings)
    probs = pd.DataFrame(preds.probs[[position[i] for i in case_ids[inferred]]], index=labels.index, columns=dataset.findings)
    args = dict(model=model, dataset=dataset.name, labels=labels, scores=probs, findings=dataset.findings,
                threshold=cfg.fixed_threshold, n_boot=cfg.bootstrap_replicates, seed=cfg.bootstrap_seed)
    rescore = functools.partial(scored_table, pairs, **args)
    prepared = prepare_score(pairs, **args)

    curves, pair_rows = [], pd.DataFrame()
    if pairs is not None:
        taus = {f: v for (f, m), v in zip(prepared.rows.specs, prepared.rows.values) if m == BEST_TAU}
        thresholds = THRESHOLDS
        for finding, sub in pairs.groupby("finding", sort=False):
            dc, ic = np.stack(sub["dice_curve"].to_numpy()), np.stack(sub["iou_curve"].to_numpy())
            curves.append(pd.DataFrame({"model": model, "dataset": dataset.name, "finding": finding, "tau": thresholds,
                                        "mean_dice": np.nanmean(dc, axis=0), "mean_iou": np.nanmean(ic, axis=0),
                                        "n_pairs": len(sub)}))
        best_idx = pairs["finding"].map(lambda f: int(np.argmin(np.abs(thresholds - taus.get(f, np.nan))))
                                        if np.isfinite(taus.get(f, np.nan)) else -1)
        pair_rows = pairs.drop(columns=["dice_curve", "iou_curve"]).rename(columns={"dice_fixed": f"dice@{cfg.fixed_threshold:g}",
                                                                                   "iou_fixed": f"iou@{cfg.fixed_threshold:g}"})
        pair_rows["dice@best"] = [d[i] if i >= 0 else np.nan for d, i in zip(pairs["dice_curve"], best_idx)]
        pair_rows.insert(0, "model", model)
        pair_rows.insert(1, "dataset", dataset.name)
    head = PairEvaluation(pd.DataFrame(), pair_rows, pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(),
                          counts, None, rescore)
    return head, prepared


def _with_replicates(head: PairEvaluation, prepared: PreparedScore,
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


_GT_MEMO: dict[str, tuple[str, dict[str, GroundTruth]]] = {}  # worker: the last ground truth file read


def _worker_ground_truth(path: Path, key: dict[str, Any]) -> dict[str, GroundTruth]:
    """The ground truth cached at ``path`` (checked against ``key``), kept in memory for the next pair of the
    same dataset in this worker process (one file at a time)."""
    text = json.dumps(key, sort_keys=True, default=str)
    memo = _GT_MEMO.get(str(path))
    if memo is None or memo[0] != text:
        _GT_MEMO.clear()
        _GT_MEMO[str(path)] = (text, read_cache(path, key))
    return _GT_MEMO[str(path)][1]


def _evaluate_pair_job(state: State, dataset: BaseDataset, cfg: RunConfig, name: str, model: str, gt_file: Path,
                       gt_key: dict[str, Any]) -> tuple[PairEvaluation, dict[str, Any]]:
    """:func:`evaluate_pair` in a worker process (ground truth read from the run's cache), with the model's
    ``model_info``; errors name the pair (:func:`_naming_the_pair`). The parent's ``state`` is installed first
    (:mod:`xbench.evaluation.worker_state`)."""
    with _naming_the_pair(name, model):
        apply_state(state)
        store = ResultStore(cfg.output_dir)
        result = evaluate_pair(cfg, dataset, model, _worker_ground_truth(gt_file, gt_key), store)
        return result, store.meta(dataset.name, model)["model_info"]


@contextlib.contextmanager
def _naming_the_pair(name: str, model: str) -> Iterator[None]:
    """A worker job's error comes back naming the pair: as itself when it is an :class:`XBenchError` whose message
    names both dataset and model and that crosses the process boundary intact, else as a :class:`PairError`."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if isinstance(exc, XBenchError) and name in text and model in text and round_trips(exc):
            raise
        raise PairError(name, model, f"{name} × {model}: {type(exc).__name__}: {text}", type(exc).__name__) from exc


#: A pair is evaluated in steps over the pool (:func:`_pair_steps`) when its dataset has at least this many
#: grounding pairs (positives with a region), or this many (case, finding) labels ×10; smaller pairs are one job.
SPLIT_PAIRS = 4000
#: grounding pairs per step of a split pair (about: whole findings go together)
PAIRS_PER_STEP = 2500


def _finding_groups(dataset: BaseDataset, gt: dict[str, GroundTruth]) -> list[list[int]] | None:
    """Consecutive groups of finding indices with about :data:`PAIRS_PER_STEP` grounding pairs each, when the
    pair is large enough to be split (:data:`SPLIT_PAIRS`); None when it is evaluated as one job."""
    sizes = [len(gt[f].rows) if f in gt else 0 for f in dataset.findings]
    total = sum(sizes)
    if total < SPLIT_PAIRS and len(dataset) * len(dataset.findings) < 10 * SPLIT_PAIRS:
        return None
    steps = max(1, min(len(sizes), math.ceil(total / PAIRS_PER_STEP)))
    groups: list[list[int]] = [[]]
    done = 0
    for c, n in enumerate(sizes):
        if groups[-1] and done >= len(groups) * total / steps:
            groups.append([])
        groups[-1].append(c)
        done += n
    return groups


def _pair_steps(cfg: RunConfig, shipped: tuple[State, BaseDataset], model: str, gt_file: Path, gt_key: dict[str, Any],
                groups: list[list[int]], folder: Path) -> Generator[list[tuple], list[Any], tuple[Any, list]]:
    """One (dataset, model) as :func:`evaluate_pair` computes it, in steps run by a pool: yields lists of jobs
    ``(function, *arguments)`` and is sent their results, in order; returns ``((evaluation, model_info), caught)``
    with the warnings the serial call would raise, in its order.

    Steps: the grounding rows of each group of findings (:func:`_ground_job`, rows kept in ``folder``); the score
    table's rows, per-pair rows and curves (:func:`_head_job`); the bootstrap replicates batch by batch
    (:func:`_replicates_job`, each batch's case weights drawn anew: the same as in one loop). The results are the
    bytes of :func:`evaluate_pair`. Files in ``folder`` (private to this run's process) are this run's own.
    """
    state, dataset = shipped
    common = (state, dataset, cfg, model)
    parts = [folder / f"ground-{k}.pkl" for k in range(len(groups))]
    grounded = yield [(_ground_job, *common, gt_file, gt_key, group, part) for group, part in zip(groups, parts)]
    caught = [w for _, got in grounded for w in got]
    pair_counts = {f: n for counts, _ in grounded for f, n in counts.items()}
    [((head, prepared, info), got)] = yield [(_head_job, *common, parts, pair_counts, folder / "score.pkl")]
    caught += got
    batches = yield [(_replicates_job, state, dataset.name, model, folder / "score.pkl", b)
                     for b in range(len(prepared.batches()))]
    caught += [w for _, got in batches for w in got]
    reps = np.concatenate([r for r, _ in batches]) if batches else None
    result, message = _with_replicates(head, prepared, reps)
    if message is not None:
        caught.append((message, XBenchWarning, *_DROPPED_AT))
    return (result, info), caught


def _ground_job(state: State, dataset: BaseDataset, cfg: RunConfig, model: str, gt_file: Path,
                gt_key: dict[str, Any], findings: list[int], out: Path) -> dict[str, dict[str, int]]:
    """Worker: the grounding rows of ``findings`` written to ``out`` (pickle, read back by :func:`_head_job` of
    this run); returns their pair counts."""
    with _naming_the_pair(dataset.name, model):
        apply_state(state)
        preds = _predictions(cfg, dataset, model, ResultStore(cfg.output_dir))
        frame, counts = _ground(cfg, dataset, preds, _worker_ground_truth(gt_file, gt_key), findings)
        _write_pickle(out, frame)
        return counts


def _head_job(state: State, dataset: BaseDataset, cfg: RunConfig, model: str, parts: list[Path],
              pair_counts: dict[str, dict[str, int]], out: Path) -> tuple[PairEvaluation, PreparedScore, dict]:
    """Worker: the pair's evaluation up to its bootstrap from the grounding rows in ``parts`` (deleted after),
    the prepared score table written to ``out`` for :func:`_replicates_job` (returned without its statistic),
    and the model's ``model_info``."""
    with _naming_the_pair(dataset.name, model):
        apply_state(state)
        store = ResultStore(cfg.output_dir)
        preds = _predictions(cfg, dataset, model, store)
        frames = [f for f in map(_read_pickle, parts) if f is not None]
        for part in parts:
            part.unlink()
        counts = _counts(dataset, model, preds)
        counts["pairs"] = pair_counts
        pairs = pd.concat(frames, ignore_index=True) if frames else None
        head, prepared = _scored_head(cfg, dataset, model, preds, pairs, counts)
        if prepared.n_boot:
            _write_pickle(out, prepared)
        return head, prepared.without_statistic(), store.meta(dataset.name, model)["model_info"]


_SCORE_MEMO: dict[str, PreparedScore] = {}  # worker: the last prepared score table read


def _replicates_job(state: State, name: str, model: str, path: Path, batch: int) -> np.ndarray:
    """Worker: bootstrap replicates of batch ``batch`` of the prepared score table at ``path`` (kept in memory for
    the next batch of the same pair in this process)."""
    with _naming_the_pair(name, model):
        apply_state(state)
        if str(path) not in _SCORE_MEMO:
            _SCORE_MEMO.clear()
            _SCORE_MEMO[str(path)] = _read_pickle(path)
        return _SCORE_MEMO[str(path)].replicates(batch)


def _write_pickle(path: Path, obj: Any) -> None:
    import pickle

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _read_pickle(path: Path) -> Any:
    """A file written by :func:`_write_pickle` in this run's private step folder (made by the evaluating process
    with mode 0700; the same trust as the pool's own pipes, which carry pickles too). Never a user's file."""
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


class _Steps:
    """A pair evaluated in steps (:func:`_pair_steps`): its generator, the futures of its current step, and the
    future that gets its result (what a one-job pair's future would hold)."""

    def __init__(self, steps: Generator, folder: Path):
        self.steps, self.folder = steps, folder
        self.future: Future = Future()
        self.pending: list[Future] = []
        self.started = False


def evaluate_run(cfg: RunConfig, *, progress: bool = True) -> pd.DataFrame:
    """Compute and write every table of a run (see the module docstring); returns the tidy table.

    Ground truth of each dataset comes from the run's cache (:mod:`xbench.evaluation.ground_truth`:
    ``<output_dir>/cache/ground_truth/``, computed on a miss and shared by the dataset's models).
    ``cfg.eval_workers`` processes (:func:`~xbench.core.workers.resolve_workers`: ``"auto"`` = min(CPUs, pairs);
    0 / 1 = serial, in this process) rasterise ground truth and evaluate the (dataset, model) pairs; results are
    gathered in run order (datasets, then models), and every pair's bootstrap uses ``cfg.bootstrap_seed`` as
    it would serially, so the tables are byte-identical whatever the worker count. Every process evaluates with
    one BLAS thread (workers and this one alike): OpenBLAS may split a matrix product's sums over its threads, so
    with more threads the last bits of bootstrap CIs would depend on the machine's core count. Progress: at most
    one line per finished pair. :class:`RunEvaluation` is the same work, started while inference still runs. When
    each step ran is written to ``<output_dir>/evaluation_timing.json`` (timings only, outside ``tables/``).
    """
    evaluation = RunEvaluation(cfg, progress=progress)
    try:
        table = evaluation.finish()
        evaluation.write_timing()
        return table
    finally:
        evaluation.close()


class RunEvaluation:
    """The tables of one run, computed dataset by dataset as each dataset's store becomes complete.

    :func:`xbench.workflows.run.run` overlaps evaluation with inference through it:

    * :meth:`start` prepares each dataset's ground truth in a background thread, through the worker pool, largest
      dataset first (:func:`~xbench.datasets.base.largest_first`, the order a run infers them in);
    * :meth:`ready` is called with a dataset's index once every one of its pairs is in the store, and the thread
      submits that dataset's pairs to the pool; with ``watch_store`` (rank 0 of a distributed run, whose store the
      other ranks write too) the thread also looks for datasets whose every chunk index is present;
    * :meth:`finish` waits for the rest, gathers the results in run order and writes the tables.

    The tables are the same bytes as :func:`evaluate_run` (which is :meth:`finish` alone). The work that runs in
    this process is done in :meth:`finish`, under one BLAS thread: datasets that cannot be shipped to a worker, and
    every dataset when there is no pool (``eval_workers`` ≤ 1). Workers started by :meth:`start` run at lower CPU
    priority (``nice`` 10), so the inference feeding the GPU keeps the cores it needs. :meth:`close` stops the
    thread and the pool (after a failed inference, or after :meth:`finish`).
    """

    def __init__(self, cfg: RunConfig, *, progress: bool = True, nice: int = 0, watch_store: bool = False):
        from ..inference.preflight import runnable_models

        self.cfg, self.progress = cfg, progress
        run_models, self.left_out = runnable_models(cfg, announce=False)
        self.labels = [m.label for m in run_models]
        self.workers = resolve_workers(cfg.eval_workers, len(cfg.datasets) * len(self.labels))
        self.cache = Path(cfg.output_dir) / "cache" / "ground_truth"
        self.registry: dict = {}  # warnings replayed from workers: once per (text, category, place), as serially
        self.bar = progress_bar(total=len(cfg.datasets) * len(self.labels), desc="evaluate", unit="pair",
                                disable=not progress)
        self.pool = process_pool(self.workers, preload=(__name__,), nice=nice) if self.workers > 1 else None
        self.items: dict[int, tuple[str, list[Any]]] = {}  # dataset index -> (name, per model a result or a future)
        self.compared: dict[int, Future] = {}  # dataset index -> its comparisons, computed by a worker
        self._ready: set[int] = set()
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.watch_store = watch_store  # other processes write the store (ranks): a dataset is ready once it is full
        self._t0, self._created_unix = time.perf_counter(), round(time.time(), 3)
        self.timing: dict[str, dict[str, float]] = {}  # "run" or a dataset name -> event -> seconds since created
        self._timing_lock = threading.Lock()  # futures' callbacks mark from the pool's threads
        self._staged: list[_Steps] = []  # pairs evaluated in steps, advanced by the stepping thread
        self._stepper: threading.Thread | None = None
        self._scratch: Path | None = None  # private folder of the steps' files (removed by close)

    def start(self) -> None:
        """Prepare ground truth and submit ready datasets in a background thread (only with a pool)."""
        if self.pool is not None and self._thread is None:
            self._thread = threading.Thread(target=self._ahead, daemon=True, name="xbench-evaluate")
            self._thread.start()

    def ready(self, index: int) -> None:
        """Dataset ``index`` of the config has every pair in the store: its pairs may be evaluated now."""
        with self._cond:
            if index not in self._ready:
                self.mark("ready", self.cfg.datasets[index].name)
            self._ready.add(index)
            self._cond.notify_all()

    def mark(self, event: str, dataset: str = "run") -> None:
        """Note when ``event`` happened (seconds since this evaluation was created; the first time only)."""
        self._note(dataset, event, first=True)

    def _note(self, dataset: str, event: str, *, first: bool) -> None:
        with self._timing_lock:
            events = self.timing.setdefault(dataset, {})
            if not (first and event in events):
                events[event] = round(time.perf_counter() - self._t0, 3)

    def write_timing(self) -> None:
        """``<output_dir>/evaluation_timing.json``: when each step of the evaluation happened (seconds since it was
        created, ``created_unix`` on the wall clock). Timings only: never part of the tables."""
        with self._timing_lock:
            events = {name: dict(ev) for name, ev in self.timing.items()}
        doc = {"created_unix": self._created_unix, "workers": self.workers, "events": events}
        atomic_write_bytes(Path(self.cfg.output_dir) / "evaluation_timing.json", json.dumps(doc, indent=1).encode())

    def _ahead(self) -> None:
        """Ground truth dataset by dataset, largest first (the order a run infers them in), each dataset's pairs
        submitted as soon as its ground truth is prepared and it is ready; then wait for the rest."""
        try:
            prepared: dict[int, Any] = {}
            opened = [open_dataset(dspec) for dspec in self.cfg.datasets]
            for i in largest_first(opened):
                if self._stop:
                    return
                prepared[i] = self._prepare(self.cfg.datasets[i], in_pool=True, dataset=opened[i])
                self._watch(prepared)
                self._submit_ready(prepared)
            while (prepared or self._uncompared()) and not self._stop:
                self._watch(prepared)
                with self._cond:
                    if not self._stop and not (self._ready & set(prepared)) and not self._comparable():
                        self._cond.wait(timeout=0.5)
                self._submit_ready(prepared)
                self._submit_comparisons()
        except BaseException as exc:  # raised by finish
            self._error = exc

    def _watch(self, prepared: dict[int, Any]) -> None:
        """With ``watch_store``: every prepared dataset whose store is full (all ranks' chunks indexed) is ready."""
        if self.watch_store:
            full = {i for i, got in prepared.items() if got is not None and self._full(got[0])}
            with self._cond:
                self._ready |= full

    def _uncompared(self) -> list[int]:
        """Datasets whose pairs are all in the pool, none failed so far, and whose comparisons are not submitted yet
        (a dataset with a failed pair is left to :meth:`finish`)."""
        return [i for i, (_, items) in list(self.items.items())
                if i not in self.compared and items and all(isinstance(x, Future) for x in items)
                and not any(x.done() and (x.cancelled() or x.exception() is not None) for x in items)]

    def _comparable(self) -> list[int]:
        """Of :meth:`_uncompared`, those whose pairs are all done without error: their comparisons can start."""
        return [i for i in self._uncompared() if all(x.done() for x in self.items[i][1])]

    def _submit_comparisons(self) -> None:
        """Each dataset whose pairs are done gets its model comparisons (paired bootstrap, ranks) computed by a
        worker, so that :meth:`finish` only gathers them. A dataset with a failed pair is left to :meth:`finish`,
        which raises that pair's error as before."""
        from .comparisons import compare_dataset

        for i in self._comparable():
            name, items = self.items[i]
            evaluated = {label: x.result()[0][0] for label, x in zip(self.labels, items)}
            self.compared[i] = self.pool.submit(capture_warnings, compare_dataset, name, evaluated,
                                                threshold=self.cfg.fixed_threshold)
            self.mark("comparisons_submitted", name)
            self.compared[i].add_done_callback(lambda _, name=name: self.mark("comparisons_done", name))

    def _pair_done(self, name: str, _: Any = None) -> None:
        """A pair of dataset ``name`` is done: count it, and wake the thread (its dataset's comparisons may start)."""
        self.bar.update(1)
        self._note(name, "pairs_done", first=False)  # the last pair's
        with self._cond:
            self._cond.notify_all()

    def _full(self, dataset: BaseDataset) -> bool:
        """Every chunk of every model of ``dataset`` has its index in the store (written after the chunk itself)."""
        store, chunks = ResultStore(self.cfg.output_dir), math.ceil(len(dataset) / self.cfg.chunk_size)
        return all(store.indexed(dataset.name, label, chunks) for label in self.labels)

    def _submit_ready(self, prepared: dict[int, Any]) -> None:
        with self._cond:
            due = sorted(self._ready & set(prepared))
        for i in due:
            got = prepared.pop(i)
            if got is not None and not self._stop:
                self.items[i] = (got[0].name, self._pairs(*got))

    def _prepare(self, dspec: Any, *, in_pool: bool, dataset: BaseDataset | None = None) -> tuple[Any, ...] | None:
        """``(dataset, shipped, gt, gt_file, gt_key)``; None when ``in_pool`` and the dataset cannot be shipped."""
        dataset = open_dataset(dspec) if dataset is None else dataset
        shipped = shippable(dataset) if self.pool is not None else None
        if in_pool and shipped is None:
            return None  # evaluated in this process by finish()
        self.mark("ground_truth_started", dspec.name)
        gt, gt_file, gt_key, _ = cached_ground_truth(dataset, self.cfg.grid, self.cache, options=dspec.options,
                                                     pool=None if shipped is None else self.pool, workers=self.workers,
                                                     progress=self.progress, warning_registry=self.registry,
                                                     shipped=shipped)
        self.mark("ground_truth_done", dspec.name)
        return dataset, shipped, gt, gt_file, gt_key

    def _pairs(self, dataset: BaseDataset, shipped: Any, gt: dict[str, GroundTruth], gt_file: Path,
               gt_key: dict[str, Any]) -> list[Any]:
        """Every model's evaluation of one dataset: futures in the pool, or results computed here."""
        items: list[Any] = []
        self.mark("pairs_submitted", dataset.name)
        for label in self.labels:
            if shipped is None:  # in this process
                store = ResultStore(self.cfg.output_dir)
                items.append((evaluate_pair(self.cfg, dataset, label, gt, store), store.meta(dataset.name, label)["model_info"]))
                self.bar.update(1)
            else:
                groups = _finding_groups(dataset, gt)
                if groups is None:
                    items.append(self.pool.submit(capture_warnings, _evaluate_pair_job, *shipped, self.cfg,
                                                  dataset.name, label, gt_file, gt_key))
                else:
                    items.append(self._start_steps(shipped, label, gt_file, gt_key, groups))
                items[-1].add_done_callback(functools.partial(self._pair_done, dataset.name))
        return items

    def _start_steps(self, shipped: tuple[State, BaseDataset], model: str, gt_file: Path, gt_key: dict[str, Any],
                     groups: list[list[int]]) -> Future:
        """Evaluate one pair in steps over the pool (:func:`_pair_steps`); returns the future of its result."""
        import tempfile

        with self._cond:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="xbench-evaluate-"))  # mode 0700
            folder = Path(tempfile.mkdtemp(dir=self._scratch))  # one private folder per pair
            steps = _Steps(_pair_steps(self.cfg, shipped, model, gt_file, gt_key, groups, folder), folder)
            self._staged.append(steps)
            if self._stepper is None:
                self._stepper = threading.Thread(target=self._step_loop, daemon=True, name="xbench-evaluate-steps")
                self._stepper.start()
            self._cond.notify_all()
        return steps.future

    def _advanceable(self) -> list[_Steps]:
        """Pairs in steps whose current step is done (or not started)."""
        return [st for st in self._staged if all(f.done() for f in st.pending)]

    def _step_loop(self) -> None:
        """The stepping thread: submits each pair's next step once its current one is done, until :meth:`close`."""
        while True:
            with self._cond:
                while not self._stop and not self._advanceable():
                    self._cond.wait(timeout=0.5)
                if self._stop:
                    return
                due = self._advanceable()
            for steps in due:
                self._advance(steps)

    def _wake(self, _: Any = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _advance(self, steps: _Steps) -> None:
        """Send the results of ``steps``' current step to its generator and submit the next step; set its future
        when it returns or raises (a job's error is the pair's error)."""
        try:
            while True:
                results = [f.result() for f in steps.pending]
                jobs = steps.steps.send(results) if steps.started else next(steps.steps)
                steps.started = True
                steps.pending = [self.pool.submit(capture_warnings, fn, *args) for fn, *args in jobs]
                if steps.pending:
                    break
        except StopIteration as stop:
            self._end_steps(steps)
            steps.future.set_result(stop.value)
            return
        except BaseException as exc:
            for f in steps.pending:
                f.cancel()
            self._end_steps(steps)
            steps.future.set_exception(exc)
            return
        for f in steps.pending:
            f.add_done_callback(self._wake)

    def _end_steps(self, steps: _Steps) -> None:
        import shutil

        with self._cond:
            self._staged.remove(steps)
        shutil.rmtree(steps.folder, ignore_errors=True)

    def finish(self) -> pd.DataFrame:
        """Evaluate what is left, gather in run order, write every table; returns the tidy table."""
        cfg = self.cfg
        self.mark("finish_called")
        for i in range(len(cfg.datasets)):
            self.ready(i)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        tidy, pairs, curves, log, models, compared = [], [], [], [], {}, []

        def collect(i: int, name: str, items: list[Any]) -> None:
            """Tables of one dataset's pairs, in model order, then its comparisons (a worker's, when computed)."""
            evaluated = {}
            for label, item in zip(self.labels, items):
                if isinstance(item, Future):
                    item, caught = item.result()
                    replay_warnings(caught, self.registry)
                result, info = item
                evaluated[label] = result
                tidy.append(result.tidy)
                pairs.append(result.pairs)
                curves.append(result.curves)
                log.append(result.counts)
                models.setdefault(label, info)
            if i in self.compared:
                got, caught = self.compared.pop(i).result()
                replay_warnings(caught, self.registry)
            else:
                got = compare_dataset(name, evaluated, threshold=cfg.fixed_threshold)
            compared.append(got)

        from .comparisons import compare_dataset, write_comparisons

        blas = one_blas_thread()  # as in the workers: the tables must not depend on the BLAS thread count
        try:
            for i, dspec in enumerate(cfg.datasets):
                if i not in self.items:  # serial, or not shippable: in this process, as soon as it is ready
                    got = self._prepare(dspec, in_pool=False)
                    self.items[i] = (got[0].name, self._pairs(*got))
                    if self.pool is None:
                        collect(i, *self.items.pop(i))  # serial: each dataset's tables as soon as its pairs are done
            for i in range(len(cfg.datasets)):  # run order, whatever order the workers finished in
                if i in self.items:
                    collect(i, *self.items.pop(i))
        finally:
            blas.restore_original_limits()
        self.mark("gathered")
        out = Path(cfg.output_dir) / "tables"
        table = pd.concat(tidy, ignore_index=True)
        write_table(table, out / "metrics")
        pair_table = (pd.concat([p for p in pairs if len(p)], ignore_index=True) if any(len(p) for p in pairs)
                      else pd.DataFrame())
        write_frame(pair_table, out / "pairs.parquet")  # every table atomically: a full disk leaves no truncated file
        write_frame(pd.concat([c for c in curves if len(c)] or [pd.DataFrame()], ignore_index=True), out / "curves.csv")
        for name, why in self.left_out.items():  # optional models without weights: a row saying so
            models[name] = {"model": name, "weights": "absent", "note": why}
        write_frame(pd.DataFrame(list(models.values())), out / "models.csv")
        atomic_write_bytes(out / "evaluation_log.json", json.dumps(log, indent=1).encode())
        write_comparisons(compared, out)
        self.mark("tables_written")
        return table

    def close(self) -> None:
        """Stop the background thread and the pool (queued pairs are cancelled); idempotent."""
        self._stop = True
        with self._cond:
            self._cond.notify_all()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        for thread in (self._thread, self._stepper):
            if thread is not None:
                thread.join()
        self._thread = self._stepper = None
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self.bar.close()


def load_tables(output_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables of an evaluated run: ``metrics``, ``pairs``, ``curves``, ``models``."""
    folder = Path(output_dir) / "tables"
    if not (folder / "metrics.parquet").exists():
        raise XBenchError(f"{folder} has no metrics table: run `xbench run` (or `xbench evaluate`) first")
    return {
        "metrics": pd.read_parquet(folder / "metrics.parquet"),
        "pairs": pd.read_parquet(folder / "pairs.parquet"),
        "curves": pd.read_csv(folder / "curves.csv"),
        "models": pd.read_csv(folder / "models.csv"),
    }
