"""Image reading: PNG 8/16-bit, RGB luma, DICOM modality/VOI/MONOCHROME1, bad files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from conftest import shared_path
from PIL import Image
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from xbench.datasets.images import ImageFolder, image_size, read_image
from xbench.core.errors import FormatError, MissingFileError


def write_dicom(path: Path, pixels: np.ndarray, *, bits: int = 8, photometric: str = "MONOCHROME2", **extra) -> Path:
    """A minimal uncompressed single-frame DICOM with ``pixels`` (unsigned) and extra attributes."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated = 8 if bits <= 8 else 16
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits, bits - 1, 0
    for key, value in extra.items():
        setattr(ds, key, value)
    ds.PixelData = pixels.astype(np.uint8 if bits <= 8 else np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)
    return path


@pytest.mark.parametrize("name", ["00000001_000.png", "00027426_000.png"])
def test_real_png_matches_pillow_over_255(name):
    path = shared_path("samples", name)
    img = read_image(path)
    expected = np.asarray(Image.open(path).convert("L"), dtype=np.float64) / 255.0
    assert img.dtype == np.float32 and img.shape == (512, 512)
    np.testing.assert_allclose(img, expected, atol=1e-7)
    assert image_size(path) == (512, 512)
    assert 0.0 <= img.min() < img.max() <= 1.0


def test_sixteen_bit_png_divides_by_65535(tmp_path):
    values = np.array([[0, 1, 32768], [65535, 1000, 50000]], dtype=np.uint16)
    path = tmp_path / "x16.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode.startswith("I")
    np.testing.assert_allclose(read_image(path), values / 65535.0, rtol=1e-6)
    assert image_size(path) == (2, 3)


def test_rgb_uses_luma_and_drops_alpha(tmp_path):
    rgba = np.zeros((1, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (255, 0, 0, 10)  # L = 255*299/1000 = 76.245 → Pillow rounds to 76
    rgba[0, 1] = (0, 255, 0, 255)  # 149.685 → 150
    rgba[0, 2] = (0, 0, 255, 0)  # 29.07 → 29
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, "RGBA").save(path)
    np.testing.assert_allclose(read_image(path), np.array([[76, 150, 29]]) / 255.0, atol=1e-7)


def test_dicom_monochrome1_is_inverted(tmp_path):
    pixels = np.array([[0, 255], [51, 102]], dtype=np.uint8)
    mono2 = read_image(write_dicom(tmp_path / "m2.dcm", pixels))
    mono1 = read_image(write_dicom(tmp_path / "m1.dcm", pixels, photometric="MONOCHROME1"))
    np.testing.assert_allclose(mono2, [[0.0, 1.0], [0.2, 0.4]], atol=1e-6)  # no window: own min-max
    np.testing.assert_allclose(mono1, 1.0 - mono2, atol=1e-6)


def test_dicom_rescale_then_minmax(tmp_path):
    stored = np.array([[0, 1000], [2000, 4000]], dtype=np.uint16)
    path = write_dicom(tmp_path / "r.dcm", stored, bits=12, RescaleSlope=2, RescaleIntercept=-1024)
    # modality values -1024, 976, 2976, 6976 → min-max over 8000
    np.testing.assert_allclose(read_image(path), [[0.0, 0.25], [0.5, 1.0]], atol=1e-6)


def test_dicom_window_scales_its_output_range(tmp_path):
    stored = np.array([[0, 50], [100, 200]], dtype=np.uint8)
    path = write_dicom(tmp_path / "w.dcm", stored, WindowCenter=100, WindowWidth=101)
    # PS3.3 C.11.2.1.2.1 LINEAR: c' = 99.5, w' = 100, output range [0, 255]:
    # x=50 → ((50-99.5)/100 + 0.5) = 0.005; x=100 → 0.505; x≤49.5 → 0; x>149.5 → 1
    np.testing.assert_allclose(read_image(path), [[0.0, 0.005], [0.505, 1.0]], atol=1e-6)


def test_dicom_window_with_rescale(tmp_path):
    stored = np.array([[0, 1000], [2000, 4000]], dtype=np.uint16)
    path = write_dicom(tmp_path / "wr.dcm", stored, bits=12, RescaleSlope=2, RescaleIntercept=-1024,
                       WindowCenter=976, WindowWidth=2001)
    # output range: [0*2-1024, 4095*2-1024] = [-1024, 7166]; x=976 → (0.5/2000 + 0.5) = 0.50025
    np.testing.assert_allclose(read_image(path), [[0.0, 0.50025], [1.0, 1.0]], atol=1e-6)


def test_pydicom_bundled_ct_and_header_size():
    from pydicom.data import get_testdata_file

    path = get_testdata_file("CT_small.dcm")
    img = read_image(path)
    ds = pydicom.dcmread(path)
    assert img.shape == (ds.Rows, ds.Columns) == image_size(path)
    assert img.dtype == np.float32 and img.min() >= 0 and img.max() <= 1
    # CT_small has a window: pixels clipped by it reach 0 or 1 exactly
    assert img.min() == 0.0 or img.max() == 1.0


def test_truncated_dicom_is_a_format_error():
    from pydicom.data import get_testdata_file

    path = get_testdata_file("MR_truncated.dcm")
    with pytest.raises(FormatError, match="MR_truncated.dcm"):
        read_image(path)


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(MissingFileError, match="nope.png"):
        read_image(tmp_path / "nope.png")
    with pytest.raises(MissingFileError):
        image_size(tmp_path / "nope.dcm")
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image at all")
    with pytest.raises(FormatError, match="junk.png"):
        read_image(junk)
    with pytest.raises(FormatError, match="junk.png"):
        image_size(junk)
    fake = tmp_path / "fake.dcm"
    fake.write_bytes(b"\0" * 200)
    with pytest.raises(FormatError, match="fake.dcm"):
        read_image(fake)


def test_float_mode_rejected(tmp_path):
    path = tmp_path / "f.tif"
    Image.fromarray(np.ones((2, 2), dtype=np.float32), "F").save(path)
    with pytest.raises(FormatError, match="mode 'F'"):
        read_image(path)


def test_image_folder_finds_nested_files_and_names_missing(tmp_path):
    nested = tmp_path / "images" / "images_001" / "images"
    nested.mkdir(parents=True)
    Image.fromarray(np.full((3, 4), 51, dtype=np.uint8)).save(nested / "a.png")
    folder = ImageFolder(tmp_path / "images", source="https://example.org/nih")
    assert folder.locate("a.png") == nested / "a.png"
    np.testing.assert_allclose(folder.read(tmp_path / "images" / "a.png"), 0.2, atol=1e-7)
    with pytest.raises(MissingFileError, match=r"b\.png.*https://example.org/nih"):
        folder.locate("b.png")
