"""Issue 20 items 7–10: names that would leave the output folder, annotation files edited after the maps were
stored, NUL bytes in file names, and the chunk_size message.

On a7aa795: a dataset named ``..`` (manifest ``...yaml``) was accepted and its store landed outside ``store/``;
``xbench evaluate`` / ``merge`` after an annotation edit ran silently with other metrics; a ChestX-Det
``file_name`` holding a NUL byte gave a raw ``ValueError``; ``chunk_size: 0`` was reported as ``batch_size``."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_run

from xbench.spec import registry
from xbench.spec.config import RunConfig
from xbench.core.errors import FormatError, XBenchError, XBenchWarning
from xbench.evaluation.evaluate import evaluate_run
from xbench.store.results import ResultStore
from xbench.workflows.run import merge, run


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return fn(*args, **kwargs)


# -- item 7 ------------------------------------------------------------------------------------------------
@pytest.fixture()
def dotdot_manifest(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "datasets"
    folder.mkdir(parents=True)
    phantom = Path(registry.dataset_manifest("phantom")["config_path"]).read_text()
    (folder / "...yaml").write_text(phantom)  # a manifest whose name is '..'
    (folder / "ok+v1.yaml").write_text(phantom)
    monkeypatch.setattr(registry, "MANIFEST_DIRS", [*registry.MANIFEST_DIRS, folder])
    return folder


def test_dataset_named_dotdot_is_refused_at_the_registry_and_the_store(tmp_path, dotdot_manifest):
    with pytest.raises(XBenchError, match=r"dataset name '\.\.' .*is not allowed"):
        registry.dataset_manifest("..")
    with pytest.raises(XBenchError, match=r"'\.\.' .*is not allowed"):
        RunConfig.from_dict(tiny_run(tmp_path / "out", datasets=[{"name": ".."}]))
    assert registry.dataset_manifest("ok+v1")["name"] == "ok+v1"  # '+' (model variants) stays allowed
    store = ResultStore(tmp_path / "out")
    for bad in ("..", "../x", "/abs", "a/b", "", "x\0y", ".hidden"):
        with pytest.raises(XBenchError, match="is not allowed"):
            store.folder(bad, "center_prior")
        with pytest.raises(XBenchError, match="is not allowed"):
            store.folder("phantom", bad)
    assert not (tmp_path / "x").exists()


# -- item 8 ------------------------------------------------------------------------------------------------
def _perturb_first_number(node):
    """Change the first number of a JSON document (one box of one annotation row moves by 1 px); True when done."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        if isinstance(value, int | float) and not isinstance(value, bool):
            node[key] = value + 1
            return True
        if isinstance(value, dict | list) and _perturb_first_number(value):
            return True
    return False


def _edit_annotations(cache: Path) -> Path:
    (path,) = sorted(cache.glob("phantom/test-*/annotations.json"))
    data = json.loads(path.read_text())
    assert _perturb_first_number(data)
    path.write_text(json.dumps(data))
    return path


def test_evaluate_and_merge_refuse_after_an_annotation_edit(tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))  # a private phantom: this test edits it
    torch.set_num_threads(1)
    raw = tiny_run(tmp_path / "run", cases=8, models=["center_prior"], bootstrap={"replicates": 0})
    cfg = RunConfig.from_dict(raw)
    quiet(run, cfg, progress=False)
    shards = []
    for i in range(2):
        shard_cfg = RunConfig.from_dict({**raw, "output_dir": str(tmp_path / f"shard{i}")})
        quiet(run, shard_cfg, shard=(i, 2), progress=False)
        shards.append(tmp_path / f"shard{i}")
    edited = _edit_annotations(tmp_path / "cache")
    with pytest.raises(XBenchError, match=r"annotation file\(s\) changed .*annotations\.json"):
        quiet(evaluate_run, cfg, progress=False)
    merged = RunConfig.from_dict({**raw, "output_dir": str(tmp_path / "merged")})
    with pytest.raises(XBenchError, match=r"annotation file\(s\) changed .*annotations\.json"):
        quiet(merge, merged, shards, progress=False)
    assert edited.exists()


# -- item 9 ------------------------------------------------------------------------------------------------
def test_nul_byte_in_a_chestx_det_file_name_is_a_format_error(tmp_path):
    from xbench.datasets.chestx_det import ChestXDet

    (tmp_path / "test_data").mkdir()
    record = {"file_name": "a\0.png", "syms": [], "boxes": [], "polygons": []}
    (tmp_path / "ChestX_Det_test.json").write_text(json.dumps([record]))
    manifest = {**registry.dataset_manifest("chestx_det"), "image_size": [8, 8]}
    with pytest.raises(FormatError, match=r"ChestX_Det_test\.json.*record 1.*control character") as err:
        ChestXDet(tmp_path, "test", manifest=manifest)
    assert err.value.field == "file_name"
    ds = ChestXDet(tmp_path, "test", manifest=manifest, on_error="skip")
    assert len(ds.cases) == 0 and sum(dict(ds.skipped).values()) == 1


# -- item 10 -----------------------------------------------------------------------------------------------
def test_chunk_size_zero_names_chunk_size(tmp_path):
    with pytest.raises(FormatError, match=r"chunk_size.*got 0") as err:
        RunConfig.from_dict(tiny_run(tmp_path, chunk_size=0))
    assert err.value.field == "chunk_size" and "batch_size" not in str(err.value)
    with pytest.raises(FormatError, match=r"batch_size.*got 0"):
        RunConfig.from_dict(tiny_run(tmp_path, batch_size=0))
