"""docs/extending.md's "A new metric" example runs: the block, extracted from the doc, registers a per-pair metric
that the evaluation, the tables, the report and the analysis then carry with no other code."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import copy_run, tiny_run

import xbench
from xbench.outputs import analysis, report, tables
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.evaluation.evaluate import evaluate_run, load_tables
from xbench.metrics import DATASET_LEVEL, POOLED, normalize_maps, upsample_maps
from xbench.metrics import table as metric_table
from xbench.store.results import read_chunk_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


@pytest.fixture
def energy(tmp_path):
    """The doc's block run as a module; the metric table is restored afterwards."""
    (code,) = re.findall(r"```python energy_pointing\.py\n(.*?)```", DOC.read_text(), flags=re.S)
    saved = list(metric_table.METRIC_TABLE)
    namespace: dict = {"__name__": "energy_pointing"}
    exec(compile(code, str(tmp_path / "energy_pointing.py"), "exec"), namespace)
    yield namespace
    metric_table.METRIC_TABLE[:] = saved


def test_doc_metric_is_evaluated_tabled_and_reported(energy, phantom_run, tmp_path):
    assert metric_table.display("energy_pointing") == "Energy" and metric_table.is_ranked("energy_pointing")
    out = copy_run(phantom_run, tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        tidy = evaluate_run(RunConfig.from_dict(tiny_run(out)), progress=False)
    pairs = load_tables(out)["pairs"]

    # per pair: the doc's function on the stored center-prior maps, upsampled and normalised as the evaluation does
    data = xbench.load_dataset("phantom", split="test", cases=22)
    mine = pairs[pairs["model"] == "center_prior"]
    files = sorted((out / "store" / "phantom" / "center_prior").glob("chunk-*.npz"))
    parts = [read_chunk_file(f) for f in files]
    maps, ids = np.concatenate([p["maps"] for p in parts]), np.concatenate([p["case_ids"] for p in parts]).tolist()
    row_of = {c: i for i, c in enumerate(data.cases["case_id"].astype(str))}
    expected = []
    for case, finding in zip(mine["case_id"], mine["finding"]):
        m = maps[ids.index(case), data.findings.index(finding)].astype(np.float32)[None]
        mask = data[row_of[case]].mask(finding, (64, 64))[None]
        expected.append(energy["energy_pointing"](normalize_maps(upsample_maps(m, (64, 64))), mask)[0])
    np.testing.assert_allclose(mine["energy_pointing"], expected, rtol=1e-6)

    # class, dataset and pooled rows with CIs, after the fixed-τ rows; the other metrics unchanged
    rows = tidy[(tidy["model"] == "center_prior") & (tidy["metric"] == "energy_pointing")].set_index("finding")
    by_class = mine.groupby("finding")["energy_pointing"].mean()
    np.testing.assert_allclose(rows.loc[by_class.index, "value"], by_class, rtol=1e-12)
    assert rows.at[DATASET_LEVEL, "value"] == pytest.approx(by_class.mean())
    assert rows.at[POOLED, "value"] == pytest.approx(mine["energy_pointing"].mean())
    assert np.isfinite(rows.loc[by_class.index, ["ci_low", "ci_high"]].to_numpy()).all()
    first = tidy[(tidy["model"] == "center_prior") & (tidy["finding"] == by_class.index[0])]["metric"].tolist()
    assert first[:4] == ["pointing", "dice@0.5", "iou@0.5", "energy_pointing"]
    before = load_tables(phantom_run)["metrics"]
    pd.testing.assert_frame_equal(tidy[tidy["metric"] != "energy_pointing"].reset_index(drop=True), before)

    # tables rank it, the report's summary shows it, the lesion-size bins average it
    wide = tables.wide(tidy, rows="model", columns=["dataset"], metrics=["pointing", "energy_pointing"],
                       finding=DATASET_LEVEL)
    assert ("phantom", "energy_pointing", "value") in wide.columns
    assert "energy_pointing" in tables.cell_counts(wide, tidy, finding=DATASET_LEVEL).columns.get_level_values(1)
    summary = report._summary_metrics(set(tidy["metric"]))
    assert summary.index("energy_pointing") == summary.index("iou@0.5") + 1
    assert "energy_pointing" in analysis.size_bins(pairs).columns
