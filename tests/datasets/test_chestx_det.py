"""ChestX-Det10 and ChestX-Det (polygons) on the real Deepwise JSON files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from PIL import Image

from xbench.datasets.base import Box, Polygon
from xbench.datasets.chestx_det import ChestXDet, ChestXDet10
from xbench.datasets.regions import polygon_mask
from xbench.core.errors import FormatError, MissingFileError
from xbench.datasets.checks import counts
from xbench.spec.registry import dataset_manifest

DET10 = ["Atelectasis", "Calcification", "Consolidation", "Effusion", "Emphysema", "Fibrosis", "Fracture", "Mass", "Nodule",
         "Pneumothorax"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cxd")
    os.symlink(shared_path("annotations", "chestx_det10", "test.json"), root / "test.json")
    os.symlink(shared_path("annotations", "chestx_det", "ChestX_Det_test.json"), root / "ChestX_Det_test.json")
    return root


@pytest.fixture(scope="module")
def det10(root) -> ChestXDet10:
    return ChestXDet10(root, "test", manifest=dataset_manifest("chestx_det10"))


@pytest.fixture(scope="module")
def det13(root) -> ChestXDet:
    return ChestXDet(root, "test", manifest=dataset_manifest("chestx_det"))


def write_json(tmp_path: Path, records, name: str = "test.json") -> Path:
    (tmp_path / name).write_text(json.dumps(records))
    return tmp_path


def test_det10_counts(det10):
    assert det10.findings == DET10
    found = counts(det10)
    assert (found["cases"], found["positive_cases"], found["regions"]) == (542, 459, 1476)
    assert found["positives"]["Consolidation"] == 289 and found["region_counts"]["Nodule"] == 166
    assert all(isinstance(r, Box) for _, row in det10.cases.iterrows() for rs in det10._regions(row).values() for r in rs)


def test_det13_counts_classes_and_polygons(det13):
    assert det13.findings == sorted(DET10 + ["Cardiomegaly", "Diffuse Nodule", "Pleural Thickening"])
    found = counts(det13)
    assert (found["cases"], found["positive_cases"], found["regions"]) == (553, 489, 1734)
    assert found["positives"]["Cardiomegaly"] == 70 and found["region_counts"]["Pleural Thickening"] == 105
    sample = det13[int(np.flatnonzero(det13.cases["case_id"] == "36302")[0])]
    (region,) = sample.regions["Effusion"]
    assert isinstance(region, Polygon) and region.points[0].tolist() == [799, 678]
    assert sample.labels["Effusion"] == 1.0 and sample.labels["Nodule"] == 0.0
    mask = sample.mask("Effusion")
    assert (mask == polygon_mask(region.points, (1024, 1024))).all()
    rows, cols = np.nonzero(mask)  # the polygon lies inside its box [799, 666, 937, 761] (inclusive ends)
    assert rows.min() >= 666 and rows.max() <= 761 and cols.min() >= 799 and cols.max() <= 937


def test_det10_known_box_and_negative(det10):
    # test.json: {"file_name": "36302.png", "syms": ["Effusion"], "boxes": [[799, 666, 937, 761]]}
    sample = det10[int(np.flatnonzero(det10.cases["case_id"] == "36302")[0])]
    assert sample.regions["Effusion"] == [Box(799, 666, 937, 761)]
    mask = sample.mask("Effusion")
    assert mask.sum() == 138 * 95 and mask[666, 799] and not mask[761, 937]
    negative = det10[int(np.flatnonzero(det10.cases["case_id"] == "36199")[0])]
    assert set(negative.labels.values()) == {0.0} and not any(negative.regions.values())
    with pytest.raises(MissingFileError, match=r"test_data/36199\.png"):
        negative.image()


def test_polygon_fallback_and_size_from_header(tmp_path):
    records = [{"file_name": "a.png", "syms": ["Mass", "Mass"], "boxes": [[1, 1, 4, 4], [5, 5, 7, 7]],
                "polygons": [[[1, 1], [3, 1], [3, 3]], [[5, 5]]]}]
    root = write_json(tmp_path, records, "ChestX_Det_test.json")
    (root / "test_data").mkdir()
    Image.fromarray(np.zeros((9, 8), dtype=np.uint8)).save(root / "test_data" / "a.png")
    manifest = {k: v for k, v in dataset_manifest("chestx_det").items() if k != "image_size"}
    ds = ChestXDet(root, "test", manifest=manifest)
    sample = ds[0]
    assert sample.size == (9, 8)  # read from the PNG header: no image_size in the manifest
    first, second = sample.regions["Mass"]
    assert isinstance(first, Polygon) and second == Box(5, 5, 7, 7)  # one point: box fallback
    assert sample.image().shape == (9, 8)


@pytest.mark.parametrize("record, message, field", [
    ({"file_name": "b.png", "syms": ["Hernia"], "boxes": [[1, 1, 5, 5]]}, "unknown class 'Hernia'", "syms[0]"),
    ({"file_name": "b.png", "syms": ["Mass"], "boxes": [[1, 1, 1100, 5]]}, "outside", "boxes[0]"),
    ({"file_name": "b.png", "syms": ["Mass"], "boxes": [[1, 1, 5]]}, "expected 4 numbers", "boxes[0]"),
    ({"file_name": "b.png", "syms": ["Mass", "Nodule"], "boxes": [[1, 1, 5, 5]]}, "equal length", "boxes"),
    ({"file_name": "b.png", "boxes": []}, "missing key", "syms"),
])
def test_bad_records(tmp_path, record, message, field):
    root = write_json(tmp_path, [{"file_name": "a.png", "syms": [], "boxes": []}, record])
    with pytest.raises(FormatError, match=message) as info:
        ChestXDet10(root, "test", manifest=dataset_manifest("chestx_det10"))
    assert info.value.path.name == "test.json" and "record 2" in str(info.value) and info.value.field == field
    with pytest.warns(UserWarning, match="skipped 1"):
        ds = ChestXDet10(root, "test", manifest=dataset_manifest("chestx_det10"), on_error="skip")
    assert ds.cases["case_id"].tolist() == ["a"]


def test_invalid_json_and_missing_file(tmp_path):
    (tmp_path / "test.json").write_text('[{"file_name": "a.png",\n "syms": [}]')
    with pytest.raises(FormatError, match="invalid JSON") as info:
        ChestXDet10(tmp_path, "test", manifest=dataset_manifest("chestx_det10"))
    assert info.value.line == 2
    with pytest.raises(MissingFileError, match=r"ChestX_Det_test.json.*Deepwise-AILab/ChestX-Det-Dataset"):
        ChestXDet(tmp_path, "test", manifest=dataset_manifest("chestx_det"))
