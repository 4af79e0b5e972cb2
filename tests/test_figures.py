"""Figures from the tables of a tiny phantom run: each function returns a Figure with the expected panels,
and save_figure writes non-empty PNG and PDF files."""
from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import xbench
from xbench import figures
from xbench.config import RunConfig
from xbench.errors import XBenchWarning
from xbench.evaluate import load_tables
from xbench.metrics import DATASET_LEVEL
from xbench.runner import run

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
    assert "n = 2" in ax.get_title() and "R² =" in ax.get_title() and ax.get_title().startswith("phantom")
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
    assert len(fig.axes) == 2 * 4
    assert [ax.get_title() for ax in fig.axes[:4]] == ["image + GT", "m1", "m2", "m3"]
    assert len(fig.axes[1].images) == 2 and len(fig.axes[0].images) == 1  # image (+ map) per panel
    check_saved(fig, tmp_path, "fig2")


def test_visual_comparison_from_the_store(done, tmp_path):
    data = xbench.load_dataset("phantom", split="test", cases=CASES)
    fig = figures.visual_comparison(done["out"], data, MODELS, n_cases=2, seed=0)
    assert len(fig.axes) == 2 * (len(MODELS) + 1)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["image + GT", *MODELS]
    assert "synthetic phantom" in fig._suptitle.get_text()
    check_saved(fig, tmp_path, "visual")


def test_data_label_flags_the_phantom():
    assert figures.data_label(["phantom", "nih_bbox"]) == "Data: phantom (synthetic phantom, not patient data), nih_bbox"
