"""A whole run: inference into the store, then the metric tables — the one place that calls both stages.

:func:`run` and :func:`merge` are what ``xbench run`` / ``xbench merge``, the notebooks and the tests call;
the stages themselves (:mod:`xbench.inference.runner`, :mod:`xbench.evaluation.evaluate`) never import each other.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..core.lock import output_lock
from ..spec.config import RunConfig
from ..evaluation.evaluate import RunEvaluation, evaluate_run
from ..inference.runner import infer_run, merge_shards
from ..outputs.tables import write_paper_tables
from .evaluation_process import EvaluationProcess, apart, finish_here

__all__ = ["run", "merge"]


def run(cfg: RunConfig, *, shard: tuple[int, int] | None = None, overwrite: bool = False, progress: bool = True,
        evaluate: bool = True, check: bool = True, keep_going: bool = False) -> Path:
    """Infer every (dataset, model) of ``cfg`` into the store, then (unless sharded) compute the metric tables.

    With ``check`` (default) :func:`xbench.preflight.preflight` runs first and any problem stops the run before a
    model is built. Returns the output folder. A re-run with the same config only evaluates (and infers cases
    skipped before). In one process each dataset is evaluated (worker processes at lower CPU priority,
    :class:`~xbench.evaluation.evaluate.RunEvaluation`; coordinated by a process of its own on CUDA runs,
    ``eval_process``) while the next one infers. Under ``torchrun`` every rank infers
    its share, and rank 0 evaluates each dataset once the ranks have filled its store, the rest after the barrier.
    ``keep_going``: see :func:`xbench.inference.runner.infer_run`. Besides the tidy tables, the paper-form tables
    (CSV/Markdown/LaTeX/HTML) are written. The output folder's lock (:func:`xbench.core.lock.output_lock`) is held
    throughout: a second run, evaluate or merge on the folder refuses while this one works.
    """
    with output_lock(cfg.output_dir, "run"):
        return _run(cfg, shard=shard, overwrite=overwrite, progress=progress, evaluate=evaluate, check=check,
                    keep_going=keep_going)


def _run(cfg: RunConfig, *, shard: tuple[int, int] | None, overwrite: bool, progress: bool, evaluate: bool,
         check: bool, keep_going: bool) -> Path:
    world = int(os.environ.get("WORLD_SIZE", "1")) if shard is None else 1
    alone = shard in (None, (0, 1)) and world <= 1
    rank0 = world > 1 and os.environ.get("RANK", "0") == "0"
    if not evaluate or not (alone or rank0):  # no evaluation, a rank other than 0, or a shard (`xbench merge`)
        out, evaluate_here = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                                       keep_going=keep_going)
        if evaluate and evaluate_here:
            evaluate_run(cfg, progress=progress)
            write_paper_tables(cfg.output_dir)
        return out
    # each dataset is evaluated (worker processes, lower priority) while the next one infers: in one process once its
    # pairs are inferred; on rank 0 of torchrun once every rank's chunks of it are in the store (from the start)
    # with eval_process (auto: CUDA runs) the evaluation is coordinated by a process of its own (evaluation_process)
    evaluation: RunEvaluation | EvaluationProcess | None = None

    def started() -> RunEvaluation | EvaluationProcess:
        nonlocal evaluation
        if evaluation is None:
            kind = EvaluationProcess if apart(cfg) else RunEvaluation
            evaluation = kind(cfg, progress=progress, nice=10, watch_store=rank0)
            evaluation.start()
        return evaluation

    try:
        if rank0:
            started()
        out, _ = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                           keep_going=keep_going, on_dataset=(lambda i: started().ready(i)) if alone else None)
        if evaluation is None:  # no dataset was handed over (infer_run raises when a pair failed)
            evaluation = RunEvaluation(cfg, progress=progress)
        evaluation.mark("inference_done")
        if isinstance(evaluation, EvaluationProcess):
            evaluation.complete()
        else:
            finish_here(evaluation)
    finally:
        if evaluation is not None:
            evaluation.close()
    return out


def merge(cfg: RunConfig, sources: Sequence[str | Path], *, progress: bool = True) -> Path:
    """Join shards written to other folders into ``cfg.output_dir`` (:func:`xbench.inference.runner.merge_shards`),
    then evaluate, holding the output folder's lock (:func:`xbench.core.lock.output_lock`)."""
    with output_lock(cfg.output_dir, "merge"):
        out = merge_shards(cfg, sources)
        evaluate_run(cfg, progress=progress)
        write_paper_tables(cfg.output_dir)
    return out
