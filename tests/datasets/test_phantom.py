"""The procedural phantom: determinism, on-disk format through the ChestX-Det reader, exact and visible regions."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import binary_dilation

import xbench
from xbench.datasets.chestx_det import ChestXDet
from xbench.datasets.phantom import FINDINGS, PhantomParams, ensure_split, render_case
from xbench.core.errors import UnknownNameError, XBenchError


def _digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    return xbench.load_dataset("phantom", root=tmp_path_factory.mktemp("ph"), split="test", cases=60)


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = ensure_split(PhantomParams("test", 8), tmp_path / "a")
    b = ensure_split(PhantomParams("test", 8), tmp_path / "b")
    c = ensure_split(PhantomParams("test", 8, seed=1), tmp_path / "c")
    assert _digest(a) == _digest(b) and len(_digest(a)) == 8 + 2
    assert _digest(a)["images/test_00000.png"] != _digest(c)["images/test_00000.png"]


def test_case_does_not_depend_on_split_size_and_splits_differ(tmp_path):
    small = ensure_split(PhantomParams("test", 3), tmp_path)
    large = ensure_split(PhantomParams("test", 5), tmp_path)
    train = ensure_split(PhantomParams("train", 3), tmp_path)
    assert (small / "images/test_00002.png").read_bytes() == (large / "images/test_00002.png").read_bytes()
    assert (small / "images/test_00000.png").read_bytes() != (train / "images/train_00000.png").read_bytes()


def test_loader_reads_chestx_det_format(test_split):
    assert isinstance(test_split, ChestXDet) and len(test_split) == 60
    assert test_split.findings == list(FINDINGS)
    records = json.loads((test_split.root / "annotations.json").read_text())
    assert set(records[0]) == {"file_name", "syms", "boxes", "polygons"}
    labels = test_split.labels()
    assert (labels.sum(0) > 0).all()  # every finding occurs
    assert (labels.sum(1) == 0).sum() >= 10 and (labels.sum(1) >= 2).sum() >= 5  # negatives and multi-label cases
    sample = test_split[0]
    assert sample.size == (256, 256) and sample.image().shape == (256, 256)
    assert sample.image().dtype == np.float32


def test_regions_are_exact(test_split):
    """The loader's mask (via regions.rasterize) reproduces the mask the pixels were drawn with."""
    records = json.loads((test_split.root / "annotations.json").read_text())
    checked = 0
    for i, record in enumerate(records[:20]):
        for sym, box in zip(record["syms"], record["boxes"]):
            mask = test_split[i].mask(sym)
            rows, cols = np.nonzero(mask)
            # box is the bound of its own region; the union mask of the finding contains it
            assert cols.min() <= box[0] and rows.min() <= box[1] and cols.max() + 1 >= box[2] and rows.max() + 1 >= box[3]
            assert mask[box[1]:box[3], box[0]:box[2]].any()
            checked += 1
    assert checked > 10
    rng = np.random.default_rng([0, 2, 0])
    image, regions = render_case(rng)
    assert image.dtype == np.float32 and 0.0 <= image.min() and image.max() <= 1.0
    assert [f for f, _ in regions] == records[0]["syms"]
    assert [p.tolist() for _, p in regions] == records[0]["polygons"]


@pytest.mark.parametrize("finding, sign", [("Nodule", 1), ("Consolidation", 1), ("Pleural Effusion", 1), ("Pneumothorax", -1)])
def test_findings_are_visible(test_split, finding, sign):
    """Inside the region the image is denser (lucent for pneumothorax) than in a ring around it."""
    c = test_split.findings.index(finding)
    diffs = []
    for i in np.flatnonzero(test_split.labels()[:, c] == 1):
        sample = test_split[int(i)]
        mask = sample.mask(finding)
        ring = binary_dilation(mask, iterations=4) & ~mask
        others = np.zeros_like(mask)
        for f in test_split.findings:
            if f != finding and sample.labels[f] == 1:
                others |= sample.mask(f)
        ring &= ~others
        if ring.sum() < 10:  # surrounded by another finding
            continue
        image = sample.image()
        diffs.append(image[mask].mean() - image[ring].mean())
    assert len(diffs) >= 3 and sign * np.median(diffs) > 0.02


def test_sizes_in_the_regimes(test_split):
    areas = {f: [] for f in FINDINGS}
    for sample in test_split:
        for f in FINDINGS:
            if sample.labels[f] == 1:
                areas[f].append(sample.mask(f).mean())
    med = {f: np.median(v) for f, v in areas.items()}
    assert med["Nodule"] < 0.005 < med["Consolidation"] < med["Cardiomegaly"]
    assert med["Pneumothorax"] < med["Consolidation"] and med["Pleural Effusion"] > 0.01


def test_sixteen_bit_and_size(tmp_path):
    ds = xbench.load_dataset("phantom", root=tmp_path, split="prior", cases=2, size=128, bit_depth=16)
    assert Image.open(ds[0].image_path).mode.startswith("I;16")
    image = ds[0].image()
    assert image.shape == (128, 128) and len(np.unique(image)) > 256
    assert ds[0].mask(ds.findings[0], grid=(16, 16)).shape == (16, 16)


def test_cache_root_idempotent_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path))
    ds = xbench.load_dataset("phantom", split="test", cases=2)
    assert ds.root.parent == tmp_path / "phantom"
    stamp = (ds.root / "annotations.json").stat().st_mtime_ns
    again = xbench.load_dataset("phantom", split="test", cases=2)
    assert again.root == ds.root and (ds.root / "annotations.json").stat().st_mtime_ns == stamp
    assert [p.name for p in ds.root.parent.iterdir()] == [ds.root.name]  # no temporary folder left behind
    (ds.root / "phantom.json").write_text(json.dumps({"seed": 99}))
    with pytest.raises(XBenchError, match="does not hold"):
        xbench.load_dataset("phantom", split="test", cases=2)


def test_bad_arguments(tmp_path):
    with pytest.raises(UnknownNameError, match="split"):
        xbench.load_dataset("phantom", root=tmp_path, split="validation")
    with pytest.raises(ValueError, match="bit_depth"):
        PhantomParams("test", 1, bit_depth=12)
