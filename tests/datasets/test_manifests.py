"""Manifest schema, check/build reports, and canonical finding names."""
from __future__ import annotations

import os

import pandas as pd
import pytest
from conftest import shared_path

from xbench.core.errors import FormatError, UnknownNameError
from xbench.spec.findings import CANONICAL, canonical, display_name
from xbench.spec.manifests import class_lookup, file_entries, validate
from xbench.datasets.checks import build, check
from xbench.spec.registry import dataset_manifest, list_datasets

MINE = ["nih_bbox", "rsna_pneumonia", "siim_acr", "chestx_det10", "chestx_det"]


@pytest.mark.parametrize("name", list_datasets())
def test_every_registered_manifest_follows_the_schema(name):
    manifest = dataset_manifest(name)
    validate(manifest)
    assert all(cls["finding"] in CANONICAL for cls in manifest["classes"])


@pytest.mark.parametrize("name", MINE)
def test_my_manifests_name_publishers_and_class_spellings(name):
    manifest = dataset_manifest(name)
    assert all(entry.get("source", "").startswith("http") for entry in file_entries(manifest, manifest["default_split"]).values())
    for cls in manifest["classes"]:
        assert canonical(cls["name"]) == cls["finding"]  # the dataset spelling maps to the stated canonical id


def test_validate_reports_file_and_field():
    manifest = {**dataset_manifest("chestx_det10"), "classes": [{"name": "X", "finding": "x_ray", "prompt": "x", "display": "X",
                                                               "localized": True}]}
    with pytest.raises(FormatError, match=r"chestx_det10.yaml.*classes\[0\].finding"):
        validate(manifest)
    with pytest.raises(FormatError, match="default_split"):
        validate({**dataset_manifest("chestx_det10"), "default_split": "val"})


def test_file_entries_fill_split_and_drop_other_splits():
    manifest = dataset_manifest("rsna_pneumonia")
    assert set(file_entries(manifest, "all")) == {"labels", "images"}
    assert file_entries(manifest, "test")["split_list"]["path"] == "lovt_split/test.csv"
    assert file_entries(dataset_manifest("chestx_det10"), "train")["annotations"]["path"] == "train.json"
    assert class_lookup(dataset_manifest("nih_bbox"))["Infiltration"] == "Infiltrate"


def test_synonyms_share_an_id_but_spellings_stay():
    assert {canonical(n) for n in ("Effusion", "Pleural Effusion", "Pleural effusion")} == {"pleural_effusion"}
    assert canonical("Infiltrate") == canonical("Infiltration") == "infiltration"
    assert canonical("Pleural_Thickening") == canonical("Pleural Thickening") == "pleural_thickening"
    assert canonical("Airspace Opacity") == canonical("Lung Opacity") == "lung_opacity"
    assert canonical("Nodule/Mass") == "nodule_mass" != canonical("Nodule")
    assert canonical("Rib fracture") != canonical("Fracture")
    assert display_name("effusion") == "Pleural effusion"
    with pytest.raises(UnknownNameError, match="Unknown finding 'Efusion'"):
        canonical("Efusion")


def test_check_reports_missing_files_hashes_and_counts(tmp_path):
    os.symlink(shared_path("annotations", "chestx_det10", "test.json"), tmp_path / "test.json")
    report = check("chestx_det10", tmp_path)
    assert report.opened and report.counts["cases"] == 542 and not report.mismatches
    missing = {f.key: f for f in report.files if not f.exists}
    assert set(missing) == {"images"} and "resource.deepwise.com" in missing["images"].source
    assert not report.ok and "MISSING" in report.format() and "cases: 542 (expected 542)" in report.format()
    # a file whose hash differs, and counts that differ from expected
    (tmp_path / "stage_2_train_labels.csv").write_text("patientId,x,y,width,height,Target\na,,,,,0\nb,1,2,3,4,1\n")
    report = check("rsna_pneumonia", tmp_path, "all")
    labels = next(f for f in report.files if f.key == "labels")
    assert labels.exists and not labels.ok and "sha256 differs" in report.format()
    assert "cases: found 2, expected 26684" in report.mismatches


def test_check_reports_loader_failure(tmp_path):
    report = check("siim_acr", tmp_path)
    assert not report.opened and "MissingFileError" in report.error and "loader: failed" in report.format()


def test_build_writes_the_normalised_table(tmp_path):
    os.symlink(shared_path("annotations", "chestx_det10", "test.json"), tmp_path / "test.json")
    table = build("chestx_det10", tmp_path, tmp_path / "out" / "cases.csv")
    back = pd.read_csv(tmp_path / "out" / "cases.csv", dtype={"case_id": str})
    assert list(back.columns[:5]) == ["case_id", "image_path", "height", "width", "view"]
    assert len(back) == 542 and back["regions:Nodule"].sum() == 166 and back["label:Effusion"].sum() == 252
    assert back["case_id"].tolist() == table["case_id"].tolist()
    build("chestx_det10", tmp_path, tmp_path / "cases.parquet")
    assert pd.read_parquet(tmp_path / "cases.parquet")["regions:Effusion"].sum() == 372
