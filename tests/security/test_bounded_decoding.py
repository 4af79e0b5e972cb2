"""Issue 12 item 6: decompression bombs are refused from the header, before any pixel is decoded.

A 14000² PNG (1-bit, a few kB on disk) and a small RLE DICOM whose header claims 60000² pixels give a clear
FormatError naming the bound, and a counted skip in a run with `on_missing_image: skip`. (Old main: a raw
DecompressionBombError from Pillow; the DICOM was decoded — gigabytes — before any error.)"""
from __future__ import annotations

from pathlib import Path

import pydicom
import pytest
from PIL import Image
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import RLELossless, generate_uid

import xbench
from xbench.spec.config import RunConfig
from xbench.datasets.images import image_size, read_image
from xbench.core.errors import FormatError, XBenchWarning
from xbench.store.results import ResultStore
from xbench.workflows.run import run


def png_bomb(path: Path, side: int = 14000) -> Path:
    Image.new("1", (side, side), 0).save(path)  # 196 M pixels, ~25 kB compressed
    return path


def dicom_bomb(path: Path, side: int = 60000) -> Path:
    """An RLE-compressed DICOM of a few hundred bytes whose header claims ``side``² 16-bit pixels."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = RLELossless
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Rows = ds.Columns = side
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    segment = bytes([0x81, 0]) * 64  # RLE runs of zeros
    header = (2).to_bytes(4, "little") + (64).to_bytes(4, "little") + (64 + len(segment)).to_bytes(4, "little") + bytes(52)
    ds.PixelData = pydicom.encaps.encapsulate([header + segment + segment])
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.fixture()
def never_decoded(monkeypatch):
    """Fail loudly if pydicom is asked to decode pixel data."""
    def refuse(self):
        raise AssertionError("pixel data was decoded")
    monkeypatch.setattr(pydicom.dataset.Dataset, "pixel_array", property(refuse))


def test_png_bomb_is_a_format_error_naming_the_bound(tmp_path):
    path = png_bomb(tmp_path / "bomb.png")
    assert path.stat().st_size < 100_000
    with pytest.raises(FormatError, match=r"196000000 pixels.*above the bound") as err:
        read_image(path)
    assert err.value.path == path
    with pytest.raises(FormatError, match="above the bound"):
        image_size(path)


def test_png_above_a_configured_bound_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("L", (1200, 1000), 7).save(path)
    assert read_image(path).shape == (1000, 1200)
    monkeypatch.setenv("XBENCH_MAX_PIXELS", "1000000")
    with pytest.raises(FormatError, match=r"1,200,000 pixels, above the bound of 1,000,000"):
        read_image(path)
    with pytest.raises(FormatError, match="above the bound"):
        read_image(path.with_name("big.png"), max_pixels=10)


def test_dicom_bomb_is_refused_from_its_header_before_decoding(tmp_path, never_decoded):
    path = dicom_bomb(tmp_path / "bomb.dcm")
    assert path.stat().st_size < 2_000
    with pytest.raises(FormatError, match=r"60000 x 60000 x 1 x 1 = 3,600,000,000 pixels, above the bound"):
        read_image(path)
    with pytest.raises(FormatError, match="above the bound"):
        image_size(path)


def test_bomb_in_a_run_is_a_counted_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = xbench.load_dataset("phantom", split="test", cases=6)
    victim = data.cases["case_id"].iloc[2]
    png_bomb(Path(data.cases["image_path"].iloc[2]))
    raw = {"output_dir": str(tmp_path / "run"), "datasets": [{"name": "phantom", "split": "test", "cases": 6}],
           "models": ["center_prior"], "grid": [32, 32], "chunk_size": 3, "batch_size": 3,
           "bootstrap": {"replicates": 0}, "on_missing_image": "skip"}
    with pytest.warns(XBenchWarning, match="skipped 1 "):
        run(RunConfig.from_dict(raw), progress=False)
    stored = ResultStore(tmp_path / "run").read("phantom", "center_prior", expected_chunks=2)
    assert victim not in stored.case_ids.tolist() and len(stored.case_ids) == 5
    assert "FormatError" in stored.skipped[victim] and "pixels" in stored.skipped[victim]
