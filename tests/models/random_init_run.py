"""Test helper shared by the tests that run VLM adapters through ``xbench run`` with seeded random weights
(``from random_init_run import run_random_init``): plumbing (registry → adapter → store → tables), not grounding."""
from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from conftest import tiny_run

from xbench.core.errors import XBenchWarning
from xbench.spec.config import RunConfig
from xbench.workflows.run import run


def run_random_init(output_dir: Path, names: Sequence[str], cases: int) -> tuple[dict[str, dict], pd.Series]:
    """The phantom run (:func:`conftest.tiny_run`) of the models ``names`` with ``random_init`` on ``cases`` cases in one
    chunk and batch, without bootstrap, 2 threads; XBench warnings silenced (rare classes have one label value on
    a few cases, DeViDe is unverified). Returns the run log by model and each model's pooled pointing accuracy."""
    torch.set_num_threads(2)
    models = [{"name": m, "params": {"random_init": True}} for m in names]
    cfg = RunConfig.from_dict(tiny_run(output_dir, cases=cases, models=models, chunk_size=cases, batch_size=cases,
                                       bootstrap={"replicates": 0}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False)
    log = {e["model"]: e for e in json.loads((output_dir / "run_log.json").read_text())}
    tidy = pd.read_csv(output_dir / "tables" / "metrics.csv")
    pointing = tidy[(tidy["metric"] == "pointing") & (tidy["finding"] == "(pooled)")].set_index("model")["value"]
    return log, pointing
