"""COVID-19 Rural loader: fixtures in the published layout (covid_rural_annot/ of
haimingt/opacity_segmentation_covid_chest_X_ray: jpgs/, jpgs/jsons/ LabelMe 4.5.6, pngs_masks/ {0,1})
and the real LoVT split lists from ../shared."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from PIL import Image

import xbench
from xbench.datasets.covid_rural import COVIDRural
from xbench.core.errors import FormatError, MissingFileError, XBenchWarning
from xbench.spec.registry import dataset_manifest

P1, P2 = "COVID-19-AR-16406505_01-14-2012-XR", "COVID-19-AR-16406505_01-09-2012-XR"
SIZE = (24, 32)  # (H, W); the real JPEGs are e.g. 1760 x 2140


def opacity() -> np.ndarray:
    mask = np.zeros(SIZE, dtype=np.uint8)
    mask[10:20, 20:30] = 1  # rows 10-19, columns 20-29
    return mask


def labelme(shapes: list[dict], size: tuple[int, int] = SIZE) -> dict:
    """A LabelMe 4.5.6 file as the annotation repo has them (imageData left out: null)."""
    return {"version": "4.5.6", "flags": {}, "shapes": shapes, "imagePath": f"{P1}.jpg", "imageData": None,
            "imageHeight": size[0], "imageWidth": size[1]}


def shape(label: str, points: list[list[float]], shape_type: str = "polygon") -> dict:
    return {"label": label, "points": points, "group_id": None, "shape_type": shape_type, "flags": {}}


LUNGS = [shape("right_lung", [[2, 2], [14, 2], [14, 22], [2, 22]]),
         shape("left_lung", [[18, 2], [30, 2], [30, 22], [18, 22]])]


def make_root(tmp_path: Path, ids: list[str] = (P1, P2), split: str = "test") -> Path:
    root = tmp_path / "covid_rural"
    for folder in ("lovt_split", "jpgs/jsons", "pngs_masks"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "lovt_split" / f"{split}.csv").write_text("ID\n" + "\n".join(ids) + "\n")
    grey = np.tile(np.linspace(0, 255, SIZE[1], dtype=np.uint8), (SIZE[0], 1))
    for i, case in enumerate(ids):
        Image.fromarray(np.stack([grey] * 3, axis=-1)).save(root / "jpgs" / f"{case}.jpg", quality=95)  # colour JPEG
        mask = opacity() if i == 0 else np.zeros(SIZE, dtype=np.uint8)
        Image.fromarray(mask).save(root / "pngs_masks" / f"{case}.png")
        shapes = LUNGS + ([shape("consolidation", [[20, 10], [29, 10], [29, 19], [20, 19]])] if i == 0 else [])
        (root / "jpgs" / "jsons" / f"{case}.json").write_text(json.dumps(labelme(shapes), indent=2))
    return root


def open_ds(root: Path, split: str = "test", **kwargs) -> COVIDRural:
    return COVIDRural(root, split, manifest=dataset_manifest("covid_rural"), **kwargs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_root(tmp_path)


def test_cases_labels_and_image(root):
    ds = xbench.load_dataset("covid_rural", root=root)
    assert isinstance(ds, COVIDRural) and len(ds) == 2 and ds.findings == ["COVID-19 opacity"]
    assert list(ds.cases["case_id"]) == [P1, P2]
    sample = ds[0]
    assert sample.size == SIZE and sample.image_path == root / "jpgs" / f"{P1}.jpg"
    assert sample.labels == {"COVID-19 opacity": 1.0} and ds[1].labels == {"COVID-19 opacity": 1.0}
    image = sample.image()  # colour JPEG read as luma in [0, 1]
    assert image.shape == SIZE and image[:, 0].max() < 0.05 and image[:, -1].min() > 0.95


def test_png_mask_regions_at_original_size_and_on_a_grid(root):
    ds = open_ds(root)
    full = ds[0].mask("COVID-19 opacity")
    assert full.dtype == bool and np.array_equal(full, opacity().astype(bool))
    # 12 x 16 grid (half size, area resampling at 0.5): rows 10-19 → 5-9, columns 20-29 → 10-14
    half = ds[0].mask("COVID-19 opacity", grid=(12, 16))
    expected = np.zeros((12, 16), dtype=bool)
    expected[5:10, 10:15] = True
    assert np.array_equal(half, expected)
    assert not ds[1].mask("COVID-19 opacity").any()  # an empty mask: still a positive case


def test_labelme_polygons_drop_lung_outlines(root):
    ds = open_ds(root, regions="polygons")
    assert len(ds[0].regions["COVID-19 opacity"]) == 1 and ds[1].regions["COVID-19 opacity"] == []
    # the square polygon (PIL, outline included) covers columns 20-29, rows 10-19: equal to the PNG mask
    assert np.array_equal(ds[0].mask("COVID-19 opacity"), opacity().astype(bool))
    assert ds[0].size == SIZE


def test_lovt_split_counts_from_shared(tmp_path):
    split_dir = shared_path("annotations", "covid_rural", "lovt_split")
    stats = json.loads((split_dir / "dataset_statistics.json").read_text())
    root = tmp_path / "covid_rural"
    (root / "pngs_masks").mkdir(parents=True)
    (root / "lovt_split").symlink_to(split_dir)
    tiny = Image.fromarray(np.zeros((2, 3), dtype=np.uint8))
    counts, patients = {}, {}
    for split in ("train", "validation", "test"):
        ids = [line.strip() for line in (split_dir / f"{split}.csv").read_text().splitlines()[1:] if line.strip()]
        for case in ids:
            tiny.save(root / "pngs_masks" / f"{case}.png")
        ds = open_ds(root, split=split)
        counts[split] = len(ds)
        patients[split] = {case.split("_")[0] for case in ds.cases["case_id"]}
        assert patients[split] == set(stats[split]["patient_ids"])
    assert counts == {"train": 133, "validation": 44, "test": 44}
    assert [len(patients[s]) for s in ("train", "validation", "test")] == [63, 23, 18]
    assert not (patients["train"] & patients["test"]) and not (patients["validation"] & patients["test"])


@pytest.mark.parametrize("content, line", [
    (f"ID\n{P1}\n{P1}\n", 3),  # duplicate
    (f"ID\n{P1}\nCOVID-19-AR-16406505.jpg\n", 3),  # not an image stem
    (f"ID\n{P1}\n\n{P2},extra\n", 4),  # two fields (blank lines keep their numbers)
])
def test_bad_split_rows(root, content, line):
    path = root / "lovt_split" / "test.csv"
    path.write_text(content)
    with pytest.raises(FormatError) as info:
        open_ds(root)
    assert (info.value.path, info.value.line, info.value.field) == (path, line, "ID")
    with pytest.warns(XBenchWarning):
        assert len(open_ds(root, on_error="skip")) == 1


def test_bad_split_header(root):
    (root / "lovt_split" / "test.csv").write_text(f"image\n{P1}\n")
    with pytest.raises(FormatError, match="single column 'ID'"):
        open_ds(root)


@pytest.mark.parametrize("bad, reason, field", [
    (shape("consolidation", [[20, 10], [29, 10], [29, 19], [20, 19]], "rectangle"), "not a polygon", "shape_type"),
    (shape("consolidation", [[20, 10], [29, 10]]), "malformed polygon", "points"),
    (shape("groud_glass_opacity", [[20, 10], [40, 10], [40, 19]]), "polygon outside the image", "points"),
])
def test_bad_labelme_shapes(root, bad, reason, field):
    path = root / "jpgs" / "jsons" / f"{P2}.json"
    path.write_text(json.dumps(labelme(LUNGS + [bad])))
    with pytest.raises(FormatError) as info:
        open_ds(root, regions="polygons")
    assert (info.value.path, info.value.line, info.value.field) == (path, 3, field)
    with pytest.warns(XBenchWarning):
        ds = open_ds(root, regions="polygons", on_error="skip")
    assert ds.skipped[reason] == 1 and ds[1].regions["COVID-19 opacity"] == []


def test_labelme_without_image_size(root):
    path = root / "jpgs" / "jsons" / f"{P1}.json"
    data = labelme(LUNGS)
    del data["imageHeight"]
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="imageHeight"):
        open_ds(root, regions="polygons")


def test_bad_masks_raise_when_decoded(root):
    Image.fromarray(opacity() * 255).save(root / "pngs_masks" / f"{P1}.png")  # {0, 255}, not {0, 1}
    ds = open_ds(root)
    with pytest.raises(FormatError, match=r"values in \{0, 1\}") as info:
        ds[0].mask("COVID-19 opacity")
    assert info.value.path == root / "pngs_masks" / f"{P1}.png"
    Image.fromarray(np.zeros((SIZE[0], SIZE[1] + 1), dtype=np.uint8)).save(root / "pngs_masks" / f"{P2}.png")
    with pytest.raises(FormatError, match="differs from the image"):
        open_ds(root)[1].mask("COVID-19 opacity")


def test_missing_files(root):
    (root / "pngs_masks" / f"{P2}.png").unlink()
    with pytest.raises(MissingFileError) as info:
        open_ds(root)
    assert info.value.path == root / "pngs_masks" / f"{P2}.png"
    assert "github.com/haimingt/opacity_segmentation_covid_chest_X_ray" in str(info.value)
    (root / "lovt_split" / "test.csv").unlink()
    with pytest.raises(MissingFileError, match="lovt_split/test.csv.*philip-mueller/lovt"):
        open_ds(root)


def test_manifest_valid_and_counts(root):
    from xbench.spec.manifests import validate
    from xbench.datasets.checks import counts

    validate(dataset_manifest("covid_rural"))
    found = counts(open_ds(root))
    assert found == {**found, "cases": 2, "positive_cases": 2, "regions": 2}  # one mask per case, empty or not


def test_only_images_with_an_opacity_are_positive_pairs(root):
    """Both images are labelled positive; only P1's non-empty mask makes a grounding pair (P2's is counted, not scored)."""
    from xbench.evaluation.evaluate import ground_truth

    ds = open_ds(root)
    assert ds.labels()[:, 0].tolist() == [1.0, 1.0]
    rows, masks, no_region = ground_truth(ds, (16, 16), progress=False)[ds.findings[0]]
    assert rows.tolist() == [0] and masks.shape == (1, 16, 16) and masks.any() and no_region == 1


def test_dataset_pickles_with_its_lazy_masks(root):
    """Evaluation workers receive the dataset pickled: its lazy mask readers survive and decode the same."""
    import pickle

    ds = open_ds(root)
    copy = pickle.loads(pickle.dumps(ds))
    for i in range(len(ds)):
        f = ds.findings[0]
        assert np.array_equal(copy[i].mask(f, (16, 16)), ds[i].mask(f, (16, 16)))
        assert np.array_equal(copy[i].mask(f), ds[i].mask(f))


def test_a_mask_over_the_image_bounds_is_a_format_error(root):
    """Masks are read under the images' bounds: 1.2 MB of PNG text (over the 1 MiB bound) or a header claiming
    more pixels than ``XBENCH_MAX_PIXELS`` is a FormatError naming the mask (a raw ValueError / a full decode
    before)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path = root / "pngs_masks" / f"{P1}.png"
    raw = path.read_bytes()
    text = b"".join(chunk(b"tEXt", f"k{i}".encode() + b"\x00" + b"v" * 600_000) for i in range(2))
    path.write_bytes(raw[:33] + text + raw[33:])  # after the signature and IHDR
    with pytest.raises(FormatError, match=r"MAX_TEXT_MEMORY") as info:
        open_ds(root)[0].mask("COVID-19 opacity")
    assert info.value.path == path
    path.write_bytes(raw)
    assert open_ds(root)[0].mask("COVID-19 opacity").sum() == opacity().sum()  # the mask without the text reads


def test_a_mask_claiming_too_many_pixels_is_refused_before_decoding(root, monkeypatch):
    ds = open_ds(root)
    monkeypatch.setenv("XBENCH_MAX_PIXELS", "100")  # the 24 x 32 mask claims 768
    with pytest.raises(FormatError, match=r"32 x 24 = 768 pixels, above the bound of 100") as info:
        ds[0].mask("COVID-19 opacity")
    assert info.value.path == root / "pngs_masks" / f"{P1}.png"
