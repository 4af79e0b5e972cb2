"""NIH ChestX-ray14 boxes on the real BBox_List_2017.csv + Data_Entry_2017_v2020.csv."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from PIL import Image

from xbench.datasets.nih_bbox import NIHBoxes
from xbench.core.errors import FormatError, MissingFileError
from xbench.datasets.checks import counts
from xbench.spec.registry import dataset_manifest

HEADER = "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"


@pytest.fixture(scope="module")
def real_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nih")
    for name in ("BBox_List_2017.csv", "Data_Entry_2017_v2020.csv"):
        os.symlink(shared_path("annotations", "nih_chestxray14", name), root / name)
    return root


@pytest.fixture(scope="module")
def ds(real_root) -> NIHBoxes:
    return NIHBoxes(real_root, manifest=dataset_manifest("nih_bbox"))


@pytest.fixture(scope="module")
def small_entry(tmp_path_factory) -> Path:
    """Data_Entry header plus the rows of the two sample images and one boxed image."""
    src = shared_path("annotations", "nih_chestxray14", "Data_Entry_2017_v2020.csv")
    keep = ("00000001_000.png", "00027426_000.png", "00013118_008.png")
    with open(src) as handle:
        lines = [line for i, line in enumerate(handle) if i == 0 or line.startswith(keep)]
    path = tmp_path_factory.mktemp("entry") / "Data_Entry_2017_v2020.csv"
    path.write_text("".join(lines))
    return path


def small_root(tmp_path: Path, entry: Path, rows: list[str]) -> Path:
    os.symlink(entry, tmp_path / "Data_Entry_2017_v2020.csv")
    (tmp_path / "BBox_List_2017.csv").write_text(HEADER + "".join(r + "\n" for r in rows))
    return tmp_path


def test_counts_and_classes(ds):
    assert ds.findings == ["Atelectasis", "Cardiomegaly", "Effusion", "Infiltrate", "Mass", "Nodule", "Pneumonia", "Pneumothorax"]
    found = counts(ds)
    assert (found["cases"], found["regions"]) == (880, 984)
    assert found["region_counts"] == {"Atelectasis": 180, "Cardiomegaly": 146, "Effusion": 153, "Infiltrate": 123,
                                      "Mass": 85, "Nodule": 79, "Pneumonia": 120, "Pneumothorax": 98}
    assert set(ds.cases["view"]) == {"PA", "AP"}
    assert (ds.cases[["height", "width"]] == 1024).all().all()


def test_infiltrate_labels_come_from_data_entry_infiltration(ds):
    labels = ds.labels()
    infiltrate = labels[:, ds.findings.index("Infiltrate")]
    # 123 boxed, but Data_Entry says "Infiltration" on 312 of the 880 images (datasets.md §6)
    assert infiltrate.sum() == 312
    boxed = np.array([len(ds._regions(row)["Infiltrate"]) > 0 for _, row in ds.cases.iterrows()])
    assert boxed.sum() == 123 and (infiltrate[boxed] == 1).all()
    assert not np.isnan(labels).any()


def test_known_box_at_1024_and_224(ds):
    # line 2: 00013118_008.png,Atelectasis,225.084745762712,547.019216763771,86.7796610169491,79.1864406779661
    sample = ds[int(np.flatnonzero(ds.cases["case_id"] == "00013118_008.png")[0])]
    assert sample.labels["Atelectasis"] == 1.0 and sample.view == "PA"
    rows, cols = np.nonzero(sample.mask("Atelectasis"))
    # x in [225.08, 311.86): centres 225.5..311.5; y in [547.02, 626.21): centres 547.5..625.5
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (547, 625, 225, 311)
    rows, cols = np.nonzero(sample.mask("Atelectasis", (224, 224)))
    # centre (c+0.5)*1024/224 in [225.08, 311.86) → c = 49..67; rows: [547.02, 626.21) → r = 120..136
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (120, 136, 49, 67)


def test_real_pngs_through_sample_image_nested_and_missing(tmp_path, small_entry):
    root = small_root(tmp_path, small_entry, ["00000001_000.png,Cardiomegaly,100,100,200,200",
                                              "00027426_000.png,Mass,10,10,5,5",
                                              "00013118_008.png,Atelectasis,1,1,2,2"])
    nested = root / "images" / "images_001" / "images"
    nested.mkdir(parents=True)
    for name in ("00000001_000.png", "00027426_000.png"):
        shutil.copyfile(shared_path("samples", name), nested / name)  # a copy: symlinks out of the root are refused
    manifest = {**dataset_manifest("nih_bbox"), "image_size": [512, 512]}  # the samples are downsized to 512²
    ds = NIHBoxes(root, manifest=manifest)
    assert ds.cases["case_id"].tolist() == ["00000001_000.png", "00027426_000.png", "00013118_008.png"]
    first = ds[0]
    expected = np.asarray(Image.open(shared_path("samples", "00000001_000.png")).convert("L"), dtype=np.float32) / 255
    np.testing.assert_allclose(first.image(), expected, atol=1e-7)
    assert first.labels["Cardiomegaly"] == 1.0 and first.labels["Mass"] == 0.0  # Data_Entry: "Cardiomegaly"
    assert ds[1].labels["Mass"] == 1.0  # boxed, though Data_Entry says "No Finding"
    with pytest.raises(MissingFileError, match="00013118_008.png"):
        ds[2].image()


@pytest.mark.parametrize("row, message, field", [
    ("00013118_008.png,Atelectasis,1,2,3", "expected 6 fields", None),
    ("00013118_008.png,Hernia,1,2,3,4", "unknown class 'Hernia'", "Finding Label"),
    ("00013118_008.png,Atelectasis,1000,10,50,10", "outside", "Bbox [x,y,w,h]"),
    ("00013118_008.png,Atelectasis,a,10,50,10", "could not convert", "Bbox [x,y,w,h]"),
])
def test_bad_rows_raise_with_file_and_line_or_are_skipped(tmp_path, small_entry, row, message, field):
    root = small_root(tmp_path, small_entry, ["00000001_000.png,Cardiomegaly,100,100,200,200", row])
    with pytest.raises(FormatError, match=message) as info:
        NIHBoxes(root, manifest=dataset_manifest("nih_bbox"))
    assert info.value.path.name == "BBox_List_2017.csv" and info.value.line == 3 and info.value.field == field
    with pytest.warns(UserWarning, match="skipped 1"):
        ds = NIHBoxes(root, manifest=dataset_manifest("nih_bbox"), on_error="skip")
    assert len(ds) == 1 and sum(ds.skipped.values()) == 1


def test_image_missing_from_data_entry(tmp_path, small_entry):
    root = small_root(tmp_path, small_entry, ["99999999_000.png,Mass,1,1,5,5"])
    with pytest.raises(FormatError, match="99999999_000.png.*not in Data_Entry") as info:
        NIHBoxes(root, manifest=dataset_manifest("nih_bbox"))
    assert info.value.line == 2


def test_missing_annotation_names_publisher(tmp_path):
    with pytest.raises(MissingFileError, match=r"BBox_List_2017.csv.*nihcc.app.box.com"):
        NIHBoxes(tmp_path, manifest=dataset_manifest("nih_bbox"))
