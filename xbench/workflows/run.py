"""A whole run: inference into the store, then the metric tables — the one place that calls both stages.

:func:`run` and :func:`merge` are what ``xbench run`` / ``xbench merge``, the notebooks and the tests call;
the stages themselves (:mod:`xbench.inference.runner`, :mod:`xbench.evaluation.evaluate`) never import each other.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..spec.config import RunConfig
from ..evaluation.evaluate import evaluate_run
from ..inference.runner import infer_run, merge_shards
from ..outputs.tables import write_paper_tables

__all__ = ["run", "merge"]


def run(cfg: RunConfig, *, shard: tuple[int, int] | None = None, overwrite: bool = False, progress: bool = True,
        evaluate: bool = True, check: bool = True, keep_going: bool = False) -> Path:
    """Infer every (dataset, model) of ``cfg`` into the store, then (unless sharded) compute the metric tables.

    With ``check`` (default) :func:`xbench.inference.preflight.preflight` runs first and any problem stops the run before a
    model is built. Returns the output folder. A re-run with the same config only evaluates (and infers cases
    skipped before). Under ``torchrun`` every rank infers its share and rank 0 evaluates after the barrier.
    ``keep_going``: see :func:`xbench.inference.runner.infer_run`. Besides the tidy tables, the paper-form tables
    (CSV/Markdown/LaTeX/HTML) are written.
    """
    out, evaluate_here = infer_run(cfg, shard=shard, overwrite=overwrite, progress=progress, check=check,
                                   keep_going=keep_going)
    if evaluate and evaluate_here:
        evaluate_run(cfg, progress=progress)
        write_paper_tables(cfg.output_dir)
    return out


def merge(cfg: RunConfig, sources: Sequence[str | Path], *, progress: bool = True) -> Path:
    """Join shards written to other folders into ``cfg.output_dir`` (:func:`xbench.inference.runner.merge_shards`),
    then evaluate."""
    out = merge_shards(cfg, sources)
    evaluate_run(cfg, progress=progress)
    write_paper_tables(cfg.output_dir)
    return out
