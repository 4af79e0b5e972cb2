"""One dataset checker (xbench.datasets.checks.check) behind `xbench check` and `xbench manifest check`; one root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import shared_path

from xbench import preflight
from xbench.datasets import checks
from xbench.spec.config import RunConfig
from xbench.datasets import data_root
from xbench.core.errors import XBenchError


def test_one_root_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("XBENCH_DATA", raising=False)
    assert data_root("chestx_det10", tmp_path) == tmp_path
    assert data_root("phantom", None) is None  # generated: the loader picks its cache folder
    with pytest.raises(XBenchError, match="No data root for dataset 'chestx_det10'"):
        data_root("chestx_det10", None)
    monkeypatch.setenv("XBENCH_DATA", str(tmp_path))
    assert data_root("chestx_det10", None) == tmp_path / "chestx_det10"


def test_preflight_reads_the_manifest_checker(tmp_path, monkeypatch):
    os.symlink(shared_path("annotations", "chestx_det10", "test.json"), tmp_path / "test.json")
    calls = []
    real = checks.check
    monkeypatch.setattr(checks, "check", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    cfg = RunConfig.from_dict({"output_dir": str(tmp_path / "o"), "models": ["center_prior"],
                               "datasets": [{"name": "chestx_det10", "root": str(tmp_path)}]})
    found = preflight.preflight(cfg, decode=False).datasets[0]
    direct = real("chestx_det10", tmp_path)
    assert len(calls) == 1 and calls[0][0][:3] == ("chestx_det10", str(tmp_path), "test")
    # the same files, the same image count: one checker, two reports
    assert [line.split(": ")[0] for line in found.files] == [f"file {f.key}" for f in direct.files if f.key != "images"]
    assert found.images_present == direct.images_present == 0
    assert len(found.images_missing) == len(direct.images_missing) == 542
    assert any("none of the 542 image files is present" in p for p in found.problems)


def test_manifest_check_of_a_generated_source_looks_in_the_generated_folder(phantom_cache):
    report = checks.check("phantom", None, "test", options={"cases": 22})
    assert report.opened and Path(report.root).parent == phantom_cache / "phantom"
    assert {f.key: f.exists for f in report.files} == {"annotations": True, "images": True}
    assert report.images_present == 22 and report.mismatches == ["cases: found 22, expected 300"]


def test_manifest_check_names_missing_images_by_file(tmp_path, capsys):
    """`xbench manifest check` on real ChestX-Det10 annotations without images: the missing images are named as the
    files looked for (subfolder and extension, under the root), then their case ids."""
    import shutil

    from conftest import shared_path

    from xbench.cli import main

    root = tmp_path / "cxd"
    root.mkdir()
    for name in ("test.json", "train.json"):
        shutil.copy(shared_path("annotations", "chestx_det10", name), root / name)
    assert main(["manifest", "check", "chestx_det10", "--root", str(root)]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "image files:" in x)
    assert "(first: test_data/" in line and ".png" in line and f"under {root}" in line and "(cases " in line
