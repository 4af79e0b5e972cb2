"""docs/extending.md's worked example runs: its YAML and module, extracted from the doc, make a model that
``create_model`` builds (random init and from a weights file) and that follows the adapter contract."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from xbench.spec import registry
from xbench.core.errors import MissingFileError
from xbench.models import create_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture
def example(tmp_path, monkeypatch):
    (yaml_text,), module_text = _blocks("yaml"), _blocks("python")[0]  # the model's module; later: the metric example
    configs, code = tmp_path / "configs", tmp_path / "code"
    configs.mkdir()
    code.mkdir()
    (configs / "brightness.yaml").write_text(yaml_text)
    (code / "brightness.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", list(registry.MODEL_CONFIG_DIRS))
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    registry.add_config_path(configs)
    return tmp_path


def test_doc_example_model_builds_and_follows_the_contract(example):
    assert "brightness" in registry.list_models()
    model = create_model("brightness", random_init=True)
    assert model.weights_label == "random-init" and model.name == "brightness"
    assert (model.input_size, model.grid, model.map_source) == (64, (8, 8), "similarity")
    image = np.linspace(0, 1, 300 * 200, dtype=np.float32).reshape(300, 200)
    pixels = torch.stack([model.preprocess(image), model.preprocess(1 - image)])
    assert pixels.shape == (2, 3, 64, 64)
    pred = model.predict(pixels, ["a", "b", "c"])
    assert pred.scores.shape == (2, 3) and pred.maps.shape == (2, 3, 8, 8)
    assert ((pred.scores > 0) & (pred.scores < 1)).all()

    with pytest.raises(MissingFileError, match="brightness.safetensors"):
        create_model("brightness")
    weights = example / "weights"
    weights.mkdir()
    save_file({"weight": torch.tensor([2.0])}, str(weights / "brightness.safetensors"))
    loaded = create_model("brightness", weights=weights)
    assert loaded.weights_label == "official"
    expected = torch.sigmoid(2.0 * pixels.mean(dim=(1, 2, 3)))
    torch.testing.assert_close(loaded.predict(pixels, ["a"]).scores[:, 0], expected)

    # the in-memory constructor: a loaded checkpoint object; the partial config gets its facts from the YAML
    direct = type(loaded).from_checkpoint({"weight": torch.tensor([2.0])})
    assert (direct.name, direct.input_size, direct.grid) == ("brightness", 64, (8, 8))
    torch.testing.assert_close(direct.predict(pixels, ["a"]).scores[:, 0], expected)
