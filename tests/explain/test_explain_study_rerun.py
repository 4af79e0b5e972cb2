"""Notebook 11's study in a folder made with other settings: the error says how to recompute from where it runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import xbench.workflows.run as run_module
from xbench.core.errors import StoreError
from xbench.spec.config import RunConfig
from xbench.store.results import ResultStore
from xbench.workflows.explain_study import explainer_study

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "11_explainers_faithfulness.ipynb"


def _real_conflict(tmp_path: Path) -> StoreError:
    store = ResultStore(tmp_path / "store")
    store.prepare("phantom", "ref_xattn", {"findings": ["Nodule"], "grid": [224, 224], "cases": 16})
    with pytest.raises(StoreError) as caught:
        store.prepare("phantom", "ref_xattn", {"findings": ["Nodule"], "grid": [224, 224], "cases": 8})
    return caught.value


def test_a_study_made_with_other_cases_names_the_way_out_that_reproduce_has(tmp_path, monkeypatch):
    conflict = _real_conflict(tmp_path)
    seen = {}

    def fake_run(cfg, **kw):
        seen.update(kw)
        if not kw.get("overwrite"):
            raise conflict
        raise RuntimeError("recomputing")  # stop here: the flag reached the run

    monkeypatch.setattr(run_module, "run", fake_run)
    cfg = RunConfig.from_yaml("phantom", output_dir=str(tmp_path / "out"))
    with pytest.raises(StoreError) as caught:
        explainer_study(cfg, models=["ref_xattn"], explainers=[], output_dir=tmp_path / "out" / "explain", cases=8)
    msg = str(caught.value)
    assert "-p overwrite true" in msg and str((tmp_path / "out" / "explain").resolve()) in msg
    assert "--overwrite" not in msg  # `xbench reproduce` has no such option
    with pytest.raises(RuntimeError, match="recomputing"):
        explainer_study(cfg, models=["ref_xattn"], explainers=[], output_dir=tmp_path / "out" / "explain", cases=8,
                        overwrite=True)
    assert seen["overwrite"] is True


def test_notebook_11_declares_overwrite_and_passes_it_on():
    cells = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in json.loads(NOTEBOOK.read_text())["cells"]
             if c["cell_type"] == "code"]
    params = next(src for src, tags in cells if "parameters" in tags)
    assert "overwrite = False" in params
    assert any("explainer_study(" in src and "overwrite=overwrite" in src for src, _ in cells)


def test_the_studys_dropped_replicate_notes_come_as_one_warning(tmp_path, monkeypatch):
    import warnings

    from xbench.core.errors import XBenchError, XBenchWarning

    def fake_run(cfg, **kw):
        for model in ("ref_xattn", "ref_xattn+gradcam", "ref_patchsim"):
            warnings.warn(f"score_table({model!r}, 'phantom'): undefined bootstrap replicates dropped (of 1000, per "
                          "class, every metric alike unless listed): 'Nodule' 3", XBenchWarning, stacklevel=1)
        warnings.warn("something else", XBenchWarning, stacklevel=1)

    monkeypatch.setattr(run_module, "run", fake_run)
    cfg = RunConfig.from_yaml("phantom", output_dir=str(tmp_path / "out"))
    with warnings.catch_warnings(record=True) as seen, pytest.raises(XBenchError, match="no metrics table"):
        warnings.simplefilter("always")
        explainer_study(cfg, models=["ref_xattn"], explainers=[], output_dir=tmp_path / "explain", cases=8)
    texts = [str(w.message) for w in seen]
    dropped = [t for t in texts if "replicates dropped" in t]
    assert "something else" in texts and len(dropped) == 1, texts
    assert "in 3 variant(s)" in dropped[0] and "'ref_xattn+gradcam', 'phantom'): 'Nodule' 3" in dropped[0]


def test_a_study_folder_that_is_a_link_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """Containment by real paths: the study writes into `<output_dir>/explain` only when that is a real folder (a link
    would send its store and tables elsewhere)."""
    from xbench.core.errors import XBenchError

    def no_run(cfg, **kw):
        raise AssertionError("the run started")

    monkeypatch.setattr(run_module, "run", no_run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "explain").symlink_to(elsewhere)
    cfg = RunConfig.from_yaml("phantom", output_dir=str(tmp_path / "out"))
    with pytest.raises(XBenchError, match="symbolic link"):
        explainer_study(cfg, models=["ref_xattn"], explainers=[], output_dir=tmp_path / "out" / "explain", cases=8)
    assert not any(elsewhere.iterdir())
