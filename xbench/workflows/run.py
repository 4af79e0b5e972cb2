"""A whole run: inference into the store, then the metric tables — the one place that calls both stages.

:func:`run` and :func:`merge` are what ``xbench run`` / ``xbench merge``, the notebooks and the tests call;
the stages themselves (:mod:`xbench.inference.runner`, :mod:`xbench.evaluation.evaluate`) never import each other.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..spec.config import RunConfig
from ..evaluation.evaluate import RunEvaluation, evaluate_run
from ..inference.runner import infer_run, merge_shards
from ..outputs.tables import write_paper_tables

__all__ = ["run", "merge"]


def run(cfg: RunConfig, *, shard: tuple[int, int] | None = None, overwrite: bool = False, progress: bool = True,
        evaluate: bool = True, check: bool = True, keep_going: bool = False) -> Path:
    """Infer every (dataset, model) of ``cfg`` into the store, then (unless sharded) compute the metric tables.

    With ``check`` (default) :func:`xbench.inference.preflight.preflight` runs first and any problem stops the run before a
    model is built. Returns the output folder. A re-run with the same config only evaluates (and infers cases
    skipped before). In one process each dataset is evaluated (worker processes at lower CPU priority,
    :class:`~xbench.evaluation.evaluate.RunEvaluation`) while the next one infers. Under ``torchrun`` every rank infers
    its share, and rank 0 evaluates each dataset once the ranks have filled its store, the rest after the barrier.
    ``keep_going``: see :func:`xbench.inference.runner.infer_run`. Besides the tidy tables, the paper-form tables
    (CSV/Markdown/LaTeX/HTML) are written.
    """
    world = int(os.environ.get("WORLD_SIZE", "1")) if shard is None else 1
    alone = shard in (None, (0, 1)) and world <= 1
    if not evaluate or not alone and not (world > 1 and os.environ.get("RANK", "0") == "0"):
        # an independent shard (`xbench merge` evaluates), a rank other than 0, or no evaluation
        out, evaluate_here = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                                       keep_going=keep_going)
        if evaluate and evaluate_here:
            evaluate_run(cfg, progress=progress)
            write_paper_tables(cfg.output_dir)
        return out
    if not alone:  # rank 0 of torchrun: datasets are evaluated as the ranks fill the store, the rest after the barrier
        evaluation = RunEvaluation(cfg, progress=progress, nice=10, watch_store=True)
        try:
            evaluation.start()
            out, _ = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                               keep_going=keep_going)
            evaluation.finish()
        finally:
            evaluation.close()
        write_paper_tables(cfg.output_dir)
        return out
    # one process: each dataset's pairs are evaluated (worker processes, lower priority) while the next dataset infers
    evaluation: RunEvaluation | None = None

    def inferred(index: int) -> None:
        nonlocal evaluation
        if evaluation is None:  # after preflight and the first dataset: a run stopped earlier starts no workers
            evaluation = RunEvaluation(cfg, progress=progress, nice=10)
            evaluation.start()
        evaluation.ready(index)

    try:
        out, _ = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                           keep_going=keep_going, on_dataset=inferred)
        if evaluation is None:
            evaluation = RunEvaluation(cfg, progress=progress)
        evaluation.finish()
    finally:
        if evaluation is not None:
            evaluation.close()
    write_paper_tables(cfg.output_dir)
    return out


def merge(cfg: RunConfig, sources: Sequence[str | Path], *, progress: bool = True) -> Path:
    """Join shards written to other folders into ``cfg.output_dir`` (:func:`xbench.inference.runner.merge_shards`),
    then evaluate."""
    out = merge_shards(cfg, sources)
    evaluate_run(cfg, progress=progress)
    write_paper_tables(cfg.output_dir)
    return out
