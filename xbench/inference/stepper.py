"""The stepper: every model of one dataset inferred into the store, batch by batch.

A :class:`PairRun` is one (dataset, model) pair in three steps: plan (``__init__``: the store prepared, the rows still
to infer, the batches), stream (:meth:`PairRun.steps`: one batch predicted per step, chunks flushed as they complete)
and :meth:`PairRun.finish` (the counts for the run log). A :class:`DatasetStepper` runs every pair of a dataset: with a
decode-once feed one batch of each model in turn (:func:`step_in_turn`) while the feed decodes ahead, so decoding
overlaps the models, models still being built joining once built; without one (``decode_once: false``) each model
decodes through its own DataLoader, one after the other. Every model's batches are the ones it would get alone, so
its outputs are the same bytes.

A chunk is resumable: the chunks already in the store are skipped, and a case skipped for a missing or unreadable
image is recorded in its chunk as skipped, never as done, so a later run infers exactly those cases.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..core.errors import FormatError, MissingFileError, XBenchError, XBenchWarning
from ..core.logs import advance, progress_bar
from ..core.version import __version__
from ..datasets import BaseDataset
from ..models import Adapter
from ..spec.config import DatasetSpec, ModelSpec
from ..store.fingerprint import run_fingerprint
from ..store.results import ResultStore, chunk_rows
from . import feeds
from .builder import Building, fitted_folder
from .decode import CaseItem
from .feeds import FeedOptions
from .plan import Knobs
from .recorder import PairTimes
from .skips import first_examples, format_examples, skip_records
from .speed import autocast, precision_mode, to_channels_last

logger = logging.getLogger(__name__)

Flush = Callable[..., None]


class _Inputs(Dataset):
    """Dataset row → ``(CaseItem, pixels or None)``: the per-model input pipeline (``decode_once: false``)."""

    def __init__(self, dataset: BaseDataset, adapter: Adapter, skip_missing: bool):
        self.dataset, self.adapter, self.skip_missing = dataset, adapter, skip_missing

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, row: int) -> tuple[CaseItem, torch.Tensor | None]:
        sample = self.dataset[row]
        try:
            image = sample.image()
        except (MissingFileError, FormatError) as exc:
            if not self.skip_missing:
                raise
            return CaseItem(row, sample.case_id, f"{type(exc).__name__}: {exc}", None, None), None
        item = CaseItem(row, sample.case_id, None, image.shape, self.adapter.input_window(image.shape))
        return item, self.adapter.preprocess(image)


def _collate(items: list[Any]) -> list[Any]:
    return items


def _meta(knobs: Knobs, dspec: DatasetSpec, mspec: ModelSpec, dataset: BaseDataset, adapter: Adapter) -> dict[str, Any]:
    return {
        "dataset": dspec.name,
        "split": dataset.split,
        "dataset_root": str(dspec.root) if dspec.root else None,
        "dataset_options": dspec.options,
        "n_cases": len(dataset),
        "findings": dataset.findings,
        "prompts": [dataset.prompts[f] for f in dataset.findings],
        "model": mspec.label,
        "explainer": mspec.explainer,
        "weights": mspec.weights,
        "fit_split": mspec.fit_split,
        "params": mspec.params,
        "model_info": adapter.describe(),
        "grid": list(adapter.grid),
        "chunk_size": knobs.chunk_size,
        "precision": knobs.precision,
        "map_dtype": knobs.map_dtype,
        "code_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "fingerprint": run_fingerprint(dataset, mspec.name, mspec.weights,
                                       fitted=fitted_folder(knobs.output_dir, dspec, mspec) if mspec.fit_split else None),
    }


class PairRun:
    """One (dataset, model) pair's inference: plan, steps, finish (module docstring).

    ``chunks``: this rank's chunks of the dataset. ``feed`` (an :class:`xbench.inference.input_feed.InputFeed` over
    ``dataset``) supplies inputs decoded once for every model; without it each model decodes through its own
    DataLoader. ``writer`` (an executor) writes finished chunks with ``flush`` in the background; without it they are
    written in :meth:`steps`.
    """

    def __init__(self, knobs: Knobs, dspec: DatasetSpec, mspec: ModelSpec, dataset: BaseDataset, adapter: Adapter,
                 chunks: Sequence[int], *, overwrite: bool = False, feed: Any = None, writer: Executor | None = None,
                 flush: Flush | None = None):
        self.knobs, self.dspec, self.mspec, self.dataset, self.adapter = knobs, dspec, mspec, dataset, adapter
        self.feed, self.writer, self.flush = feed, writer, flush or _flush
        self._writes: list[Future] = []
        self.device = knobs.device
        meta = _meta(knobs, dspec, mspec, dataset, adapter)
        self.store = store = ResultStore(knobs.output_dir)
        store.prepare(dspec.name, mspec.label, meta, overwrite=overwrite)
        n_chunks = -(-len(dataset) // knobs.chunk_size)
        mine = sorted(int(k) for k in chunks)
        todo = _rows_to_infer(store, dspec.name, mspec.label, dataset, mine, knobs.chunk_size)
        self.counts: dict[str, Any] = {
            "dataset": dspec.name, "model": mspec.label, "chunks_total": n_chunks,
            "chunks_done_before": len(mine) - len(todo), "chunks_written": 0, "cases_inferred": 0,
            "cases_retried": sum(len(r) for k, r in todo.items() if store.has_chunk(dspec.name, mspec.label, k)),
            "cases_skipped": 0, "skip_reasons": {}}
        self.batches = _plan_batches(todo, knobs.batch_size)
        self.rows = [r for b in self.batches for r in b]  # what this pair needs from the feed, in order
        self.remaining = {k: len(rows) for k, rows in todo.items()}
        self.total = len(self.rows)
        self.reasons: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}
        self.times = PairTimes()  # waiting for inputs, and this pair's own steps

    def steps(self) -> Iterator[tuple[int, int]]:
        """Predict batch by batch; yields ``(cases inferred, cases skipped)`` after each batch.

        Chunks are written by ``writer`` (a thread, when given) while inference goes on: a failed write is raised at
        the pair's next batch, and the pair's last step waits for its writes.
        """
        if not self.batches:
            return
        knobs, device, adapter, dataset = self.knobs, self.device, self.adapter, self.dataset
        prompts = [dataset.prompts[f] for f in dataset.findings]
        amp = autocast(knobs.precision, device)
        if knobs.channels_last:
            to_channels_last(adapter)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self._pending: dict[int, dict[str, Any]] = {}
        stream = _stream(knobs, dataset, adapter, self.batches, self.feed)
        while True:
            with self.times.waiting():
                got = next(stream, None)  # waits for the inputs (decoding, or the feed's stacking and upload)
            if got is None:
                break
            with self.times.working():
                items, pixels = got
                ok = self._take(items)
                pred = None
                if ok:
                    with amp, precision_mode(knobs.precision, device), (torch.inference_mode() if self.feed is not None
                                                                        else nullcontext()):
                        pred = adapter.predict_cases(pixels, prompts, [it.case_id for it in ok])
                self._land(items[0].row // knobs.chunk_size, len(items), pred)
            yield len(ok), len(items) - len(ok)
        with self.times.working():
            for write in self._writes:  # this pair's chunks are on disk (or their error is raised here)
                write.result()

    def _take(self, items: list[CaseItem]) -> list[CaseItem]:
        """Note a batch's cases in its chunk's accumulator: the skipped ones with their reason; returns the others."""
        acc = self._pending.setdefault(items[0].row // self.knobs.chunk_size,
                                       {"ids": [], "scores": [], "probs": [], "maps": [], "sizes": [], "windows": [],
                                        "skipped": {}})
        ok = [it for it in items if it.reason is None]
        for it in items:
            if it.reason is not None:
                acc["skipped"][it.case_id] = self.skipped[it.case_id] = it.reason
                self.reasons[it.reason.split(":")[0]] += 1
        acc["ids"] += [it.case_id for it in ok]
        acc["sizes"] += [it.shape for it in ok]
        acc["windows"] += [it.window for it in ok]
        return ok

    def _land(self, chunk: int, rows: int, pred: Any) -> None:
        """Take in one batch's outputs; write its chunk once every planned row of it has been seen."""
        acc = self._pending[chunk]
        map_dtype = self.knobs.map_numpy_dtype
        if pred is not None:
            scores = pred.scores.float().cpu().numpy()
            acc["scores"].append(scores)
            acc["probs"].append(self.adapter.to_probability(scores).astype(np.float32))
            acc["maps"].append(pred.maps.float().cpu().numpy().astype(map_dtype))
        self.remaining[chunk] -= rows
        for write in [w for w in self._writes if w.done()]:  # a failed write stops the pair at once
            self._writes.remove(write)
            write.result()
        if self.remaining[chunk] == 0:
            done = self._pending.pop(chunk)
            self.counts["chunks_written"] += 1
            self.counts["cases_inferred"] += len(done["ids"])
            self.counts["cases_skipped"] += len(done["skipped"])
            args = (self.store, self.dspec.name, self.mspec.label, chunk, done, self.dataset,
                    len(self.dataset.findings), self.adapter.grid, map_dtype)
            if self.writer is None:
                self.flush(*args)
            else:
                self._writes.append(self.writer.submit(self.flush, *args))

    def finish(self) -> dict[str, Any]:
        """The pair's counts for the run log (skipped cases named; a warning when any)."""
        counts = self.counts
        if not self.batches:
            return counts
        counts.update(self.times.counts())
        if self.device.type == "cuda":
            counts["gpu_peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        counts["skip_reasons"] = dict(self.reasons)
        dataset = self.dataset
        files = dict(zip(dataset.cases["case_id"].astype(str), dataset.cases["image_path"].astype(str)))
        counts["skipped_cases"] = skip_records(self.dspec.name, self.mspec.label, self.skipped, files)  # → a CSV
        counts["skipped_examples"] = first_examples(counts["skipped_cases"])
        if counts["cases_skipped"]:
            warnings.warn(f"{self.mspec.label} × {self.dspec.name}: skipped {counts['cases_skipped']} cases whose image "
                          f"could not be read: {format_examples(counts['skipped_examples'], self.reasons)}; they are "
                          "left out of every metric and stay missing in the store (all listed in skipped_cases.csv): "
                          "a later run infers them once the files are present", XBenchWarning, stacklevel=3)
        return counts


def _drive(pair: PairRun, progress: bool) -> dict[str, Any]:
    """Run one pair's steps to the end under its own progress bar."""
    bar = progress_bar(total=pair.total, desc=f"{pair.mspec.label} × {pair.dspec.name}", unit="img",
                       disable=not progress)
    started = time.perf_counter()
    for done, skipped in pair.steps():
        advance(bar, done, skipped, started)
    bar.close()
    return pair.finish()


def _plan_batches(todo: dict[int, list[int]], batch_size: int) -> list[list[int]]:
    """Rows still to infer, per chunk, cut into batches that never straddle a chunk (so a chunk can be flushed as
    soon as its last batch is seen)."""
    return [rows[i:i + batch_size] for rows in todo.values() for i in range(0, len(rows), batch_size)]


def _stream(knobs: Knobs, dataset: BaseDataset, adapter: Adapter, batches: list[list[int]],
            feed: Any) -> Iterator[tuple[list[CaseItem], torch.Tensor | None]]:
    """``(items, pixels on device)`` per planned batch, from the decode-once feed or the per-model loader."""
    if feed is not None:
        yield from feed.batches(adapter, batches, knobs.device, channels_last=knobs.channels_last)
        return
    loader = DataLoader(_Inputs(dataset, adapter, knobs.skip_missing), batch_sampler=batches,
                        num_workers=knobs.num_workers, collate_fn=_collate)
    for pairs in loader:
        pixels = [x for _, x in pairs if x is not None]
        yield [it for it, _ in pairs], torch.stack(pixels).to(knobs.device) if pixels else None


def _flush(store: ResultStore, dataset_name: str, model: str, chunk: int, acc: dict[str, Any], dataset: BaseDataset,
           n_classes: int, grid: tuple[int, int], map_dtype: Any) -> None:
    """Write one finished chunk (joined with the stored one on a retry of skipped cases); safe in a writer thread
    (chunks are written by exactly one pair, and each pair's chunks are distinct files)."""
    h, w = grid
    arrays = {
        "case_ids": acc["ids"],
        "scores": np.concatenate(acc["scores"]) if acc["scores"] else np.zeros((0, n_classes), np.float32),
        "probs": np.concatenate(acc["probs"]) if acc["probs"] else np.zeros((0, n_classes), np.float32),
        "maps": np.concatenate(acc["maps"]) if acc["maps"] else np.zeros((0, n_classes, h, w), map_dtype),
        "sizes": np.asarray(acc["sizes"], np.int64).reshape(-1, 2),
        "windows": np.asarray(acc["windows"], np.float64).reshape(-1, 4),
    }
    if store.has_chunk(dataset_name, model, chunk):  # a retry of formerly skipped cases: join the chunk
        arrays = _join_chunk(store.load_chunk(store.chunk_path(dataset_name, model, chunk)), arrays, dataset)
    store.write_chunk(dataset_name, model, chunk, skipped=acc["skipped"], **arrays)


def _rows_to_infer(store: ResultStore, dataset_name: str, model: str, dataset: BaseDataset, chunks: list[int],
                   chunk_size: int) -> dict[int, list[int]]:
    """Chunk → dataset rows still to infer: every row of an absent chunk, the skipped rows of a present one."""
    ids = dataset.cases["case_id"].astype(str).tolist()
    todo: dict[int, list[int]] = {}
    for k in chunks:
        rows = list(chunk_rows(k, chunk_size, len(dataset)))
        if not store.has_chunk(dataset_name, model, k):
            todo[k] = rows
            continue
        skipped = set(store.load_chunk(store.chunk_path(dataset_name, model, k))["skipped_ids"].tolist())
        if skipped:
            todo[k] = [r for r in rows if ids[r] in skipped]
    return todo


def _join_chunk(old: dict[str, np.ndarray], new: dict[str, Any], dataset: BaseDataset) -> dict[str, Any]:
    """The arrays of a stored chunk (checked by :meth:`ResultStore.load_chunk`) joined with newly inferred cases,
    in dataset row order."""
    order = {cid: i for i, cid in enumerate(dataset.cases["case_id"].astype(str))}
    keys = ("case_ids", "scores", "probs", "maps", "sizes", "windows")
    joined = {k: np.concatenate([np.asarray(old[k]), np.asarray(new[k]).astype(old[k].dtype)]) for k in keys}
    at = np.argsort([order[c] for c in joined["case_ids"].tolist()], kind="stable")
    return {k: v[at] for k, v in joined.items()}


class DatasetStepper:
    """Runs every pair of a dataset (module docstring), built once per run.

    ``feed``: the options of a feed of its own for models whose input twin's preprocessing differed (None without
    ``decode_once``). ``keep_going``: a pair failing with an :class:`~xbench.core.errors.XBenchError` is logged and
    noted (``failed``, and in :attr:`failures`), the others go on; otherwise the error is raised. ``flush`` writes a
    finished chunk.
    """

    def __init__(self, knobs: Knobs, feed: FeedOptions | None, *, overwrite: bool, progress: bool, keep_going: bool,
                 flush: Flush | None = None):
        self.knobs, self.feed, self.overwrite, self.progress = knobs, feed, overwrite, progress
        self.keep_going, self.flush = keep_going, flush or _flush
        self.failures: list[str] = []

    def run(self, dspec: DatasetSpec, dataset: BaseDataset, models: Sequence[ModelSpec], adapters: list[Any],
            feed: Any, chunks: Sequence[int], *, building: Building | None = None, expected: int = 0,
            on_built: Callable[[list[Adapter]], None] | None = None) -> list[dict[str, Any]]:
        """Every model of one dataset; one run-log entry per model, in order.

        ``building``: networks still being built in the background (:func:`xbench.inference.builder.build_behind`);
        ``adapters[i]`` is None for those, and each is expected to infer ``expected`` cases (the rows the feed was
        started for). Each joins the models in turn once built, its inputs taken from what the feed decoded for its
        twin (:func:`~xbench.inference.feeds.fits_twin`); a model whose twin's preprocessing differs runs afterwards
        from a feed of its own. ``adapters`` is completed in place, and ``on_built(adapters)`` is called once every
        model is built. A failed build is raised at once (the pairs already running stop; their written chunks stay).
        """
        return _DatasetRun(self, dspec, dataset, models, adapters, chunks, building or {}, on_built).infer(feed, expected)


class _DatasetRun:
    """One dataset's pairs under a :class:`DatasetStepper`: their entries, the builds still to join, the models
    that need a feed of their own."""

    def __init__(self, stepper: DatasetStepper, dspec: DatasetSpec, dataset: BaseDataset, models: Sequence[ModelSpec],
                 adapters: list[Any], chunks: Sequence[int], building: Building,
                 on_built: Callable[[list[Adapter]], None] | None):
        self.stepper, self.dspec, self.dataset, self.models, self.adapters = stepper, dspec, dataset, models, adapters
        self.chunks, self.building, self.on_built = chunks, dict(building), on_built
        self.entries: dict[int, dict[str, Any]] = {}
        self.apart: list[int] = []  # models whose twins' inputs do not fit them: inferred after, from a feed of their own
        self.writer: Executor | None = None
        self.feed: Any = None

    def failed(self, i: int, exc: XBenchError) -> None:
        if not self.stepper.keep_going:
            raise exc
        label = self.models[i].label
        logger.error("%s × %s failed: %s", label, self.dspec.name, exc)
        self.stepper.failures.append(f"{label} × {self.dspec.name}: {exc}")
        self.entries[i] = {"dataset": self.dspec.name, "model": label, "failed": str(exc)}

    def pair(self, i: int, feed: Any) -> PairRun | None:
        s = self.stepper
        try:
            return PairRun(s.knobs, self.dspec, self.models[i], self.dataset, self.adapters[i], self.chunks,
                           overwrite=s.overwrite, feed=feed, writer=self.writer, flush=s.flush)
        except XBenchError as exc:
            self.failed(i, exc)
            return None

    def join(self, i: int) -> PairRun | None:
        """A model built in the background: its pair, if its twin's inputs fit it."""
        future, twin = self.building.pop(i)
        self.adapters[i] = future.result()  # a failed build is raised here
        fits = feeds.fits_twin(self.models[i].label, self.adapters[i], twin)  # first: a fitting adapter takes its calibration
        self._all_built()
        if not fits:
            self.apart.append(i)
            return None
        return self.pair(i, self.feed)

    def _all_built(self) -> None:
        if not self.building and self.on_built is not None:
            self.on_built(self.adapters)

    def infer(self, feed: Any, expected: int) -> list[dict[str, Any]]:
        # chunks are compressed and written in the background while the models run (zlib releases the GIL), in the
        # order they finish (one thread); leaving this block waits for every queued write, so a failure elsewhere
        # loses no chunk
        self.feed = feed
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xbench-write") if feed is not None else None
        name, progress = self.dspec.name, self.stepper.progress
        try:
            pairs = {i: p for i in range(len(self.models)) if i not in self.building
                     and (p := self.pair(i, feed)) is not None}
            self._all_built()
            if feed is None:  # each model decodes for itself: one after the other
                for i, run_ in pairs.items():
                    try:
                        self.entries[i] = _drive(run_, progress)
                    except XBenchError as exc:
                        self.failed(i, exc)
                return self._in_order()
            step_in_turn(pairs, feed, name, progress, self.entries, self.failed, later=self.building, join=self.join,
                         expected=expected)
            if self.apart:
                feed.release()  # the others are done: what was decoded for the twins goes before decoding again
                alone = feeds.new_feed(self.stepper.feed, self.dataset, [self.adapters[i] for i in self.apart])
                again = {i: p for i in self.apart if (p := self.pair(i, alone)) is not None}
                step_in_turn(again, alone, name, progress, self.entries, self.failed)
        finally:
            for future, _ in self.building.values():  # after an error: the builds not begun are dropped
                future.cancel()
            if self.writer is not None:
                self.writer.shutdown(wait=True)
        return self._in_order()

    def _in_order(self) -> list[dict[str, Any]]:
        return [self.entries[i] for i in range(len(self.models))]


def step_in_turn(pairs: dict[int, PairRun], feed: Any, name: str, progress: bool, entries: dict[int, dict[str, Any]],
                 failed: Callable[[int, XBenchError], None], *, later: Building | None = None,
                 join: Callable[[int], PairRun | None] | None = None, expected: int = 0) -> None:
    """One batch of each pair in turn while the feed decodes ahead; finished pairs' run-log entries into ``entries``.

    ``later`` (model index -> (build future, twin)): models still being built; ``join(i)`` is called once model
    ``i``'s build is done and gives its pair (None: not stepped here), which then runs in turn with the others. With no
    pair running, the loop waits for the next build. The bar counts ``expected`` cases for each model not yet joined
    and follows the real count once it has.
    """
    later = later if later is not None else {}
    feed.start(sorted({r for pair in pairs.values() for r in pair.rows}))  # decoded ahead in the background
    bar = progress_bar(total=sum(p.total for p in pairs.values()) + expected * len(later), desc=f"{len(pairs) + len(later)} "
                       f"models × {name}", unit="pass", disable=not progress)
    started = time.perf_counter()
    running = {i: pair.steps() for i, pair in pairs.items()}
    try:
        while running or later:
            if later:
                for i in _built(later, wait=not running):
                    joined = join(i)
                    bar.total += (joined.total if joined is not None else 0) - expected
                    if joined is not None:
                        pairs[i] = joined
                        running[i] = joined.steps()
            for i in list(running):
                try:
                    done, skipped = next(running[i])
                    advance(bar, done, skipped, started)
                except StopIteration:
                    del running[i]
                    entries[i] = pairs[i].finish()
                except XBenchError as exc:
                    del running[i]
                    failed(i, exc)
    except BaseException:
        feed.stop()  # nothing more will be read: end the decoding thread and its workers now
        raise
    finally:
        bar.close()
    if any("failed" in e for e in entries.values()):
        feed.stop()  # a decoding error reached every pair that waited for it and is noted there (keep_going)
    else:
        feed.close()  # the decoding thread has ended; an error it met is raised here


def _built(later: Building, *, wait: bool) -> list[int]:
    """The models of ``later`` whose build is done, in model order; with ``wait`` (nothing to step) and none done,
    after waiting for the next one."""
    ready = [i for i, (future, _) in later.items() if future.done()]
    if not ready and wait:  # nothing to step: wait for the next network
        wait_futures([future for future, _ in later.values()], return_when=FIRST_COMPLETED)
        ready = [i for i, (future, _) in later.items() if future.done()]
    return sorted(ready)
