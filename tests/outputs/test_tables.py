"""Paper-style tables: wide pivot, best (bold) / second (underlined) marks per column, baselines not ranked,
best_tau not ranked, dagger for unverified models, Markdown / LaTeX text, write_table's three files."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from xbench.metrics import DATASET_LEVEL
from xbench.outputs.tables import model_flags, model_notes, per_class, pick_datasets, render, wide, write_table

METRICS = ["pointing", "dice@best", "best_tau"]
VALUES = {  # (model, dataset, metric) → value; the baseline has the highest pointing on d1
    ("alpha", "d1", "pointing"): 0.5, ("beta", "d1", "pointing"): 0.7, ("gamma", "d1", "pointing"): 0.6,
    ("center_prior", "d1", "pointing"): 0.9,
    ("alpha", "d1", "dice@best"): 0.3, ("beta", "d1", "dice@best"): 0.3, ("gamma", "d1", "dice@best"): 0.2,
    ("center_prior", "d1", "dice@best"): 0.1,
    ("alpha", "d1", "best_tau"): 0.9, ("beta", "d1", "best_tau"): 0.4, ("gamma", "d1", "best_tau"): 0.2,
    ("center_prior", "d1", "best_tau"): 0.5,
    ("alpha", "d2", "pointing"): np.nan, ("beta", "d2", "pointing"): 0.4, ("gamma", "d2", "pointing"): 0.5,
    ("center_prior", "d2", "pointing"): 0.1,
}


def tidy(with_ci: bool = True) -> pd.DataFrame:
    rows = []
    for (model, dataset, metric), v in VALUES.items():
        ci = (v - 0.1, v + 0.1) if with_ci and metric != "best_tau" else (np.nan, np.nan)
        rows.append({"model": model, "dataset": dataset, "finding": DATASET_LEVEL, "metric": metric, "value": v,
                     "ci_low": ci[0], "ci_high": ci[1], "n_pairs": 10})
        # a per-class row that the finding filter must drop
        rows.append({"model": model, "dataset": dataset, "finding": "Nodule", "metric": metric, "value": 0.0,
                     "ci_low": np.nan, "ci_high": np.nan, "n_pairs": 3})
    return pd.DataFrame(rows)


@pytest.fixture()
def table() -> pd.DataFrame:
    return wide(tidy(), rows="model", columns=["dataset"], metrics=METRICS, finding=DATASET_LEVEL)


def md_cells(text: str) -> dict[str, dict[str, str]]:
    """Markdown table → row label → column header → cell text."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = dict(zip(header[1:], cells[1:]))
    return out


def test_wide_layout_and_values(table):
    assert table.columns.names == ["dataset", "metric", "stat"]
    assert table.index.name == "model" and sorted(table.index) == ["alpha", "beta", "center_prior", "gamma"]
    assert list(table.columns[:9]) == [("d1", m, s) for m in METRICS for s in ("value", "ci_low", "ci_high")]
    assert list(table.columns[9:]) == [("d2", "pointing", s) for s in ("value", "ci_low", "ci_high")]
    assert table.loc["beta", ("d1", "pointing", "value")] == 0.7
    assert table.loc["beta", ("d1", "pointing", "ci_low")] == pytest.approx(0.6)
    assert math.isnan(table.loc["alpha", ("d2", "pointing", "value")])
    assert table.loc["gamma", ("d1", "dice@best", "value")] == 0.2  # the per-class rows (0.0) were filtered out


def test_wide_dataset_filter():
    t = wide(tidy(), rows="model", columns=["dataset"], metrics=["pointing"], finding=DATASET_LEVEL,
             dataset="d2")
    assert {c[0] for c in t.columns} == {"d2"}


def test_render_md_marks_best_and_second_and_skips_baselines(table):
    cells = md_cells(render(table, fmt="md", baselines=["center_prior"], unverified=["gamma"]))
    assert set(cells) == {"alpha", "beta", "gamma†", "center_prior (baseline)"}
    col = "d1 / pointing"
    assert cells["beta"][col] == "**0.700** [0.600, 0.800]"
    assert cells["gamma†"][col] == "<u>0.600</u> [0.500, 0.700]"
    assert cells["alpha"][col] == "0.500 [0.400, 0.600]"
    assert cells["center_prior (baseline)"][col] == "0.900 [0.800, 1.000]"  # highest, but a baseline: not ranked
    # a tie shares the best mark; the next distinct value is second
    assert cells["alpha"]["d1 / dice@best"].startswith("**0.300**")
    assert cells["beta"]["d1 / dice@best"].startswith("**0.300**")
    assert cells["gamma†"]["d1 / dice@best"].startswith("<u>0.200</u>")
    # best_tau is a setting, never ranked; no CI → no brackets
    assert [cells[r]["d1 / best_tau"] for r in ("alpha", "beta", "gamma†")] == ["0.900", "0.400", "0.200"]
    # NaN → dash, and ranking among the rest
    assert cells["alpha"]["d2 / pointing"] == "–"
    assert cells["gamma†"]["d2 / pointing"].startswith("**0.500**")
    assert cells["beta"]["d2 / pointing"].startswith("<u>0.400</u>")


def test_render_md_notes(table):
    text = render(table, fmt="md", baselines=["center_prior"], unverified=["gamma"])
    assert "Bold: best; underlined: second best" in text and "†: unverified" in text
    assert "†: unverified" not in render(table, fmt="md")
    header = text.splitlines()[0]
    assert header == "| model | d1 / pointing | d1 / dice@best | d1 / best_tau | d2 / pointing |"


def test_without_baselines_everyone_is_ranked(table):
    cells = md_cells(render(table, fmt="md"))
    assert cells["center_prior"]["d1 / pointing"].startswith("**0.900**")
    assert cells["beta"]["d1 / pointing"].startswith("<u>0.700</u>")


def test_render_latex(table):
    text = render(table, fmt="tex", baselines=["center_prior"], unverified=["gamma"])
    lines = text.strip().splitlines()
    assert lines[0] == r"\begin{tabular}{lcccc}" and lines[-1] == r"\end{tabular}"
    assert lines[1] == r"\toprule" and lines[3] == r"\midrule" and lines[-2] == r"\bottomrule"
    assert lines[2] == r"model & d1 / pointing & d1 / dice@best & d1 / best\_tau & d2 / pointing \\"
    body = {ln.split(" & ")[0]: ln for ln in lines[4:-2]}
    assert set(body) == {"alpha", "beta", r"gamma$^\dagger$", r"center\_prior (baseline)"}
    assert all(ln.endswith(r" \\") and ln.count(" & ") == 4 for ln in body.values())
    assert r"\textbf{0.700} [0.600, 0.800]" in body["beta"]
    assert r"\underline{0.600}" in body[r"gamma$^\dagger$"]
    assert r"\textbf" not in body[r"center\_prior (baseline)"]


def test_tables_without_ci_render(tmp_path):
    """No bootstrap (all CI bounds NaN): the wide table keeps the bound columns and cells carry no brackets."""
    t = wide(tidy(with_ci=False), rows="model", columns=["dataset"], metrics=["pointing"], finding=DATASET_LEVEL)
    assert list(t.columns[:3]) == [("d1", "pointing", s) for s in ("value", "ci_low", "ci_high")]
    cells = md_cells(render(t, fmt="md", baselines=["center_prior"]))
    assert cells["beta"]["d1 / pointing"] == "**0.700**"


def test_write_table_writes_three_files(table, tmp_path):
    paths = write_table(table, tmp_path / "out" / "table1", baselines=["center_prior"], unverified=["gamma"],
                        caption="Table 1 (phantom)")
    assert [p.name for p in paths] == ["table1.csv", "table1.md", "table1.tex"]
    assert all(p.stat().st_size > 0 for p in paths)
    csv = pd.read_csv(paths[0], index_col=0)
    assert csv.loc["beta", "d1 / pointing / value"] == 0.7 and len(csv) == 4
    md = paths[1].read_text()
    assert md.startswith("**Table 1 (phantom)**\n\n") and "**0.700**" in md
    assert paths[2].read_text() == render(table, fmt="tex", baselines=["center_prior"], unverified=["gamma"])


def test_model_flags_and_pick_datasets():
    models = pd.DataFrame({"model": ["clip", "center_prior", "kad"], "map_source": ["gradcam", "prior", "attention"],
                           "verified": [True, True, False]})
    assert model_flags(models) == (["center_prior"], ["kad"])
    t = tidy()
    assert pick_datasets(t, ["d2", "zzz"]) == ["d2"]
    assert pick_datasets(t, ["zzz"]) == ["d1", "d2"]


def test_per_class_tables_rank_each_row_across_models():
    rows = [("m1", "A", 0.9), ("m2", "A", 0.5), ("prior", "A", 0.95), ("m1", "B", 0.1), ("m2", "B", 0.7), ("prior", "B", 0.0)]
    tidy_rows = pd.DataFrame([{"model": m, "dataset": "d", "finding": f, "metric": "pointing", "value": v,
                               "ci_low": v - 0.01, "ci_high": v + 0.01, "n_pairs": 10} for m, f, v in rows])
    table = per_class(tidy_rows, "d")
    text = render(table, fmt="md", baselines=["prior"], models_on="columns")
    line_a = next(line for line in text.splitlines() if line.startswith("| A "))
    line_b = next(line for line in text.splitlines() if line.startswith("| B "))
    assert "**0.900**" in line_a and "<u>0.500</u>" in line_a and "**0.950**" not in line_a  # baseline not ranked
    assert "**0.700**" in line_b and "<u>0.100</u>" in line_b
    assert "prior (baseline) / pointing" in text.splitlines()[0]
    with pytest.raises(ValueError, match="models_on"):
        render(table, fmt="md", models_on="diagonal")


def test_model_notes_label_random_init_models(table):
    models = pd.DataFrame({"model": ["a", "b"], "weights": ["random-init", "official"], "map_source": ["similarity"] * 2,
                           "verified": [True, True]})
    notes = model_notes(models)
    assert notes == {"a": "random-init weights"}
    text = render(table, fmt="md", notes={table.index[0]: "random-init weights"})
    assert f"{table.index[0]} (random-init weights)" in text


# -- the paper's form ------------------------------------------------------------------------------------------------
from xbench.paper import MODELS, TABLE_CLASSES, load_reference, synthetic_results  # noqa: E402
from xbench.outputs.tables import MIN_PAIRS_TO_RANK, cell_counts, paper_class_table, paper_table1, skipped_note  # noqa: E402

PAPER_ROWS = ["CLIP", "BiomedCLIP", "MedKLIP", "KAD", "MAVL", "CARZero", "DeViDe"]
PAPER_GROUPS = ["COVID-19", "RSNA Pneumonia", "SIIM Pneumothorax", "CheXDet-10", "CheXlocalize", "VinDr-CXR",
                "ChestX-ray14"]


def test_paper_table1_has_the_papers_rows_columns_and_order():
    tidy = synthetic_results().sample(frac=1, random_state=1)  # row order of the input must not matter
    t = paper_table1(tidy)
    assert list(t.values.index) == PAPER_ROWS and t.separator is None
    assert list(t.values.columns) == [(g, m) for g in PAPER_GROUPS for m in ("Point", "Dice", "IoU")]
    # values are percent of the tidy dataset-level values, n the pairs summed over classes
    level = tidy[(tidy.finding == DATASET_LEVEL) & (tidy.model == "kad") & (tidy.dataset == "nih_bbox")]
    assert t.values.at["KAD", ("ChestX-ray14", "Dice")] == pytest.approx(100 * level.set_index("metric").at["dice@best", "value"])
    assert t.n.at["KAD", ("ChestX-ray14", "Point")] == 984  # the 984 NIH boxes
    assert t.n.at["KAD", ("RSNA Pneumonia", "Point")] == 1218
    md = t.to_markdown()
    header = next(ln for ln in md.splitlines() if ln.startswith("| Method"))
    assert header.split(" | ")[1:4] == ["COVID-19 Point", "COVID-19 Dice", "COVID-19 IoU"]
    assert md.count("**") >= 2 * 21 and md.count("<u>") >= 21  # a best and a second in every column


def test_paper_class_tables_have_mean_then_the_papers_classes():
    tidy = synthetic_results()
    for table, dataset in ((2, "vindr_cxr"), (3, "nih_bbox"), (4, "chestx_det10"), (5, "chexlocalize")):
        t = paper_class_table(tidy, dataset)
        assert list(t.values.index) == PAPER_ROWS
        assert list(t.values.columns) == ["Mean", *TABLE_CLASSES[table]], table
        assert t.caption.startswith(f"Table {table}.")
    t3 = paper_class_table(tidy, "nih_bbox")
    assert list(t3.values.columns) == ["Mean", "ATE", "CARD", "EFF", "INF", "MASS", "NOD", "PNEU", "PTX"]
    assert t3.n.at["CARZero", "CARD"] == 146 and t3.n.at["CARZero", "Mean"] == 984


def test_paper_tables_set_other_models_apart_and_do_not_rank_baselines(tmp_path):
    tidy = synthetic_results(models=["center_prior", "kad", "ref_xattn", "clip"], datasets=["nih_bbox"])
    t = paper_table1(tidy, baselines=["center_prior"], unverified=["ref_xattn"], notes={"clip": "random-init weights"})
    assert list(t.values.index) == ["CLIP (random-init weights)", "KAD", "ref_xattn†", "center_prior (baseline)"]
    assert t.separator == "ref_xattn†"
    assert (t.ranks().loc["center_prior (baseline)"] == 0).all()
    md, tex = t.to_markdown(), t.to_latex()
    assert "*other models and baselines*" in md
    assert tex.startswith("\\begin{table}") and "\\caption{" in tex and tex.rstrip().endswith("\\end{table}")
    assert tex.count("\\midrule") == 2  # header rule + the separator
    paths = t.write(tmp_path / "paper_table1")
    assert [p.suffix for p in paths] == [".csv", ".md", ".tex", ".html"]
    csv = pd.read_csv(paths[0], index_col=0)
    assert list(csv.columns[:2]) == ["ChestX-ray14 / Point", "ChestX-ray14 / Point / n_pairs"]
    html = paths[3].read_text()
    assert "font-weight: bold" in html and "text-decoration: underline" in html and "984 positive pairs" in html
    assert t.to_html() == html  # the same bytes on every render (the Styler's element ids come from the caption)


def test_no_ranking_where_n_is_too_small():
    tidy = synthetic_results(datasets=["nih_bbox"])
    small = tidy.copy()
    small.loc[small["finding"] == "Nodule", "n_pairs"] = MIN_PAIRS_TO_RANK - 1
    t = paper_class_table(small, "nih_bbox")
    assert (t.ranks()["NOD"] == 0).all() and (t.ranks()["CARD"] > 0).sum() >= 2
    assert "ranked only where n ≥ 30" in t.to_markdown()
    # the rich form follows the same rule and shows n
    table = per_class(small, "nih_bbox")
    counts = cell_counts(table, small, dataset="nih_bbox")
    text = render(table, fmt="md", models_on="columns", counts=counts)
    nodule = next(ln for ln in text.splitlines() if ln.startswith("| Nodule "))
    assert "**" not in nodule and "<u>" not in nodule and f"n={MIN_PAIRS_TO_RANK - 1}" in nodule
    cardio = next(ln for ln in text.splitlines() if ln.startswith("| Cardiomegaly "))
    assert "**" in cardio and "n=146" in cardio


def test_skipped_cases_are_stated():
    log = [{"dataset": "nih_bbox", "model": "kad", "cases": 880, "cases_skipped_at_inference": 878},
           {"dataset": "nih_bbox", "model": "clip", "cases": 880, "cases_skipped_at_inference": 878}]
    assert "nih_bbox: 878 of 880" in skipped_note(log)
    t = paper_table1(synthetic_results(datasets=["nih_bbox"]), log=log)
    assert "nih_bbox: 878 of 880" in t.to_markdown()


def test_the_paper_itself_renders_in_paper_form():
    """The reference data through the same tables: Table 3 as printed (percent → fraction → percent)."""
    ref = load_reference([3]).assign(value=lambda d: d["value"] / 100, n_pairs=100, ci_low=np.nan, ci_high=np.nan)
    t = paper_class_table(ref, "nih_bbox")
    assert list(t.values.index) == PAPER_ROWS
    assert t.values.at["CARZero", "CARD"] == pytest.approx(99.32) and t.values.at["CLIP", "Mean"] == pytest.approx(7.42)
    assert set(MODELS.values()) == set(PAPER_ROWS)


def test_undefined_note_names_metrics_undefined_when_every_image_is_positive():
    from xbench.metrics import score_table
    from xbench.outputs.tables import undefined_note

    labels = pd.DataFrame({"COVID-19 opacity": [1.0, 1.0, 1.0]}, index=["a", "b", "c"])
    scores = pd.DataFrame({"COVID-19 opacity": [0.9, 0.4, 0.7]}, index=labels.index)
    with pytest.warns(Warning):
        t = score_table(None, model="m", dataset="covid_rural", labels=labels, scores=scores, n_boot=0)
    note = undefined_note(t, ["auc", "auprc", "f1", "accuracy", "hamming_accuracy"])
    assert note.startswith("Undefined") and "covid_rural: auc, auprc, f1, accuracy." in note
    hamming = t[(t.finding == DATASET_LEVEL) & (t.metric == "hamming_accuracy")]["value"].item()
    assert hamming == pytest.approx(2 / 3)  # defined: the share of images scored ≥ 0.5
