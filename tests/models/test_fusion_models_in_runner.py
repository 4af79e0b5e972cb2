"""Every VLM adapter runs through `xbench run` like the others (full-size architectures, seeded random weights).

Random weights say nothing about grounding quality; this checks the plumbing: registry → adapter →
store → tables, for the fusion models (cross-attention maps), BiomedCLIP needs a config folder and is
covered in tests/models/test_biomedclip.py.
"""
from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch

from conftest import tiny_run
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")
FUSION = ["medklip", "mavl", "kad", "carzero", "devide"]


def test_fusion_adapters_run_end_to_end(tmp_path):
    torch.set_num_threads(2)
    models = [{"name": m, "params": {"random_init": True}} for m in FUSION]
    cfg = RunConfig.from_dict(tiny_run(tmp_path, cases=4, models=models, chunk_size=4, batch_size=4,
                                       bootstrap={"replicates": 0}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)  # DeViDe is unverified; rare classes have one label value
        run(cfg, progress=False)
    log = {e["model"]: e for e in json.loads((tmp_path / "run_log.json").read_text())}
    assert {m: log[m]["cases_inferred"] for m in FUSION} == {m: 4 for m in FUSION}
    assert {log[m]["weights_label"] for m in FUSION} == {"random-init"}
    models_table = pd.read_csv(tmp_path / "tables" / "models.csv").set_index("model")
    assert (models_table.loc[FUSION, "map_source"] == "cross-attention").all()
    assert not models_table.loc["devide", "verified"] and models_table.loc[["medklip", "mavl", "kad", "carzero"], "verified"].all()
    tidy = pd.read_csv(tmp_path / "tables" / "metrics.csv")
    pointing = tidy[(tidy["metric"] == "pointing") & (tidy["finding"] == "(pooled)")].set_index("model")["value"]
    assert set(pointing.index) == set(FUSION) and pointing.between(0, 1).all()
