"""The models beyond the paper's seven (BioViL, MedCLIP) in every part of XBench: registry listing, the ``beyond`` run config,
the phantom run, an explainer on the YAML's layer, the tables (after the paper's seven, set apart) and the GPU
benchmark's CPU version from stand-in weight files. Full-size networks with seeded random weights: plumbing, not
grounding quality (parity with the official code: test_parity_biovil.py, test_parity_medclip.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from random_init_run import run_random_init

import xbench
from xbench.explain import explained
from xbench.spec.config import RunConfig
from xbench.models.weights_check import check_weights
from xbench.spec.listing import model_rows
from xbench.spec.registry import list_models, model_config

BEYOND = {"biovil": "https://github.com/microsoft/hi-ml", "medclip": "https://github.com/RyanWangZf/MedCLIP"}  # -> publisher
PAPER_SEVEN = ["clip", "biomedclip", "medklip", "kad", "mavl", "carzero", "devide"]
RUNS = Path(__file__).resolve().parents[2] / "xbench" / "configs" / "runs"


def test_listed_with_their_publisher_and_outside_the_paper():
    rows = {r["name"]: r for r in model_rows()}
    for name, publisher in BEYOND.items():
        assert name in list_models()
        assert rows[name]["publisher"] == publisher and rows[name]["kind"] == "VLM"
        assert rows[name]["paper_group"] == "-" and model_config(name).get("paper") is None
        for entry in model_config(name)["weights"].values():  # every file names where it is published
            assert entry["source"].startswith("https://")


def test_beyond_config_runs_the_paper_seven_and_the_models_beyond():
    paper, beyond = (RunConfig.from_yaml(RUNS / f"{n}.yaml") for n in ("paper", "beyond"))
    assert [(d.name, d.split) for d in beyond.datasets] == [(d.name, d.split) for d in paper.datasets]
    vlms = [m.name for m in beyond.models if model_config(m.name)["map_source"] != "prior"]
    assert vlms[:7] == PAPER_SEVEN and set(BEYOND) <= set(vlms[7:])
    assert not set(BEYOND) & {m.name for m in paper.models}  # the paper config stays the paper's
    assert not beyond.allow_random_init and beyond.output_dir != paper.output_dir


def test_tables_put_them_after_the_paper_models():
    from xbench.outputs.tables import _row_order

    order, first_other = _row_order(["biovil", "kad", "center_prior", "clip"], baselines=["center_prior"])
    assert order == ["clip", "kad", "biovil", "center_prior"] and first_other == "biovil"


@pytest.mark.usefixtures("phantom_cache")
def test_phantom_run_and_gradcam(tmp_path):
    log, pointing = run_random_init(tmp_path, list(BEYOND), cases=2)
    assert {m: log[m]["cases_inferred"] for m in BEYOND} == {m: 2 for m in BEYOND}
    assert {log[m]["weights_label"] for m in BEYOND} == {"random-init"}
    assert set(pointing.index) == set(BEYOND) and pointing.between(0, 1).all()

    for name in BEYOND:  # Grad-CAM on the YAML's explain_layer, at the model's native grid
        adapter = xbench.create_model(name, random_init=True)
        pixels = adapter.preprocess(np.random.default_rng(0).random((300, 260), dtype=np.float32))[None]
        scores = adapter.predict(pixels, ["cardiomegaly", "pleural effusion"]).scores
        out = explained(adapter, "gradcam").predict(pixels, ["cardiomegaly", "pleural effusion"])
        assert tuple(out.maps.shape) == (1, 2, *adapter.grid)
        assert torch.isfinite(out.maps).all() and out.maps.abs().sum() > 0
        torch.testing.assert_close(out.scores, scores)  # the explainer keeps the model's scores


def test_standin_folders_pass_weights_check(tmp_path, monkeypatch):
    """`xbench weights check` knows their layouts: the stand-in folders the GPU benchmark writes (official layout) read
    file by file, then build strictly. (The benchmark's CPU run of every model beyond the paper is in
    tests/benchmarks/test_bench_gpu.py.)"""
    spec = importlib.util.spec_from_file_location("standin_weights", Path(__file__).resolve().parents[2] / "benchmarks"
                                                  / "standin_weights.py")
    standin = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "standin_weights", standin)
    spec.loader.exec_module(standin)
    folders = standin.write_weight_folders(list(BEYOND), tmp_path / "weights")
    assert sorted(folders) == sorted(BEYOND)
    for name in BEYOND:
        report = check_weights(name, folders[name])
        assert report.ok and report.build[0] == "ok", report.format()
        assert {status for status, _, _ in report.lines} == {"ok"} and len(report.lines) == len(model_config(name)["weights"])
