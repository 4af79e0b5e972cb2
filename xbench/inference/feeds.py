"""A run's decode-once feeds (:class:`xbench.inference.input_feed.InputFeed`): where their resizes run
(``preprocess_device``) and what they decode ahead (``decode_ahead``), before a dataset's pairs are planned.

Decoding ahead fills two places where the decode stage would otherwise wait (docs/performance.md):

* while a fresh dataset's networks are built (one after another in a background thread, each model inferring once
  its network is built), its feed decodes with *input twins* (:func:`xbench.models.base.input_twin`), and
  :func:`fits_twin` checks each built adapter against its twin;
* while a dataset's models run, the next fresh dataset's feed starts once this one's decoding ends
  (:meth:`xbench.inference.input_feed.InputFeed.then`).

``auto`` (the default) is on for CUDA runs only: on the CPU decoding competes with the models for the same cores.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..datasets import BaseDataset
from ..models import Adapter
from ..store.results import ResultStore, chunk_rows
from .calibration import inherit_input
from .input_feed import InputFeed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedOptions:
    """What every decode-once feed of a run is built with: the image cache folder, the decoding processes, whether an
    unreadable image is a counted skip, and where the ported models' resizes run (None: the CPU path)."""

    cache_dir: str | Path | None
    workers: int
    skip_missing: bool
    preprocess_device: torch.device | None


def decodes_ahead(decode_once: bool, decode_ahead: bool | str, device: torch.device) -> bool:
    """Whether this run decodes ahead: ``decode_once`` and ``decode_ahead`` true, or ``auto`` on a CUDA device."""
    return decode_once and (decode_ahead is True or (decode_ahead == "auto" and device.type == "cuda"))


def preprocess_device(setting: str, device: torch.device) -> torch.device | None:
    """Where ported models' resizes run (``preprocess_device``: ``auto`` = the run device if CUDA, ``device`` = the
    run device, ``cpu`` = the decode workers); None means the CPU path (:class:`xbench.inference.input_feed.InputFeed`)."""
    if setting == "device" or (setting == "auto" and device.type == "cuda"):
        return device
    return None


def new_feed(options: FeedOptions, dataset: BaseDataset, adapters: Sequence[Any]) -> InputFeed:
    """The decode-once feed (:class:`xbench.inference.input_feed.InputFeed`) of ``dataset`` for ``adapters``."""
    return InputFeed(dataset, adapters, cache_dir=options.cache_dir, workers=options.workers,
                     skip_missing=options.skip_missing, preprocess_device=options.preprocess_device)


def fresh_rows(store: ResultStore, dataset: str, cases: int, labels: Sequence[str], chunks: Sequence[int],
               chunk_size: int, overwrite: bool) -> list[int]:
    """Every row of this rank's ``chunks`` of a dataset (``cases`` rows in all) when none of them is in the store of
    any model (``labels``) yet, or ``overwrite``: then every pair needs every row, and they can be decoded before the
    pairs are planned (while the networks are built, or while the previous dataset's models run). Empty otherwise: a
    resumed dataset decodes what its pairs plan."""
    if not overwrite and any(store.chunk_path(dataset, label, k).exists() for label in labels for k in chunks):
        return []
    return [r for k in sorted(chunks) for r in chunk_rows(k, chunk_size, cases)]


def fits_twin(label: str, adapter: Adapter, twin: Adapter) -> bool:
    """Whether what a feed decoded for ``twin`` may be given to the built ``adapter``: true when the adapter maps the
    two probe images to its twin's values bit for bit and reads pixels as its twin does (it then takes the twin's input
    calibration, :func:`~xbench.inference.calibration.inherit_input`). False (a twin whose preprocessing differs: a bug) is
    logged; the runner then infers that model from a feed of its own, decoded from the start."""
    if (getattr(adapter, "reads_pixels", True) == getattr(twin, "reads_pixels", True)
            and inherit_input(adapter, twin)):
        return True
    logger.warning("inputs decoded ahead for %s do not match the built model's preprocessing; decoding again", label)
    return False
