"""Notebook 10 (score your own maps, report, exports) runs headlessly through papermill on a small phantom run."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import pytest
import yaml

from conftest import copy_run, tiny_run
from xbench.metrics import DATASET_LEVEL

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "10_score_your_maps.ipynb"
pytestmark = pytest.mark.usefixtures("phantom_cache")


def test_five_lines_are_one_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    five = [c for c in nb.cells if c.cell_type == "code" and "xbench.evaluate_maps(" in c.source]
    assert len(five) == 1 and len(five[0].source.strip().splitlines()) == 5


def test_notebook_runs_on_a_small_phantom_run(tmp_path, phantom_run):
    copy_run(phantom_run, tmp_path / "run")  # the notebook writes its report and exports into the run
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_run(tmp_path / "run")))
    out = tmp_path / "executed.ipynb"
    pm.execute_notebook(str(NOTEBOOK), str(out), cwd=str(NOTEBOOK.parent), progress_bar=False, kernel_name="python3",
                        parameters={"config": str(tmp_path / "run.yaml"), "output_dir": str(tmp_path / "run"),
                                    "maps_output_dir": str(tmp_path / "my_maps")})
    tidy = pd.read_parquet(tmp_path / "my_maps" / "tables" / "metrics.parquet")
    level = tidy[(tidy["finding"] == DATASET_LEVEL)].set_index("metric")["value"]
    assert {"pointing", "dice@best", "best_tau"} <= set(level.index) and "auc" not in level.index
    assert 0 <= level["dice@best"] <= 1
    assert (tmp_path / "run" / "report.html").stat().st_size > 10_000
    assert (tmp_path / "run" / "exports" / "phantom" / "anatomical_prior" / "boxes_coco.json").exists()
    assert (tmp_path / "my_maps" / "tables" / "paper" / "table1_grounding.md").exists()


def test_readme_shows_the_notebook_five_lines():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "code" and "xbench.evaluate_maps(" in c.source)
    readme = (REPO / "README.md").read_text()
    assert cell.replace("output_dir=maps_output_dir", 'output_dir="results/my_maps"') in readme
