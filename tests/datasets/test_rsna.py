"""RSNA Pneumonia on the real stage_2_train_labels.csv and the LoVT test list."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path

from xbench.datasets.rsna import RSNAPneumonia
from xbench.core.errors import FormatError, MissingFileError
from xbench.datasets.checks import counts
from xbench.spec.registry import dataset_manifest

HEADER = "patientId,x,y,width,height,Target\n"


@pytest.fixture(scope="module")
def real_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rsna")
    os.symlink(shared_path("annotations", "rsna_pneumonia", "stage_2_train_labels.csv"), root / "stage_2_train_labels.csv")
    (root / "lovt_split").mkdir()
    os.symlink(shared_path("annotations", "rsna_pneumonia", "lovt_split", "test.csv"), root / "lovt_split" / "test.csv")
    return root


@pytest.fixture(scope="module")
def ds(real_root) -> RSNAPneumonia:
    return RSNAPneumonia(real_root, "test", manifest=dataset_manifest("rsna_pneumonia"))


def make_root(tmp_path: Path, rows: list[str], split_ids: list[str] | None = None) -> Path:
    (tmp_path / "stage_2_train_labels.csv").write_text(HEADER + "".join(r + "\n" for r in rows))
    if split_ids is not None:
        (tmp_path / "lovt_split").mkdir()
        (tmp_path / "lovt_split" / "test.csv").write_text("ID,boxes,classes\n" + "".join(f"{i},,\n" for i in split_ids))
    return tmp_path


def test_lovt_test_split_counts(ds):
    assert ds.findings == ["Pneumonia"] and ds.prompts == {"Pneumonia": "pneumonia"}
    found = counts(ds)
    assert (found["cases"], found["positive_cases"], found["negative_cases"]) == (5337, 1218, 4119)
    assert ds.cases["case_id"].is_unique


def test_all_split_counts(real_root):
    found = counts(RSNAPneumonia(real_root, "all", manifest=dataset_manifest("rsna_pneumonia")))
    assert (found["cases"], found["positive_cases"], found["regions"]) == (26684, 6012, 9555)


def test_boxes_agree_with_the_lovt_list(ds, real_root):
    """The split file repeats the boxes (x;y;w;h joined by |): they must equal the labels file's."""
    with open(real_root / "lovt_split" / "test.csv") as handle:
        listed = {line.split(",")[0]: line.strip().split(",")[1] for line in list(handle)[1:]}
    for _, row in ds.cases.iterrows():
        boxes = ds._regions(row)["Pneumonia"]
        text = "|".join(f"{b.x_min};{b.y_min};{b.x_max - b.x_min};{b.y_max - b.y_min}" for b in boxes)
        assert text == listed[row["case_id"]]


def test_known_box_mask_at_1024_and_224(ds):
    # stage_2_train_labels.csv line 68: 01dc817c-3cfa-49fe-8662-518edc30652a,368.0,677.0,101.0,139.0,1
    sample = ds[int(np.flatnonzero(ds.cases["case_id"] == "01dc817c-3cfa-49fe-8662-518edc30652a")[0])]
    assert sample.labels == {"Pneumonia": 1.0} and sample.size == (1024, 1024)
    mask = sample.mask("Pneumonia")
    rows, cols = np.nonzero(mask)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (677, 815, 368, 468) and mask.sum() == 101 * 139
    rows, cols = np.nonzero(sample.mask("Pneumonia", (224, 224)))
    # centre (c+0.5)*1024/224: c=80 → exactly 368 (inside); rows: r=178 → exactly 816 (outside, max exclusive)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (148, 177, 80, 102)


def test_negative_has_no_region_and_missing_dicom(ds):
    sample = ds[int(np.flatnonzero(ds.cases["label:Pneumonia"] == 0)[0])]
    assert sample.regions == {"Pneumonia": []} and not sample.mask("Pneumonia", (7, 7)).any()
    with pytest.raises(MissingFileError, match=rf"stage_2_train_images/{sample.case_id}\.dcm"):
        sample.image()


@pytest.mark.parametrize("row, message", [
    ("b,,,,,1", "Target=1 row without a box"),
    ("b,1,2,3,4,2", "Target must be 0 or 1"),
    ("b,1000,2,100,4,1", "outside"),
    ("b,1,2,3,4,0", "Target=0 row with a box"),
    ("b,1,2,3,1", "expected 6 fields"),
])
def test_bad_rows(tmp_path, row, message):
    root = make_root(tmp_path, ["a,,,,,0", row])
    with pytest.raises(FormatError, match=message) as info:
        RSNAPneumonia(root, "all", manifest=dataset_manifest("rsna_pneumonia"))
    assert info.value.path.name == "stage_2_train_labels.csv" and info.value.line == 3
    with pytest.warns(UserWarning, match="skipped 1"):
        ds = RSNAPneumonia(root, "all", manifest=dataset_manifest("rsna_pneumonia"), on_error="skip")
    assert ds.cases["case_id"].iloc[0] == "a" and sum(ds.skipped.values()) == 1


def test_split_id_missing_from_labels_and_missing_split_file(tmp_path):
    root = make_root(tmp_path, ["a,,,,,0", "c,10,10,20,20,1", "c,50,50,20,20,1"], split_ids=["c", "zz"])
    with pytest.raises(FormatError, match="'zz' is not in") as info:
        RSNAPneumonia(root, "test", manifest=dataset_manifest("rsna_pneumonia"))
    assert info.value.line == 3 and info.value.path.name == "test.csv"
    with pytest.warns(UserWarning):
        ds = RSNAPneumonia(root, "test", manifest=dataset_manifest("rsna_pneumonia"), on_error="skip")
    assert ds.cases["case_id"].tolist() == ["c"] and len(ds[0].regions["Pneumonia"]) == 2
    os.remove(root / "lovt_split" / "test.csv")
    with pytest.raises(MissingFileError, match=r"lovt_split/test.csv.*philip-mueller/lovt"):
        RSNAPneumonia(root, "test", manifest=dataset_manifest("rsna_pneumonia"))
