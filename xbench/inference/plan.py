"""The run plan: everything a run decides before a model is built, resolved once from its config.

:func:`plan_run` checks the run (:func:`xbench.preflight.preflight`), keeps the runnable models, starts hashing their
weight files, opens every dataset, joins the torchrun group and assigns each dataset's store chunks to the ranks
(:func:`~xbench.inference.distributed.assign_chunks`). The :class:`RunPlan` it returns is plain data; the builder, the stepper and the recorder take
from it only the fields they use.

Scaling out: under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) each rank takes its own shard; ``shard=(i, n)`` runs
shard ``i`` of ``n`` independent processes. Either way a chunk is written whole by the one rank that owns it, so the
stores do not depend on the number of ranks.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.atomic import check_writable
from ..core.errors import XBenchError
from ..datasets import BaseDataset, open_dataset
from ..datasets.base import inference_order
from ..preflight.checks import preflight, runnable_models, summary
from ..spec.config import DatasetSpec, ModelSpec, RunConfig
from ..models.base import weight_files
from ..store.fingerprint import hash_ahead
from .distributed import chunk_costs, rank_share
from .feeds import FeedOptions, decodes_ahead, preprocess_device


@dataclass(frozen=True)
class Knobs:
    """How each (dataset, model) pair is inferred and stored: the chunk and batch sizes, precision, layout, map storage
    dtype, decoding processes of the per-model loader, missing images skipped or raised, the output folder and the
    device the passes run on (as configured: plain ``cuda`` is the stepping thread's current GPU)."""

    output_dir: Path
    device: torch.device
    chunk_size: int
    batch_size: int
    precision: str
    channels_last: bool
    map_dtype: str
    num_workers: int
    skip_missing: bool

    @property
    def map_numpy_dtype(self) -> Any:
        return np.float32 if self.map_dtype == "float32" else np.float16


@dataclass(frozen=True)
class RunPlan:
    """What a run infers and where: the opened datasets (in config order) and the order they are inferred in, this
    rank's chunks of each, the runnable models (and those left out, with why), the knobs, the feeds' options
    (``feed``: None without ``decode_once``) and whether feeds decode ahead of the builds and of the next dataset."""

    knobs: Knobs
    device: torch.device  # with its index (:func:`~xbench.inference.distributed.with_index`): builds and feeds use it
    datasets: tuple[DatasetSpec, ...]
    opened: tuple[BaseDataset, ...]
    order: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    models: tuple[ModelSpec, ...]
    left_out: Mapping[str, str]
    images: Mapping[str, Any] | None  # the preflight's image counts per dataset (None: not checked)
    shard: tuple[int, int]
    distributed: bool
    feed: FeedOptions | None
    decode_ahead: bool
    allow_random_init: bool


def plan_run(cfg: RunConfig, *, shard: tuple[int, int] | None = None, check: bool = True,
             keep_going: bool = False) -> RunPlan:
    """Check and resolve ``cfg`` into a :class:`RunPlan` (the module docstring says what is done, in that order).

    ``check``: run the preflight first; any problem stops the run here, before a model is built (with ``keep_going``
    the error also says how to record each failing pair instead). Optional models
    without weights are left out (logged). An unwritable output folder, a shard index outside ``0 <= i < n`` and a
    dataset without cases are errors naming them.
    """
    report = preflight(cfg) if check else None
    if report is not None:
        report.raise_for_problems(keep_going=keep_going)
    images = summary(report) if report is not None else None
    models, left_out = runnable_models(cfg, report.left_out if report is not None else None)
    for mspec in models:  # the stores' fingerprints need every weight file's sha256: read while the run starts up
        if mspec.fit_split is None:
            hash_ahead(weight_files(mspec.name, mspec.weights))
    out = check_writable(cfg.output_dir, "output_dir")  # read-only / unwritable: a clear error before inference
    run_device = cfg.resolved_device()
    opened = tuple(_opened(dspec) for dspec in cfg.datasets)
    ranks = rank_share(shard, run_device, [chunk_costs(d, cfg.chunk_size) for d in opened])
    device = ranks.device
    knobs = Knobs(out, run_device, cfg.chunk_size, cfg.batch_size, cfg.precision, cfg.channels_last,
                  cfg.map_dtype, cfg.num_workers, cfg.on_missing_image == "skip")
    feed = (FeedOptions(cfg.cache_dir, cfg.num_workers, knobs.skip_missing, preprocess_device(cfg.preprocess_device,
                                                                                             device))
            if cfg.decode_once else None)
    return RunPlan(knobs, device, tuple(cfg.datasets), opened, tuple(inference_order(list(opened))), ranks.chunks,
                   tuple(models), dict(left_out), images, ranks.shard,
                   ranks.distributed, feed,
                   decodes_ahead(cfg.decode_once, cfg.decode_ahead, device), cfg.allow_random_init)


def _opened(dspec: DatasetSpec) -> BaseDataset:
    dataset = open_dataset(dspec)
    if not len(dataset):
        raise XBenchError(f"dataset {dspec.name} [{dataset.split}] has no cases (check its root, split and options)")
    return dataset
