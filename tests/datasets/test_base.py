"""What BaseDataset owns for every loader: the split check, file paths under the root, and the module layout
(region types live with `rasterize`: `regions` does not import `base`, so there is no import cycle)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import xbench.datasets.regions as regions
from xbench.datasets.base import Box
from xbench.datasets.chestx_det import ChestXDet10
from xbench.core.errors import FormatError, UnknownNameError
from xbench.spec.registry import dataset_manifest


def det10(root: Path, split: str = "test") -> ChestXDet10:
    (root / f"{split}.json").write_text(json.dumps([{"file_name": "a.png", "syms": [], "boxes": []}]))
    return ChestXDet10(root, split, manifest={**dataset_manifest("chestx_det10"), "image_size": [8, 8]})


def test_unknown_split_is_refused_before_any_file_is_read(tmp_path):
    with pytest.raises(UnknownNameError, match=r"split of dataset 'chestx_det10' 'tset'.*Did you mean 'test'"):
        ChestXDet10(tmp_path, "tset", manifest=dataset_manifest("chestx_det10"))


def test_paths_come_from_the_manifest_folders(tmp_path):
    ds = det10(tmp_path)
    assert ds.folder("images") == tmp_path / "test_data/"
    assert ds.image_path("a.png") == tmp_path / "test_data" / "a.png"
    assert ds.cases["image_path"].tolist() == [str(tmp_path / "test_data" / "a.png")]
    assert ds.file("annotations") == tmp_path / "test.json"
    with pytest.raises(FormatError, match="outside the dataset root"):
        ds.image_path("../../elsewhere.png")


def test_regions_module_does_not_import_base():
    tree = ast.parse(Path(regions.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert "base" not in imported
    assert Box is regions.Box  # base re-exports the types defined with rasterize


def test_open_dataset_opens_a_run_config_entry(phantom_cache):
    from xbench.spec.config import DatasetSpec
    from xbench.datasets import open_dataset

    spec = DatasetSpec("phantom", split="test", options={"cases": 5})
    ds = open_dataset(spec)
    assert ds.name == "phantom" and len(ds) == 5 and ds.split == "test"
    assert open_dataset(spec, split="prior").split == "prior"
