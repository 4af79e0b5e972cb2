"""Figures from the tables of a tiny phantom run: each function returns a Figure with the expected panels,
and save_figure writes non-empty PNG and PDF files."""
from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import xbench
from xbench.outputs import figures
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.evaluation.evaluate import load_tables
from xbench.metrics import DATASET_LEVEL
from xbench.workflows.run import run

MODELS = ["center_prior", "random_prior"]
CASES = 22


pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def done(tmp_path_factory, phantom_cache) -> dict:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("figures-run")
    cfg = RunConfig.from_dict({"output_dir": str(out), "datasets": [{"name": "phantom", "split": "test", "cases": CASES}],
                               "models": MODELS, "grid": [32, 32], "chunk_size": 11, "batch_size": 11,
                               "bootstrap": {"replicates": 10}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False)
    return {"out": out, **load_tables(out)}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def check_saved(fig, tmp_path, name: str) -> None:
    paths = figures.save_figure(fig, tmp_path / "figs" / name)
    assert [p.name for p in paths] == [f"{name}.png", f"{name}.pdf"]
    png, pdf = (p.read_bytes() for p in paths)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert pdf.startswith(b"%PDF") and len(pdf) > 1000


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.axison]


def test_auc_vs_pointing(done, tmp_path):
    fig = figures.auc_vs_pointing(done["metrics"], level=DATASET_LEVEL, title="phantom")
    assert isinstance(fig, plt.Figure)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "classification AUC" and ax.get_ylabel() == "pointing game accuracy"
    assert "n = 2" in ax.get_title() and ax.get_title().startswith("phantom")
    assert "no fit (fewer than 4 points)" in ax.get_title() and "R²" not in ax.get_title()  # 2 points: no line
    assert not [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(MODELS)  # one point per model × dataset
    check_saved(fig, tmp_path, "fig3")


def test_auc_vs_pointing_per_class(done):
    fig = figures.auc_vs_pointing(done["metrics"], level="per-class", title="per class")
    n_points = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    tidy = done["metrics"]
    both = tidy[~tidy["finding"].str.startswith("(") & tidy["metric"].isin(["auc", "pointing"])]
    defined = both.dropna(subset=["value"]).groupby(["model", "finding"])["metric"].nunique()
    assert n_points == int((defined == 2).sum()) > 0


def test_calibration(done, tmp_path):
    fig = figures.calibration(done["metrics"], fixed="dice@0.5", best="dice@best", title="phantom")
    ax = fig.axes[0]
    deltas = [t.get_text() for t in ax.texts if t.get_text().startswith("Δ")]
    assert len(deltas) == len(MODELS)
    assert all(float(d[1:]) >= 0 for d in deltas)  # the best τ can only improve mean Dice over classes
    assert {t.get_text() for t in ax.get_xticklabels()} == set(MODELS)
    check_saved(fig, tmp_path, "fig4")


def test_discrepancy_has_one_panel_per_model(done, tmp_path):
    fig = figures.discrepancy(done["metrics"], dataset="phantom", title="phantom per class")
    axes = visible_axes(fig)
    assert sorted(ax.get_title() for ax in axes) == sorted(MODELS)
    assert fig._suptitle.get_text() == "phantom per class"
    check_saved(fig, tmp_path, "discrepancy")


def test_lesion_size(done, tmp_path):
    fig = figures.lesion_size(done["pairs"], title="size", metrics=("pointing", "dice@best"))
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()] == ["pointing", "dice@best"]
    check_saved(fig, tmp_path, "size")


def test_threshold_curves(done, tmp_path):
    fig = figures.threshold_curves(done["curves"], title="curves")
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("threshold τ")
    long_lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 101]
    assert len(long_lines) == len(MODELS)
    check_saved(fig, tmp_path, "curves")


def test_overlay_grid_hand_built(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.random((16, 16)) for _ in range(2)]
    masks = [np.zeros((16, 16), bool), np.zeros((16, 16), bool)]
    masks[0][4:9, 4:9] = True  # second case: empty mask, no outline drawn
    maps = [[rng.random((16, 16)) for _ in range(3)] for _ in range(2)]
    fig = figures.overlay_grid(images, maps, masks, row_labels=["c1", "c2"], col_labels=["m1", "m2", "m3"], title="t")
    assert len(fig.axes) == 2 * 4 + 1  # + the colour bar
    assert [ax.get_title() for ax in fig.axes[:4]] == ["image + GT (blue)", "m1", "m2", "m3"]
    assert fig.axes[1].images[1].get_cmap().name == figures.MAP_CMAP
    assert len(fig.axes[1].images) == 2 and len(fig.axes[0].images) == 1  # image (+ map) per panel
    check_saved(fig, tmp_path, "fig2")


def test_visual_comparison_from_the_store(done, tmp_path):
    data = xbench.load_dataset("phantom", split="test", cases=CASES)
    fig = figures.visual_comparison(done["out"], data, MODELS, seed=0)
    # the paper's findings present in the phantom: Pneumothorax, Consolidation (no Lung Opacity)
    assert len(fig.axes) == 2 * (len(MODELS) + 1) + 1
    assert [ax.get_title() for ax in fig.axes[:3]] == ["image + GT (blue)", *MODELS]
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes[: 2 * 3 : 3]] == ["Pneumothorax", "Consolidation"]
    panel_texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(panel_texts) == 2 * len(MODELS) and all(t.startswith("hit ") and "Dice" in t for t in panel_texts)
    assert any(ln.get_marker() == "x" for ln in fig.axes[1].get_lines())  # argmax marked
    assert "synthetic phantom" in fig._suptitle.get_text()
    check_saved(fig, tmp_path, "visual")


def test_data_label_flags_the_phantom():
    assert figures.data_label(["phantom", "nih_bbox"]) == "Data: phantom (synthetic phantom, not patient data), nih_bbox"


def test_visual_comparison_takes_case_ids_and_refuses_unevaluated_cases(done):
    data = xbench.load_dataset("phantom", split="test", cases=CASES)
    labels = data.labels()
    c = data.findings.index("Consolidation")
    ids = data.cases["case_id"].astype(str).tolist()
    case = next(ids[r] for r in np.flatnonzero(labels[:, c] == 1) if data[int(r)].regions.get("Consolidation"))
    fig = figures.visual_comparison(done["out"], data, MODELS, findings=["Consolidation"], case_ids=[case])
    assert fig.axes[0].get_ylabel() == f"Consolidation\n{case}"
    with pytest.raises(ValueError, match="not in phantom"):
        figures.visual_comparison(done["out"], data, MODELS, findings=["Consolidation"], case_ids=["nope"])
    with pytest.raises(ValueError, match="not classes of phantom"):
        figures.visual_comparison(done["out"], data, MODELS, findings=["Lung Opacity"])


def test_paper_fig3_one_point_per_model_with_groups_fit_and_residuals(tmp_path):
    from xbench.outputs.analysis import model_correlation
    from xbench.paper import synthetic_results

    tidy = synthetic_results()
    fig = figures.paper_fig3(tidy, title="synthetic")
    ax = fig.axes[0]
    assert sum(len(c.get_offsets()) for c in ax.collections) == 7
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == sorted(
        ["direct contrastive", "structured alignment", "cross-attention"])
    pts, fit = model_correlation(tidy)
    assert fit is not None and f"R² = {fit.r2:.2f}" in ax.get_title() and "nan" not in ax.get_title()
    assert np.allclose(pts["residual"], pts["y"] - (fit.slope * pts["x"] + fit.intercept))
    labels = [t.get_text() for t in ax.texts]
    assert any(lbl.startswith("CARZero (") for lbl in labels)
    check_saved(fig, tmp_path, "fig3_paper")
    few = figures.paper_fig3(tidy[tidy["model"].isin(["kad", "clip", "mavl"])], title="three")
    assert "no fit" in few.axes[0].get_title() and not few.axes[0].get_lines()


def test_fig4_states_the_averaging_rule_and_uses_paper_names():
    from xbench.paper import synthetic_results

    fig = figures.calibration(synthetic_results(), fixed="dice@0.5", best="dice@best", title="synthetic")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["CLIP", "BiomedCLIP", "MedKLIP", "KAD", "MAVL",
                                                           "CARZero", "DeViDe"]
    assert "mean over datasets of the mean over classes" in ax.get_title()


def test_difference_heatmap(tmp_path):
    from xbench.outputs.analysis import compare_with_paper
    from xbench.paper import synthetic_results

    fig = figures.difference_heatmap(compare_with_paper(synthetic_results()), title="synthetic vs paper")
    panels = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("Table")]
    assert [ax.get_title(loc="left") for ax in panels] == [f"Table {t}" for t in range(1, 6)]
    check_saved(fig, tmp_path, "heat")


def test_importing_figures_keeps_the_backend():
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg'); import xbench.outputs.figures; "
            "import matplotlib.pyplot as plt; print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_saved_figures_use_matplotlibs_own_fonts_whatever_the_machine_has(tmp_path):
    """Another file of the family listed first (as a system DejaVu Sans is on some machines) changes neither the
    saved PDF's bytes nor, afterwards, the font list's order. Here the stand-in "other copy" is a copy of matplotlib's
    DejaVu Serif listed as DejaVu Sans: without :func:`figures.matplotlib_fonts` it would be drawn instead."""
    import matplotlib
    from matplotlib import font_manager

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_title("Dice at τ=0.5 vs best τ − ρ")
    want = figures.save_figure(fig, tmp_path / "plain")[1].read_bytes()

    serif = tmp_path / "fonts" / "DejaVuSans.ttf"  # a copy elsewhere, of other glyphs
    serif.parent.mkdir()
    serif.write_bytes(Path(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSerif.ttf").read_bytes())
    other = font_manager.FontEntry(fname=str(serif), name="DejaVu Sans", style="normal", variant="normal",
                                   weight=400, stretch="normal", size="scalable")
    manager = font_manager.fontManager
    listed = list(manager.ttflist)
    manager.ttflist.insert(0, other)
    font_manager.FontManager._findfont_cached.cache_clear()
    try:
        assert font_manager.findfont("DejaVu Sans") == str(serif)  # the stand-in copy is what matplotlib picks now
        got = figures.save_figure(fig, tmp_path / "other")[1].read_bytes()
        assert manager.ttflist[0] is other  # the order is given back
    finally:
        manager.ttflist[:] = listed
        font_manager.FontManager._findfont_cached.cache_clear()
    plt.close(fig)
    assert got == want
