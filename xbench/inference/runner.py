"""Inference: every (dataset, model) of a run config into the results store, resumable and shardable.

:func:`infer_run` is the loop over the datasets, in the order they are inferred. The parts it drives are each built
once from the config and take only what they use: the run plan (:mod:`~xbench.inference.plan`: checks, runnable
models, datasets opened, chunks assigned to ranks, knobs), the model builder (:mod:`~xbench.inference.builder`), the
decode-once feeds (:mod:`~xbench.inference.feeds`), the stepper (:mod:`~xbench.inference.stepper`: each pair's
batches, chunks written as they complete, already stored chunks skipped) and the recorder
(:mod:`~xbench.inference.recorder`: run log, skipped cases, timings). Metrics are computed afterwards from the store
alone (:mod:`xbench.evaluation.evaluate`), so re-scoring needs no inference.

A fresh dataset that decodes ahead is decoded while its networks are built (input twins stand in for them), and the
next fresh dataset's decoding follows this one's while its models run. Under ``torchrun`` the ranks meet at a barrier
once every dataset is inferred; shards written to separate folders are joined with :func:`merge_shards`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..core.atomic import check_writable
from ..core.errors import XBenchError
from ..models import Adapter
from ..models.base import input_twin
from ..spec.config import RunConfig
from ..store.results import ResultStore
from . import feeds
from .builder import Building, ModelBuilder, open_model
from .builder import build_behind as _build_behind
from .builder import on_own_stream as _on_own_stream
from .distributed import barrier, with_index
from .distributed import assign_chunks, chunk_costs
from .plan import RunPlan, plan_run
from .recorder import BuildTimes, RunClock, RunRecorder, merge_run_logs
from .stepper import DatasetStepper, PairRun, _flush

# open_model, input_twin, _build_behind and _flush are read from this module when infer_run builds its parts, so a
# caller may replace one here (the tests do); the others are the stage's names as tests and benchmarks import them.
__all__ = ["infer_run", "merge_shards", "open_model", "input_twin", "PairRun", "assign_chunks", "chunk_costs",
           "with_index", "_build_behind", "_on_own_stream", "_flush"]


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
    clock = RunClock()  # since_start_seconds in the run log count from here (preflight included)
    plan = plan_run(cfg, shard=shard, check=check, keep_going=keep_going)
    knobs, times = plan.knobs, BuildTimes(clock)
    builder = ModelBuilder(plan.device, knobs.output_dir, times, overwrite=overwrite,
                           allow_random_init=plan.allow_random_init, open_model=open_model, input_twin=input_twin,
                           build_behind=_build_behind)
    stepper = DatasetStepper(knobs, plan.feed, overwrite=overwrite, progress=progress, keep_going=keep_going,
                             flush=_flush)
    recorder = RunRecorder(knobs.output_dir, plan.shard, clock, times, plan.images)
    behind: dict[int, Any] = {}  # dataset index -> its feed, whose decoding follows the previous dataset's
    for pos, i in enumerate(plan.order):
        entries, adapters, feed, twins = _infer_dataset(plan, builder, stepper, behind, pos, overwrite)
        recorder.dataset_done(plan.datasets[i].name, plan.opened[i].skipped, plan.models, adapters, entries, twins,
                              feed, plan.left_out)
        del feed, adapters  # this dataset's decoded inputs go before the next one's
        if on_dataset is not None and not any("failed" in e for e in entries):
            on_dataset(i)
    recorder.write()
    if stepper.failures:
        raise XBenchError(f"{len(stepper.failures)} model × dataset pair(s) failed (the others ran; no tables "
                          "computed):\n  - " + "\n  - ".join(stepper.failures))
    if plan.distributed:
        barrier(plan.shard)
        return knobs.output_dir, plan.shard[0] == 0
    return knobs.output_dir, plan.shard == (0, 1)  # independent shards: `xbench merge` evaluates once all are present


def _infer_dataset(plan: RunPlan, builder: ModelBuilder, stepper: DatasetStepper, behind: dict[int, Any], pos: int,
                   overwrite: bool) -> tuple[list[dict[str, Any]], list[Any], Any, set[int]]:
    """The ``pos``-th dataset inferred: its feed (started behind the previous dataset's, or set up now while its
    networks are built), then its pairs. Returns the run-log entries, the adapters, the feed and the models built
    while it decoded (by spec identity)."""
    i = plan.order[pos]
    dspec, dataset, mine, models = plan.datasets[i], plan.opened[i], plan.chunks[i], plan.models
    feed = behind.pop(i, None)
    twins: dict[int, Adapter] = {}
    building: Building = {}
    rows: list[int] = []
    if feed is not None:  # decoding began behind the previous dataset's; every model was built then
        adapters: list[Any] = [builder.built[id(m)] for m in models]
    else:
        rows = _fresh_rows(plan, i, overwrite) if plan.decode_ahead else []
        twins = builder.twins(models if rows else [])  # a fresh dataset decodes while its networks are built
        adapters, building = builder.launch(models, dspec, twins)
        try:
            feed = (feeds.new_feed(plan.feed, dataset, [twins[id(m)] if id(m) in twins else a
                                                        for m, a in zip(models, adapters)])
                    if plan.feed is not None else None)
            if twins:
                feed.start(rows)
        except BaseException:
            for future, _ in building.values():
                future.cancel()  # builds not yet begun; the one under way ends with its thread
            raise
    nxt = plan.order[pos + 1] if pos + 1 < len(plan.order) else None
    try:
        entries = stepper.run(dspec, dataset, models, adapters, feed, mine, building=building,
                              expected=len(rows) if building else 0,
                              on_built=partial(_chain, plan, builder, behind, feed, nxt, overwrite))
    except BaseException:
        for running in (feed, *behind.values()):  # this feed first: it starts the next one when it ends
            if running is not None:
                running.stop()  # decoding ahead (input twins, the next dataset) with no pair left to read it
        raise
    return entries, adapters, feed, set(twins)


def _chain(plan: RunPlan, builder: ModelBuilder, behind: dict[int, Any], feed: Any, nxt: int | None, overwrite: bool,
           adapters: list[Adapter]) -> None:
    """Once every model is built: the next fresh dataset's decoding follows this one's, while its models run."""
    if plan.decode_ahead and nxt is not None and builder.all_built(plan.models):  # none refitted per dataset
        rows = _fresh_rows(plan, nxt, overwrite)
        if rows:
            behind[nxt] = feeds.new_feed(plan.feed, plan.opened[nxt], adapters)
            feed.then(partial(behind[nxt].start, rows))


def _fresh_rows(plan: RunPlan, i: int, overwrite: bool) -> list[int]:
    """Dataset ``i``'s rows to decode ahead (:func:`xbench.inference.feeds.fresh_rows`)."""
    return feeds.fresh_rows(ResultStore(plan.knobs.output_dir), plan.datasets[i].name, len(plan.opened[i]),
                            [m.label for m in plan.models], plan.chunks[i], plan.knobs.chunk_size, overwrite)


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
    merge_run_logs(Path(cfg.output_dir), sources)  # the shards' run logs and skipped cases, joined
    return Path(cfg.output_dir)
