"""Issue 12 item 8: no loader reads a file outside the dataset root.

ChestX-Det `file_name` variants — `../../x.png`, an absolute path, a symlink inside the images folder pointing out
of the root (when the table is built and again when the image is read) — are refused (FormatError naming the annotation file, record and field, or a counted skip); a
`file_name` that stays inside the root is read. (Old main read all three outside files.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xbench.datasets.chestx_det import ChestXDet
from xbench.core.errors import FormatError
from xbench.spec.registry import dataset_manifest


def record(file_name: str) -> dict:
    return {"file_name": file_name, "syms": [], "boxes": [], "polygons": []}


@pytest.fixture()
def layout(tmp_path) -> dict:
    """root/test_data/ with one good image, and a secret image outside the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "test_data" / "sub").mkdir(parents=True)
    outside.mkdir()
    Image.fromarray(np.full((8, 8), 200, np.uint8)).save(outside / "secret.png")
    Image.fromarray(np.full((8, 8), 50, np.uint8)).save(root / "test_data" / "good.png")
    (root / "test_data" / "link.png").symlink_to(outside / "secret.png")
    return {"root": root, "secret": outside / "secret.png"}


def open_det(root: Path, names: list[str], **kwargs) -> ChestXDet:
    (root / "ChestX_Det_test.json").write_text(json.dumps([record(n) for n in names]))
    manifest = {**dataset_manifest("chestx_det"), "image_size": [8, 8]}
    return ChestXDet(root, "test", manifest=manifest, **kwargs)


@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_file_name_leaving_the_root_is_refused_naming_the_record(layout, kind):
    name = "../../outside/secret.png" if kind == "parent" else str(layout["secret"])
    with pytest.raises(FormatError, match=r"outside the dataset root") as err:
        open_det(layout["root"], ["good.png", name])
    assert err.value.path.name == "ChestX_Det_test.json" and err.value.field == "file_name"
    assert "record 2" in str(err.value)


def test_file_names_leaving_the_root_are_counted_skips(layout):
    ds = open_det(layout["root"], ["good.png", "../../outside/secret.png", str(layout["secret"]), "sub/../good2.png"],
                  on_error="skip")
    assert ds.cases["case_id"].tolist() == ["good", "good2"]
    assert dict(ds.skipped) == {"file_name outside the dataset root": 2}


def test_symlink_out_of_the_root_is_refused_when_listed_and_when_read(layout):
    with pytest.raises(FormatError, match=r"resolves to .*secret\.png, outside the dataset root"):
        open_det(layout["root"], ["good.png", "link.png"])
    ds = open_det(layout["root"], ["good.png"])
    assert ds[0].image().max() == pytest.approx(50 / 255)
    good = layout["root"] / "test_data" / "good.png"
    good.unlink()
    good.symlink_to(layout["secret"])  # swapped after the table was built: checked again at read time
    with pytest.raises(FormatError, match=r"resolves to .*secret\.png, outside the dataset root"):
        ds[0].image()
