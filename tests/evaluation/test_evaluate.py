"""Metric tables from the store: tidy layout, values recomputed independently from stored maps and masks,
pairs / curves / models tables, evaluation log, and evaluation from the store alone (no inference)."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import zstandard
from sklearn.metrics import roc_auc_score

import xbench
from conftest import tiny_run
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError, XBenchWarning
from xbench.evaluation.evaluate import evaluate_run, load_tables
from xbench.metrics import DATASET_LEVEL, POOLED, TIDY_COLUMNS
from xbench.models.priors import CenterPrior, RandomPrior

CASES, GRID = 22, (64, 64)
MODELS = ["center_prior", "random_prior", "anatomical_prior"]


def config(output_dir: Path) -> RunConfig:
    return RunConfig.from_dict(tiny_run(output_dir, cases=CASES))


pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def done(phantom_run) -> dict:
    """The session's phantom run (conftest), read only: tests that evaluate again copy it."""
    data = xbench.load_dataset("phantom", split="test", cases=CASES)
    return {"out": phantom_run, "tables": load_tables(phantom_run), "data": data}


def stored(out: Path, model: str) -> dict[str, np.ndarray]:
    """Chunks read with plain NumPy and zstandard (the maps' float16 byte planes, one zstd frame each, joined by hand),
    concatenated in chunk order."""
    files = sorted((out / "store" / "phantom" / model).glob("chunk-*.npz"))
    parts = []
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            part = {k: z[k] for k in z.files}
        planes = [np.frombuffer(zstandard.ZstdDecompressor().decompress(part.pop(f"maps_z{k}").tobytes()), np.uint8)
                  for k in range(2)]
        part["maps"] = np.stack(planes, axis=-1).view("<f2").reshape(part["maps_shape"])
        parts.append(part)
    return {k: np.concatenate([p[k] for p in parts]) for k in ("case_ids", "probs", "maps")}


def by_hand(out: Path, data, model: str) -> dict[str, dict[str, list[float]]]:
    """Per finding: pointing (first argmax of the bilinear upsampled map) and Dice at τ=0.5 of each positive pair."""
    st = stored(out, model)
    row_of = {c: i for i, c in enumerate(st["case_ids"].tolist())}
    labels = data.labels()
    res: dict[str, dict[str, list[float]]] = {}
    for c, finding in enumerate(data.findings):
        for r in np.flatnonzero(labels[:, c] == 1):
            mask = data[int(r)].mask(finding, GRID)
            if not mask.any():
                continue
            native = torch.from_numpy(st["maps"][row_of[data.cases["case_id"].iloc[r]], c].astype(np.float32))
            up = F.interpolate(native[None, None], size=GRID, mode="bilinear", align_corners=False)[0, 0].numpy()
            i, j = np.unravel_index(np.argmax(up), up.shape)
            span = up.max() - up.min()
            v = (up - up.min()) / span if span > 0 else np.zeros_like(up)
            pred = v >= 0.5
            dice = 2.0 * (pred & mask).sum() / (pred.sum() + mask.sum())
            entry = res.setdefault(finding, {"pointing": [], "dice": []})
            entry["pointing"].append(float(mask[i, j]))
            entry["dice"].append(float(dice))
    return res


def value(tidy: pd.DataFrame, model: str, finding: str, metric: str) -> pd.Series:
    row = tidy[(tidy["model"] == model) & (tidy["finding"] == finding) & (tidy["metric"] == metric)]
    assert len(row) == 1, (model, finding, metric)
    return row.iloc[0]


def test_tidy_table_layout(done):
    tidy = done["tables"]["metrics"]
    assert list(tidy.columns) == list(TIDY_COLUMNS)
    assert set(tidy["model"]) == set(MODELS) and set(tidy["dataset"]) == {"phantom"}
    assert {DATASET_LEVEL, POOLED} <= set(tidy["finding"])
    assert {"pointing", "dice@0.5", "iou@0.5", "dice@best", "iou@best", "best_tau", "auc", "auprc", "f1",
            "accuracy", "hamming_accuracy"} <= set(tidy["metric"])
    assert not tidy.duplicated(["model", "dataset", "finding", "metric"]).any()
    csv = pd.read_csv(done["out"] / "tables" / "metrics.csv")
    assert len(csv) == len(tidy) and list(csv.columns) == list(TIDY_COLUMNS)


@pytest.mark.parametrize("model", ["center_prior", "random_prior"])
def test_grounding_values_equal_an_independent_computation(done, model):
    tidy, expected = done["tables"]["metrics"], by_hand(done["out"], done["data"], model)
    assert expected, "the phantom split should have positive pairs"
    for finding, got in expected.items():
        row = value(tidy, model, finding, "pointing")
        assert row["value"] == pytest.approx(np.mean(got["pointing"]), abs=1e-12) and row["n_pairs"] == len(got["pointing"])
        assert row["ci_low"] <= row["value"] <= row["ci_high"]
        assert value(tidy, model, finding, "dice@0.5")["value"] == pytest.approx(np.mean(got["dice"]), abs=1e-6)
    class_means = [np.mean(g["pointing"]) for g in expected.values()]
    assert value(tidy, model, DATASET_LEVEL, "pointing")["value"] == pytest.approx(np.mean(class_means))
    pooled = np.concatenate([g["pointing"] for g in expected.values()])
    assert value(tidy, model, POOLED, "pointing")["value"] == pytest.approx(pooled.mean())


def test_auc_equals_sklearn_on_stored_probabilities(done):
    tidy, data = done["tables"]["metrics"], done["data"]
    st = stored(done["out"], "random_prior")
    labels = data.labels()
    for c, finding in enumerate(data.findings):
        if len(set(labels[:, c])) < 2:
            continue
        want = roc_auc_score(labels[:, c], st["probs"][:, c])
        assert value(tidy, "random_prior", finding, "auc")["value"] == pytest.approx(want)


def test_constant_scores_give_auc_one_half(done):
    """The centre prior scores every case 0.5: AUC is 0.5 for every class with both labels."""
    tidy = done["tables"]["metrics"]
    aucs = tidy[(tidy["model"] == "center_prior") & (tidy["metric"] == "auc")
                & tidy["finding"].isin(done["data"].findings)]["value"].dropna()
    assert len(aucs) > 0 and np.allclose(aucs, 0.5)


def test_pairs_table(done):
    pairs, tidy, data = done["tables"]["pairs"], done["tables"]["metrics"], done["data"]
    assert {"model", "dataset", "case_id", "finding", "pointing", "dice@0.5", "iou@0.5", "gt_area", "area_fraction",
            "dice@best"} <= set(pairs.columns)
    assert ((pairs["area_fraction"] > 0) & (pairs["area_fraction"] <= 1)).all()
    np.testing.assert_allclose(pairs["area_fraction"], pairs["gt_area"] / (GRID[0] * GRID[1]))
    expected = by_hand(done["out"], data, "center_prior")
    sub = pairs[pairs["model"] == "center_prior"]
    assert len(sub) == sum(len(g["pointing"]) for g in expected.values())
    assert set(pairs["model"]) == set(MODELS)
    for finding, group in sub.groupby("finding"):  # dice@best of a pair: its Dice at the class's best τ
        assert group["dice@best"].mean() == pytest.approx(value(tidy, "center_prior", finding, "dice@best")["value"])


def test_curves_have_101_thresholds_per_class(done):
    curves, tidy, pairs = done["tables"]["curves"], done["tables"]["metrics"], done["tables"]["pairs"]
    assert {"model", "dataset", "finding", "tau", "mean_dice", "mean_iou", "n_pairs"} <= set(curves.columns)
    for (model, finding), sub in curves.groupby(["model", "finding"]):
        assert len(sub) == 101
        np.testing.assert_allclose(sub["tau"], np.linspace(0, 1, 101), atol=1e-9)
        assert sub["n_pairs"].iloc[0] == ((pairs["model"] == model) & (pairs["finding"] == finding)).sum()
        assert sub.loc[np.isclose(sub["tau"], 0.5), "mean_dice"].item() == \
            pytest.approx(value(tidy, model, finding, "dice@0.5")["value"])
        assert sub["mean_dice"].max() == pytest.approx(value(tidy, model, finding, "dice@best")["value"])
    assert set(curves["model"]) == set(MODELS)


def test_models_table_lists_the_models(done):
    models = done["tables"]["models"]
    assert models["model"].tolist() == MODELS
    assert (models["map_source"] == "prior").all() and (models["weights"] == "none").all()


def test_evaluation_log_counts_the_pairs(done):
    log = json.loads((done["out"] / "tables" / "evaluation_log.json").read_text())
    assert [e["model"] for e in log] == MODELS
    expected = by_hand(done["out"], done["data"], "center_prior")
    for entry in log:
        assert entry["cases"] == CASES and entry["cases_skipped_at_inference"] == 0
        assert {f: p["evaluated"] for f, p in entry["pairs"].items()} == \
            {f: len(g["pointing"]) for f, g in expected.items()}


def test_evaluation_needs_no_inference_and_is_reproducible(done, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(done["out"], out)
    shutil.rmtree(out / "tables")

    def no_inference(*args, **kwargs):
        raise AssertionError("evaluation must not run a model")

    monkeypatch.setattr(CenterPrior, "predict", no_inference)
    monkeypatch.setattr(RandomPrior, "predict", no_inference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        tidy = evaluate_run(config(out), progress=False)
    pd.testing.assert_frame_equal(tidy, done["tables"]["metrics"])
    pd.testing.assert_frame_equal(load_tables(out)["pairs"], done["tables"]["pairs"])


def test_findings_changed_since_inference_is_an_error(done, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(done["out"], out)
    meta_path = out / "store" / "phantom" / "center_prior" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["findings"] = meta["findings"][::-1]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(XBenchError, match="--overwrite"):
        evaluate_run(config(out), progress=False)


def test_load_tables_without_a_run_is_an_error(tmp_path):
    with pytest.raises(XBenchError, match="has no metrics table"):
        load_tables(tmp_path)
