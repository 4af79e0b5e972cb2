"""Models beyond the paper's seven (CheXzero, GLoRIA): registry, run configs, phantom run, explainers, stand-in
weights, ``xbench weights check`` and the tables that set them apart. Their parity with the official code is in
``tests/models/test_parity_<name>.py``."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from random_init_run import run_random_init
from xbench.cli import main
from xbench.explain import explained
from xbench.explain.base import module_at
from xbench.models import create_model
from xbench.outputs.tables import paper_table1
from xbench.paper import MODELS as PAPER_MODELS
from xbench.paper import synthetic_results
from xbench.spec.config import RunConfig
from xbench.spec.listing import model_rows
from xbench.spec.registry import model_config

REPO = Path(__file__).resolve().parents[2]
BEYOND = {"chexzero": "https://github.com/rajpurkarlab/CheXzero", "gloria": "https://github.com/marshuang80/gloria"}
PROMPTS = ["pneumothorax", "pleural effusion"]


def _standin():
    spec = importlib.util.spec_from_file_location("standin_weights", REPO / "benchmarks" / "standin_weights.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registered_beyond_the_paper_with_their_publishers():
    rows = {r["name"]: r for r in model_rows()}
    for name, code in BEYOND.items():
        assert "paper" not in model_config(name) and name not in PAPER_MODELS
        assert rows[name]["publisher"] == code and rows[name]["kind"] == "VLM" and rows[name]["paper_group"] == "-"


def test_beyond_config_runs_the_papers_models_plus_these():
    runs = REPO / "xbench" / "configs" / "runs"
    paper, beyond = RunConfig.from_yaml(runs / "paper.yaml"), RunConfig.from_yaml(runs / "beyond.yaml")
    paper_models = [m.name for m in paper.models]
    assert [m.name for m in beyond.models if m.name in paper_models] == paper_models
    assert set(BEYOND) <= {m.name for m in beyond.models} - set(paper_models)  # with BioViL and MedCLIP
    assert [d.name for d in beyond.datasets] == [d.name for d in paper.datasets]
    assert not set(BEYOND) & set(paper_models)  # the paper config stays the paper's


def test_tables_set_them_apart_from_the_papers_models():
    models = ["clip", *BEYOND, "carzero"]
    table = paper_table1(synthetic_results(models, ["rsna_pneumonia"]))
    rows = list(table.values.index)
    assert rows[:2] == ["CLIP", "CARZero"] and set(rows[2:]) == set(BEYOND)
    assert table.separator == rows[2]


@pytest.mark.usefixtures("phantom_cache")
def test_phantom_run_with_each_adapter(tmp_path):
    log, pointing = run_random_init(tmp_path, list(BEYOND), cases=3)
    assert {m: (log[m]["cases_inferred"], log[m]["weights_label"]) for m in BEYOND} == {
        m: (3, "random-init") for m in BEYOND}
    assert set(pointing.index) == set(BEYOND) and pointing.between(0, 1).all()


@pytest.mark.parametrize("name", list(BEYOND))
def test_explainers_on_the_named_layers(name):
    torch.set_num_threads(2)
    adapter = create_model(name, random_init=True)
    px = torch.stack([adapter.preprocess(torch.rand(300, 260).numpy()) for _ in range(2)])
    calls = []
    module_at(adapter, model_config(name)["explain_layer"]).register_forward_hook(lambda *_: calls.append(1))
    maps = explained(adapter, "gradcam").predict(px, PROMPTS).maps
    assert calls  # the YAML's layer is the one hooked
    assert tuple(maps.shape) == (2, 2, *adapter.grid) and torch.isfinite(maps).all() and maps.abs().sum() > 0
    assert not torch.equal(maps[:, 0], maps[:, 1])
    if model_config(name).get("explain_attention"):  # CheXzero's ViT: gradient-weighted attention too
        maps = explained(adapter, "attngrad").predict(px, PROMPTS).maps
        assert tuple(maps.shape) == (2, 2, *adapter.grid) and torch.isfinite(maps).all() and maps.abs().sum() > 0


@pytest.mark.parametrize("name", list(BEYOND))
def test_standin_folder_passes_weights_check_and_loads_the_same_network(name, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    torch.set_num_threads(2)
    standin = _standin()
    folder = standin.write_weight_folders([name], tmp_path, seed=3)[name]
    assert main(["weights", "check", name, str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK: the folder is complete and loads strictly"), out
    loaded = create_model(name, weights=folder)
    reference = standin.random_init_adapter(name, 3)
    assert loaded.weights_label == "official"
    want = reference.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.model.state_dict().items())
