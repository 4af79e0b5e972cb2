"""xbench.open_run: one call gives a notebook the run's config, tables, evaluation log and model flags."""
from __future__ import annotations

import warnings

import pytest
import yaml
from conftest import tiny_run

import xbench
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError, XBenchWarning
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")


def test_open_run_reads_an_evaluated_run(tmp_path):
    raw = tiny_run(tmp_path / "out", cases=10, models=["center_prior", "random_prior"], bootstrap={"replicates": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(raw), progress=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = xbench.open_run(path)
    assert set(r.metrics["model"]) == {"center_prior", "random_prior"} and len(r.pairs) > 0 and len(r.curves) > 0
    assert r.baselines == ["center_prior", "random_prior"] and r.unverified == [] and r.notes == {}
    assert r.flags == {"baselines": r.baselines, "unverified": [], "notes": {}}
    assert r.datasets == ["phantom"] and "synthetic phantom" in r.label
    assert {e["model"] for e in r.log} == {"center_prior", "random_prior"} and r.log[0]["cases"] == 10
    assert r.path("figures", "x.png") == tmp_path / "out" / "figures" / "x.png" and (tmp_path / "out" / "figures").is_dir()
    with pytest.raises(XBenchError, match="no metrics table"):
        xbench.open_run(path, output_dir=tmp_path / "empty")


def test_a_relative_output_dir_without_a_run_names_the_absolute_folder_and_where_to_run(tmp_path, monkeypatch):
    """A notebook's default `../results/phantom` run from the repository root: the error says where it looked."""
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    with pytest.raises(XBenchError) as caught:
        xbench.open_run("phantom", output_dir="../results/phantom")
    msg = str(caught.value)
    assert str(tmp_path / "results" / "phantom" / "tables") in msg  # absolute
    assert f"working folder {tmp_path / 'repo'}" in msg
    assert "cd notebooks && papermill 01_table1_grounding.ipynb" in msg and "-p output_dir" in msg
