"""Maps of a run → binary masks, boxes (COCO JSON and CSV) and per-case metric CSVs in cheXlocalize's style.

For every (dataset, model) of an evaluated run and every positive (case, class) pair with a region:

* **mask** = ``{u : v_u ≥ τ}`` on the map placed, resized to the evaluation grid and min–max
  normalised exactly as the evaluation does (so its Dice with the ground truth is the pair's Dice
  at τ in ``pairs.parquet``); τ = the class's best τ of the run (default) or a given value;
* **boxes** = bounding boxes of the mask's connected components (8-connectivity), in original
  image pixels (``x_max``/``y_max`` exclusive, XBench's :class:`~xbench.datasets.base.Box`
  convention: grid cell ``(r, c)`` spans ``[c·W/w, (c+1)·W/w) × [r·H/h, (r+1)·H/h)``), each with a
  ``score`` = the largest normalised saliency inside the component; rasterised back with
  :func:`xbench.datasets.regions.rasterize` at the grid they cover exactly the component's
  bounding cells.

Written under ``<run>/exports/<dataset>/<model>/``:

* ``masks.npz`` — one bool ``(h, w)`` array per pair, key ``<case_id>|<class>``, at the evaluation grid;
* ``boxes.csv`` — one row per box: ``img_id, task, x_min, y_min, x_max, y_max, score, area_cells,
  image_height, image_width``
  (``img_id``/``task`` as cheXlocalize names a CXR and a pathology);
* ``boxes_coco.json`` — COCO detection results plus ``images``/``categories``: ``bbox`` =
  ``[x, y, width, height]`` in original pixels, ``score``;
* ``{pointing,dice,iou,dice_boxes}_results_per_cxr.csv`` — cheXlocalize's per-CXR layout: one row
  per CXR (``img_id``), one column per task, NaN where the pair is not a positive pair with a region;
  ``pointing`` is at margin 0 (``pointing@Npx`` with ``margin=N``), Dice / IoU at the export τ;
* ``export.json`` — τ per class, grid, margin and the rules above.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write, atomic_write_text, write_frame
from ..core.errors import XBenchError
from ..spec.names import contained

__all__ = ["maps_at_grid", "mask_boxes", "export_run", "open_run_dataset", "run_grid", "pointing_tolerance_table"]


def open_run_dataset(meta: dict[str, Any]) -> Any:
    """The dataset a store folder was made from (its ``meta.json``: name, root, split, options)."""
    from ..datasets import load_dataset

    return load_dataset(meta["dataset"], root=meta.get("dataset_root"), split=meta.get("split"),
                        **(meta.get("dataset_options") or {}))


def run_grid(pairs: pd.DataFrame) -> tuple[int, int]:
    """The evaluation grid of a run from its pairs table (``gt_area / area_fraction`` = H·W; square grids)."""
    ok = pairs[pairs["area_fraction"] > 0] if len(pairs) else pairs
    if len(ok):
        cells = float((ok["gt_area"] / ok["area_fraction"]).median())
        side = int(round(math.sqrt(cells)))
        if side * side == round(cells):
            return side, side
    raise XBenchError("cannot recover the evaluation grid from pairs.parquet (non-square grid?): pass grid=(H, W) "
                      "/ --grid H W")


def maps_at_grid(maps: np.ndarray, windows: np.ndarray, sizes: np.ndarray, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Native stored maps ``(N, h, w)`` → (maps at the grid, min–max normalised maps), as the evaluation makes them.

    Models that saw a window of the image have their map placed in it first (:mod:`xbench.models.windows`);
    then bilinear resize (:func:`~xbench.metrics.upsample_maps`) and per-map min–max
    (:func:`~xbench.metrics.normalize_maps`, non-finite maps → NaN).
    """
    from ..metrics import normalize_maps, upsample_maps
    from ..models.windows import is_whole_image, place_maps

    maps = np.asarray(maps, np.float32)
    windows, sizes = np.asarray(windows, np.float64), np.asarray(sizes)
    cropped = np.isfinite(windows).all(axis=1) & ~is_whole_image(np.nan_to_num(windows), sizes)
    if cropped.any():
        maps = place_maps(maps, np.where(cropped[:, None], windows, np.c_[np.zeros((len(maps), 2)), sizes]), sizes, grid)
    up = upsample_maps(maps, grid)
    return up, normalize_maps(up, nonfinite="skip")


def mask_boxes(mask: np.ndarray, saliency: np.ndarray, size: tuple[int, int] | None = None) -> list[dict[str, float]]:
    """Connected components (8-connectivity) of a grid mask → boxes with scores.

    Parameters
    ----------
    mask : bool array (h, w)
        A binary mask at the evaluation grid.
    saliency : float array (h, w)
        The normalised map the mask came from; a box's ``score`` is its maximum inside the component.
    size : (H, W), optional
        Original image size; boxes are given in its pixels (default: grid cells).

    Returns
    -------
    list of dict
        ``x_min, y_min, x_max, y_max`` (max exclusive), ``score``, ``area_cells`` (component size),
        ordered by score (highest first), then position.

    Examples
    --------
    >>> m = np.zeros((4, 4), bool); m[0, 0] = m[2:4, 2:4] = True
    >>> [(b["x_min"], b["y_min"], b["x_max"], b["y_max"]) for b in mask_boxes(m, m * 1.0, size=(8, 8))]
    [(0.0, 0.0, 2.0, 2.0), (4.0, 4.0, 8.0, 8.0)]
    """
    from scipy import ndimage

    mask = np.asarray(mask, bool)
    h, w = mask.shape
    height, width = size if size is not None else (h, w)
    sy, sx = height / h, width / w
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), bool))
    boxes = []
    for k, sl in enumerate(ndimage.find_objects(labels), start=1):
        if sl is None:
            continue
        part = labels[sl] == k
        boxes.append({"x_min": sl[1].start * sx, "y_min": sl[0].start * sy, "x_max": sl[1].stop * sx,
                      "y_max": sl[0].stop * sy, "score": float(np.nanmax(np.where(part, saliency[sl], np.nan))),
                      "area_cells": int(part.sum())})
    return sorted(boxes, key=lambda b: (-b["score"], b["y_min"], b["x_min"]))


def tau_mask(v: np.ndarray, tau: float) -> np.ndarray:
    """``v ≥ τ`` decided exactly, as the metrics decide it (:mod:`xbench.metrics._sweep`): the normalised map is
    compared in float64, never by rounding τ to the map's float32 (NumPy 2 compares a float32 array with a
    Python float in float32, which admits ``v = fl32(τ) < τ``).

    Examples
    --------
    >>> v = np.array([0.7], np.float32)   # fl32(0.7) = 0.699999988... < 0.7
    >>> tau_mask(v, 0.7).tolist(), (v >= 0.7).tolist()
    ([False], [True])
    """
    return np.asarray(v, dtype=np.float64) >= np.float64(tau)


def export_run(run_dir: str | Path, out_dir: str | Path | None = None, *, tau: float | str = "best",
               grid: tuple[int, int] | None = None, margin: int = 0, models: list[str] | None = None) -> list[Path]:
    """Write masks, boxes and per-case metric CSVs of an evaluated run (see the module docstring); returns the files.

    ``tau``: ``"best"`` (each class's best τ from the run's tables) or a number in [0, 1].
    ``grid``: the run's evaluation grid (default: recovered from the tables, as the report does).
    ``margin``: tolerance of the per-case pointing CSV (:func:`~xbench.metrics.pointing_game_tolerance`).
    """
    from ..evaluation.evaluate import load_tables
    from ..core.files import contained_folder
    from ..store.results import ResultStore

    run_dir = Path(run_dir)
    default_out = out_dir is None
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "exports"
    t = load_tables(run_dir)
    pairs, tidy = t["pairs"], t["metrics"]
    if pairs.empty:
        raise XBenchError(f"{run_dir}: no positive pairs to export")
    grid = tuple(grid) if grid is not None else run_grid(pairs)
    if tau != "best" and not (isinstance(tau, (int, float)) and 0.0 <= float(tau) <= 1.0):
        raise XBenchError(f"tau must be 'best' or a number in [0, 1]; got {tau!r}")
    best = tidy[tidy["metric"] == "best_tau"].set_index(["dataset", "model", "finding"])["value"]
    store = ResultStore(run_dir)
    written: list[Path] = []
    for (ds, model), mp in pairs.groupby(["dataset", "model"], sort=False):
        if models is None or model in models:
            taus = {f: float(best.get((ds, model, f), np.nan)) if tau == "best" else float(tau)
                    for f in dict.fromkeys(mp["finding"])}
            preds = store.read(ds, model)
            contained(out_dir, ds, model, kind="dataset/model")  # safe names
            # real folders inside the run folder (default) or --out: no link among them (checked before each batch)
            folder = (contained_folder(run_dir, "exports", ds, model) if default_out
                      else contained_folder(out_dir, ds, model))
            written += _export_pair(ds, model, preds, mp, folder, taus, grid, margin,
                                    "best" if tau == "best" else "fixed")
    return written


class _PairExport:
    """What one (dataset, model) export collects, finding by finding: masks, box rows and per-case values."""

    def __init__(self) -> None:
        self.masks: dict[str, np.ndarray] = {}
        self.box_rows: list[dict[str, Any]] = []
        self.per_case: dict[str, dict[tuple[str, str], float]] = {k: {} for k in ("pointing", "dice", "iou", "dice_boxes")}


def _export_pair(ds: str, model: str, preds: Any, mp: pd.DataFrame, folder: Path, taus: dict[str, float], grid: tuple[int, int],
                 margin: int, tau_rule: str) -> list[Path]:
    """One (dataset, model): its positive pairs ``mp`` exported at ``taus`` (per finding) into ``folder``."""
    data = open_run_dataset(preds.meta)
    row_of = {c: i for i, c in enumerate(data.cases["case_id"].astype(str))}
    at = {c: i for i, c in enumerate(preds.case_ids.tolist())}
    got = _PairExport()
    for finding, fp in mp.groupby("finding", sort=False):
        ids = [i for i in fp["case_id"].astype(str) if i in at]
        _export_finding(got, preds, data, finding, ids, [at[i] for i in ids], [row_of[i] for i in ids],
                        taus[finding], grid, margin)
    return _write_pair(got, folder, data.findings, list(taus), sorted({i for d in got.per_case.values() for i, _ in d},
                                                                      key=lambda i: row_of[i]),
                       {"dataset": ds, "model": model, "grid": list(grid),
                        "tau": taus, "tau_rule": tau_rule, "pointing_margin_px": margin,
                        "mask_rule": "normalised map >= tau at the evaluation grid",
                        "boxes": "8-connected components of the mask, original pixels, max exclusive; "
                                 "score = max saliency"}, margin)


def _export_finding(got: _PairExport, preds: Any, data: Any, finding: str, ids: list[str], idx: list[int],
                    rows: list[int], tau_f: float, grid: tuple[int, int], margin: int) -> None:
    """One finding's cases (store positions ``idx``, dataset rows ``rows``): masks at τ, their boxes, per-case
    pointing, Dice, IoU and boxes' Dice."""
    from ..metrics import pointing_game_tolerance

    c = data.findings.index(finding)
    up, v = maps_at_grid(preds.maps[idx, c], preds.windows[idx], preds.sizes[idx], grid)
    gts = np.stack([data[r].mask(finding, grid) for r in rows])
    pred_masks = tau_mask(v, tau_f) if np.isfinite(tau_f) else np.zeros_like(gts)
    box_masks = np.zeros_like(gts)
    for k, (case_id, r) in enumerate(zip(ids, rows)):
        size = tuple(int(s) for s in data[r].size)
        got.masks[f"{case_id}|{finding}"] = pred_masks[k]
        for b in mask_boxes(pred_masks[k], np.nan_to_num(v[k], nan=0.0), size=size):
            got.box_rows.append({"img_id": case_id, "task": finding, **b, "image_height": size[0],
                                 "image_width": size[1]})
            box_masks[(k, *_cells(b, size, grid))] = True
    hits = pointing_game_tolerance(up, gts, margin)
    for name, values in (("pointing", hits), ("dice", _overlap(pred_masks, gts, "dice")),
                         ("iou", _overlap(pred_masks, gts, "iou")), ("dice_boxes", _overlap(box_masks, gts, "dice"))):
        got.per_case[name].update({(i, finding): float(x) for i, x in zip(ids, values)})


def _write_pair(got: _PairExport, folder: Path, findings: list[str], tasks: list[str], cxrs: list[str],
                about: dict[str, Any], margin: int) -> list[Path]:
    """The files of one (dataset, model) export (module docstring), in the order they are listed."""
    from ..metrics import pointing_metric_name

    atomic_write(folder / "masks.npz", lambda tmp, m=got.masks: np.savez_compressed(tmp, **m))
    boxes = pd.DataFrame(got.box_rows, columns=["img_id", "task", "x_min", "y_min", "x_max", "y_max", "score",
                                                "area_cells", "image_height", "image_width"])
    write_frame(boxes, folder / "boxes.csv")
    atomic_write_text(folder / "boxes_coco.json", json.dumps(_coco(boxes, findings), indent=1))
    written = [folder / "masks.npz", folder / "boxes.csv", folder / "boxes_coco.json"]
    for name, values in got.per_case.items():
        label = pointing_metric_name(margin) if name == "pointing" else name
        table = pd.DataFrame({task: [values.get((i, task), np.nan) for i in cxrs] for task in tasks})
        table.insert(0, "img_id", cxrs)
        path = folder / f"{label}_results_per_cxr.csv"
        write_frame(table, path)
        written.append(path)
    atomic_write_text(folder / "export.json", json.dumps(about, indent=1))
    return written + [folder / "export.json"]


def pointing_tolerance_table(run_dir: str | Path, margins: list[int] | tuple[int, ...], *, grid: tuple[int, int] | None = None,
                             ties: str = "first", n_boot: int = 1000, seed: int = 0,
                             pairs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Tidy rows of the tolerance pointing game of an evaluated run: metric ``pointing@{m}px`` per margin ``m > 0``.

    Per (dataset, model): class values, the mean over classes and the pooled value, with 95 %
    bootstrap CIs from :func:`~xbench.metrics.score_table` (resampling the cases of the positive
    pairs; the run's own CIs also resample label-only cases, so these are not paired with them).
    ``ties`` must be the run's ``pointing_ties``: the margin-0 hits are recomputed and must equal
    the run's ``pointing`` column, else an error says so. ``pairs``: the run's per-pair table when it is not read
    from ``run_dir``'s tables (an evaluation that has not written them yet).
    """
    from ..evaluation.evaluate import load_tables
    from ..metrics import POINTING, THRESHOLDS, pointing_game_tolerance, pointing_metric_name, score_table
    from ..store.results import ResultStore

    pairs = load_tables(run_dir)["pairs"] if pairs is None else pairs
    grid = tuple(grid) if grid is not None else run_grid(pairs)
    margins = [int(m) for m in margins if int(m) != 0]
    store, rows = ResultStore(run_dir), []
    for (ds, model), mp in pairs.groupby(["dataset", "model"], sort=False):
        preds = store.read(ds, model)
        data = open_run_dataset(preds.meta)
        row_of = {c: i for i, c in enumerate(data.cases["case_id"].astype(str))}
        at = {c: i for i, c in enumerate(preds.case_ids.tolist())}
        frames: dict[int, list[pd.DataFrame]] = {m: [] for m in margins}
        for finding, fp in mp.groupby("finding", sort=False):
            c = data.findings.index(finding)
            ids = fp["case_id"].astype(str).tolist()
            idx = [at[i] for i in ids]
            up, _ = maps_at_grid(preds.maps[idx, c], preds.windows[idx], preds.sizes[idx], grid)
            gts = np.stack([data[row_of[i]].mask(finding, grid) for i in ids])
            if not np.array_equal(pointing_game_tolerance(up, gts, 0, ties=ties), fp["pointing"].to_numpy(), equal_nan=True):
                raise XBenchError(f"{ds} × {model} × {finding}: margin-0 hits differ from the run's pointing column; "
                                  f"pass the run's pointing_ties (got ties={ties!r}) and grid")
            zeros = [np.zeros(len(THRESHOLDS))] * len(ids)
            for m in margins:
                frames[m].append(pd.DataFrame({"case_id": ids, "finding": finding,
                                               "pointing": pointing_game_tolerance(up, gts, m, ties=ties),
                                               "dice_fixed": np.nan, "iou_fixed": np.nan, "dice_curve": zeros,
                                               "iou_curve": zeros}))
        for m, parts in frames.items():
            tidy = score_table(pd.concat(parts, ignore_index=True), model=model, dataset=ds, n_boot=n_boot, seed=seed)
            tidy = tidy[tidy["metric"] == POINTING].copy()
            tidy["metric"] = pointing_metric_name(m)
            rows.append(tidy)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _cells(box: dict[str, float], size: tuple[int, int], grid: tuple[int, int]) -> tuple[slice, slice]:
    """Grid cells of a box made by :func:`mask_boxes` (exact inverse of its scaling)."""
    sy, sx = size[0] / grid[0], size[1] / grid[1]
    return (slice(int(round(box["y_min"] / sy)), int(round(box["y_max"] / sy))),
            slice(int(round(box["x_min"] / sx)), int(round(box["x_max"] / sx))))


def _overlap(pred: np.ndarray, gt: np.ndarray, kind: str) -> np.ndarray:
    inter = (pred & gt).reshape(len(gt), -1).sum(axis=1).astype(np.float64)
    p, g = pred.reshape(len(gt), -1).sum(axis=1), gt.reshape(len(gt), -1).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 2 * inter / (p + g) if kind == "dice" else inter / (p + g - inter)
    out[g == 0] = np.nan
    return out


def _coco(boxes: pd.DataFrame, findings: list[str]) -> dict[str, Any]:
    images = boxes.drop_duplicates("img_id")
    image_id = {c: k + 1 for k, c in enumerate(images["img_id"])}
    return {
        "images": [{"id": image_id[r.img_id], "file_name": str(r.img_id), "height": int(r.image_height),
                    "width": int(r.image_width)} for r in images.itertuples()],
        "categories": [{"id": k + 1, "name": f} for k, f in enumerate(findings)],
        "annotations": [{"id": k + 1, "image_id": image_id[r.img_id], "category_id": findings.index(r.task) + 1,
                         "bbox": [r.x_min, r.y_min, r.x_max - r.x_min, r.y_max - r.y_min],
                         "area": (r.x_max - r.x_min) * (r.y_max - r.y_min), "score": r.score, "iscrowd": 0}
                        for k, r in enumerate(boxes.itertuples())],
    }
