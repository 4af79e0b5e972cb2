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

The (dataset, model) pairs run in ``eval_workers`` processes (:func:`evaluate_run`), each as one job
(:mod:`xbench.evaluation.pair`) or, when large, in steps spread over the pool (:mod:`xbench.evaluation.steps`); the
tables are byte-identical to the serial evaluation's.
"""
from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.atomic import atomic_write_bytes, write_frame
from ..spec.config import RunConfig
from ..datasets import BaseDataset, open_dataset
from ..datasets.base import inference_order, largest_first
from ..core.errors import XBenchError
from ..core.logs import progress_bar
from ..preflight.checks import runnable_models
from ..core.workers import capture_warnings, one_blas_thread, process_pool, replay_warnings, resolve_workers
from ..store.results import ResultStore, write_table
from .ground_truth import GroundTruth, cached_ground_truth, ground_truth, ground_truth_file, shippable
from .pair import DatasetView, PairError, PairEvaluation, _evaluate_pair_job, check_annotations, evaluate_pair
from .steps import MOST_STEPS, Steps, finding_groups, pair_steps
from .worker_state import State

__all__ = ["GroundTruth", "PairEvaluation", "PairError", "ground_truth", "check_annotations", "evaluate_pair",
           "evaluate_run", "RunEvaluation", "load_tables", "read_evaluation_log"]


def evaluate_run(cfg: RunConfig, *, progress: bool = True, leave_out: Sequence[str] = (),
                 extra_rows: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> pd.DataFrame:
    """Compute and write every table of a run (see the module docstring); returns the tidy table.

    ``leave_out``: metrics whose rows are left out of the metric table, the comparisons and the ranks (scored maps
    given without probabilities: their placeholder recognition rows). ``extra_rows(pairs)``: rows appended to the
    metric table, from the per-pair table once every pair is evaluated (scored maps' tolerance pointing game). Both are applied before any table is
    written, so every table is written once (:meth:`RunEvaluation.finish`).

    Ground truth of each dataset comes from the run's cache (:mod:`xbench.evaluation.ground_truth`:
    ``<output_dir>/cache/ground_truth/``, computed on a miss and shared by the dataset's models).
    ``cfg.eval_workers`` processes (:func:`~xbench.core.workers.resolve_workers`: ``"auto"`` = min(CPUs, 8 × pairs),
    room for large pairs evaluated in steps;
    0 / 1 = serial, in this process) rasterise ground truth and evaluate the (dataset, model) pairs; results are
    gathered in run order (datasets, then models), and every pair's bootstrap uses ``cfg.bootstrap_seed`` as
    it would serially, so the tables are byte-identical whatever the worker count. Every process evaluates with
    one BLAS thread (workers and this one alike): OpenBLAS may split a matrix product's sums over its threads, so
    with more threads the last bits of bootstrap CIs would depend on the machine's core count. Progress: at most
    one line per finished pair. :class:`RunEvaluation` is the same work, started while inference still runs. When
    each step ran is written to ``<output_dir>/evaluation_timing.json`` (timings only, outside ``tables/``). The
    output folder's lock (:func:`xbench.core.lock.output_lock`) is held throughout.
    """
    from ..core.lock import output_lock

    with output_lock(cfg.output_dir, "evaluate"):  # one XBench process per output folder
        evaluation = RunEvaluation(cfg, progress=progress)
        try:
            table = evaluation.finish(leave_out=leave_out, extra_rows=extra_rows)
            evaluation.write_timing()
            return table
        finally:
            evaluation.close()


class RunEvaluation:
    """The tables of one run, computed dataset by dataset as each dataset's store becomes complete.

    :func:`xbench.workflows.run.run` overlaps evaluation with inference through it:

    * :meth:`start` prepares each dataset's ground truth in a background thread, through the worker pool, in the
      order a run infers them in (:func:`~xbench.datasets.base.inference_order`);
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
        self.cfg, self.progress = cfg, progress
        run_models, self.left_out = runnable_models(cfg, announce=False)
        self.labels = [m.label for m in run_models]
        # a large pair runs as several jobs at once (steps): room for them, workers are started only when needed
        self.workers = resolve_workers(cfg.eval_workers, len(cfg.datasets) * len(self.labels) * MOST_STEPS)
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
        self._staged: list[Steps] = []  # pairs evaluated in steps, advanced by the stepping thread
        self._stepper: threading.Thread | None = None
        self._scratch: Path | None = None  # private folder of the steps' files (removed by close)
        self._views: dict[str, DatasetView] = {}  # dataset name -> what its pairs' steps read of it

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
        created, ``created_unix`` on the wall clock) and the process that coordinated it. Timings only: never part
        of the tables."""
        with self._timing_lock:
            events = {name: dict(ev) for name, ev in self.timing.items()}
        doc = {"created_unix": self._created_unix, "workers": self.workers, "process": os.getpid(), "events": events}
        atomic_write_bytes(Path(self.cfg.output_dir) / "evaluation_timing.json", json.dumps(doc, indent=1).encode())

    def _ahead(self) -> None:
        """Ground truth dataset by dataset, in the order a run infers them (:func:`inference_order`), each dataset's pairs
        submitted as soon as its ground truth is prepared and it is ready; then wait for the rest."""
        try:
            prepared: dict[int, Any] = {}
            opened = [open_dataset(dspec) for dspec in self.cfg.datasets]
            for i in inference_order(opened):
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
        from .comparisons import compare_dataset, for_comparison

        for i in self._comparable():
            name, items = self.items[i]
            evaluated = for_comparison({label: x.result()[0][0] for label, x in zip(self.labels, items)})
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
        """``(dataset, shipped, gt, gt_file, gt_key)``; None when ``in_pool`` and the dataset cannot be shipped.
        ``gt``: the ground truth when the pairs are evaluated here (``shipped`` None), else grounding pairs per
        finding (the workers read the masks from ``gt_file``; this process never unpacks them)."""
        dataset = open_dataset(dspec) if dataset is None else dataset
        shipped = shippable(dataset) if self.pool is not None else None
        if in_pool and shipped is None:
            return None  # evaluated in this process by finish()
        self.mark("ground_truth_started", dspec.name)
        made = cached_ground_truth if shipped is None else ground_truth_file
        gt, gt_file, gt_key, _ = made(dataset, self.cfg.grid, self.cache, options=dspec.options,
                                      pool=None if shipped is None else self.pool, workers=self.workers,
                                      progress=self.progress, warning_registry=self.registry, shipped=shipped)
        self.mark("ground_truth_done", dspec.name)
        return dataset, shipped, gt, gt_file, gt_key

    def _pairs(self, dataset: BaseDataset, shipped: Any, gt: dict[str, GroundTruth] | dict[str, int], gt_file: Path,
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
                groups = finding_groups(dataset, gt) if self._room_for_steps() else None
                if groups is None:
                    items.append(self.pool.submit(capture_warnings, _evaluate_pair_job, *shipped, self.cfg,
                                                  dataset.name, label, gt_file, gt_key))
                else:
                    items.append(self._start_steps(shipped, label, gt_file, gt_key, groups))
                items[-1].add_done_callback(functools.partial(self._pair_done, dataset.name))
        return items

    def _room_for_steps(self) -> bool:
        """Whether the pool has more workers than pairs in flight, this dataset's included: steps cost some CPU
        more than one job (each reads the store again), worth it only where workers would otherwise idle."""
        busy = sum(not x.done() for _, items in list(self.items.values()) for x in items if isinstance(x, Future))
        return busy + len(self.labels) < self.workers

    def _start_steps(self, shipped: tuple[State, BaseDataset], model: str, gt_file: Path, gt_key: dict[str, Any],
                     groups: list[list[int]]) -> Future:
        """Evaluate one pair in steps over the pool (:func:`~xbench.evaluation.steps.pair_steps`), in a private
        folder under this evaluation's temporary folder; returns the future of its result."""
        import tempfile

        with self._cond:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="xbench-evaluate-"))  # mode 0700
            folder = Path(tempfile.mkdtemp(dir=self._scratch))  # one private folder per pair
            view = self._views.setdefault(shipped[1].name, DatasetView.of(shipped[1]))
            steps = Steps(pair_steps(self.cfg, shipped, view, model, gt_file, gt_key, groups, folder), folder)
            self._staged.append(steps)
            if self._stepper is None:
                self._stepper = threading.Thread(target=self._step_loop, daemon=True, name="xbench-evaluate-steps")
                self._stepper.start()
            self._cond.notify_all()
        return steps.future

    def _advanceable(self) -> list[Steps]:
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

    def _advance(self, steps: Steps) -> None:
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

    def _end_steps(self, steps: Steps) -> None:
        import shutil

        with self._cond:
            self._staged.remove(steps)
        shutil.rmtree(steps.folder, ignore_errors=True)

    def finish(self, *, leave_out: Sequence[str] = (),
               extra_rows: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> pd.DataFrame:
        """Evaluate what is left, gather in run order, write every table; returns the tidy table (``leave_out``,
        ``extra_rows``: :func:`evaluate_run`)."""
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
            todo = [i for i in range(len(cfg.datasets)) if i not in self.items]
            opened = {i: open_dataset(cfg.datasets[i]) for i in todo}  # every dataset's files checked before the work
            if self.pool is not None:  # the largest first: its pairs take longest (tables are gathered in run order)
                todo = [todo[k] for k in largest_first([opened[i] for i in todo])]
            for i in todo:  # serial, or not yet submitted by the thread (not shippable, or no thread): from here
                got = self._prepare(cfg.datasets[i], in_pool=False, dataset=opened[i])
                self.items[i] = (got[0].name, self._pairs(*got))
                if self.pool is None:
                    collect(i, *self.items.pop(i))  # serial: each dataset's tables as soon as its pairs are done
            for i in range(len(cfg.datasets)):  # run order, whatever order the workers finished in
                if i in self.items:
                    collect(i, *self.items.pop(i))
        finally:
            blas.restore_original_limits()
        self.mark("gathered")
        from ..core.files import contained_folder

        out = contained_folder(cfg.output_dir, "tables")  # a real folder inside the output folder, no link
        pair_table = (pd.concat([p for p in pairs if len(p)], ignore_index=True) if any(len(p) for p in pairs)
                      else pd.DataFrame())
        table = _final_metrics(pd.concat(tidy, ignore_index=True), leave_out,
                               None if extra_rows is None else extra_rows(pair_table))
        write_table(table, out / "metrics")
        write_frame(pair_table, out / "pairs.parquet")  # every table atomically: a full disk leaves no truncated file
        write_frame(pd.concat([c for c in curves if len(c)] or [pd.DataFrame()], ignore_index=True), out / "curves.csv")
        for name, why in self.left_out.items():  # optional models without weights: a row saying so
            models[name] = {"model": name, "weights": "absent", "note": why}
        write_frame(pd.DataFrame(list(models.values())), out / "models.csv")
        atomic_write_bytes(out / "evaluation_log.json", json.dumps(log, indent=1).encode())
        write_comparisons([_without(part, leave_out) for part in compared], out)
        self.mark("tables_written")
        return table

    def close(self) -> None:
        """Stop the background thread and the pool (queued pairs are cancelled); idempotent."""
        self._stop = True
        with self._cond:
            self._cond.notify_all()
        # shutdown(wait=False) forgets the pool's manager thread, so the second shutdown would not wait for it: it is
        # joined here, so the workers have their stop signal before this returns (a process that ends right after,
        # e.g. an EvaluationProcess, would otherwise race that signal and leave its workers waiting)
        manager = getattr(self.pool, "_executor_manager_thread", None)
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        for thread in (self._thread, self._stepper):
            if thread is not None:
                thread.join()
        self._thread = self._stepper = None
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            if manager is not None:
                manager.join()
            self.pool = None
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self.bar.close()


def _final_metrics(table: pd.DataFrame, leave_out: Sequence[str], extra: pd.DataFrame | None) -> pd.DataFrame:
    """The metric table as written: rows of ``leave_out`` metrics dropped, ``extra`` rows appended."""
    if not leave_out and extra is None:
        return table
    table = table[~table["metric"].isin(list(leave_out))]
    if extra is not None:
        table = pd.concat([table, extra], ignore_index=True)
    return table.reset_index(drop=True)


def _without(part: tuple[pd.DataFrame, pd.DataFrame], leave_out: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A dataset's ``(comparisons, ranks)`` without the rows of ``leave_out`` metrics."""
    if not leave_out:
        return part
    return tuple(frame[~frame["metric"].isin(list(leave_out))].reset_index(drop=True) if "metric" in frame else frame
                 for frame in part)


_LOG_COUNTS = ("evaluated", "missing_prediction", "positive_without_region")


def read_evaluation_log(path: str | Path) -> list[dict[str, Any]] | None:
    """A run's ``evaluation_log.json`` (None when absent), read as a regular file inside its folder
    (:func:`xbench.core.files.read_regular`) and checked: a list of entries with ``dataset`` and ``model`` texts,
    ``cases`` / ``cases_skipped_at_inference`` counts and per-finding ``pairs`` counts. Anything else is one
    :class:`~xbench.core.errors.FormatError` naming the file, the entry and the field."""
    from ..core.errors import FormatError
    from ..core.files import read_regular

    path = Path(path)
    try:
        log = json.loads(read_regular(path, within=path.parent, limit=64 << 20).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, RecursionError) as exc:
        raise FormatError(path, f"not JSON ({type(exc).__name__}: {str(exc)[:120]})") from None

    def count(value: Any) -> bool:
        return type(value) is int and value >= 0

    if not isinstance(log, list):
        raise FormatError(path, f"must be a list of entries, not {type(log).__name__}")
    for i, entry in enumerate(log, 1):
        if not isinstance(entry, dict):
            raise FormatError(path, f"entry {i} must be an object, not {type(entry).__name__}")
        for field in ("dataset", "model"):
            if not isinstance(entry.get(field), str):
                raise FormatError(path, f"entry {i} must name its {field} (a text)", field=field)
        for field in ("cases", "cases_skipped_at_inference"):
            if field in entry and not count(entry[field]):
                raise FormatError(path, f"entry {i}: must be a count (an integer ≥ 0)", field=field)
        pairs = entry.get("pairs", {})
        if not isinstance(pairs, dict) or not all(isinstance(c, dict) and all(count(c.get(k, 0)) for k in _LOG_COUNTS)
                                                  for c in pairs.values()):
            raise FormatError(path, f"entry {i}: must map each finding to counts {list(_LOG_COUNTS)}", field="pairs")
    return log


def load_tables(output_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables of an evaluated run: ``metrics``, ``pairs``, ``curves``, ``models``."""
    folder = Path(output_dir) / "tables"
    if not (folder / "metrics.parquet").exists():
        where = "" if folder.is_absolute() else f" ({str(folder)!r} read from the working folder {Path.cwd()})"
        raise XBenchError(f"{folder.resolve()} has no metrics table{where}: run `xbench run` (or `xbench evaluate`) "
                          "first")
    return {
        "metrics": pd.read_parquet(folder / "metrics.parquet"),
        "pairs": pd.read_parquet(folder / "pairs.parquet"),
        "curves": pd.read_csv(folder / "curves.csv"),
        "models": pd.read_csv(folder / "models.csv"),
    }
