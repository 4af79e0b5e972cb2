"""CheXlocalize loader on small fixtures in the published format (Stanford AIMI files are restricted).

Formats follow rajpurkarlab/cheXlocalize's README and ``sample/`` folder: label CSV with ``Path``;
``gt_segmentations_*.json`` = ``{cxr_id: {task: {"size": [h, w], "counts": <COCO RLE str>}}}`` over all
10 tasks; ``gt_annotations_*.json`` = ``{cxr_id: {"img_size": [h, w], task: [[[x, y], ...]]}}``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as coco

import xbench
from xbench.datasets.chexlocalize import CheXlocalize, rle_length
from xbench.core.errors import FormatError, MissingFileError, XBenchWarning
from xbench.spec.registry import dataset_manifest

COLUMNS = ["No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema",
           "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other",
           "Fracture", "Support Devices"]
TASKS = ["Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema", "Consolidation",
         "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices"]  # eval_constants.LOCALIZATION_TASKS
A, B, C = "patient64741_study1_view1_frontal", "patient64742_study1_view1_frontal", "patient64742_study1_view2_lateral"
SIZE_A, SIZE_B, SIZE_C = (30, 40), (20, 25), (12, 18)


def rle(mask: np.ndarray) -> dict:
    """Encoded as cheXlocalize's utils.encode_segmentation does."""
    out = coco.encode(np.asfortranarray(mask.astype("uint8")))
    return {"size": list(out["size"]), "counts": out["counts"].decode()}


def cardiomegaly_a() -> np.ndarray:
    mask = np.zeros(SIZE_A, dtype=bool)
    mask[4:14, 8:20] = True  # rows 4-13, columns 8-19
    return mask


def opacity_a() -> np.ndarray:
    mask = np.zeros(SIZE_A, dtype=bool)
    mask[20:26, 2:5] = True
    mask[22, 30] = True
    return mask


def label_row(path: str, positives: set[str], raw: dict[str, str] | None = None) -> str:
    raw = raw or {}
    return ",".join([path, *(raw.get(c, "1.0" if c in positives else "0.0") for c in COLUMNS)])


def segmentations(masks: dict[str, dict[str, np.ndarray]], sizes: dict[str, tuple[int, int]]) -> dict:
    return {cxr: {t: rle(masks[cxr].get(t, np.zeros(sizes[cxr], dtype=bool))) for t in TASKS} for cxr in masks}


def make_root(tmp_path: Path, labels: list[str] | None = None, seg: dict | None = None, ann: dict | None = None,
              split: str = "test") -> Path:
    root = tmp_path / "chexlocalize"
    (root / "CheXpert").mkdir(parents=True)
    (root / "CheXlocalize").mkdir()
    labels = labels if labels is not None else [
        label_row(f"{split}/patient64741/study1/view1_frontal.jpg", {"Cardiomegaly", "Lung Opacity", "Fracture"}),
        label_row(f"{split}/patient64742/study1/view1_frontal.jpg", {"Support Devices"}),
        label_row(f"{split}/patient64742/study1/view2_lateral.jpg", {"No Finding"}),
    ]
    (root / "CheXpert" / f"{split}_labels.csv").write_text("\n".join([",".join(["Path", *COLUMNS]), *labels]) + "\n")
    devices = np.zeros(SIZE_B, dtype=bool)
    devices[0:5, 0:25] = True
    seg = seg if seg is not None else segmentations(
        {A: {"Cardiomegaly": cardiomegaly_a(), "Airspace Opacity": opacity_a()}, B: {"Support Devices": devices}},
        {A: SIZE_A, B: SIZE_B})
    (root / "CheXlocalize" / f"gt_segmentations_{split}.json").write_text(json.dumps(seg))
    ann = ann if ann is not None else {
        A: {"img_size": list(SIZE_A), "Cardiomegaly": [[[8, 4], [19, 4], [19, 13], [8, 13]]],
            "Airspace Opacity": [[[2, 20], [4, 20], [4, 25], [2, 25]], [[30, 22], [30.4, 22], [30.2, 22.4]]]},
        B: {"img_size": list(SIZE_B), "Support Devices": [[[0, 0], [24, 0], [24, 4], [0, 4]]]},
    }
    (root / "CheXlocalize" / f"gt_annotations_{split}.json").write_text(json.dumps(ann))
    for cxr, size in ((A, SIZE_A), (B, SIZE_B), (C, SIZE_C)):  # JPEG placeholders at the Path locations
        patient, study, view = cxr.split("_", 2)
        folder = root / "CheXpert" / split / patient / study
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full(size, 128, dtype=np.uint8)).save(folder / f"{view}.jpg")
    return root


def open_ds(root: Path, split: str = "test", **kwargs) -> CheXlocalize:
    return CheXlocalize(root, split, manifest=dataset_manifest("chexlocalize"), **kwargs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


def test_cases_classes_paths_and_sizes(root):
    ds = xbench.load_dataset("chexlocalize", root=root)
    assert isinstance(ds, CheXlocalize) and len(ds) == 3
    assert len(ds.findings) == 13 and "Airspace Opacity" in ds.findings  # the ground-truth file's spelling
    assert ds.localized == ["Cardiomegaly", "Airspace Opacity", "Support Devices"]  # classes with a drawn region
    assert list(ds.cases["case_id"]) == [A, B, C]
    assert ds[0].image_path == root / "CheXpert" / "test" / "patient64741" / "study1" / "view1_frontal.jpg"
    # A, B: size from the JSON; C (not in the JSON): from its JPEG header
    assert [ds[i].size for i in range(3)] == [SIZE_A, SIZE_B, SIZE_C]
    assert ds[2].view == "LATERAL" and ds[0].view is None
    assert ds[0].image().shape == SIZE_A


def test_labels_and_recognition_only_classes(root):
    ds = open_ds(root)
    a, b, c = ds[0], ds[1], ds[2]
    assert a.labels["Cardiomegaly"] == 1.0 and a.labels["Airspace Opacity"] == 1.0 and a.labels["Edema"] == 0.0
    assert a.labels["Fracture"] == 1.0 and b.labels["Support Devices"] == 1.0
    for sample in (a, b, c):  # classes without any region in the file: labels, never regions
        assert {"Fracture", "Pleural Other", "Pneumonia", "Edema"}.isdisjoint(sample.regions)
        assert set(sample.regions) == set(ds.localized)
    assert c.regions["Cardiomegaly"] == [] and a.regions["Support Devices"] == []  # all-zero RLE → no region
    assert ds.labels().shape == (3, 13)


def test_grounding_classes_follow_the_ground_truth_file(tmp_path):
    """A Fracture region in the ground-truth file makes Fracture a grounding class (the paper reports it)."""
    fracture = np.zeros(SIZE_A, dtype=bool)
    fracture[1:3, 1:4] = True
    seg = segmentations({A: {"Cardiomegaly": cardiomegaly_a()}, B: {}}, {A: SIZE_A, B: SIZE_B})
    seg[A]["Fracture"] = rle(fracture)
    ds = open_ds(make_root(tmp_path, seg=seg))
    assert ds.localized == ["Cardiomegaly", "Fracture"]
    assert np.array_equal(ds[0].mask("Fracture"), fracture) and ds[1].regions["Fracture"] == []


def test_coco_rle_round_trips_and_airspace_opacity_is_lung_opacity(root):
    a = open_ds(root)[0]
    assert np.array_equal(a.mask("Cardiomegaly"), cardiomegaly_a())
    assert np.array_equal(a.mask("Airspace Opacity"), opacity_a())
    # half grid (15 x 20), area resampling at 0.5: rows 4-13 → 2-6, columns 8-19 → 4-9
    half = a.mask("Cardiomegaly", grid=(15, 20))
    expected = np.zeros((15, 20), dtype=bool)
    expected[2:7, 4:10] = True
    assert np.array_equal(half, expected)


def test_polygons_are_rasterised_like_chexlocalize(root):
    ds = open_ds(root, regions="annotations")
    a, b = ds[0], ds[1]
    assert np.array_equal(a.mask("Cardiomegaly"), cardiomegaly_a())  # PIL polygon with outline: 12 x 10 px
    opacity = a.mask("Airspace Opacity")
    assert opacity[20:26, 2:5].all() and opacity[22, 30] and opacity.sum() == 6 * 3 + 1
    assert b.mask("Support Devices").sum() == 25 * 5
    assert ds[2].regions["Cardiomegaly"] == [] and ds[2].size == SIZE_C


def test_val_paths_drop_the_chexpert_folder(tmp_path):
    labels = [label_row("CheXpert-v1.0/valid/patient64741/study1/view1_frontal.jpg", {"Cardiomegaly"}),
              label_row("CheXpert-v1.0/valid/patient64742/study1/view1_frontal.jpg", set()),
              label_row("CheXpert-v1.0/valid/patient64742/study1/view2_lateral.jpg", set())]
    root = make_root(tmp_path, labels=labels, split="val")
    for cxr in (B, C):  # move the placeholders where the val Path points
        patient, study, view = cxr.split("_", 2)
        target = root / "CheXpert" / "valid" / patient / study
        target.mkdir(parents=True, exist_ok=True)
        (root / "CheXpert" / "val" / patient / study / f"{view}.jpg").rename(target / f"{view}.jpg")
    ds = open_ds(root, split="val")
    assert ds[0].image_path == root / "CheXpert" / "valid" / "patient64741" / "study1" / "view1_frontal.jpg"
    assert ds[2].size == SIZE_C


def test_rle_length_matches_pycocotools():
    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w = (int(v) for v in rng.integers(1, 120, 2))
        mask = rng.random((h, w)) < rng.random()
        assert rle_length(rle(mask)["counts"]) == h * w
    assert rle_length("PVWX6") == 2320 * 2828  # cheXlocalize sample: empty mask of a 2320 x 2828 CXR
    with pytest.raises(ValueError, match="alphabet"):
        rle_length("PV~X6")


def test_rle_size_mismatch_between_tasks(root):
    path = root / "CheXlocalize" / "gt_segmentations_test.json"
    seg = json.loads(path.read_text())
    seg[B]["Edema"] = rle(np.zeros((21, 25), dtype=bool))
    path.write_text(json.dumps(seg))
    with pytest.raises(FormatError, match="RLE size mismatch|differs") as info:
        open_ds(root)
    assert info.value.path == path and info.value.line == 2 and info.value.field == "Edema"
    with pytest.warns(XBenchWarning):
        ds = open_ds(root, on_error="skip")
    assert ds.skipped["RLE size mismatch"] == 1 and len(ds[1].regions["Support Devices"]) == 1


def test_empty_rle_covering_the_wrong_size(root):
    path = root / "CheXlocalize" / "gt_segmentations_test.json"
    seg = json.loads(path.read_text())
    seg[A]["Edema"]["counts"] = "PVWX6"  # an empty mask of 2320 x 2828, claimed for 30 x 40
    path.write_text(json.dumps(seg))
    with pytest.raises(FormatError, match="RLE size mismatch") as info:
        open_ds(root)
    assert info.value.line == 1 and info.value.field == "Edema"


def test_rle_runs_not_covering_size_raise_on_decode(root):
    path = root / "CheXlocalize" / "gt_segmentations_test.json"
    seg = json.loads(path.read_text())
    bigger = (SIZE_A[0] + 1, SIZE_A[1])  # counts encode 30 x 40, every task claims 31 x 40
    seg[A] = {t: rle(np.zeros(bigger, dtype=bool)) for t in TASKS}
    seg[A]["Cardiomegaly"] = {"size": list(bigger), "counts": rle(cardiomegaly_a())["counts"]}
    path.write_text(json.dumps(seg))
    a = open_ds(root)[0]  # the table opens: masks are decoded lazily
    with pytest.raises(FormatError, match="cover 1200 pixels.*1240") as info:
        a.mask("Cardiomegaly")
    assert info.value.field == "Cardiomegaly"


@pytest.mark.parametrize("edit, line, field, reason", [
    (lambda seg: seg[A].update({"Lung Nodule": seg[A]["Edema"]}), 1, "Lung Nodule", "unknown task"),
    (lambda seg: seg[B].update({"Edema": {"size": [20, 25]}}), 2, "Edema", "malformed RLE"),
    (lambda seg: seg.update({"patient99999_study1_view1_frontal": {}}), 3, "patient99999_study1_view1_frontal",
     "CXR absent from the label file"),
])
def test_bad_segmentation_records(root, edit, line, field, reason):
    path = root / "CheXlocalize" / "gt_segmentations_test.json"
    seg = json.loads(path.read_text())
    edit(seg)
    path.write_text(json.dumps(seg))
    with pytest.raises(FormatError) as info:
        open_ds(root)
    assert (info.value.path, info.value.line, info.value.field) == (path, line, field)
    with pytest.warns(XBenchWarning):
        ds = open_ds(root, on_error="skip")
    assert ds.skipped[reason] == 1 and len(ds) == 3


def test_unknown_task_suggests_names(root):
    path = root / "CheXlocalize" / "gt_segmentations_test.json"
    seg = json.loads(path.read_text())
    seg[A]["Cardiomegally"] = seg[A].pop("Cardiomegaly")
    path.write_text(json.dumps(seg))
    with pytest.raises(FormatError, match="Did you mean 'Cardiomegaly'"):
        open_ds(root)


@pytest.mark.parametrize("contour, reason", [
    ([[8, 4], [19, 4]], "malformed contour"),  # two points
    ([[8, 4], [45, 4], [45, 13]], "contour outside the image"),  # x 45 > width 40 + 1
])
def test_bad_contours(root, contour, reason):
    path = root / "CheXlocalize" / "gt_annotations_test.json"
    ann = json.loads(path.read_text())
    ann[A]["Cardiomegaly"] = [contour]
    path.write_text(json.dumps(ann))
    with pytest.raises(FormatError) as info:
        open_ds(root, regions="annotations")
    assert (info.value.line, info.value.field) == (1, "Cardiomegaly")
    with pytest.warns(XBenchWarning):
        ds = open_ds(root, regions="annotations", on_error="skip")
    assert ds.skipped[reason] == 1 and ds[0].regions.get("Cardiomegaly", []) == []  # no region left: not a grounding class


@pytest.mark.parametrize("row, field", [
    (label_row("test/patient64743/study1/view1_frontal.png", set()), "Path"),
    (label_row("test/patient64743/study1/view1_frontal.jpg", set(), {"Edema": "-1.0"}), "Edema"),  # no "uncertain" here
    (label_row("test/patient64741/study1/view1_frontal.jpg", set()), "Path"),  # duplicate CXR
    (label_row("test/patient64743/study1/view1_frontal.jpg", set())[:-4], None),  # 14 fields
])
def test_bad_label_rows(tmp_path, row, field):
    labels = [label_row("test/patient64741/study1/view1_frontal.jpg", {"Cardiomegaly"}),
              label_row("test/patient64742/study1/view1_frontal.jpg", set()),
              label_row("test/patient64742/study1/view2_lateral.jpg", set()), row]
    root = make_root(tmp_path, labels=labels)
    with pytest.raises(FormatError) as info:
        open_ds(root)
    assert (info.value.line, info.value.field) == (5, field)
    with pytest.warns(XBenchWarning):
        assert len(open_ds(root, on_error="skip")) == 3


def test_missing_files(root):
    (root / "CheXpert" / "test" / "patient64742" / "study1" / "view2_lateral.jpg").unlink()
    with pytest.raises(MissingFileError, match="view2_lateral.jpg.*stanfordaimi"):
        open_ds(root)  # C is not in the JSON: its header is needed for the size
    (root / "CheXlocalize" / "gt_segmentations_test.json").unlink()
    with pytest.raises(MissingFileError, match="gt_segmentations_test.json.*stanfordaimi"):
        open_ds(root)
    with pytest.raises(ValueError, match="regions must be one of"):
        open_ds(root, regions="masks")


def test_manifest_valid_and_counts(root):
    from xbench.spec.manifests import validate
    from xbench.datasets.checks import counts

    validate(dataset_manifest("chexlocalize"))
    found = counts(open_ds(root))
    assert found["cases"] == 3 and found["regions"] == 3  # Cardiomegaly, Airspace Opacity (A), Support Devices (B)
    assert found["positives"]["Fracture"] == 1 and found["region_counts"]["Fracture"] == 0


def test_dataset_pickles_with_its_lazy_rle_masks(root):
    """Evaluation workers receive the dataset pickled: its lazy RLE decoders survive and decode the same."""
    import pickle

    ds = open_ds(root)
    copy = pickle.loads(pickle.dumps(ds))
    compared = 0
    for i in range(len(ds)):
        for f in ds.findings:
            if ds[i].regions.get(f):
                assert np.array_equal(copy[i].mask(f, (32, 32)), ds[i].mask(f, (32, 32)))
                compared += 1
    assert compared > 0
