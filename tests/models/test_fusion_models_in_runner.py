"""Every VLM adapter runs through `xbench run` like the others (full-size architectures, seeded random weights).

Random weights say nothing about grounding quality; this checks the plumbing: registry → adapter →
store → tables, for the fusion models (cross-attention maps), BiomedCLIP needs a config folder and is
covered in tests/models/test_biomedclip.py.
"""
from __future__ import annotations

import pandas as pd
import pytest

from random_init_run import run_random_init

pytestmark = pytest.mark.usefixtures("phantom_cache")
FUSION = ["medklip", "mavl", "kad", "carzero", "devide"]


def test_fusion_adapters_run_end_to_end(tmp_path):
    log, pointing = run_random_init(tmp_path, FUSION, cases=4)
    assert {m: log[m]["cases_inferred"] for m in FUSION} == {m: 4 for m in FUSION}
    assert {log[m]["weights_label"] for m in FUSION} == {"random-init"}
    models_table = pd.read_csv(tmp_path / "tables" / "models.csv").set_index("model")
    assert (models_table.loc[FUSION, "map_source"] == "cross-attention").all()
    assert not models_table.loc["devide", "verified"] and models_table.loc[["medklip", "mavl", "kad", "carzero"], "verified"].all()
    assert set(pointing.index) == set(FUSION) and pointing.between(0, 1).all()
