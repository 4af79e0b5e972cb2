"""Inference runner: datasets × models → the results store, resumable and shardable.

``run(config)`` loops over every (dataset, model) pair of a :class:`RunConfig`:
it splits the dataset's rows into fixed chunks of ``chunk_size`` cases, skips the
chunks already in the store (so an interrupted run resumes and a re-run with the
same config is a no-op), and runs batched inference (DataLoader with workers,
autocast on CUDA when ``precision`` asks) on the rest, writing each chunk
atomically. Metrics are computed afterwards from the store alone
(:mod:`xbench.evaluation.evaluate`), so re-scoring needs no inference.

Scaling out: ``shard=(i, n)`` processes the chunks with ``(index + offset) % n == i`` (``offset``: the
chunks of the run's earlier datasets, so shards stay balanced over many small datasets); under
``torchrun`` (``RANK``/``WORLD_SIZE`` set) each rank takes its own shard and
ranks meet at a barrier (gloo or nccl) before rank 0 evaluates. Shards written to
separate folders are joined with :func:`merge`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..core.version import __version__
from ..core.atomic import atomic_write_bytes, check_writable
from ..spec.config import DatasetSpec, ModelSpec, RunConfig
from ..datasets import BaseDataset, open_dataset
from ..datasets.base import case_pixels, inference_order
from ..core.errors import FormatError, MissingFileError, XBenchError, XBenchWarning
from ..store.fingerprint import fit_key, fitted_is_current, hash_ahead, refit, run_fingerprint, weight_files
from ..models import Adapter, create_model
from ..models.base import input_twin
from ..spec.registry import dataset_manifest, import_target, model_config
from ..core.logs import advance, progress_bar
from .skips import first_examples, format_examples, skip_records, write_skips_csv
from ..store.results import ResultStore, chunk_rows
from . import feeds
from .cache import CaseItem
from .speed import autocast, precision_mode, to_channels_last

logger = logging.getLogger(__name__)


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


def open_model(spec: ModelSpec, device: torch.device, dspec: DatasetSpec | None = None,
               output_dir: str | Path | None = None, *, overwrite: bool = False) -> Adapter:
    """Build a model named in a run config.

    A spec with ``fit_split`` (a baseline whose class has ``fit(dataset)`` and ``save(folder)``) is fitted
    on that split of ``dspec``'s dataset and saved under ``<output_dir>/fitted/<dataset>/<model>/`` with a
    ``fit.json`` of what it was fitted on (:func:`xbench.store.fingerprint.fit_key`); it is refitted when that
    differs (other dataset options, root content, params) or with ``overwrite``.
    """
    if spec.explainer is not None:  # the model built as below, its maps made by a post-hoc explainer
        from ..explain import explained

        plain = ModelSpec(spec.name, spec.weights, spec.params, spec.fit_split, spec.optional)
        return explained(open_model(plain, device, dspec, output_dir, overwrite=overwrite), spec.explainer)
    if spec.fit_split is None:
        return create_model(spec.name, weights=spec.weights, device=device, **spec.params)
    if dspec is None or output_dir is None:
        raise XBenchError(f"model {spec.name!r} has fit_split: it needs the dataset it is fitted on")
    evaluated = dspec.split or dataset_manifest(dspec.name).get("default_split", "test")
    if spec.fit_split == evaluated:
        raise XBenchError(f"model {spec.name!r}: fit_split {spec.fit_split!r} is the evaluation split of "
                          f"{dspec.name!r}; a baseline must be fitted on a disjoint split")
    folder = fitted_folder(output_dir, dspec, spec)
    fit_data = open_dataset(dspec, split=spec.fit_split)
    key = fit_key(fit_data, dspec, spec)
    if overwrite or not fitted_is_current(folder, key):
        cls = import_target(model_config(spec.name)["class"])
        refit(folder, lambda tmp: cls.fit(fit_data).save(tmp), key)
    return create_model(spec.name, weights=folder, device=device, **spec.params)


def fitted_folder(output_dir: str | Path, dspec: DatasetSpec, mspec: ModelSpec) -> Path:
    """Where a ``fit_split`` baseline's fitted files live."""
    return Path(output_dir) / "fitted" / dspec.name / mspec.name


def _dist_shard() -> tuple[int, int] | None:
    """(rank, world) under torchrun, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else None


def barrier_timeout() -> float:
    """Seconds a rank waits at the barrier for the others: ``$XBENCH_BARRIER_TIMEOUT`` (default 3600)."""
    return float(os.environ.get("XBENCH_BARRIER_TIMEOUT", "3600"))


_GLOO_GROUP: Any = None


def _init_distributed(cfg: RunConfig) -> None:
    """Join the torchrun group (NCCL on CUDA, else gloo), each rank on GPU ``LOCAL_RANK``, plus a gloo group
    for the monitored barrier."""
    global _GLOO_GROUP
    from datetime import timedelta

    cuda = cfg.resolved_device().type == "cuda"
    if cuda and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" then means this rank's GPU
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=barrier_timeout()))
        _GLOO_GROUP = None  # a group of an earlier, destroyed process group is unusable
    if _GLOO_GROUP is None:
        _GLOO_GROUP = (torch.distributed.new_group(backend="gloo")
                       if torch.distributed.get_backend() != "gloo" else torch.distributed.group.WORLD)


def with_index(device: torch.device) -> torch.device:
    """``device`` with its index: plain ``cuda`` is this thread's current GPU (a distributed rank's ``LOCAL_RANK``,
    :func:`_init_distributed`). CUDA's current device is per thread, and in a new thread it is GPU 0: the decoding
    and building threads are given the index. Other devices are returned as they are.

    >>> with_index(torch.device("cpu"))
    device(type='cpu')
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _barrier(shard: tuple[int, int]) -> None:
    """Wait for every rank; a rank that crashed or hangs is an error naming it after the timeout, never a hang."""
    from datetime import timedelta

    try:
        torch.distributed.monitored_barrier(group=_GLOO_GROUP, timeout=timedelta(seconds=barrier_timeout()),
                                            wait_all_ranks=True)
    except RuntimeError as exc:
        raise XBenchError(
            f"rank {shard[0]} of {shard[1]}: not every rank reached the end of inference within "
            f"{barrier_timeout():g} s (XBENCH_BARRIER_TIMEOUT) — a rank crashed or is stuck ({exc}). The chunks every "
            "rank finished are in the store; run the same command again to resume, or evaluate with `xbench merge`."
        ) from exc


def _meta(cfg: RunConfig, dspec: DatasetSpec, mspec: ModelSpec, dataset: BaseDataset, adapter: Adapter) -> dict[str, Any]:
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
        "chunk_size": cfg.chunk_size,
        "precision": cfg.precision,
        "map_dtype": cfg.map_dtype,
        "code_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "fingerprint": run_fingerprint(dataset, mspec.name, mspec.weights,
                                       fitted=fitted_folder(cfg.output_dir, dspec, mspec) if mspec.fit_split else None),
    }


class PairRun:
    """One (dataset, model) pair's inference in three steps: plan (``__init__``: the store prepared, the rows still to
    infer, the batches), stream (:meth:`steps`: one batch predicted per step, chunks flushed as they complete) and
    :meth:`finish` (the counts for the run log).

    ``feed`` (an :class:`xbench.inference.cache.InputFeed` over ``dataset``) supplies inputs decoded once for every
    model; without it (``decode_once: false``) each model decodes through its own DataLoader. ``chunks`` (given by
    :func:`infer_run`: its share of :func:`assign_chunks`) names this rank's chunks of the dataset; without it, shard
    ``(i, n)`` takes the chunks ``k`` with ``(k + chunk_offset) % n == i``. ``writer`` (an executor) writes finished
    chunks in the background; without it they are written in :meth:`steps`. Several pairs of one dataset are stepped in
    turn by :func:`infer_run` (one batch of each model while the feed decodes ahead), so every model's batches are the
    ones it would get alone and its outputs are the same bytes.
    """

    def __init__(self, cfg: RunConfig, dspec: DatasetSpec, mspec: ModelSpec, *, dataset: BaseDataset | None = None,
                 adapter: Adapter | None = None, shard: tuple[int, int] = (0, 1), overwrite: bool = False,
                 feed: Any = None, chunk_offset: int = 0, chunks: Sequence[int] | None = None, writer: Executor | None = None):
        self.cfg, self.dspec, self.mspec, self.feed, self.writer = cfg, dspec, mspec, feed, writer
        self._writes: list[Future] = []
        self.device = device = cfg.resolved_device()
        self.dataset = dataset = dataset if dataset is not None else open_dataset(dspec)
        self.adapter = adapter = (adapter if adapter is not None
                                  else open_model(mspec, device, dspec, cfg.output_dir, overwrite=overwrite))
        self.store = store = ResultStore(cfg.output_dir)
        store.prepare(dspec.name, mspec.label, _meta(cfg, dspec, mspec, dataset, adapter), overwrite=overwrite)
        n_chunks = math.ceil(len(dataset) / cfg.chunk_size)
        index, count = shard
        mine = (sorted(int(k) for k in chunks) if chunks is not None
                else [k for k in range(n_chunks) if (k + chunk_offset) % count == index])
        todo = _rows_to_infer(store, dspec.name, mspec.label, dataset, mine, cfg.chunk_size)
        self.counts: dict[str, Any] = {
            "dataset": dspec.name, "model": mspec.label, "chunks_total": n_chunks,
            "chunks_done_before": len(mine) - len(todo), "chunks_written": 0, "cases_inferred": 0,
            "cases_retried": sum(len(r) for k, r in todo.items() if store.has_chunk(dspec.name, mspec.label, k)),
            "cases_skipped": 0, "skip_reasons": {}}
        self.batches = _plan_batches(todo, cfg.batch_size)
        self.rows = [r for b in self.batches for r in b]  # what this pair needs from the feed, in order
        self.remaining = {k: len(rows) for k, rows in todo.items()}
        self.total = len(self.rows)
        self.reasons: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}
        self.model_seconds = 0.0  # in this pair's steps, waiting for inputs excluded
        self.wait_seconds = 0.0  # waiting for this pair's inputs (decoding; with a feed also stacking and upload)

    def steps(self) -> Iterator[tuple[int, int]]:
        """Predict batch by batch; yields ``(cases inferred, cases skipped)`` after each batch.

        Chunks are written by ``writer`` (a thread, when given) while inference goes on: a failed write is raised at
        the pair's next batch, and the pair's last step waits for its writes.
        """
        if not self.batches:
            return
        cfg, device, adapter, dataset = self.cfg, self.device, self.adapter, self.dataset
        prompts = [dataset.prompts[f] for f in dataset.findings]
        amp = autocast(cfg.precision, device)
        if cfg.channels_last:
            to_channels_last(adapter)
        self._map_dtype = np.float32 if cfg.map_dtype == "float32" else np.float16
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.started = time.perf_counter()
        self._pending: dict[int, dict[str, Any]] = {}
        stream = _stream(cfg, dataset, adapter, self.batches, device, self.feed)
        while True:
            began = time.perf_counter()
            got = next(stream, None)  # waits for the inputs (decoding, or the feed's stacking and upload)
            wait = time.perf_counter() - began
            if got is None:
                break
            items, pixels = got
            chunk = items[0].row // cfg.chunk_size
            acc = self._pending.setdefault(chunk, {"ids": [], "scores": [], "probs": [], "maps": [], "sizes": [],
                                                   "windows": [], "skipped": {}})
            ok = [it for it in items if it.reason is None]
            for it in items:
                if it.reason is not None:
                    acc["skipped"][it.case_id] = self.skipped[it.case_id] = it.reason
                    self.reasons[it.reason.split(":")[0]] += 1
            pred = None
            if ok:
                with amp, precision_mode(cfg.precision, device), (torch.inference_mode() if self.feed is not None
                                                                  else nullcontext()):
                    pred = adapter.predict_cases(pixels, prompts, [it.case_id for it in ok])
                acc["ids"] += [it.case_id for it in ok]
                acc["sizes"] += [it.shape for it in ok]
                acc["windows"] += [it.window for it in ok]
            self._land(chunk, len(items), pred)
            self.wait_seconds += wait
            self.model_seconds += time.perf_counter() - began - wait
            yield len(ok), len(items) - len(ok)
        began = time.perf_counter()
        for write in self._writes:  # this pair's chunks are on disk (or their error is raised here)
            write.result()
        self.model_seconds += time.perf_counter() - began

    def _land(self, chunk: int, rows: int, pred: Any) -> None:
        """Take in one batch's outputs; write its chunk once every planned row of it has been seen."""
        acc = self._pending[chunk]
        if pred is not None:
            scores = pred.scores.float().cpu().numpy()
            acc["scores"].append(scores)
            acc["probs"].append(self.adapter.to_probability(scores).astype(np.float32))
            acc["maps"].append(pred.maps.float().cpu().numpy().astype(self._map_dtype))
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
                    len(self.dataset.findings), self.adapter.grid, self._map_dtype)
            if self.writer is None:
                _flush(*args)
            else:
                self._writes.append(self.writer.submit(_flush, *args))

    def finish(self) -> dict[str, Any]:
        """The pair's counts for the run log (skipped cases named; a warning when any)."""
        counts = self.counts
        if not self.batches:
            return counts
        counts["seconds"] = round(self.model_seconds + self.wait_seconds, 3)
        counts["model_seconds"] = round(self.model_seconds, 3)  # this model's own steps
        counts["decode_seconds"] = round(self.wait_seconds, 3)  # waiting for inputs
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


def infer(cfg: RunConfig, dspec: DatasetSpec, mspec: ModelSpec, *, dataset: BaseDataset | None = None,
          adapter: Adapter | None = None, shard: tuple[int, int] = (0, 1), overwrite: bool = False,
          progress: bool = True, feed: Any = None, chunk_offset: int = 0,
          chunks: Sequence[int] | None = None) -> dict[str, Any]:
    """Run one (dataset, model) pair into the store (:class:`PairRun`'s plan, steps, finish); returns counts for the
    run log."""
    pair = PairRun(cfg, dspec, mspec, dataset=dataset, adapter=adapter, shard=shard, overwrite=overwrite, feed=feed,
                   chunk_offset=chunk_offset, chunks=chunks)
    return _drive(pair, progress)


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


def _stream(cfg: RunConfig, dataset: BaseDataset, adapter: Adapter, batches: list[list[int]], device: torch.device,
            feed: Any) -> Iterator[tuple[list[CaseItem], torch.Tensor | None]]:
    """``(items, pixels on device)`` per planned batch, from the decode-once feed or the per-model loader."""
    if feed is not None:
        yield from feed.batches(adapter, batches, device, channels_last=cfg.channels_last)
        return
    loader = DataLoader(_Inputs(dataset, adapter, cfg.on_missing_image == "skip"), batch_sampler=batches,
                        num_workers=cfg.num_workers, collate_fn=_collate)
    for pairs in loader:
        pixels = [x for _, x in pairs if x is not None]
        yield [it for it, _ in pairs], torch.stack(pixels).to(device) if pixels else None


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
    """Chunk → dataset rows still to infer: every row of an absent chunk, the skipped rows of a present one.

    A case skipped for a missing / unreadable image is recorded in its chunk as skipped, never as done,
    so a later run infers exactly those cases.
    """
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


def chunk_costs(dataset: BaseDataset, chunk_size: int) -> list[tuple[float, float]]:
    """What each store chunk of ``dataset`` costs a rank: ``(pixels, cases)``. Decoding grows with the images' pixels
    (``height × width`` of the case table; the case count when the table has no sizes), the models' passes with the
    cases."""
    pixels = case_pixels(dataset)
    return [(float(pixels[k: k + chunk_size].sum()), float(min(chunk_size, len(dataset) - k)))
            for k in range(0, len(dataset), chunk_size)]


def assign_chunks(costs: Sequence[Sequence[float | Sequence[float]]], ranks: int) -> dict[tuple[int, int], int]:
    """Rank of every ``(dataset index, chunk)``, balancing every resource a chunk costs at once.

    A chunk's cost is a number or a tuple of numbers (:func:`chunk_costs`: pixels to decode, cases to infer). Each
    resource is taken as a share of its total over all chunks. Chunks go by decreasing largest share (ties in dataset,
    then chunk order), each to the rank whose largest share would be smallest with it (then the smallest sum of
    shares, then the lowest rank). With one resource this is longest processing time first. Balancing pixels alone
    gave one of four ranks 1.8 times the cases of another (docs/performance.md, issue 22 round 15).

    Deterministic from the costs alone, so independent shards (``--shard i/n``) agree without talking. A chunk is
    written whole by one rank, so stores do not depend on the number of ranks.

    >>> owner = assign_chunks([[9.0, 1.0, 1.0], [5.0, 4.0]], 2)
    >>> [owner[(0, 0)], owner[(1, 0)], owner[(1, 1)], owner[(0, 1)], owner[(0, 2)]]
    [0, 1, 1, 0, 1]
    >>> owner = assign_chunks([[(8.0, 1.0), (8.0, 1.0)], [(1.0, 4.0), (1.0, 4.0)]], 2)  # (pixels, cases)
    >>> sorted(owner.items())
    [((0, 0), 0), ((0, 1), 1), ((1, 0), 0), ((1, 1), 1)]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    vectors = {(d, k): (tuple(float(x) for x in c) if isinstance(c, Sequence) else (float(c),))
               for d, row in enumerate(costs) for k, c in enumerate(row)}
    dims = max((len(v) for v in vectors.values()), default=1)
    if any(len(v) != dims for v in vectors.values()):
        raise ValueError("every chunk's cost must name the same resources")
    totals = [sum(v[i] for v in vectors.values()) or 1.0 for i in range(dims)]
    share = {key: tuple(v[i] / totals[i] for i in range(dims)) for key, v in vectors.items()}
    load = [[0.0] * dims for _ in range(ranks)]
    owner: dict[tuple[int, int], int] = {}
    for key in sorted(share, key=lambda key: (-max(share[key]), key)):
        after = [[load[r][i] + share[key][i] for i in range(dims)] for r in range(ranks)]
        rank = min(range(ranks), key=lambda r: (max(after[r]), sum(after[r]), r))
        owner[key] = rank
        load[rank] = after[rank]
    return owner


def _join_chunk(old: dict[str, np.ndarray], new: dict[str, Any], dataset: BaseDataset) -> dict[str, Any]:
    """The arrays of a stored chunk (checked by :meth:`ResultStore.load_chunk`) joined with newly inferred cases,
    in dataset row order."""
    order = {cid: i for i, cid in enumerate(dataset.cases["case_id"].astype(str))}
    keys = ("case_ids", "scores", "probs", "maps", "sizes", "windows")
    joined = {k: np.concatenate([np.asarray(old[k]), np.asarray(new[k]).astype(old[k].dtype)]) for k in keys}
    at = np.argsort([order[c] for c in joined["case_ids"].tolist()], kind="stable")
    return {k: v[at] for k, v in joined.items()}


def infer_run(cfg: RunConfig, *, shard: tuple[int, int] | None = None, overwrite: bool = False,
              progress: bool = True, check: bool = True,
              keep_going: bool = False, on_dataset: Callable[[int], None] | None = None) -> tuple[Path, bool]:
    """Infer every (dataset, model) of ``cfg`` into the store; the metric tables are computed above this layer
    (:func:`xbench.workflows.run.run`).

    ``keep_going``: a pair whose inference fails with an :class:`~xbench.core.errors.XBenchError` is logged, noted in
    ``run_log.json`` (``failed``) and the run goes on with the other pairs; the failures are raised together at the
    end (no tables are computed then: re-run once fixed, the finished pairs are not recomputed). Every skipped
    case (``on_missing_image: skip``) is listed in ``<output_dir>/skipped_cases.csv``. ``on_dataset(i)`` is called once
    every pair of ``cfg.datasets[i]`` is in the store without failure (so its evaluation can start).

    With ``check`` (default) :func:`xbench.preflight.preflight` runs first and any problem stops the run before a
    model is built. Optional models without weights are left out (logged; noted in ``run_log.json``).
    Returns the output folder and whether this process should evaluate now: false for an independent shard (`xbench
    merge` evaluates once all are present) and for every distributed rank but rank 0.
    """
    from ..preflight import preflight, runnable_models, summary

    run_started = time.perf_counter()  # since_start_seconds in the run log count from here (preflight included)
    started_unix = round(time.time(), 3)  # the same moment on the wall clock: ranks' start-ups can be compared
    report = preflight(cfg) if check else None
    if report is not None:
        report.raise_for_problems()
    models, left_out = runnable_models(cfg, report.left_out if report is not None else None)
    for mspec in models:  # the stores' fingerprints need every weight file's sha256: read while the run starts up
        if mspec.fit_split is None:
            hash_ahead(weight_files(mspec.name, mspec.weights))
    out = check_writable(cfg.output_dir, "output_dir")  # read-only / unwritable: a clear error before inference
    dist = _dist_shard() if shard is None else None
    if dist is not None:
        shard = dist
        _init_distributed(cfg)
    shard = shard or (0, 1)
    if not 0 <= shard[0] < shard[1]:
        raise XBenchError(f"shard index must satisfy 0 <= i < n, got {shard[0]}/{shard[1]}")

    device = with_index(cfg.resolved_device())  # the decoding and building threads use it too
    log: list[dict[str, Any]] = []
    failures: list[str] = []
    skipped_rows: list[dict[str, str]] = []
    built: dict[int, Adapter] = {}  # models without fit_split are built once and serve every dataset
    build_seconds: dict[int, float] = {}  # per model spec: wall seconds of open_model, summed over datasets
    opened = []
    for dspec in cfg.datasets:
        dataset = open_dataset(dspec)
        if not len(dataset):
            raise XBenchError(f"dataset {dspec.name} [{dataset.split}] has no cases (check its root, split and options)")
        opened.append(dataset)
    owner = assign_chunks([chunk_costs(d, cfg.chunk_size) for d in opened], shard[1])  # same on every rank

    ready_at: dict[int, float] = {}  # per model spec: when its network was first built, seconds since run_started

    def timed(mspec: ModelSpec, make: Callable[[], Any]) -> Any:  # seconds summed per model into build_seconds
        t = time.perf_counter()
        made = make()
        build_seconds[id(mspec)] = build_seconds.get(id(mspec), 0.0) + time.perf_counter() - t
        return made

    def build(mspec: ModelSpec, dspec: DatasetSpec) -> Adapter:
        key = id(mspec)
        adapter = built.get(key)
        if adapter is None:
            adapter = timed(mspec, lambda: open_model(mspec, device, dspec, cfg.output_dir, overwrite=overwrite))
        if adapter.weights_label == "random-init" and not (cfg.allow_random_init or mspec.params.get("random_init") is True):
            raise XBenchError(f"model {mspec.name!r} was built random-init (no weights found) but this config does not "
                              "allow random-init models (allow_random_init: true, or params: {random_init: true})")
        if mspec.fit_split is None:
            built[key] = adapter
        ready_at.setdefault(key, round(time.perf_counter() - run_started, 3))
        return adapter

    def chunks_of(d: int) -> list[int]:
        return [k for (dd, k), rank in owner.items() if dd == d and rank == shard[0]]

    ahead_on = feeds.decodes_ahead(cfg, device)
    behind: dict[int, Any] = {}  # dataset index -> its feed, whose decoding follows the previous dataset's
    order = inference_order(opened)  # tables keep the config's order; the run log lists datasets as inferred
    for pos, i in enumerate(order):
        dspec, dataset = cfg.datasets[i], opened[i]
        mine = chunks_of(i)
        feed = behind.pop(i, None)
        twins: dict[int, Adapter] = {}
        building: dict[int, tuple[Future, Adapter]] = {}  # model index -> (its build, its input twin)
        if feed is not None:  # decoding began behind the previous dataset's; every model was built then
            adapters: list[Any] = [built[id(m)] for m in models]
        else:
            # a fresh dataset's inputs are decoded while its networks are built (input twins stand in for them)
            rows = feeds.fresh_rows(cfg, dspec, dataset, models, mine, overwrite) if ahead_on else []
            pending = [m for m in models if id(m) not in built and m.fit_split is None and m.explainer is None]
            for m in pending if rows else []:
                copy = timed(m, partial(input_twin, m.name, m.weights, **m.params))  # its imports, mostly
                if copy is not None:
                    twins[id(m)] = copy
            by_spec = {id(m): build(m, dspec) for m in models if id(m) not in twins}  # before any background build
            # the background builds start before the feed is set up (its calibrations) and decoding starts: the
            # first network is read while the feed gets ready (docs/performance.md, issue 22 round 18)
            building = _build_behind({j: (_weight_bytes(m), partial(build, m, dspec), twins[id(m)])
                                      for j, m in enumerate(models) if id(m) in twins}, device) if twins else {}
            try:
                feed = (feeds.new_feed(cfg, dataset, device,
                                       [twins[id(m)] if id(m) in twins else by_spec[id(m)] for m in models])
                        if cfg.decode_once else None)
                if twins:
                    feed.start(rows)
            except BaseException:
                for future, _ in building.values():
                    future.cancel()  # builds not yet begun; the one under way ends with its thread
                raise
            adapters = [by_spec.get(id(m)) for m in models]
        nxt = order[pos + 1] if pos + 1 < len(order) else None

        def chain(adapters: list[Adapter], feed: Any = feed, nxt: int | None = nxt) -> None:
            """Once every model is built: the next fresh dataset's decoding follows this one's, while its models run."""
            if ahead_on and nxt is not None and all(id(m) in built for m in models):  # none refitted per dataset
                rows = feeds.fresh_rows(cfg, cfg.datasets[nxt], opened[nxt], models, chunks_of(nxt), overwrite)
                if rows:
                    behind[nxt] = feeds.new_feed(cfg, opened[nxt], device, adapters)
                    feed.then(partial(behind[nxt].start, rows))

        try:
            entries = _infer_dataset(cfg, dspec, dataset, models, adapters, feed, shard=shard, overwrite=overwrite,
                                     progress=progress, chunks=mine, keep_going=keep_going, failures=failures,
                                     building=building, expected=len(rows) if building else 0, on_built=chain)
        except BaseException:
            for running in (feed, *behind.values()):  # this feed first: it starts the next one when it ends
                if running is not None:
                    running.stop()  # decoding ahead (input twins, the next dataset) with no pair left to read it
            raise
        done_at = round(time.perf_counter() - run_started, 3)  # this dataset done, this rank: one end for its models
        for mspec, adapter, entry in zip(models, adapters, entries):
            skipped_rows += entry.pop("skipped_cases", [])
            entry["build_seconds"] = round(build_seconds.get(id(mspec), 0.0), 3)  # cumulative for the model
            entry["since_start_seconds"] = done_at
            entry["run_started_unix"] = started_unix
            entry["dataset_skipped_records"] = dict(dataset.skipped)
            entry["weights_label"] = adapter.weights_label
            entry["built_while_decoding"] = id(mspec) in twins
            entry["built_since_start_seconds"] = ready_at.get(id(mspec))  # this rank's first build of the model
            entry["decode_once"] = dict(feed.stats) if feed is not None else None  # cumulative for the dataset
            if feed is not None:
                entry["decode_profile"] = {k: round(v, 3) for k, v in feed.profile.items()}  # cumulative, seconds
            if feed is not None and feed.plans:
                entry["preprocessed_on"] = {"device": str(feed.preprocess_device), "inputs": feed.device_inputs}
            if report is not None:
                entry["preflight_images"] = summary(report).get(dspec.name)
            log.append(entry)
        log += [{"dataset": dspec.name, "model": name, "weights_label": "absent", "left_out": why}
                for name, why in left_out.items()]
        del feed, adapters
        if on_dataset is not None and not any("failed" in e for e in entries):
            on_dataset(i)
    suffix = "" if shard == (0, 1) else f".shard{shard[0]}of{shard[1]}"
    atomic_write_bytes(out / f"run_log{suffix}.json", json.dumps(log, indent=1, default=str).encode())
    write_skips_csv(out / f"skipped_cases{suffix}.csv", skipped_rows)
    if failures:
        raise XBenchError(f"{len(failures)} model × dataset pair(s) failed (the others ran; no tables computed):\n  - "
                          + "\n  - ".join(failures))

    if dist is not None:
        _barrier(shard)
        return out, shard[0] == 0
    return out, shard == (0, 1)  # independent shards: `xbench merge` evaluates once all are present


def _weight_bytes(mspec: ModelSpec) -> int:
    """The size of a model's weight files (0 without any): builds in the background run smallest first."""
    if mspec.fit_split is not None:
        return 0
    return sum(f.stat().st_size for f in weight_files(mspec.name, mspec.weights) if f.is_file())


def _build_behind(jobs: dict[int, tuple[int, Callable[[], Adapter], Adapter]],
                  device: torch.device | None = None) -> dict[int, tuple[Future, Adapter]]:
    """Start ``jobs`` (model index -> (its weight bytes, its build, its input twin)) one after another in a background
    thread, the smallest weight files first (ties in config order), so the first model runs soon while the larger ones
    are read. One thread: builds that seed torch's RNG (random-init) never overlap. On a CUDA ``device`` each build
    runs on a stream of its own (:func:`_on_own_stream`). Builds from weight files in three threads, and the next
    dataset decoded from the first build on, were measured and dropped: on one H200 both made the models' own passes
    slower, and neither ended the run sooner (docs/performance.md, issue 22 round 16)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xbench-build")
    order = sorted(jobs, key=lambda j: (jobs[j][0], j))
    started = {j: (pool.submit(_on_own_stream(jobs[j][1], device)), jobs[j][2]) for j in order}
    pool.shutdown(wait=False)  # the thread ends after the last build
    return started


def _on_own_stream(build: Callable[[], Adapter], device: torch.device | None) -> Callable[[], Adapter]:
    """``build`` on a CUDA stream of its own when ``device`` is CUDA, its work finished before the adapter is handed
    over (otherwise ``build`` itself).

    A network's weights reach the GPU by blocking copies, and PyTorch ends each blocking copy by synchronising the
    copying thread's current stream. On the default stream, which the stepping thread's model passes also use, each
    copy of a background build would first wait for every pass queued there. On a stream of its own it waits for the
    build's own copies only. The stream is synchronised before the adapter is returned, so the stepping thread never
    reads a weight that is still being copied.
    """
    if device is None or device.type != "cuda":
        return build

    def run() -> Adapter:
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            adapter = build()
        stream.synchronize()
        return adapter

    return run


def _infer_dataset(cfg: RunConfig, dspec: DatasetSpec, dataset: BaseDataset, models: Sequence[ModelSpec],
                   adapters: list[Any], feed: Any, *, shard: tuple[int, int], overwrite: bool, progress: bool,
                   chunks: Sequence[int], keep_going: bool, failures: list[str],
                   building: dict[int, tuple[Future, Adapter]] | None = None, expected: int = 0,
                   on_built: Callable[[list[Adapter]], None] | None = None) -> list[dict[str, Any]]:
    """Every model of one dataset; with a decode-once feed the pairs are stepped in turn (a batch of each model, the
    feed decoding ahead in the background), so decoding overlaps the models. One run-log entry per model, in order.

    ``building`` (model index -> (build future, input twin)): networks still being built in the background
    (:func:`_build_behind`); ``adapters[i]`` is None for those, and each is expected to infer ``expected`` cases (the
    rows the feed was started for). Each joins the models in turn once built, its inputs
    taken from what the feed decoded for its twin (:func:`~xbench.inference.feeds.fits_twin`); a model whose twin's
    preprocessing differs runs afterwards from a feed of its own. ``adapters`` is completed in place, and
    ``on_built(adapters)`` is called once every model is built. A failed build is raised at once (the pairs already
    running stop; their written chunks stay).

    ``keep_going``: a pair failing with an :class:`~xbench.core.errors.XBenchError` is logged and noted (``failed``),
    the others go on; otherwise the error is raised.
    """
    entries: dict[int, dict[str, Any]] = {}
    building = dict(building or {})
    apart: list[int] = []  # models whose twins' inputs do not fit them: inferred after, from a feed of their own

    def failed(i: int, exc: XBenchError) -> None:
        if not keep_going:
            raise exc
        label = models[i].label
        logger.error("%s × %s failed: %s", label, dspec.name, exc)
        failures.append(f"{label} × {dspec.name}: {exc}")
        entries[i] = {"dataset": dspec.name, "model": label, "failed": str(exc)}

    def pair(i: int, feed: Any) -> PairRun | None:
        try:
            return PairRun(cfg, dspec, models[i], dataset=dataset, adapter=adapters[i], shard=shard,
                           overwrite=overwrite, feed=feed, chunks=chunks, writer=writer)
        except XBenchError as exc:
            failed(i, exc)
            return None

    def join(i: int) -> PairRun | None:  # a model built in the background: its pair, if its twin's inputs fit it
        future, twin = building.pop(i)
        adapters[i] = future.result()  # a failed build is raised here
        fits = feeds.fits_twin(models[i].label, adapters[i], twin)  # first: a fitting adapter takes its calibration
        if not building and on_built is not None:
            on_built(adapters)
        if not fits:
            apart.append(i)
            return None
        return pair(i, feed)

    # chunks are compressed and written in the background while the models run (zlib releases the GIL), in the order
    # they finish (one thread); leaving this block waits for every queued write, so a failure elsewhere loses no chunk
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xbench-write") if feed is not None else None
    try:
        pairs = {i: p for i in range(len(models)) if i not in building and (p := pair(i, feed)) is not None}
        if not building and on_built is not None:
            on_built(adapters)
        if feed is None:  # each model decodes for itself: one after the other
            for i, run_ in pairs.items():
                try:
                    entries[i] = _drive(run_, progress)
                except XBenchError as exc:
                    failed(i, exc)
            return [entries[i] for i in range(len(models))]
        _step_in_turn(pairs, feed, dspec.name, progress, entries, failed, later=building, join=join, expected=expected)
        if apart:
            feed.release()  # the others are done: what was decoded for the twins goes before decoding again
            alone = feeds.new_feed(cfg, dataset, with_index(cfg.resolved_device()), [adapters[i] for i in apart])
            again = {i: p for i in apart if (p := pair(i, alone)) is not None}
            _step_in_turn(again, alone, dspec.name, progress, entries, failed)
    finally:
        for future, _ in building.values():  # after an error: the builds not begun are dropped
            future.cancel()
        if writer is not None:
            writer.shutdown(wait=True)
    return [entries[i] for i in range(len(models))]


def _step_in_turn(pairs: dict[int, PairRun], feed: Any, name: str, progress: bool, entries: dict[int, dict[str, Any]],
                  failed: Any, *, later: dict[int, Any] | None = None,
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
                ready = [i for i, (future, _) in later.items() if future.done()]
                if not ready and not running:  # nothing to step: wait for the next network
                    wait_futures([future for future, _ in later.values()], return_when=FIRST_COMPLETED)
                    ready = [i for i, (future, _) in later.items() if future.done()]
                for i in sorted(ready):
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


def merge_shards(cfg: RunConfig, sources: Sequence[str | Path]) -> Path:
    """Copy chunk files of shards written to other folders into ``cfg.output_dir``.

    The results store does the joining (:meth:`~xbench.store.results.ResultStore.merge_from`): shards made
    from other inputs (meta keys, weights / annotation fingerprints) are refused naming what differs;
    damaged chunks are refused naming the file. Missing chunks raise an error naming them when the
    tables are computed.
    """
    target = ResultStore(check_writable(cfg.output_dir, "output_dir"))
    for src in sources:
        target.merge_from(src)
    return Path(cfg.output_dir)
