"""``read_source`` (the file's integers + the float of each) gives ``read_image``'s bytes on every format rule."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from PIL import Image
from pydicom.sequence import Sequence
from pydicom.dataset import Dataset
from test_images import write_dicom

from xbench.core.errors import FormatError
from xbench.datasets.images import SourceImage, read_image, read_source
from xbench.inference.gpu_preprocess import source_array, upload_array


def _same(path: Path) -> SourceImage:
    src = read_source(path)
    want = read_image(path)
    got = src.image()
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), path.name  # bit for bit, -0.0 included
    upload, ref = upload_array(src), source_array(want)  # what the GPU path uploads, without the float image
    assert upload.dtype == ref.dtype and np.array_equal(upload, ref), path.name
    return src


@pytest.mark.parametrize("name", ["00000001_000.png", "00027426_000.png"])
def test_real_nih_png(name):
    src = _same(shared_path("samples", name))
    assert src.values.dtype == np.uint8 and src.levels is not None


def test_pillow_modes(tmp_path):
    rng = np.random.default_rng(5)
    cases = {"l.png": Image.fromarray(rng.integers(0, 256, (37, 41), dtype=np.uint8)),
             "i16.png": Image.fromarray(rng.integers(0, 65536, (23, 19), dtype=np.uint16)),
             "rgb.jpg": Image.fromarray(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8), "RGB"),
             "p.png": Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).convert("P"),
             "const.png": Image.fromarray(np.full((9, 7), 200, np.uint8))}
    for name, img in cases.items():
        img.save(tmp_path / name)
        src = _same(tmp_path / name)
        assert src.levels is not None
    assert read_source(tmp_path / "i16.png").values.dtype == np.uint16
    on_bytes = tmp_path / "i16_on_8bit_levels.png"  # 16-bit file whose values are all 257·k: uploaded as 8-bit codes
    Image.fromarray((rng.integers(0, 256, (12, 14)) * 257).astype(np.uint16)).save(on_bytes)
    assert upload_array(_same(on_bytes)).dtype == np.uint8


@pytest.mark.parametrize("kind", ["plain", "mono1", "rescale", "window", "window_rescale", "voi_lut", "constant",
                                  "signed", "eight_bit_window", "sigmoid"])
def test_dicom_rules(tmp_path, kind):
    rng = np.random.default_rng(len(kind))
    pixels = rng.integers(0, 4096, (33, 29)).astype(np.uint16)
    extra: dict = {}
    bits = 12
    if kind == "mono1":
        extra = {"photometric": "MONOCHROME1", "WindowCenter": 2000, "WindowWidth": 3001}
    elif kind == "rescale":
        extra = {"RescaleSlope": 2, "RescaleIntercept": -1024}
    elif kind == "window":
        extra = {"WindowCenter": 1800, "WindowWidth": 1201}
    elif kind == "window_rescale":
        extra = {"RescaleSlope": 0.5, "RescaleIntercept": 3, "WindowCenter": 900, "WindowWidth": 700}
    elif kind == "voi_lut":
        item = Dataset()
        item.LUTDescriptor = [256, 1000, 12]
        item.add_new(0x00283006, "US", [int(v) for v in np.linspace(0, 4095, 256).astype(np.uint16)])  # LUTData
        extra = {"VOILUTSequence": Sequence([item])}
    elif kind == "constant":
        pixels = np.full((8, 8), 77, np.uint16)
    elif kind == "eight_bit_window":
        pixels, bits = rng.integers(0, 256, (20, 24)).astype(np.uint8), 8
        extra = {"WindowCenter": 128, "WindowWidth": 101}
    elif kind == "sigmoid":
        extra = {"WindowCenter": 2000, "WindowWidth": 1000, "VOILUTFunction": "SIGMOID"}
    path = write_dicom(tmp_path / f"{kind}.dcm", pixels, bits=bits, **extra)
    if kind == "signed":
        import pydicom

        ds = pydicom.dcmread(path)
        ds.PixelRepresentation = 1
        ds.PixelData = (pixels.astype(np.int16) - 2048).tobytes()
        ds.save_as(path)
    src = _same(path)
    # integers kept except where the rule is not elementwise arithmetic (sigmoid: exp) — then floats, same bytes
    assert (src.levels is None) == (kind == "sigmoid")
    if src.levels is not None:
        assert src.values.dtype in (np.uint8, np.uint16) and len(src.levels) <= 65536


def test_errors_are_the_same(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(FormatError):
        read_source(bad)
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(big)
    with pytest.raises(FormatError, match="above the bound"):
        read_source(big, max_pixels=100)
    assert np.array_equal(SourceImage.from_image(read_image(big)).image(), read_image(big))
