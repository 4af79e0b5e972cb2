"""RunConfig: YAML parsing, defaults, overrides, and validation errors that name the file and the field."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from xbench.spec.config import DatasetSpec, ModelSpec, RunConfig
from xbench.core.errors import FormatError, MissingFileError

MINIMAL = {"output_dir": "out", "datasets": ["phantom"], "models": ["center_prior"]}


def write(tmp_path: Path, raw: dict | str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return path


def test_full_yaml_parses_every_field(tmp_path):
    path = write(tmp_path, """
output_dir: results/x
datasets:
  - {name: phantom, split: test, cases: 24, root: /data/p}
  - nih_bbox
models:
  - {name: clip, weights: /w/clip, params: {seed: 3}}
  - {name: anatomical_prior, fit_split: prior}
  - center_prior
grid: [64, 96]
fixed_threshold: 0.3
pointing_ties: any
batch_size: 4
num_workers: 2
precision: bf16
device: auto
chunk_size: 8
on_missing_image: skip
bootstrap: {replicates: 20, seed: 7}
""")
    cfg = RunConfig.from_yaml(path)
    assert cfg.output_dir == "results/x"
    # unknown dataset keys go into options (passed to load_dataset); known ones stay fields
    assert cfg.datasets == [DatasetSpec("phantom", root="/data/p", split="test", options={"cases": 24}),
                            DatasetSpec("nih_bbox")]
    assert cfg.models == [ModelSpec("clip", weights="/w/clip", params={"seed": 3}),
                          ModelSpec("anatomical_prior", fit_split="prior"), ModelSpec("center_prior")]
    assert cfg.grid == (64, 96) and isinstance(cfg.grid, tuple)
    assert (cfg.fixed_threshold, cfg.pointing_ties, cfg.batch_size, cfg.num_workers) == (0.3, "any", 4, 2)
    assert (cfg.precision, cfg.device, cfg.chunk_size, cfg.on_missing_image) == ("bf16", "auto", 8, "skip")
    assert (cfg.bootstrap_replicates, cfg.bootstrap_seed) == (20, 7)
    assert cfg.source == str(path)


def test_defaults_of_a_minimal_config():
    cfg = RunConfig.from_dict(dict(MINIMAL))
    assert cfg.grid == (224, 224)
    assert cfg.fixed_threshold == 0.5 and cfg.pointing_ties == "first"
    assert (cfg.batch_size, cfg.num_workers, cfg.precision, cfg.device) == (32, 0, "fp32", "cpu")
    assert (cfg.chunk_size, cfg.on_missing_image) == (256, "raise")
    assert (cfg.bootstrap_replicates, cfg.bootstrap_seed) == (1000, 0)
    assert cfg.datasets[0] == DatasetSpec("phantom", None, None, {})
    assert cfg.models[0] == ModelSpec("center_prior", None, {}, None)
    assert cfg.source is None


def test_null_bootstrap_means_defaults():
    cfg = RunConfig.from_dict({**MINIMAL, "bootstrap": None})
    assert (cfg.bootstrap_replicates, cfg.bootstrap_seed) == (1000, 0)


def test_overrides_replace_yaml_values_and_none_is_ignored(tmp_path):
    path = write(tmp_path, {**MINIMAL, "device": "cpu"})
    cfg = RunConfig.from_yaml(path, output_dir="elsewhere", device=None)
    assert cfg.output_dir == "elsewhere" and cfg.device == "cpu"


def test_to_dict_round_trips_the_fields():
    cfg = RunConfig.from_dict({**MINIMAL, "datasets": [{"name": "phantom", "cases": 5}]})
    d = cfg.to_dict()
    assert d["datasets"] == [{"name": "phantom", "root": None, "split": None, "options": {"cases": 5}}]
    assert d["models"][0]["name"] == "center_prior" and d["grid"] == (224, 224)


def test_resolved_device(monkeypatch):
    assert RunConfig.from_dict(dict(MINIMAL)).resolved_device() == torch.device("cpu")
    auto = RunConfig.from_dict({**MINIMAL, "device": "auto"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto.resolved_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert auto.resolved_device() == torch.device("cuda")


# -- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["output_dir", "datasets", "models"])
def test_missing_required_key_names_file_and_field(tmp_path, key):
    raw = {k: v for k, v in MINIMAL.items() if k != key}
    path = write(tmp_path, raw)
    with pytest.raises(FormatError) as err:
        RunConfig.from_yaml(path)
    assert err.value.field == key
    assert str(path) in str(err.value) and repr(key) in str(err.value) and "missing" in str(err.value)


def test_unknown_top_level_key_names_file_and_key(tmp_path):
    path = write(tmp_path, {**MINIMAL, "gird": [224, 224]})
    with pytest.raises(FormatError, match="unknown key") as err:
        RunConfig.from_yaml(path)
    assert str(path) in str(err.value) and "'gird'" in str(err.value)


@pytest.mark.parametrize("key, value", [
    ("pointing_ties", "all"),
    ("precision", "fp8"),
    ("on_missing_image", "ignore"),
    ("fixed_threshold", 1.5),
    ("grid", [224]),
    ("grid", [0, 224]),
    ("batch_size", 0),
])
def test_invalid_value_names_file_field_and_value(tmp_path, key, value):
    path = write(tmp_path, {**MINIMAL, key: value})
    with pytest.raises(FormatError) as err:
        RunConfig.from_yaml(path)
    assert err.value.field == key
    assert str(path) in str(err.value) and repr(key) in str(err.value)


def test_bad_chunk_size_is_reported_under_batch_size_field():
    with pytest.raises(FormatError, match="chunk_size") as err:
        RunConfig.from_dict({**MINIMAL, "chunk_size": 0}, source="cfg.yaml")
    assert "cfg.yaml" in str(err.value)


def test_bad_pointing_ties_message_shows_the_value(tmp_path):
    path = write(tmp_path, {**MINIMAL, "pointing_ties": "all"})
    with pytest.raises(FormatError, match=r"must be 'first' or 'any', got 'all'"):
        RunConfig.from_yaml(path)


def test_unknown_model_key_is_an_error(tmp_path):
    path = write(tmp_path, {**MINIMAL, "models": [{"name": "clip", "weight": "/w"}]})
    with pytest.raises(FormatError, match=r"unknown model key\(s\) 'weight' \(did you mean 'weights'\?\)") as err:
        RunConfig.from_yaml(path)
    assert err.value.field == "models[0]" and str(path) in str(err.value)


@pytest.mark.parametrize("key", ["datasets", "models"])
def test_entry_without_name_is_an_error(tmp_path, key):
    path = write(tmp_path, {**MINIMAL, key: [{"split": "test"}]})
    with pytest.raises(FormatError, match="needs a 'name'") as err:
        RunConfig.from_yaml(path)
    assert err.value.field == key and str(path) in str(err.value)


def test_unknown_bootstrap_key_is_an_error(tmp_path):
    path = write(tmp_path, {**MINIMAL, "bootstrap": {"replicate": 20}})
    with pytest.raises(FormatError, match="replicate") as err:
        RunConfig.from_yaml(path)
    assert err.value.field == "bootstrap" and str(path) in str(err.value)


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "output_dir: out\ndatasets: [phantom\nmodels: [x]\n")
    with pytest.raises(FormatError) as err:
        RunConfig.from_yaml(path)
    assert err.value.line is not None and str(path) in str(err.value)


def test_missing_config_file_is_a_missing_file_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(MissingFileError) as err:
        RunConfig.from_yaml(path)
    assert str(path) in str(err.value)


def test_validate_uses_placeholder_without_source():
    cfg = RunConfig.from_dict(dict(MINIMAL))
    cfg.pointing_ties = "middle"
    with pytest.raises(FormatError, match="<config>"):
        cfg.validate()
