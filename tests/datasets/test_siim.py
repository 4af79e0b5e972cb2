"""SIIM-ACR pneumothorax on the real RLE file and the LoVT test list."""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from test_images import write_dicom

from xbench.datasets.base import EncodedMask
from xbench.datasets.regions import decode_siim_rle
from xbench.datasets.siim import SIIMPneumothorax
from xbench.core.errors import FormatError, MissingFileError
from xbench.datasets.checks import counts
from xbench.spec.registry import dataset_manifest

RLE_NAME = "siim-pneumothorax-train-rle.csv"
SIX_ROWS = "1.2.276.0.7230010.3.1.4.8323329.2878.1517875175.188420"  # 6 RLE rows, in the LoVT test split


@pytest.fixture(scope="module")
def real_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("siim")
    os.symlink(shared_path("annotations", "siim_acr_pneumothorax", RLE_NAME), root / RLE_NAME)
    (root / "lovt_split").mkdir()
    os.symlink(shared_path("annotations", "siim_acr_pneumothorax", "lovt_split", "test.csv"), root / "lovt_split" / "test.csv")
    return root


@pytest.fixture(scope="module")
def ds(real_root) -> SIIMPneumothorax:
    return SIIMPneumothorax(real_root, "test", manifest=dataset_manifest("siim_acr"))


def make_root(tmp_path: Path, rows: list[str]) -> Path:
    (tmp_path / RLE_NAME).write_text("ImageId, EncodedPixels\n" + "".join(r + "\n" for r in rows))
    return tmp_path


def test_lovt_test_split_counts(ds):
    found = counts(ds)
    assert ds.findings == ["Pneumothorax"]
    assert (found["cases"], found["positive_cases"], found["negative_cases"]) == (2409, 515, 1894)
    assert (ds.cases[["height", "width"]] == 1024).all().all()


def test_rows_of_one_image_are_united(ds, real_root):
    with open(real_root / RLE_NAME, newline="") as handle:
        rles = [r[1] for r in csv.reader(handle) if r[0] == SIX_ROWS]
    sample = ds[int(np.flatnonzero(ds.cases["case_id"] == SIX_ROWS)[0])]
    regions = sample.regions["Pneumothorax"]
    assert len(rles) == 6 and len(regions) == 6 and all(isinstance(r, EncodedMask) for r in regions)
    expected = np.logical_or.reduce([decode_siim_rle(r) for r in rles])
    mask = sample.mask("Pneumothorax")
    assert (mask == expected).all()
    assert mask.sum() > max(decode_siim_rle(r).sum() for r in rles)  # the union is larger than any one row
    assert sample.mask("Pneumothorax", (224, 224)).shape == (224, 224)


def test_first_positive_image_through_the_loader(real_root):
    ds = SIIMPneumothorax(real_root, "all", manifest=dataset_manifest("siim_acr"))
    assert len(ds) == 12047
    sample = ds[int(np.flatnonzero(ds.cases["case_id"] == "1.2.276.0.7230010.3.1.4.8323329.13666.1517875247.117800")[0])]
    rows, cols = np.nonzero(sample.mask("Pneumothorax"))
    assert (rows.min(), rows.max(), cols.min(), cols.max(), rows.size) == (125, 390, 544, 795, 30859)


def test_kaggle_spacing_and_nested_dicom(tmp_path):
    root = make_root(tmp_path, ["1.2.3, -1", "1.2.4, 2 3", "1.2.4, -1"])  # Kaggle's leading spaces
    ds = SIIMPneumothorax(root, "all", manifest=dataset_manifest("siim_acr"))
    assert ds.cases["case_id"].tolist() == ["1.2.3", "1.2.4"] and ds.labels()[:, 0].tolist() == [0.0, 1.0]
    mask = ds[1].mask("Pneumothorax")
    assert mask[2:5, 0].all() and mask.sum() == 3  # column-major: flat 2..4 = rows 2..4 of column 0
    nested = root / "dicom-images-train" / "1.2.999" / "1.2.998"
    nested.mkdir(parents=True)
    write_dicom(nested / "1.2.4.dcm", np.array([[0, 255]], dtype=np.uint8))
    np.testing.assert_allclose(ds[1].image(), [[0.0, 1.0]])
    with pytest.raises(MissingFileError, match=r"1\.2\.3\.dcm.*kaggle.com"):
        ds[0].image()


@pytest.mark.parametrize("row, message", [
    ("1.2.5,1 2 3", "odd number"),
    ("1.2.5,1048570 10", "past the end"),
    ("1.2.5,abc", "non-integer"),
    ("1.2.5,", "non-empty string"),
])
def test_bad_rle_raises_with_line_or_is_skipped(tmp_path, row, message):
    root = make_root(tmp_path, ["1.2.3,-1", row])
    with pytest.raises(FormatError, match=message) as info:
        SIIMPneumothorax(root, "all", manifest=dataset_manifest("siim_acr"))
    assert (info.value.path.name, info.value.line, info.value.field) == (RLE_NAME, 3, "EncodedPixels")
    with pytest.warns(UserWarning, match="skipped 1"):
        ds = SIIMPneumothorax(root, "all", manifest=dataset_manifest("siim_acr"), on_error="skip")
    assert ds.cases["case_id"].tolist() == ["1.2.3"] and ds.skipped == {"bad RLE": 1}


def test_malformed_row_and_missing_file(tmp_path):
    root = make_root(tmp_path, ["1.2.3,-1,extra"])
    with pytest.raises(FormatError, match="expected 2 fields") as info:
        SIIMPneumothorax(root, "all", manifest=dataset_manifest("siim_acr"))
    assert info.value.line == 2
    with pytest.raises(MissingFileError, match=r"lovt_split/test.csv"):
        SIIMPneumothorax(root, "test", manifest=dataset_manifest("siim_acr"))
    os.remove(root / RLE_NAME)
    with pytest.raises(MissingFileError, match=r"siim-pneumothorax-train-rle.csv.*siim-acr-pneumothorax-segmentation"):
        SIIMPneumothorax(root, "all", manifest=dataset_manifest("siim_acr"))
