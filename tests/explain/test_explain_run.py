"""`xbench run` with explainer entries on the phantom: stored as model variants, tables and figures end to end."""
from __future__ import annotations

import json

import matplotlib
import pandas as pd
import pytest

from conftest import tiny_run
from xbench.core.atomic import write_frame
from xbench.spec.config import RunConfig
from xbench.outputs.exports import export_run
from xbench.explain.report_section import STUDY_TABLE
from xbench.outputs.report import build_report
from xbench.datasets import load_dataset
from xbench.evaluation.evaluate import load_tables
from xbench.explain.faithfulness import faithfulness_table
from xbench.explain.summary import (faithfulness_summary, plausibility_faithfulness_figure,
                                    plausibility_vs_faithfulness)
from xbench.outputs.figures import visual_comparison
from xbench.models import create_model
from xbench.explain import explained
from xbench.workflows.run import run

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("phantom_cache")


def test_run_with_explainer_entries_end_to_end(tmp_path):
    models = ["ref_xattn", {"name": "ref_xattn", "explainer": "gradcam"},
              {"name": "center_prior", "explainer": "gradxinput"}]
    cfg = RunConfig.from_dict(tiny_run(tmp_path, cases=6, models=models, chunk_size=6, batch_size=3))
    run(cfg, progress=False)
    log = {e["model"]: e for e in json.loads((tmp_path / "run_log.json").read_text())}
    assert {m: log[m]["cases_inferred"] for m in log} == {"ref_xattn": 6, "ref_xattn+gradcam": 6,
                                                            "center_prior+gradxinput": 6}
    tables = load_tables(tmp_path)
    info = tables["models"].set_index("model")
    assert info.loc["ref_xattn+gradcam", "map_source"] == "explainer:gradcam"
    assert info.loc["center_prior+gradxinput", "grid"] == "8x8"  # input 32 px, 4x4 pooling
    tidy = tables["metrics"]
    pooled = tidy[(tidy["finding"] == "(pooled)") & (tidy["metric"] == "pointing")].set_index("model")["value"]
    assert set(pooled.index) == {"ref_xattn", "ref_xattn+gradcam", "center_prior+gradxinput"}
    auc = tidy[tidy["metric"] == "auc"].set_index(["model", "finding"])["value"]
    pd.testing.assert_series_equal(auc["ref_xattn"], auc["ref_xattn+gradcam"])  # the explainer keeps the scores
    assert pooled.between(0, 1).all()

    dataset = load_dataset("phantom", split="test", cases=6)
    fig = visual_comparison(tmp_path, dataset, ["ref_xattn", "ref_xattn+gradcam"], n_cases=2, grid=(64, 64))
    assert len(fig.axes) >= 4

    faith = pd.concat([faithfulness_table(m, dataset, steps=4, road=False)
                       for m in (create_model("ref_xattn"), explained(create_model("ref_xattn"), "gradcam"))])
    summary = faithfulness_summary(faith, n_boot=50)
    frame = plausibility_vs_faithfulness(tidy, summary, dataset="phantom")
    assert set(frame["model"]) == {"ref_xattn", "ref_xattn+gradcam", "center_prior+gradxinput"}
    row = frame.set_index("model").loc["ref_xattn+gradcam"]
    assert row["faithfulness_low"] <= row["faithfulness"] <= row["faithfulness_high"]
    figure = plausibility_faithfulness_figure(frame)
    assert len(figure.axes[0].lines) + len(figure.axes[0].collections) > 0

    # exports and the HTML report take the variants like any model; the report gets the study section
    exported = export_run(tmp_path, tmp_path / "exports")
    assert any("ref_xattn+gradcam" in str(p) or "ref_xattn+gradcam" in p.read_text() for p in exported if p.suffix == ".csv")
    (tmp_path / STUDY_TABLE).parent.mkdir(parents=True)
    write_frame(frame, tmp_path / STUDY_TABLE)
    page = build_report(tmp_path).read_text()
    assert "Explainers and faithfulness" in page and "ref_xattn+gradcam" in page
