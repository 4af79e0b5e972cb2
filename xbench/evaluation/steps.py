"""A large (dataset, model) pair evaluated in steps over a run's pool, with the bytes of evaluating it in one job.

One pair of a large dataset (the stand-in VinDr-CXR: 3,000 cases, 21 findings, about 18,900 grounding pairs) takes
tens of seconds in one process, and at the end of a multi-GPU run its seven pairs were all that was left while the
pool's other workers idled. :func:`pair_steps` splits it:

1. the grounding rows of consecutive groups of findings (:func:`_ground_job`, about :data:`PAIRS_PER_STEP` pairs
   each), each group's rows written to the pair's private step folder as plain arrays (:func:`write_rows`: an
   ``.npz`` read back without pickles);
2. side by side: the pair's evaluation up to its bootstrap (:func:`_head_job`: score-table rows, per-pair rows,
   curves), and its bootstrap replicates in ranges of batches (:func:`_replicates_job`). Each of these jobs reads
   the rows and builds the score table's statistic itself; each batch's case weights are drawn anew from the seed
   (:func:`xbench.metrics.stats.batch_weights`), the same draws as in one loop;
3. the replicates, gathered in batch order, complete the table in the calling process
   (:meth:`xbench.metrics.PreparedScore.finish`).

Every step computes what :func:`~xbench.evaluation.pair.evaluate_pair` computes, in the same order and with one
BLAS thread, so the tables are its bytes (tested with the split forced on the phantom). Smaller pairs stay one job
(:func:`finding_groups`). The driver is :class:`xbench.evaluation.evaluate.RunEvaluation`.
"""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Generator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import XBenchWarning
from ..datasets import BaseDataset
from ..metrics import PreparedScore
from ..metrics.stats import bootstrap_batches
from ..spec.config import RunConfig
from ..store.results import ResultStore
from .pair import (
    _DROPPED_AT,
    DatasetView,
    PairEvaluation,
    ground_rows,
    naming_the_pair,
    pair_counts,
    prepared_score,
    read_predictions,
    scored_head,
    with_replicates,
    worker_ground_truth,
)
from .worker_state import State, apply_state

__all__ = ["SPLIT_PAIRS", "PAIRS_PER_STEP", "BATCHES_PER_STEP", "MOST_STEPS", "finding_groups", "pair_steps", "Steps",
           "write_rows", "read_rows"]

#: A pair is evaluated in steps when its dataset has at least this many grounding pairs (positives with a region),
#: or ten times this many (case, finding) labels; smaller pairs are one job.
SPLIT_PAIRS = 4000
#: Grounding pairs per grounding step (about: a finding's pairs stay together).
PAIRS_PER_STEP = 2500
#: Bootstrap batches (of 100 replicates) per replicates step.
BATCHES_PER_STEP = 3
#: The most grounding steps of one pair (and so of its jobs that run at once): a run's pool may hold this many
#: workers per pair (:class:`~xbench.evaluation.evaluate.RunEvaluation`).
MOST_STEPS = 8


def finding_groups(dataset: BaseDataset, pairs: Mapping[str, int]) -> list[list[int]] | None:
    """Consecutive groups of finding indices with about :data:`PAIRS_PER_STEP` grounding pairs each (``pairs``:
    grounding pairs per finding, :func:`~xbench.evaluation.ground_truth.ground_truth_file`), when the pair is large
    enough to be split (:data:`SPLIT_PAIRS`); None when it is evaluated as one job."""
    sizes = [int(pairs.get(f, 0)) for f in dataset.findings]
    total = sum(sizes)
    if total < SPLIT_PAIRS and len(dataset) * len(dataset.findings) < 10 * SPLIT_PAIRS:
        return None
    steps = max(1, min(len(sizes), math.ceil(total / PAIRS_PER_STEP), MOST_STEPS))
    groups: list[list[int]] = [[]]
    done = 0
    for c, n in enumerate(sizes):
        if groups[-1] and done >= len(groups) * total / steps:
            groups.append([])
        groups[-1].append(c)
        done += n
    return groups


def _batch_ranges(n_batches: int) -> list[tuple[int, int]]:
    """``(first batch, batches)`` of each replicates step: contiguous, near-equal, about
    :data:`BATCHES_PER_STEP` each.

    >>> _batch_ranges(10) if BATCHES_PER_STEP == 3 else None
    [(0, 3), (3, 3), (6, 2), (8, 2)]
    """
    if n_batches == 0:
        return []
    jobs = math.ceil(n_batches / BATCHES_PER_STEP)
    sizes = [n_batches // jobs + (k < n_batches % jobs) for k in range(jobs)]
    return [(sum(sizes[:k]), size) for k, size in enumerate(sizes)]


def pair_steps(cfg: RunConfig, shipped: tuple[State, BaseDataset], view: DatasetView, model: str, gt_file: Path,
               gt_key: dict[str, Any], groups: list[list[int]],
               folder: Path) -> Generator[list[tuple], list[Any], tuple[Any, list]]:
    """One (dataset, model) as :func:`~xbench.evaluation.pair.evaluate_pair` computes it, in steps run by a pool
    (see the module docstring): yields lists of jobs ``(function, *arguments)`` and is sent each job's
    ``(result, caught warnings)``, in order; returns ``((evaluation, model_info), caught)`` with the warnings the
    one-call evaluation raises, in its order. ``view``: :class:`~xbench.evaluation.pair.DatasetView` of the dataset,
    what the grounding and replicates steps get instead of the dataset (the head step gets the dataset, to check
    its annotation files). ``folder``: the pair's private step folder (its files are this run's own; the caller
    removes it)."""
    state, dataset = shipped
    common = (state, view, cfg, model)
    parts = [folder / f"rows-{k}.npz" for k in range(len(groups))]
    grounded = yield [(_ground_job, *common, gt_file, gt_key, group, part) for group, part in zip(groups, parts)]
    caught = [w for _, got in grounded for w in got]
    counts = {f: n for (found, _), _ in grounded for f, n in found.items()}
    written = [part for ((_, wrote), _), part in zip(grounded, parts) if wrote]
    ranges = _batch_ranges(len(bootstrap_batches(cfg.bootstrap_replicates)))  # PreparedScore's batches
    done = yield ([(_head_job, state, dataset, cfg, model, written, counts)] +
                  [(_replicates_job, *common, written, first, n) for first, n in ranges])
    (head, prepared, info), got = done[0]
    caught += got + [w for _, got in done[1:] for w in got]
    reps = np.concatenate([r for r, _ in done[1:]]) if len(done) > 1 else None
    result, message = with_replicates(head, prepared, reps)
    if message is not None:
        caught.append((message, XBenchWarning, *_DROPPED_AT))
    return (result, info), caught


def _ground_job(state: State, view: DatasetView, cfg: RunConfig, model: str, gt_file: Path, gt_key: dict[str, Any],
                findings: list[int], out: Path) -> tuple[dict[str, dict[str, int]], bool]:
    """Worker: the grounding rows of ``findings`` written to ``out`` (:func:`write_rows`); returns their pair
    counts and whether there were rows. Only these findings' ground truth is unpacked."""
    with naming_the_pair(view.name, model):
        apply_state(state)
        preds = read_predictions(cfg, view, model, ResultStore(cfg.output_dir))
        gt = worker_ground_truth(gt_file, gt_key, [view.findings[c] for c in findings])
        frame, counts = ground_rows(cfg, view, preds, gt, findings)
        if frame is not None:
            write_rows(out, frame)
        return counts, frame is not None


def _inputs(cfg: RunConfig, view: DatasetView, model: str, parts: list[Path],
            dataset: BaseDataset | None = None) -> tuple[Any, pd.DataFrame | None]:
    """The stored predictions (checked against ``dataset``'s annotation files when given) and the grounding rows of
    ``parts``, concatenated in order (None when none)."""
    preds = read_predictions(cfg, view, model, ResultStore(cfg.output_dir), dataset=dataset)
    frames = [read_rows(part) for part in parts]
    return preds, (pd.concat(frames, ignore_index=True) if frames else None)


def _head_job(state: State, dataset: BaseDataset, cfg: RunConfig, model: str, parts: list[Path],
              counts: dict[str, dict[str, int]]) -> tuple[PairEvaluation, PreparedScore, dict]:
    """Worker: the pair's evaluation up to its bootstrap from the rows in ``parts``, the prepared score table
    without its statistic, and the model's ``model_info``; the dataset's annotation files are checked here."""
    with naming_the_pair(dataset.name, model):
        apply_state(state)
        view = DatasetView.of(dataset)
        preds, pairs = _inputs(cfg, view, model, parts, dataset)
        every = pair_counts(view, model, preds)
        every["pairs"] = counts
        head, prepared = scored_head(cfg, view, model, preds, pairs, every)
        info = ResultStore(cfg.output_dir).meta(dataset.name, model)["model_info"]
        return head, prepared.without_statistic(), info


_PREPARED: dict[str, PreparedScore] = {}  # worker: the last pair's prepared score table, by step folder


def _replicates_job(state: State, view: DatasetView, cfg: RunConfig, model: str, parts: list[Path], first: int,
                    batches: int) -> np.ndarray:
    """Worker: the bootstrap replicates of batches ``first`` … ``first + batches - 1`` of the pair whose rows are in
    ``parts``. The score table is prepared here as :func:`_head_job` prepares it (its warnings are the head's, not
    raised again) and kept for the pair's next range in this process."""
    with naming_the_pair(view.name, model):
        apply_state(state)
        key = str(parts[0].parent) if parts else f"{view.name}\0{model}\0{cfg.output_dir}"
        if key not in _PREPARED:
            _PREPARED.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                preds, pairs = _inputs(cfg, view, model, parts)
                _PREPARED[key] = prepared_score(cfg, view, model, preds, pairs)[0]
        prepared = _PREPARED[key]
        return np.concatenate([prepared.replicates(b) for b in range(first, first + batches)])


# -- the rows of a grounding step on disk: plain arrays, no pickles --------------------------------------------------

def write_rows(path: Path, frame: pd.DataFrame) -> None:
    """Write grounding rows as an ``.npz`` of plain arrays (the folder must exist: a pair whose step folder was
    removed, after an error, writes nothing), column by column: numbers as they are, text as unicode,
    per-row arrays (the τ curves) stacked into one 2-D array; :func:`read_rows` rebuilds the same frame. A column
    of any other kind is refused (``TypeError``), never written approximately."""
    arrays: dict[str, np.ndarray] = {}
    columns = []
    for k, name in enumerate(frame.columns):
        values = frame[name].to_numpy()
        if values.dtype != object:
            kind = "plain"
        elif len(values) and all(isinstance(v, np.ndarray) and v.shape == values[0].shape for v in values):
            values, kind = np.stack(values), "stacked"
        elif all(isinstance(v, str) and not v.endswith("\0") for v in values):  # numpy text drops trailing NULs
            values, kind = values.astype(str), "text"
        else:
            raise TypeError(f"grounding rows: column {name!r} holds values other than numbers, text or arrays of one "
                            "shape")
        arrays[f"c{k}"] = values
        columns.append([name, kind])
    np.savez(path, columns=np.array(json.dumps(columns)), **arrays)  # into an existing folder: never made here


def read_rows(path: Path) -> pd.DataFrame:
    """The frame :func:`write_rows` wrote (no pickled object is read)."""
    with np.load(path, allow_pickle=False) as stored:
        data: dict[str, Any] = {}
        for k, (name, kind) in enumerate(json.loads(str(stored["columns"]))):
            values = stored[f"c{k}"]
            data[name] = list(values) if kind == "stacked" else values.astype(object) if kind == "text" else values
    return pd.DataFrame(data)


class Steps:
    """A pair in steps: its :func:`pair_steps` generator, the futures of its current step, and the future that gets
    its result (what a one-job pair's future holds)."""

    def __init__(self, steps: Generator, folder: Path):
        self.steps, self.folder = steps, folder
        self.future: Future = Future()
        self.pending: list[Future] = []
        self.started = False
