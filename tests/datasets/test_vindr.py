"""VinDr-CXR loader on small fixtures written in the published PhysioNet format (files are credentialed)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import xbench
from xbench.datasets.vindr import VinDrCXR
from xbench.core.errors import FormatError, MissingFileError, UnknownNameError, XBenchWarning
from xbench.spec.registry import dataset_manifest

# image_labels_test.csv header: the 28 VinDr labels, test-file spelling ("Other disease").
LABELS = ["Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Clavicle fracture", "Consolidation",
          "Edema", "Emphysema", "Enlarged PA", "ILD", "Infiltration", "Lung Opacity", "Lung cavity", "Lung cyst",
          "Mediastinal shift", "Nodule/Mass", "Other lesion", "Pleural effusion", "Pleural thickening", "Pneumothorax",
          "Pulmonary fibrosis", "Rib fracture", "COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other disease",
          "No finding"]
A, B, C = "a" * 32, "0123456789abcdef" * 2, "f" * 32  # image_id: 32-character hex hashes
SIZES = {A: (40, 60), B: (30, 20), C: (16, 16)}


def write_dicom(path: Path, pixels: np.ndarray, photometric: str = "MONOCHROME2") -> None:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID, "DX"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.PixelData = pixels.astype("<u2").tobytes()
    ds.save_as(path, enforce_file_format=True)


def label_row(image_id: str, positives: set[str]) -> str:
    return ",".join([image_id, *("1" if name in positives else "0" for name in LABELS)])


BOXES = [  # image_id,rad_id,class_name,x_min,y_min,x_max,y_max (test: one consensus reader)
    f"{A},R8,Cardiomegaly,10.0,5.0,30.0,25.0",
    f"{A},R8,Nodule/Mass,40.5,2.0,44.5,6.0",
    f"{A},R8,Nodule/Mass,50.0,30.0,55.0,35.0",
    f"{A},R8,Edema,1.0,1.0,5.0,5.0",
    f"{B},R8,Pleural effusion,0.0,20.0,20.0,30.0",
    f"{C},R8,No finding,,,,",
]


def make_root(tmp_path: Path, boxes: list[str] = BOXES, labels: list[str] | None = None,
              header: list[str] = LABELS) -> Path:
    root = tmp_path / "vindr"
    (root / "annotations").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "annotations" / "annotations_test.csv").write_text(
        "image_id,rad_id,class_name,x_min,y_min,x_max,y_max\n" + "\n".join(boxes) + "\n")
    labels = labels if labels is not None else [
        label_row(A, {"Cardiomegaly", "Nodule/Mass", "Edema", "Other disease"}),
        label_row(B, {"Pleural effusion", "Pneumonia"}),
        label_row(C, {"No finding"}),
    ]
    lines = [",".join(["image_id", *header]), *labels]
    (root / "annotations" / "image_labels_test.csv").write_text("\n".join(lines) + "\n")
    for image_id, (h, w) in SIZES.items():
        ramp = np.arange(h * w, dtype=np.uint16).reshape(h, w)
        write_dicom(root / "test" / f"{image_id}.dicom", ramp, "MONOCHROME1" if image_id == B else "MONOCHROME2")
    return root


def open_ds(root: Path, **kwargs) -> VinDrCXR:
    return VinDrCXR(root, "test", manifest=dataset_manifest("vindr_cxr"), **kwargs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


def test_cases_classes_and_sizes(root):
    ds = xbench.load_dataset("vindr_cxr", root=root)
    assert isinstance(ds, VinDrCXR) and len(ds) == 3
    assert len(ds.findings) == 21 and "Edema" not in ds.findings
    assert ds.findings[0] == "Aortic enlargement" and ds.prompts["ILD"] == "interstitial lung disease"
    assert list(ds.cases["case_id"]) == [A, B, C]
    assert [ds[i].size for i in range(3)] == [SIZES[A], SIZES[B], SIZES[C]]  # from the DICOM headers
    assert ds[0].image_path == root / "test" / f"{A}.dicom"


def test_labels_come_from_the_label_file_with_spelling_normalised(root):
    ds = open_ds(root)
    a, b, c = ds[0], ds[1], ds[2]
    assert a.labels["Cardiomegaly"] == 1.0 and a.labels["Nodule/Mass"] == 1.0 and a.labels["Atelectasis"] == 0.0
    assert b.labels["Pleural effusion"] == 1.0 and sum(c.labels.values()) == 0.0
    # test-file "Other disease" is renamed to the train spelling; global labels stay available
    assert "Other diseases" in ds.image_labels.columns and "Other disease" not in ds.image_labels.columns
    assert ds.image_labels.loc[A, "Other diseases"] == 1.0 and ds.image_labels.loc[C, "No finding"] == 1.0
    assert ds.image_labels.loc[B, "Pneumonia"] == 1.0
    assert ds.labels().shape == (3, 21)


def test_class_header_matched_case_insensitively(tmp_path):
    header = [name.upper() if name == "Pleural effusion" else name for name in LABELS]
    ds = open_ds(make_root(tmp_path, header=header))
    assert ds[1].labels["Pleural effusion"] == 1.0


def test_known_box_rasterised_at_original_size_and_on_224_grid(root):
    sample = open_ds(root)[0]  # 40 x 60 (H x W); Cardiomegaly box x 10-30, y 5-25
    full = sample.mask("Cardiomegaly")
    rows, cols = np.nonzero(full)
    assert full.shape == (40, 60) and full.sum() == 20 * 20
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (5, 24, 10, 29)
    # 224 grid, pixel-centre rule: x = (c + .5) * 60/224 in [10, 30) -> c = 37..111 (75 columns);
    # y = (r + .5) * 40/224 in [5, 25) -> r = 28..139 (112 rows)
    grid = sample.mask("Cardiomegaly", grid=(224, 224))
    rows, cols = np.nonzero(grid)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (28, 139, 37, 111)
    assert grid.sum() == 75 * 112


def test_regions_per_class_and_ignored_edema(root):
    ds = open_ds(root)
    a, b, c = ds[0], ds[1], ds[2]
    assert set(a.regions) == set(ds.findings)
    assert len(a.regions["Nodule/Mass"]) == 2 and a.regions["Atelectasis"] == []
    assert "Edema" not in a.regions  # read and checked, not kept: not one of the 21 classes
    nodules = a.mask("Nodule/Mass")  # two boxes, united: 4x4 + 5x5 pixels
    assert nodules.sum() == 16 + 25
    assert b.mask("Pleural effusion").sum() == 20 * 10
    assert all(regions == [] for regions in c.regions.values())  # "No finding" row: no box


def test_monochrome1_image_is_inverted(root):
    ds = open_ds(root)
    mono2, mono1 = ds[0].image(), ds[1].image()  # both ramps 0..N-1, no window
    assert mono2.shape == (40, 60) and mono1.shape == (30, 20)
    assert mono2[0, 0] == 0.0 and mono2[-1, -1] == 1.0
    assert mono1[0, 0] == 1.0 and mono1[-1, -1] == 0.0


@pytest.mark.parametrize("row, line, field", [
    (f"{A},R8,Lung nodule,1,1,5,5", 8, "class_name"),  # unknown class name
    (f"{A},R8,Cardiomegaly,1,1,5", 8, None),  # malformed row: 6 fields
    (f"{A},R8,Cardiomegaly,1,1,abc,5", 8, "x_max"),  # not a number
    (f"{A},R8,Cardiomegaly,50,30,62,41", 8, "x_min/y_min/x_max/y_max"),  # outside the 60x40 image by > 1 px
    (f"{A},R8,Cardiomegaly,20,5,10,25", 8, "x_min/y_min/x_max/y_max"),  # inverted
    (f"{'e' * 32},R8,Cardiomegaly,1,1,5,5", 8, "image_id"),  # image absent from the label file
])
def test_bad_box_rows_raise_or_are_skipped(tmp_path, row, line, field):
    root = make_root(tmp_path, boxes=[*BOXES, row])
    path = root / "annotations" / "annotations_test.csv"
    with pytest.raises(FormatError) as info:
        open_ds(root)
    assert info.value.path == path and info.value.line == line and info.value.field == field
    assert str(path) in str(info.value) and f"line {line}" in str(info.value)
    with pytest.warns(XBenchWarning, match="skipped 1"):
        ds = open_ds(root, on_error="skip")
    assert sum(ds.skipped.values()) == 1 and len(ds) == 3
    assert len(ds[0].regions["Cardiomegaly"]) == 1  # the good rows are kept


def test_unknown_class_message_suggests_names(tmp_path):
    root = make_root(tmp_path, boxes=[*BOXES, f"{A},R8,Cardiomegally,1,1,5,5"])
    with pytest.raises(FormatError, match="Did you mean 'Cardiomegaly'"):
        open_ds(root)


@pytest.mark.parametrize("bad, field", [("2", "Atelectasis"), ("", "Atelectasis")])
def test_bad_label_values(tmp_path, bad, field):
    row = label_row(C, set()).split(",")
    row[1 + LABELS.index("Atelectasis")] = bad
    labels = [label_row(A, {"Cardiomegaly", "Nodule/Mass"}), label_row(B, {"Pleural effusion"}), ",".join(row)]
    root = make_root(tmp_path, labels=labels)
    with pytest.raises(FormatError) as info:
        open_ds(root)
    assert info.value.line == 4 and info.value.field == field
    with pytest.warns(XBenchWarning):
        ds = open_ds(root, on_error="skip")
    # C's label row is dropped, so its "No finding" box row is counted too
    assert len(ds) == 2 and ds.skipped["label not 0/1"] == 1


def test_duplicate_and_short_label_rows(tmp_path):
    labels = [label_row(A, {"Cardiomegaly"}), label_row(B, set()), label_row(C, set()), label_row(A, set())]
    with pytest.raises(FormatError, match="duplicate image_id") as info:
        open_ds(make_root(tmp_path / "dup", labels=labels))
    assert info.value.line == 5
    labels = [label_row(A, {"Cardiomegaly"}), label_row(B, set()), label_row(C, set())[:-2]]
    with pytest.raises(FormatError, match="expected 29 fields, got 28"):
        open_ds(make_root(tmp_path / "short", labels=labels))


def test_missing_class_column(tmp_path):
    header = [name for name in LABELS if name != "Rib fracture"]
    labels = [",".join(label_row(i, set()).split(",")[:-1]) for i in (A, B, C)]
    with pytest.raises(FormatError) as info:
        open_ds(make_root(tmp_path, labels=labels, header=header))
    assert info.value.line == 1 and info.value.field == "Rib fracture"


def test_missing_files_name_file_and_publisher(root):
    (root / "test" / f"{B}.dicom").unlink()
    with pytest.raises(MissingFileError) as info:
        open_ds(root)
    assert info.value.path == root / "test" / f"{B}.dicom" and "physionet.org/content/vindr-cxr" in str(info.value)
    (root / "annotations" / "annotations_test.csv").unlink()
    with pytest.raises(MissingFileError, match="annotations_test.csv.*physionet.org"):
        open_ds(root)


def test_unknown_split(root):
    with pytest.raises(UnknownNameError, match="train"):
        VinDrCXR(root, "train", manifest=dataset_manifest("vindr_cxr"))


def test_manifest_is_valid_and_counts(root):
    from xbench.spec.manifests import validate
    from xbench.datasets.checks import counts

    validate(dataset_manifest("vindr_cxr"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = counts(open_ds(root))
    assert found["cases"] == 3 and found["regions"] == 4  # Cardiomegaly, 2 Nodule/Mass, Pleural effusion
    assert found["positive_cases"] == 2 and found["positives"]["Cardiomegaly"] == 1
