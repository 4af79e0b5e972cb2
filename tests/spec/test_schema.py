"""One schema for the three YAML kinds: run config, model YAML, dataset manifest (xbench.spec.schema)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from xbench.spec import registry, schema
from xbench.cli import main
from xbench.spec.config import RunConfig
from xbench.core.errors import FormatError, XBenchError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def user_dirs(tmp_path, monkeypatch) -> Path:
    """A user folder registered for models and datasets (the package's lists restored afterwards)."""
    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", list(registry.MODEL_CONFIG_DIRS))
    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))
    for kind in ("models", "datasets"):
        (tmp_path / kind).mkdir()
        registry.add_config_path(tmp_path / kind, kind)
    return tmp_path


def shipped(kind: str, name: str) -> dict:
    folder = REPO / ("xbench/configs/models" if kind == "models" else "data_manifests")
    return yaml.safe_load((folder / f"{name}.yaml").read_text())


def test_model_yaml_typo_is_one_error_at_load_time(user_dirs):
    raw = shipped("models", "center_prior")
    raw["map_sorce"] = raw.pop("map_source")
    path = user_dirs / "models" / "typo_prior.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match=r"unknown key\(s\) 'map_sorce' \(did you mean 'map_source'\?\)") as err:
        registry.model_config("typo_prior")
    assert err.value.path == path and err.value.field == "map_sorce"


@pytest.mark.parametrize("change, field, message", [
    ({"grid": [14]}, "grid", "must be a list of 2 values"),
    ({"input_size": 22.5}, "input_size", "must be an integer"),
    ({"score_rule": "probabilty"}, "score_rule", "did you mean 'probability'"),
    ({"weights": {"maps": {"pth": "x.npz"}}}, "weights.maps", "did you mean 'path'"),
])
def test_model_yaml_types_and_values_are_checked(user_dirs, change, field, message):
    (user_dirs / "models" / "bad.yaml").write_text(yaml.safe_dump({**shipped("models", "center_prior"), **change}))
    with pytest.raises(FormatError, match=message) as err:
        registry.model_config("bad")
    assert err.value.field == field


def test_model_yaml_without_grid_is_an_error_not_a_14x14_default(user_dirs):
    raw = shipped("models", "center_prior")
    del raw["grid"]
    (user_dirs / "models" / "nogrid.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match="missing required key") as err:
        registry.model_config("nogrid")
    assert err.value.field == "grid"


def test_manifest_with_unknown_finding_is_an_error_and_check_refuses_it(user_dirs, capsys):
    raw = shipped("datasets", "chestx_det10")
    raw["classes"][1]["finding"] = "efusion"
    path = user_dirs / "datasets" / "invented.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match=r"unknown finding id .* 'efusion' \(did you mean") as err:
        registry.dataset_manifest("invented")
    assert err.value.path == path and err.value.field == "classes[1].finding"
    assert main(["manifest", "check", "invented", "--root", str(user_dirs)]) != 0  # no longer "OK"
    assert "classes[1].finding" in capsys.readouterr().err


def test_manifest_missing_key_is_one_error_at_load_time(user_dirs):
    raw = shipped("datasets", "chestx_det10")
    del raw["license"]
    (user_dirs / "datasets" / "nolicense.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match="missing required key") as err:
        registry.dataset_manifest("nolicense")
    assert err.value.field == "license"
    raw = shipped("datasets", "chestx_det10")
    del raw["classes"][0]["prompt"]
    (user_dirs / "datasets" / "noprompt.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match="missing required key") as err:
        registry.dataset_manifest("noprompt")
    assert err.value.field == "classes[0].prompt"


def test_manifest_unknown_key_and_bad_count_type(user_dirs):
    raw = {**shipped("datasets", "chestx_det10"), "licence": "x"}
    (user_dirs / "datasets" / "typo.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match="did you mean 'license'"):
        registry.dataset_manifest("typo")
    raw = shipped("datasets", "chestx_det10")
    raw["splits"]["test"]["expected"]["cases"] = "542"
    (user_dirs / "datasets" / "strcount.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(FormatError, match="must be an integer") as err:
        registry.dataset_manifest("strcount")
    assert err.value.field == "splits.test.expected.cases"


def test_every_shipped_yaml_loads():
    assert len(registry.list_models()) >= 14 and len(registry.list_datasets()) >= 9
    for name in registry.list_models():
        assert isinstance(registry.check_model_yaml(registry.model_config(name), name), registry.ModelYaml)
    for name in registry.list_datasets():
        typed = registry.check_manifest(registry.dataset_manifest(name), name)
        assert typed.default_split in typed.splits
    for path in sorted((REPO / "xbench" / "configs" / "runs").glob("*.yaml")):
        assert RunConfig.from_yaml(path).datasets


def test_run_config_model_entry_takes_an_explainer():
    cfg = RunConfig.from_dict({"output_dir": "o", "datasets": ["phantom"],
                               "models": [{"name": "center_prior", "explainer": "gradcam"}, "random_prior"]})
    assert [m.explainer for m in cfg.models] == ["gradcam", None]


@dataclass
class Inner:
    n: int


@dataclass
class Outer:
    items: list[Inner]
    size: tuple[int, int] = (1, 1)
    scale: float = 1.0


def test_the_mechanism_on_its_own():
    out = schema.load(Outer, {"items": [{"n": 1}, {"n": 2}], "scale": 2})
    assert out == Outer([Inner(1), Inner(2)], (1, 1), 2.0) and isinstance(out.scale, float)
    with pytest.raises(FormatError, match="must be an integer, got True") as err:
        schema.load(Outer, {"items": [{"n": 1}, {"n": True}]}, "f.yaml")
    assert err.value.field == "items[1].n"
    with pytest.raises(FormatError, match="missing required key") as err:
        schema.load(Outer, {"items": [{}]}, "f.yaml")
    assert err.value.field == "items[0].n"


def test_a_config_is_parsed_once_each_caller_gets_its_own_copy_and_an_edit_is_read(tmp_path, monkeypatch):
    """A run asks for a model's config once per pair: it is parsed and checked once per file version, every call
    returns a copy of its own, and an edited file (new size / mtime) is parsed and checked again."""
    import os

    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", [folder])
    path = folder / "cached_model.yaml"
    path.write_text((registry.PACKAGE_DIR / "configs" / "models" / "center_prior.yaml").read_text())
    parsed = []
    real = registry.read_yaml
    monkeypatch.setattr(registry, "read_yaml", lambda p: parsed.append(p) or real(p))
    first = registry.model_config("cached_model")
    first["params"] = {"mutated": True}
    second = registry.model_config("cached_model")
    assert len(parsed) == 1 and second["params"] != {"mutated": True}
    path.write_text(path.read_text().replace("title:", "title: edited", 1))
    os.utime(path, ns=(10**18, 10**18))
    assert registry.model_config("cached_model")["title"].startswith("edited") and len(parsed) == 2
    path.write_text("class: [not, a, target]\n")  # a broken edit is checked, not served from the cache
    os.utime(path, ns=(2 * 10**18, 2 * 10**18))
    with pytest.raises(XBenchError):
        registry.model_config("cached_model")
