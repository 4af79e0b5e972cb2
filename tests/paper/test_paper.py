"""The paper's Tables 1–5 as reference data: transcription, internal consistency, implied denominators."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import shared_path

from xbench.metrics import DATASET_LEVEL
from xbench.paper import (
    CLASS_TABLES,
    DATASETS,
    MODELS,
    TABLE_CLASSES,
    denominator_table,
    expected_positive_pairs,
    fits,
    implied_denominator,
    load_reference,
    mean_checks,
    synthetic_results,
)
from xbench.paper.transcribe import transcribe
from xbench.spec.registry import dataset_manifest

REF = load_reference()


@pytest.mark.shared
def test_reference_csv_is_the_transcription_of_the_paper_text():
    from xbench.paper import flag_inconsistencies

    text = shared_path("research", "paper_2510.19599.txt").read_text()
    fresh = flag_inconsistencies(transcribe(text))
    pd.testing.assert_frame_equal(fresh.reset_index(drop=True), REF, check_dtype=False)


def test_shape_models_datasets_and_classes():
    assert REF.groupby("table").size().to_dict() == {1: 7 * 21, 2: 7 * 22, 3: 7 * 9, 4: 7 * 11, 5: 7 * 14}
    assert list(dict.fromkeys(REF["model"])) == list(MODELS)
    assert list(dict.fromkeys(REF.loc[REF.table == 1, "dataset"])) == list(DATASETS)
    for table, dataset in CLASS_TABLES.items():  # every paper class is a class of the dataset's manifest
        names = [c["name"] for c in dataset_manifest(dataset)["classes"]]
        assert sorted(TABLE_CLASSES[table].values()) == sorted(names), table
    # spot checks against the printed text, one per table
    cell = REF.set_index(["table", "model", "dataset", "paper_class", "metric"])["value"]
    assert cell[(1, "carzero", "rsna_pneumonia", "Mean", "dice@best")] == 50.47
    assert cell[(2, "biomedclip", "vindr_cxr", "Lung cyst", "pointing")] == 50.00  # lower row, 2nd column
    assert cell[(2, "carzero", "vindr_cxr", "Clav. fract.", "pointing")] == 100.00
    assert cell[(2, "devide", "vindr_cxr", "Lung Opac.", "pointing")] == 31.25  # the 11th upper-row class
    assert cell[(3, "mavl", "nih_bbox", "EFF", "pointing")] == 9.8
    assert cell[(5, "kad", "chexlocalize", "Lung Les.", "pointing")] == 42.86
    assert (REF["source_line"] > 0).all() and set(REF["mark"]) == {"", "underline"}


def test_table1_point_is_the_mean_of_the_per_class_tables():
    """Done-when: Table 1's Point for ChestX-ray14 / CheXDet-10 / CheXlocalize = mean of Tables 3–5's printed classes."""
    checks = mean_checks(REF)
    t1 = checks[(checks.table == 1) & checks.dataset.isin(["nih_bbox", "chestx_det10", "chexlocalize"])]
    assert len(t1) == 21 and t1["consistent"].all(), t1[~t1.consistent]
    for _, r in t1.iterrows():  # recomputed here from the tidy rows, not from mean_checks
        cls = REF[(REF.table == r["class_table"]) & (REF.model == r["model"]) & (REF.finding != DATASET_LEVEL)]
        assert abs(cls["value"].mean() - r["printed"]) <= 0.01


def test_every_table2_mean_is_checked_and_flagged_where_it_disagrees():
    checks = mean_checks(REF)
    t2 = checks[checks.table == 2].set_index("model")
    assert list(t2.index) == list(MODELS) and (t2["n_classes"] == 21).all()
    assert sorted(t2.index[~t2["consistent"]]) == ["carzero", "devide"]  # 39.07 vs 39.78, 21.47 vs 23.25
    assert t2.loc["devide", "class_mean"] == pytest.approx(23.2543, abs=1e-4)
    means = REF[(REF.table == 2) & (REF.finding == DATASET_LEVEL)].set_index("model")
    assert (means["flag"] != "").to_dict() == (~t2["consistent"]).to_dict()
    assert "23.25" in means.loc["devide", "flag"] and means.loc["kad", "flag"] == ""


def test_flags_name_the_table1_vs_per_class_mean_disagreements():
    t5 = REF[(REF.table == 5) & (REF.finding == DATASET_LEVEL)].set_index("model")
    assert (t5["flag"] != "").all()  # no printed Table 5 Mean is the mean of its 13 classes
    assert "Table 1 prints 3.22" in t5.loc["clip", "flag"]
    t3 = REF[(REF.table == 3) & (REF.finding == DATASET_LEVEL)]
    assert (t3["flag"] == "").all()  # Table 3 is consistent with its classes and with Table 1
    assert REF.loc[REF.flag != "", "value"].notna().all()  # flagged cells keep the printed value


def test_implied_denominator():
    assert implied_denominator([50.0]) == 2 and implied_denominator([0.0, 100.0]) == 1
    assert implied_denominator([33.33, 66.67]) == 3
    assert implied_denominator([14.29, 28.57]) == 7
    assert implied_denominator([0.46, 1.01, 1.55, 2.47, 2.78, 5.56, 3.40], max_n=600) is None
    assert fits([15.62, 3.12], 32).all() and not fits([15.62], 44).any()


def test_known_denominators_from_the_paper():
    d = denominator_table(REF).set_index(["dataset", "finding"])
    assert d.loc[("rsna_pneumonia", "Pneumonia"), "implied_n"] == 1218 == d.loc[("rsna_pneumonia", "Pneumonia"), "expected_n"]
    assert d.loc[("covid_rural", "COVID-19 opacity"), "implied_n"] == 32  # not the 44 images of the split
    siim = d.loc[("siim_acr", "Pneumothorax")]
    assert pd.isna(siim["implied_n"]) and siim["expected_n"] == 515 and siim["fit_expected"] == 1
    nih = d.loc["nih_bbox"]
    assert (nih["implied_n"] == nih["expected_n"]).all() and (nih["fit_expected"] == 7).all()
    det = d.loc["chestx_det10"]
    assert list(det["expected_n"]) == [48, 38, 289, 252, 39, 82, 76, 30, 77, 35]
    # all models but CARZero share these denominators (CARZero's values fit none of them)
    assert det["implied_n"].iloc[0] == 48 and list(det["left_out"].iloc[1:]) == ["carzero"] * 9
    assert list(det["implied_n_wo"].iloc[1:]) == [37, 277, 243, 37, 75, 67, 29, 74, 33]
    assert list(det["fit_expected"]) == [7, 3, 0, 0, 0, 0, 3, 2, 1, 1]


def test_expected_positive_pairs_from_manifests():
    assert expected_positive_pairs("nih_bbox")["Atelectasis"] == 180  # boxes, not Data_Entry labels (302)
    assert expected_positive_pairs("rsna_pneumonia") == {"Pneumonia": 1218}
    assert expected_positive_pairs("vindr_cxr")["Cardiomegaly"] is None


def test_synthetic_results_cover_every_model_dataset_and_class():
    tidy = synthetic_results()
    assert set(tidy["model"]) == set(MODELS) and set(tidy["dataset"]) == set(DATASETS)
    for d in DATASETS:
        classes = {c["name"] for c in dataset_manifest(d)["classes"]}
        assert set(tidy.loc[tidy.dataset == d, "finding"]) == classes | {DATASET_LEVEL}
    det = tidy[(tidy.dataset == "chestx_det10") & (tidy.finding == "Consolidation") & (tidy.metric == "pointing")]
    assert (det["n_pairs"] == 289).all() and np.allclose((det["value"] * 289) % 1, 0)
    assert tidy["value"].between(0, 1).all()
    pd.testing.assert_frame_equal(tidy, synthetic_results())  # seeded


def test_compare_with_paper_matches_cells_and_checks_the_ci():
    from xbench.outputs.analysis import compare_with_paper, comparison_status, comparison_summary

    tidy = synthetic_results()
    # make one published cell exact: KAD's Table 3 CARD pointing 90.41
    hit = (tidy.model == "kad") & (tidy.dataset == "nih_bbox") & (tidy.finding == "Cardiomegaly") & (tidy.metric == "pointing")
    tidy.loc[hit, ["value", "ci_low", "ci_high"]] = [0.9041, 0.85, 0.95]
    c = compare_with_paper(tidy)
    assert len(c) == len(REF) and c["run"].notna().all()
    row = c[(c.table == 3) & (c.model == "kad") & (c.paper_class == "CARD")].iloc[0]
    assert row["diff"] == pytest.approx(0.0) and bool(row["paper_in_ci"]) and row["n_pairs"] == 146
    assert np.allclose(c["diff"], c["run"] - c["paper"])
    inside = (c["run_low"] - 0.005 <= c["paper"]) & (c["paper"] <= c["run_high"] + 0.005)
    assert (c["paper_in_ci"].astype(bool) == inside).all()
    t1 = c[(c.table == 1) & (c.model == "kad") & (c.dataset == "nih_bbox") & (c.metric == "pointing")].iloc[0]
    assert t1["n_pairs"] == 984  # pairs behind a dataset value: the sum over classes
    summary = comparison_summary(c)
    assert summary.loc[3, "cells"] == 63 and summary.loc[5, "flagged_in_paper"] == 7
    assert comparison_status(tidy, synthetic=True).startswith("Synthetic")
    phantom = tidy.assign(dataset="phantom")
    assert comparison_status(phantom).startswith("No comparison of values is meaningful")
    assert "Comparable cells" in comparison_status(tidy)


def test_model_level_means_use_datasets_where_both_metrics_are_defined():
    from xbench.outputs.analysis import calibration_by_model, dataset_means, model_correlation

    tidy = synthetic_results(datasets=["nih_bbox", "covid_rural"])
    covid_auc = (tidy.dataset == "covid_rural") & (tidy.metric == "auc")
    tidy.loc[covid_auc, "value"] = np.nan  # every COVID image is positive: AUC undefined
    means = dataset_means(tidy, ["auc", "pointing"]).set_index("model")
    level = tidy[(tidy.finding == DATASET_LEVEL) & (tidy.dataset == "nih_bbox")].set_index(["model", "metric"])["value"]
    assert means.loc["kad", "pointing"] == pytest.approx(level[("kad", "pointing")])  # COVID left out for both
    assert (means["n_datasets"] == 1).all()
    gap = calibration_by_model(tidy).set_index("model")
    both = tidy[tidy.finding == DATASET_LEVEL].pivot_table(index=["model", "dataset"], columns="metric", values="value")
    assert gap.loc["kad", "best"] == pytest.approx(both.loc["kad", "dice@best"].mean())
    pts, fit = model_correlation(tidy, models=["clip", "kad", "mavl"])
    assert fit is None and pts["residual"].isna().all() and len(pts) == 3


def test_paper_names_and_groups_come_from_the_model_yamls(tmp_path, monkeypatch):
    """MODELS / GROUPS are the YAMLs' ``paper:`` sections, in row order; a clash or a bad section is one clear error."""
    import xbench.paper as paper
    from xbench.spec import registry
    from xbench.core.errors import FormatError

    models, groups = paper.paper_models()
    for name in models:
        section = registry.model_config(name)["paper"]
        assert (models[name], groups[name]) == (section["name"], section["group"])
    assert [registry.model_config(n)["paper"]["row"] for n in models] == sorted(range(1, len(models) + 1))
    assert paper.MODELS == models and paper.paper_name("kad") == "KAD" and paper.paper_name("kad_512") == "kad_512"

    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", [*registry.MODEL_CONFIG_DIRS, tmp_path])
    clip = (registry.PACKAGE_DIR / "configs" / "models" / "clip.yaml").read_text()
    try:
        (tmp_path / "clip_copy.yaml").write_text(clip)  # the same paper row as clip
        paper.paper_models.cache_clear()
        with pytest.raises(FormatError, match=r"clip_copy\.yaml.*paper\.row.*row 1 is also model 'clip'"):
            paper.paper_models()
        (tmp_path / "clip_copy.yaml").write_text(clip.replace("group: \"direct contrastive\", ", ""))
        paper.paper_models.cache_clear()
        with pytest.raises(FormatError, match=r"paper\.group"):
            paper.paper_models()
    finally:
        paper.paper_models.cache_clear()
