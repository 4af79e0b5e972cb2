"""Exports round-trip: masks and boxes, rasterised again, give back the metrics they were made with."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import xbench
from xbench.datasets.base import Box
from xbench.datasets.regions import rasterize
from xbench.core.errors import XBenchError
from xbench.evaluation.evaluate import load_tables
from xbench.outputs.exports import export_run, mask_boxes

CASES, GRID = 22, (64, 64)
pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def done(phantom_run) -> dict:
    """The session's phantom run (conftest), read only (exports are written to tmp_path)."""
    return {"out": phantom_run, "pairs": load_tables(phantom_run)["pairs"],
            "data": xbench.load_dataset("phantom", split="test", cases=CASES)}


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * (a & b).sum() / (a.sum() + b.sum())


@pytest.mark.parametrize("tau, column", [("best", "dice@best"), (0.5, "dice@0.5")])
def test_masks_round_trip_to_the_pair_dice(done, tmp_path, tau, column):
    export_run(done["out"], tmp_path, tau=tau)
    data, pairs = done["data"], done["pairs"]
    row_of = {c: i for i, c in enumerate(data.cases["case_id"])}
    checked = 0
    for model, mp in pairs.groupby("model"):
        with np.load(tmp_path / "phantom" / model / "masks.npz") as z:
            masks = {k: z[k] for k in z.files}
        per_cxr = pd.read_csv(tmp_path / "phantom" / model / "dice_results_per_cxr.csv", dtype={"img_id": str}).set_index("img_id")
        hits = pd.read_csv(tmp_path / "phantom" / model / "pointing_results_per_cxr.csv", dtype={"img_id": str}).set_index("img_id")
        assert len(masks) == len(mp)
        for r, want in zip(mp.itertuples(), mp[column]):
            gt = data[row_of[r.case_id]].mask(r.finding, GRID)
            got = dice(masks[f"{r.case_id}|{r.finding}"], gt)
            assert got == want, (model, r.case_id, r.finding, got, want)
            assert per_cxr.at[r.case_id, r.finding] == want
            assert hits.at[r.case_id, r.finding] == r.pointing
            checked += 1
    assert checked == len(pairs) > 10


def test_boxes_round_trip(done, tmp_path):
    files = export_run(done["out"], tmp_path)
    assert any(f.name == "boxes_coco.json" for f in files)
    data, pairs = done["data"], done["pairs"]
    row_of = {c: i for i, c in enumerate(data.cases["case_id"])}
    n_boxes = 0
    for model, mp in pairs.groupby("model"):
        folder = tmp_path / "phantom" / model
        boxes = pd.read_csv(folder / "boxes.csv", dtype={"img_id": str})
        dice_boxes = pd.read_csv(folder / "dice_boxes_results_per_cxr.csv", dtype={"img_id": str}).set_index("img_id")
        with np.load(folder / "masks.npz") as z:
            masks = {k: z[k] for k in z.files}
        coco = json.loads((folder / "boxes_coco.json").read_text())
        assert len(coco["annotations"]) == len(boxes)
        for r in mp.itertuples():
            sample = data[row_of[r.case_id]]
            mine = boxes[(boxes["img_id"] == r.case_id) & (boxes["task"] == r.finding)]
            drawn = rasterize([Box(b.x_min, b.y_min, b.x_max, b.y_max) for b in mine.itertuples()], sample.size, GRID)
            mask = masks[f"{r.case_id}|{r.finding}"]
            assert (drawn | ~mask).all(), "every mask pixel lies in a box"
            assert mine["area_cells"].sum() == mask.sum()
            gt = sample.mask(r.finding, GRID)
            assert dice(drawn, gt) == dice_boxes.at[r.case_id, r.finding]
            assert ((mine["score"] >= 0) & (mine["score"] <= 1)).all()
            n_boxes += len(mine)
        for a in coco["annotations"]:
            x, y, w, h = a["bbox"]
            assert w > 0 and h > 0 and 0 <= x and x + w <= coco["images"][a["image_id"] - 1]["width"] + 1e-9
    assert n_boxes > 10


def test_mask_boxes_components_and_scores():
    m = np.zeros((6, 6), bool)
    m[0, 0] = True
    m[1, 1] = True  # diagonal neighbour: same 8-connected component
    m[3:5, 2:6] = True
    s = np.where(m, 0.5, 0.0)
    s[4, 5] = 0.9
    boxes = mask_boxes(m, s)
    assert [(b["x_min"], b["y_min"], b["x_max"], b["y_max"], b["score"], b["area_cells"]) for b in boxes] == [
        (2, 3, 6, 5, 0.9, 8), (0, 0, 2, 2, 0.5, 2)]
    assert mask_boxes(np.zeros((3, 3), bool), np.zeros((3, 3))) == []


def test_bad_tau(done, tmp_path):
    with pytest.raises(XBenchError, match="tau"):
        export_run(done["out"], tmp_path, tau=1.5)


def test_cli_export_with_margin(done, tmp_path, capsys):
    from xbench.cli import main

    assert main(["export", "--run", str(done["out"]), "--out", str(tmp_path), "--tau", "0.3", "--margin", "4"]) == 0
    assert "files under" in capsys.readouterr().out
    folder = tmp_path / "phantom" / "anatomical_prior"
    assert json.loads((folder / "export.json").read_text())["pointing_margin_px"] == 4
    table = pd.read_csv(folder / "pointing@4px_results_per_cxr.csv", dtype={"img_id": str}).set_index("img_id")
    assert not (folder / "pointing_results_per_cxr.csv").exists()
    pairs = done["pairs"][done["pairs"]["model"] == "anatomical_prior"]
    margin0 = pairs.set_index(["case_id", "finding"])["pointing"]
    got = pd.Series([table.at[c, f] for c, f in margin0.index], index=margin0.index)
    assert (got >= margin0).all()
    assert main(["export", "--run", str(done["out"]), "--tau", "2"]) == 2
