"""The shipped run configs parse and name only registered datasets and models."""
from __future__ import annotations

from pathlib import Path

import pytest

from xbench.spec.config import RunConfig
from xbench.spec.registry import list_datasets, list_models, model_config

RUNS = sorted((Path(__file__).resolve().parents[2] / "xbench" / "configs" / "runs").glob("*.yaml"))


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_run_config_names_registered_entries(path: Path):
    cfg = RunConfig.from_yaml(path)
    assert {d.name for d in cfg.datasets} <= set(list_datasets())
    assert {m.name for m in cfg.models} <= set(list_models())


def test_paper_config_covers_the_seven_datasets_and_seven_models():
    cfg = RunConfig.from_yaml(next(p for p in RUNS if p.stem == "paper"))
    assert len(cfg.datasets) == 7
    vlms = [m.name for m in cfg.models if model_config(m.name)["map_source"] != "prior"]
    assert sorted(vlms) == sorted(["clip", "biomedclip", "medklip", "kad", "mavl", "carzero", "devide"])


def test_every_model_config_names_its_weights_and_rules():
    for name in list_models():
        cfg = model_config(name)
        assert cfg["map_source"] in {"similarity", "cross-attention", "prior"}, name
        assert cfg["score_rule"] in {"probability", "logit", "constant", "random"}, name
        assert len(cfg["grid"]) == 2, name
        for entry in (cfg.get("weights") or {}).values():
            assert "path" in entry and "source" in entry, name


def test_weight_files_take_the_config_name_and_publisher(tmp_path):
    from xbench.core.errors import MissingFileError
    from xbench.models.base import resolve_weight_files

    config = {"weights": {"checkpoint": {"path": "renamed.pt", "source": "https://publisher.example/ckpt"},
                          "archive": {"path": "other.pt", "source": "https://other.example", "alternative_to": "checkpoint"}}}
    with pytest.raises(MissingFileError, match="renamed.pt or other.pt.*publisher.example"):
        resolve_weight_files(config, tmp_path, ["checkpoint", "archive"])
    (tmp_path / "other.pt").write_bytes(b"x")  # the alternative fills the entry
    assert resolve_weight_files(config, tmp_path, ["checkpoint", "archive"]) == {"checkpoint": tmp_path / "other.pt"}
    (tmp_path / "renamed.pt").write_bytes(b"x")  # the entry's own file comes first
    assert resolve_weight_files(config, tmp_path, ["checkpoint"]) == {"checkpoint": tmp_path / "renamed.pt"}
