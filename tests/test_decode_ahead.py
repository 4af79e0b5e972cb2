"""A fresh dataset's inputs are decoded while its networks are built (input twins, issue 22): the decoding thread is
running during the real builds, the store is the same bytes as without twins, a twin whose preprocessing differs is
caught (decoded again, logged), and a resumed dataset builds first as before."""
from __future__ import annotations

import json
import logging
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_run
from xbench.core.errors import XBenchWarning
from xbench.inference import runner
from xbench.models.base import input_twin
from xbench.spec.config import RunConfig
from xbench.store.results import ResultStore
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")

# two trained reference networks (twins: their _random hook on the meta device), a prior that reads pixels (no twin:
# built first) and one that reads none
MODELS = ["ref_xattn", "ref_patchsim", "random_prior", "center_prior"]
TWINNED = {"ref_xattn", "ref_patchsim"}


def infer(out: Path) -> dict[str, dict]:
    cfg = RunConfig.from_dict(tiny_run(out, cases=12, models=MODELS, grid=[32, 32], num_workers=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False, evaluate=False)
    return {e["model"]: e for e in json.loads((out / "run_log.json").read_text())}


def chunk_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "store").rglob("chunk-*.npz"))}


@pytest.fixture(scope="module")
def without_twins(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("no-twins")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "input_twin", lambda *a, **k: None)
        log = infer(out)
    assert not any(e["built_while_decoding"] for e in log.values())
    return out


def test_an_input_twin_has_the_real_preprocessing_and_no_network_memory():
    import xbench

    twin, real = input_twin("ref_xattn"), xbench.create_model("ref_xattn")
    modules = [m for m in vars(twin).values() if isinstance(m, torch.nn.Module)]
    assert modules and {p.device.type for m in modules for p in m.parameters()} == {"meta"}
    image = np.random.default_rng(0).random((37, 53), dtype=np.float32)
    assert torch.equal(twin.preprocess(image), real.preprocess(image))
    assert twin.input_window((37, 53)) == real.input_window((37, 53))
    assert twin.weights_label == "input-twin" and real.weights_label == "xbench-reference"
    assert input_twin("center_prior") is None  # no _random hook: built for real, first


def test_networks_are_built_while_the_inputs_decode_and_the_store_is_unchanged(tmp_path, monkeypatch, without_twins):
    decoding_during_build: dict[str, bool] = {}
    real_open = runner.open_model

    def open_model(spec, *args, **kwargs):
        decoding_during_build[spec.name] = any(t.name == "xbench-decode" and t.is_alive() for t in threading.enumerate())
        return real_open(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "open_model", open_model)
    log = infer(tmp_path / "run")
    assert decoding_during_build == {m: m in TWINNED for m in MODELS}
    assert {m: e["built_while_decoding"] for m, e in log.items()} == {m: m in TWINNED for m in MODELS}
    got, want = chunk_bytes(tmp_path / "run"), chunk_bytes(without_twins)
    assert len(got) == 4 * 2 and got == want  # 12 cases in chunks of 8: 2 chunks per model, the same bytes


def test_a_twin_whose_preprocessing_differs_is_decoded_again(tmp_path, monkeypatch, caplog, without_twins):
    def wrong_twin(name, *args, **kwargs):
        twin = input_twin(name, *args, **kwargs)
        if twin is not None:
            twin.input_size = 48  # not the model's: what it decodes must not reach the model
        return twin

    monkeypatch.setattr(runner, "input_twin", wrong_twin)
    with caplog.at_level(logging.WARNING, logger="xbench.inference.runner"):
        infer(tmp_path / "run")
    assert "do not match the built model's preprocessing; decoding again" in caplog.text
    assert "ref_xattn" in caplog.text and "ref_patchsim" in caplog.text
    assert chunk_bytes(tmp_path / "run") == chunk_bytes(without_twins)


def test_a_resumed_dataset_builds_its_models_first(tmp_path, without_twins):
    out = tmp_path / "run"
    infer(out)
    lost = ResultStore(out).chunk_path("phantom", "ref_xattn", 1)
    lost.unlink()
    log = infer(out)
    assert not any(e["built_while_decoding"] for e in log.values())
    assert log["ref_xattn"]["chunks_written"] == 1 and log["ref_patchsim"]["chunks_written"] == 0
    assert chunk_bytes(out) == chunk_bytes(without_twins)
