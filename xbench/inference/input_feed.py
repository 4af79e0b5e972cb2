"""Decode once, feed every model: each image is read once per run and kept as each model's exact input.

Why: every adapter's ``preprocess`` starts from the float image at original size and ends with
a per-pixel normalisation. Decoding a 1024² PNG or a 3000² DICOM once per *model* dominated the
GPU run. :class:`InputFeed` decodes each case once (parallel workers), runs every
model's ``preprocess`` on that one decoded image, and keeps the results for the whole run.

The parts, each in a module of its own: the 8-bit calibration of each adapter's input
(:mod:`~xbench.inference.calibration`), the disk cache (:mod:`~xbench.inference.disk_cache`), the decode stage that
turns one row into every model's input (:mod:`~xbench.inference.decode`, run in
:class:`~xbench.inference.decode_pool.DecodePool` workers) and, here, the feed that runs the stage in a thread of its
own and hands models their batches.

GPU preprocessing (``preprocess_device``, :mod:`xbench.inference.gpu_preprocess`): the decode workers return the
image at native size as ``uint8``/``uint16`` (:func:`~xbench.inference.gpu_preprocess.source_array`) instead of
running the resizes; this process uploads it once and computes every ported model's codes on the device, for stacks
of equal-size images at a time (:class:`~xbench.inference.device_stage.DeviceStage`).
A model gets this path only when its kernel reproduces its own ``preprocess`` on probe images and its
code table equals its :class:`~xbench.inference.calibration.ModelInput`'s (checked once per adapter:
:func:`~xbench.inference.gpu_preprocess.proven_plan`); its codes are then the same bytes as the CPU path's
(``tests/inference/test_gpu_preprocess.py``), so caches and stores do not depend on the path.

Timings: the feed's :attr:`InputFeed.profile` is a :class:`~xbench.inference.recorder.Stopwatch` (the run log's
``decode_profile``); the pool and the device stage keep their own, added to it as each decoding ends.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from queue import Queue
from typing import Any, TypeVar

import numpy as np
import torch

from .calibration import ModelInput, model_input
from .decode import CaseItem, Decoded, RowDecoder, share_by_name
from .decode_pool import DecodePool
from .device_stage import STEPS, DeviceStage
from .disk_cache import DiskCache
from .gpu_preprocess import candidate_table, proven_plan
from .pinned_slots import SLOT_BYTES, SlotArena, shared_arena
from .recorder import Stopwatch

__all__ = ["InputFeed"]

T = TypeVar("T")


_COLD = 64  # rows looked up in the decoding thread before a cache with none of them is taken for cold (_from_cache)
_PREFETCH = 2  # rows in flight per decoding process: a new row is sent as soon as one comes back (decode_pool)


class InputFeed:
    """Every model input of one dataset, decoded once (see the module docstring).

    Parameters
    ----------
    dataset : BaseDataset
    adapters : sequence of Adapter
        The models of the run; adapters with equal preprocessing share entries.
    cache_dir : path, optional
        Persistent cache (second runs and other ranks reuse it); None keeps the feed in memory.
    workers : int
        Decoding processes (:class:`~xbench.inference.decode_pool.DecodePool`); 0 decodes in this process.
    skip_missing : bool
        A missing / undecodable image becomes a counted skip instead of an error.
    preprocess_device : torch.device or str, optional
        Where ported models' resizes run (module docstring); None: in the decode workers on the CPU.
    """

    def __init__(self, dataset: Any, adapters: Sequence[Any], *, cache_dir: str | Path | None = None,
                 workers: int = 0, skip_missing: bool = False, preprocess_device: torch.device | str | None = None):
        self.dataset = dataset
        self.preprocess_device = torch.device(preprocess_device) if preprocess_device is not None else None
        self.plans: dict[str, Any] = {}  # transform key -> CodePlan run on preprocess_device
        self.workers = int(workers)
        self.skip_missing = skip_missing
        self.cache = DiskCache(cache_dir) if cache_dir else None
        self.specs: dict[int, ModelInput] = {}
        self._by_key: dict[str, tuple[Any, ModelInput]] = {}
        for adapter in adapters:
            self.add(adapter)
        self.rows: dict[int, tuple[str, dict[str, np.ndarray], str | None, tuple[int, int] | None]] = {}
        self.stats = {"decoded": 0, "from_cache": 0, "skipped": 0}
        self.damaged = 0  # unusable disk-cache files met (each logged as a warning, recomputed, never served)
        self.device_inputs = 0  # model inputs computed on preprocess_device (equal plans counted once per image)
        # seconds: worker time reading files and preprocessing on the CPU (summed over workers), this process's
        # time in device preprocessing (and its steps, device_<step>: DeviceStage.seconds), waiting for the workers
        # (pool_idle) and reading their answers (pool_receive), reading cached rows itself (cache_reads), and the
        # wall time of the decode stage
        self.profile = Stopwatch(("read", "cpu_prep", "device_prep", "wall", "pool_idle", "pool_receive",
                                  "cache_reads", *(f"device_{step}" for step in STEPS)))
        self._luts: dict[tuple[str, str], torch.Tensor] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._queued: set[int] = set()  # rows the decoding thread was started for
        self._halt = threading.Event()
        self._saver: ThreadPoolExecutor | None = None
        self._saves: list[Future] = []
        self._arena: SlotArena | None = None
        self._handed: dict[int, int] = {}  # row -> arena slot handed with it, until the device has read it
        self._start_lock = threading.Lock()  # start() is called by the consumer and by another feed's then()
        self._then_lock = threading.Lock()  # not _start_lock: start() joins the decoding thread while holding that
        self._then: Callable[[], None] | None = None  # run once this feed's decoding first ends without error
        self._ended_once = False

    def add(self, adapter: Any) -> ModelInput:
        """Register an adapter's input (computed for every row decoded from now on); an adapter that does not read
        pixels (:attr:`~xbench.models.base.Adapter.reads_pixels` false) gets nothing decoded (see :meth:`batches`).
        On the GPU path its declared plan's table is a candidate for its calibration, and its plan runs on
        ``preprocess_device`` once proven equal to its CPU path (module docstring)."""
        if id(adapter) not in self.specs:
            device = self.preprocess_device
            spec = model_input(adapter, partial(candidate_table, adapter) if device is not None else None)
            self.specs[id(adapter)] = spec
            if getattr(adapter, "reads_pixels", True) and spec.key not in self._by_key:
                self._by_key[spec.key] = (adapter, spec)
                plan = proven_plan(adapter, spec.lut, device) if device is not None else None
                if plan is not None:
                    self.plans[spec.key] = plan
        return self.specs[id(adapter)]

    def start(self, rows: Iterable[int]) -> None:
        """Decode (or read from the cache) every row not yet held, in row order, in a background thread; consumers
        :meth:`wait` for the rows they need, so the models run while later rows decode."""
        wanted = set(rows)
        with self._start_lock:
            if self._thread is not None and self._thread.is_alive() and wanted <= self._queued:
                return  # already being decoded (started ahead: before the models were built, or by then())
            self._join()
            todo = sorted(wanted - set(self.rows))
            self._queued = set(todo)
            if not todo:
                return
            self._thread = threading.Thread(target=self._produce, args=(todo,), daemon=True, name="xbench-decode")
            self._thread.start()

    def then(self, action: Callable[[], None]) -> None:
        """Run ``action`` (another feed's :meth:`start`: the next dataset's) in the decoding thread once this feed's
        decoding has ended without error, or now if it already has; so the decode stage goes on into the next
        dataset while this one's models still run, one decoding thread and worker pool at a time."""
        with self._then_lock:
            if not self._ended_once:
                self._then = action
                return
        action()

    def wait(self, rows: Iterable[int]) -> None:
        """Block until every row of ``rows`` is held; the decoding thread's error is raised here."""
        rows = list(rows)
        with self._cond:
            while not all(r in self.rows for r in rows):
                if self._error is not None:
                    raise self._error
                if self._thread is None or not self._thread.is_alive():
                    missing = [r for r in rows if r not in self.rows]
                    raise RuntimeError(f"rows {missing[:5]} were never decoded (start() them first)")
                self._cond.wait(timeout=0.5)

    def ensure(self, rows: Iterable[int]) -> None:
        """Decode (or read from the cache) every row not yet held, for every registered model; returns when done."""
        rows = list(rows)
        self.start(rows)
        self.wait(rows)
        self._join()

    def close(self) -> None:
        """Wait for the decoding thread to end; its error, if any, is raised (held rows stay until :meth:`release`)."""
        self._join()

    def stop(self) -> None:
        """Stop decoding (after an error elsewhere): the thread ends at its next row; its own error is dropped."""
        self._halt.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self._halt.clear()
        self._error = None

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _produce(self, todo: list[int]) -> None:
        """The decoding thread: worker processes (:class:`~xbench.inference.decode_pool.DecodePool`) read the files;
        device codes are computed here in stacks (:class:`~xbench.inference.device_stage.DeviceStage`) on a CUDA
        stream of its own, so they overlap the models on the default stream."""
        with self.profile("wall"):
            error, finished = self._decode(todo)
        self._ended(error, finished)

    def _decode(self, todo: list[int]) -> tuple[BaseException | None, bool]:
        """Decode ``todo`` and undo what that set up; returns the error met (raised to the consumer by :meth:`wait`
        and at close) and whether every row was handed on (not halted)."""
        source = RowDecoder(self.dataset, {k: a for k, (a, _) in self._by_key.items()},
                            {k: s for k, (_, s) in self._by_key.items()}, self.cache, self.skip_missing,
                            frozenset(self.plans))
        side, stage = self._device_side()
        # device codes' cache entries are written by a thread of their own, off this (the decode stage's) thread
        self._saver = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="xbench-cache")
                       if stage is not None and self.cache is not None else None)
        self._saves = []
        pool: DecodePool | None = None
        finished, error = False, None
        try:
            todo, pool = self._workers_for(source, todo, stage, side)
            items = pool.imap_unordered(self._tasks(todo)) if pool is not None else map(source.__getitem__, todo)
            with torch.cuda.stream(side) if side is not None else nullcontext():
                finished = self._hand_on(items, stage)
        except BaseException as exc:  # handed to the consumer once everything below is undone
            error = exc
        return self._wind_down(pool, finished, stage, side, error), finished

    def _device_side(self) -> tuple[Any, DeviceStage | None]:
        """The CUDA stream the device codes run on (None off CUDA) and the device stage (None without plans)."""
        device = self.preprocess_device
        if not self.plans or device is None:
            return None, None
        side = torch.cuda.Stream(device) if device.type == "cuda" else None
        return side, DeviceStage(self.plans, device, self._computed)

    def _workers_for(self, source: RowDecoder, todo: list[int], stage: DeviceStage | None,
                     side: Any) -> tuple[list[int], DecodePool | None]:
        """The rows left once the cached ones are read here (:meth:`_from_cache`), and the worker pool for them (None:
        they are decoded in this thread)."""
        if self.workers and self.cache is not None:
            todo = self._from_cache(source, todo)
        if not (self.workers and todo):
            return todo, None
        if stage is not None:  # sources written where they are uploaded from (pinned_slots)
            # rows in the workers, held for a stack, and in flight (DeviceStage's bounds), at most 2 GiB
            slots = min(self.workers * _PREFETCH + 4 * stage.max_images, (2 << 30) // SLOT_BYTES)
            self._arena = source.arena = shared_arena(slots, pin=side is not None)
        return todo, DecodePool(source.into, self.workers, prefetch=_PREFETCH, init=share_by_name)

    def _hand_on(self, items: Iterable[Decoded], stage: DeviceStage | None) -> bool:
        """Each decoded row published, or queued on the device stage when codes of it are computed there; False when
        halted before the last row."""
        for item in items:
            if self._halt.is_set():
                return False
            self.profile.add("read", item.read_seconds)
            self.profile.add("cpu_prep", item.prep_seconds)
            if item.slot is not None:
                item.source = self._arena.view(item.slot, *item.layout)
            elif item.row in self._handed:  # the worker did not need the slot
                self._arena.give(self._handed.pop(item.row))
            if item.source is not None and stage is not None:
                with self.profile("device_prep"):
                    stage.put(item)  # published by _computed once its codes are back
            else:
                self._publish(item)
        if stage is not None:
            with self.profile("device_prep"):
                stage.drain()
        return True

    def _wind_down(self, pool: DecodePool | None, finished: bool, stage: DeviceStage | None, side: Any,
                   error: BaseException | None) -> BaseException | None:
        """Undo what decoding set up: the workers stopped (at once unless finished), slots still handed out given
        back, every cache entry written; the pool's and the stage's counts and seconds added to the feed's. Returns
        the error to hand on: decoding's, else a failed cache write's."""
        if pool is not None:
            pool.close(now=not finished)
            self.profile.add("pool_idle", pool.seconds["idle"])
            self.profile.add("pool_receive", pool.seconds["receive"])
        if self._handed:  # stopped early: no worker writes any more; the device's reads end with the stream's
            if side is not None:
                side.synchronize()
            for slot in self._handed.values():
                self._arena.give(slot)
            self._handed.clear()
        if self._saver is not None:
            self._saver.shutdown(wait=True)  # every entry on disk before the stage is over
            failed = next(filter(None, (f.exception() for f in self._saves)), None)
            error = error if error is not None else failed
            self._saver, self._saves = None, []
        if stage is not None:
            self.device_inputs += stage.device_inputs
            for step, seconds in stage.seconds.items():
                self.profile.add(f"device_{step}", seconds)
        return error

    def _ended(self, error: BaseException | None, finished: bool) -> None:
        """Decoding is over: its error handed to the consumer, or, the first time it ends without one, the action
        left by :meth:`then` run."""
        if error is not None:
            with self._cond:
                self._error = error
                self._cond.notify_all()
        elif finished:
            with self._then_lock:
                self._ended_once, action, self._then = True, self._then, None
            if action is not None:
                action()

    def _from_cache(self, source: RowDecoder, rows: list[int]) -> list[int]:
        """Publish the rows whose every entry is in the disk cache, read here; the others are returned for the
        decode workers (forked only if there are any). Reading a cached row (an index record and a few small ``.npy``
        files) costs less than sending it through a worker's pipe, and a warm run then forks no workers at all.
        Once the first ``_COLD`` rows all missed, the rest go to the workers unread (they look up the cache too)."""
        misses: list[int] = []
        with self.profile("cache_reads"):
            for i, row in enumerate(rows):
                if self._halt.is_set():
                    return []
                if len(misses) >= _COLD and len(misses) == i:  # nothing cached so far: a cold run, the workers look
                    misses.extend(rows[i:])
                    break
                item = source.cached(row)
                if item is None:
                    misses.append(row)
                else:
                    self._publish(item)
        with self._cond:
            self.damaged += source.damaged
        source.damaged = 0
        return misses

    def _tasks(self, rows: list[int]) -> Iterator[tuple[int, int | None]]:
        """``(row, slot)`` for the decode workers: a free arena slot taken as each row is sent (None when none is)."""
        for row in rows:
            slot = self._arena.take() if self._arena is not None else None
            if slot is not None:
                self._handed[row] = slot
            yield row, slot

    def _computed(self, item: Decoded, keys: list[str]) -> None:
        """A row whose device codes are back: its arena slot freed (the upload is done), the row published, and its
        cache entries queued for the saving thread (an error there is raised once the stage ends, like any decoding
        error)."""
        if item.slot is not None:
            self._arena.give(self._handed.pop(item.row))
            item.slot = None
        if self._saver is not None and item.content is not None:
            entries = {key: item.inputs[key] for key in keys}
            self._saves.append(self._saver.submit(self._save, item.content, entries))
        self._publish(item)

    def _save(self, content: str, entries: dict[str, np.ndarray]) -> None:
        for key, array in entries.items():
            self.cache.save(key, content, array)

    def _publish(self, item: Decoded) -> None:
        with self._cond:
            self.rows[item.row] = (item.case_id, item.inputs, item.reason, item.shape)
            self.stats["skipped" if item.reason else ("decoded" if item.decoded else "from_cache")] += 1
            self.damaged += item.damaged
            self._cond.notify_all()

    def release(self) -> None:
        """Stop decoding and drop every held row (the counts and profile stay)."""
        self.stop()
        self.rows.clear()
        self._queued.clear()

    def batches(self, adapter: Any, batches: Sequence[Sequence[int]], device: torch.device, *,
                channels_last: bool = False, prefetch: int = 2) -> Iterator[tuple[list[CaseItem], torch.Tensor | None]]:
        """Yield ``(items, pixels)`` per batch of rows: ``items`` are :class:`CaseItem`,
        ``pixels`` the model input of the non-skipped rows on ``device`` (None if all were skipped).

        Batches are stacked (and pinned for CUDA) in a background thread while the previous one runs.
        """
        spec = self.add(adapter)
        # a model that reads only the batch size gets zeros of its input shape, unless a model that reads pixels
        # registered the same preprocessing (then its decoded inputs, equal to preprocess, are passed)
        blank = spec.key not in self._by_key
        needed = [r for b in batches for r in b]
        if any(r not in self.rows and r not in self._queued for r in needed):
            self.start(needed)  # a caller stepping several models has started every row already
        pin = device.type == "cuda"
        lut = self._lut(spec, device)
        for items, stacked in _ahead(map(partial(self._host_batch, adapter, spec, blank, pin), batches), prefetch):
            if stacked is None:
                yield items, None
            elif blank:  # made on the device: no zeros copied over
                yield items, torch.zeros(stacked, dtype=torch.float32, device=device)
            else:
                yield items, spec.decode(stacked.to(device, non_blocking=pin), lut, channels_last)

    def _lut(self, spec: ModelInput, device: torch.device) -> torch.Tensor | None:
        """``spec``'s code table on ``device`` (copied there once per feed), None for float inputs."""
        key = (spec.key, str(device))
        if spec.lut is not None and key not in self._luts:
            self._luts[key] = torch.from_numpy(spec.lut).to(device)
        return self._luts.get(key)

    def _host_batch(self, adapter: Any, spec: ModelInput, blank: bool, pin: bool, rows: Sequence[int]
                    ) -> tuple[list[CaseItem], torch.Tensor | torch.Size | None]:
        """One batch on the host, once its rows are held: the items and the stacked inputs of the rows read (pinned
        for CUDA); for a ``blank`` model only their shape; None when every row was skipped."""
        self.wait(rows)
        items, arrays = [], []
        for r in rows:
            case_id, out, reason, shape = self.rows[r]
            window = adapter.input_window(shape) if reason is None else None
            items.append(CaseItem(r, case_id, reason, shape, window))
            if reason is None:
                arrays.append(None if blank else out[spec.key])
        if not arrays:
            return items, None
        if blank:
            return items, torch.Size((len(arrays), *spec.shape))
        stacked = torch.from_numpy(np.stack(arrays))
        return items, stacked.pin_memory() if pin else stacked


def _ahead(items: Iterable[T], prefetch: int) -> Iterator[T]:
    """``items`` made in a background thread, at most ``prefetch`` ahead of the consumer; its error is raised here."""
    queue: Queue = Queue(maxsize=max(prefetch, 1))

    def produce() -> None:
        try:
            for item in items:
                queue.put(item)
        except BaseException as exc:  # re-raised in the consumer
            queue.put(exc)
        queue.put(None)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    while (got := queue.get()) is not None:
        if isinstance(got, BaseException):
            raise got
        yield got
    thread.join()
