"""Prior baselines: exact values by hand (centre peak, mean of two masks, positive rates), save/load, errors,
and the random prior's per-image seeding (independent of batch order and composition)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from xbench.datasets.base import BaseDataset, Box
from xbench.core.errors import FormatError, MissingFileError, UnknownNameError, XBenchWarning
from xbench.models.base import create_model
from xbench.models.priors import (
    PRIOR_FILE,
    AnatomicalPrior,
    CenterPrior,
    RandomPrior,
    center_gaussian,
    fit_anatomical_prior,
    positive_rates,
    thumbnail,
)


# -- a toy dataset: 10x10 images, boxes rasterised by the pixel-centre rule onto a 5x5 grid ------------
class Toy(BaseDataset):
    """Cases (label Effusion, label Nodule, regions); the image files do not exist, so reading one would fail."""

    CASES = [
        ("a", 1.0, 0.0, {"Effusion": [Box(0, 0, 4, 4)]}),               # grid cells rows/cols 0-1
        ("b", 1.0, math.nan, {"Effusion": [Box(2, 2, 6, 6)]}),          # grid cells rows/cols 1-2
        ("c", 1.0, 0.0, {}),                                            # positive without a drawn region
        ("d", 0.0, 1.0, {"Effusion": [Box(6, 6, 10, 10)], "Nodule": [Box(8, 0, 10, 2)]}),
        ("e", math.nan, 0.0, {}),
    ]

    def _read_index(self) -> pd.DataFrame:
        return pd.DataFrame({
            "case_id": [c[0] for c in self.CASES],
            "image_path": [f"/nonexistent/{c[0]}.png" for c in self.CASES],
            "height": 10, "width": 10, "view": None,
            "label:Effusion": [c[1] for c in self.CASES],
            "label:Nodule": [c[2] for c in self.CASES],
        })

    def _regions(self, row: pd.Series) -> dict:
        return next(c[3] for c in self.CASES if c[0] == row["case_id"])


@pytest.fixture()
def toy() -> Toy:
    manifest = {"name": "toy", "classes": [{"name": "Effusion", "prompt": "pleural effusion"}, {"name": "Nodule"}]}
    return Toy("/nonexistent", manifest=manifest)


def _pixels(n: int, seed: int = 0, size: int = 32) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.stack([thumbnail(rng.random((40 + i, 50), dtype=np.float32), size) for i in range(n)])


# -- preprocessing ----------------------------------------------------------------------------------------
def test_thumbnail_is_area_mean_replicated_to_rgb():
    image = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
    out = thumbnail(image, 2)
    expected = np.array([[(0 + 1 + 4 + 5), (2 + 3 + 6 + 7)], [(8 + 9 + 12 + 13), (10 + 11 + 14 + 15)]]) / 64
    assert out.shape == (3, 2, 2) and out.dtype == torch.float32
    for channel in out:
        np.testing.assert_allclose(channel.numpy(), expected, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="grey"):
        thumbnail(np.zeros((4, 4, 3)), 2)


# -- center -----------------------------------------------------------------------------------------------
def test_center_gaussian_odd_grid_by_hand():
    g = center_gaussian((5, 5), 0.25)
    assert np.unravel_index(np.argmax(g), g.shape) == (2, 2)
    assert g[2, 2] == pytest.approx(1.0)
    # neighbour centre is 0.2 of the side away: exp(-0.04 / (2 * 0.0625))
    assert g[2, 3] == pytest.approx(math.exp(-0.04 / 0.125), rel=1e-6)
    assert g[0, 0] == pytest.approx(math.exp(-(0.4 ** 2 + 0.4 ** 2) / 0.125), rel=1e-5)
    np.testing.assert_array_equal(g, g.T)


def test_center_prior_from_registry_even_grid_ties_at_centre():
    prior = create_model("center_prior")
    assert prior.describe()["weights"] == "none" and prior.map_source == "prior" and prior.score_rule == "constant"
    pixels = torch.stack([prior.preprocess(np.zeros((64, 48), np.float32))] * 3)
    assert pixels.shape == (3, 3, 32, 32)
    pred = prior.predict(pixels, ["pneumonia", "nodule"])
    assert pred.scores.shape == (3, 2) and torch.all(pred.scores == 0.5)
    assert pred.maps.shape == (3, 2, 14, 14) and pred.maps.dtype == torch.float32
    m = pred.maps[1, 1].numpy()
    top = np.argwhere(m == m.max())
    assert sorted(map(tuple, top)) == [(6, 6), (6, 7), (7, 6), (7, 7)]
    # central cells are half a cell (1/28 of the side) from the centre on each axis
    assert m.max() == pytest.approx(math.exp(-2 * (0.5 / 14) ** 2 / (2 * 0.25 ** 2)), rel=1e-6)


def test_center_prior_sigma_is_configurable_and_checked():
    wide, narrow = CenterPrior(sigma=0.5, grid=(5, 5)), CenterPrior(sigma=0.1, grid=(5, 5))
    assert wide.map[0, 0] > narrow.map[0, 0]
    assert wide.map[0, 0].item() == pytest.approx(math.exp(-0.32 / 0.5), rel=1e-6)
    assert create_model("center_prior", sigma=0.5).map[0, 0] > create_model("center_prior").map[0, 0]
    with pytest.raises(ValueError, match="sigma"):
        CenterPrior(sigma=0)


# -- anatomical ---------------------------------------------------------------------------------------------
def test_fit_anatomical_prior_is_mean_of_positive_masks(toy):
    with pytest.warns(XBenchWarning, match="1 positive"):
        maps = fit_anatomical_prior(toy, grid=(5, 5))
    expected = np.zeros((5, 5), np.float32)
    expected[0:2, 0:2] += 0.5   # case a
    expected[1:3, 1:3] += 0.5   # case b; case c (no region) skipped; case d is negative for Effusion
    assert set(maps) == {"pleural effusion", "nodule"}
    np.testing.assert_array_equal(maps["pleural effusion"], expected)
    assert maps["pleural effusion"][1, 1] == 1.0
    nodule = np.zeros((5, 5), np.float32)
    nodule[0, 4] = 1.0  # Box(8, 0, 10, 2): column centre 9 and row centre 1 on the 5x5 grid
    np.testing.assert_array_equal(maps["nodule"], nodule)


def test_positive_rates_ignore_unknown_labels(toy):
    rates = positive_rates(toy)
    assert rates["pleural effusion"] == pytest.approx(3 / 4)  # a, b, c positive; d negative; e unknown
    assert rates["nodule"] == pytest.approx(1 / 4)            # d positive of a, c, d, e labelled
    with pytest.raises(UnknownNameError, match="Effusion"):
        positive_rates(toy, findings=["Efusion"])


def test_anatomical_prior_predict_save_load_round_trip(toy, tmp_path):
    with pytest.warns(XBenchWarning):
        prior = AnatomicalPrior.fit(toy, grid=(5, 5), findings=["Effusion"])
    assert prior.grid == (5, 5) and prior.describe()["weights"] == "none"
    path = prior.save(tmp_path)
    assert path.name == PRIOR_FILE
    loaded = create_model("anatomical_prior", weights=tmp_path)
    pixels = _pixels(2)
    pred = loaded.predict(pixels, ["pleural effusion", "pleural effusion"])
    assert pred.scores.shape == (2, 2) and torch.allclose(pred.scores, torch.tensor(0.75))
    assert pred.maps.shape == (2, 2, 5, 5)
    np.testing.assert_array_equal(pred.maps[1, 0].numpy(), prior.maps["pleural effusion"].numpy())
    with pytest.raises(UnknownNameError, match="nodule"):
        loaded.predict(pixels, ["nodule"])


def test_anatomical_prior_missing_and_malformed_files(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match="fit_anatomical_prior|AnatomicalPrior.fit"):
        create_model("anatomical_prior")
    with pytest.raises(MissingFileError, match=PRIOR_FILE):
        create_model("anatomical_prior", weights=tmp_path)
    np.savez(tmp_path / PRIOR_FILE, prompts=np.array(["a"]), maps=np.zeros((1, 3, 3)))
    with pytest.raises(FormatError, match="positive_rate"):
        AnatomicalPrior.load(tmp_path)


# -- random -------------------------------------------------------------------------------------------------
def test_random_prior_is_seeded_per_image_not_per_batch():
    prior = create_model("random_prior")
    assert prior.score_rule == "random" and prior.describe()["weights"] == "none"
    pixels = _pixels(3)
    prompts = ["pneumonia", "nodule"]
    full = prior.predict(pixels, prompts)
    assert full.scores.shape == (3, 2) and full.maps.shape == (3, 2, 14, 14)
    assert torch.all((full.maps >= 0) & (full.maps < 1)) and torch.all((full.scores >= 0) & (full.scores < 1))
    reversed_batch = prior.predict(pixels.flip(0), prompts)
    torch.testing.assert_close(reversed_batch.maps.flip(0), full.maps, rtol=0, atol=0)
    torch.testing.assert_close(reversed_batch.scores.flip(0), full.scores, rtol=0, atol=0)
    alone = prior.predict(pixels[1:2], prompts[1:])  # other images and other prompts absent
    torch.testing.assert_close(alone.maps[0, 0], full.maps[1, 1], rtol=0, atol=0)
    assert alone.scores[0, 0] == full.scores[1, 1]
    # different images / prompts / seeds give different draws
    assert not torch.equal(full.maps[0, 0], full.maps[1, 0])
    assert not torch.equal(full.maps[0, 0], full.maps[0, 1])
    other_seed = RandomPrior(seed=1).predict(pixels, prompts)
    assert not torch.equal(other_seed.maps, full.maps)


def test_random_prior_draws_depend_on_seed_case_and_class_not_on_pixels():
    """Issue 12 item 4: the draw of one (case, class) is keyed by (seed, case id, class name), so a changed grey
    level (another decoder, another machine) redraws nothing. Fails on the old pixel-hash key."""
    import hashlib

    prior = create_model("random_prior")
    pixels = _pixels(2)
    nudged = pixels.clone()
    nudged[1, :, 0, 0] += 1 / 255  # one pixel one grey level brighter
    prompts = ["pneumonia", "nodule"]
    ids = ["case-a", "case-b"]
    first = prior.predict_cases(pixels, prompts, ids)
    again = prior.predict_cases(nudged, prompts, ids)
    torch.testing.assert_close(again.scores, first.scores, rtol=0, atol=0)
    torch.testing.assert_close(again.maps, first.maps, rtol=0, atol=0)
    # the documented key, computed by hand: SeedSequence([seed, H(case id), H(class)]), score drawn first
    def h(text):
        return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest(), "little")
    rng = np.random.default_rng(np.random.SeedSequence([0, h("case-b"), h("nodule")]))
    assert first.scores[1, 1].item() == np.float32(rng.random())
    np.testing.assert_array_equal(first.maps[1, 1].numpy(), rng.random((14, 14)).astype(np.float32))
    # other case ids, other seeds: other draws; a batch of one gives the same draw as inside a batch
    swapped = prior.predict_cases(pixels, prompts, ids[::-1])
    assert not torch.equal(swapped.scores, first.scores)
    alone = prior.predict_cases(nudged[1:], prompts[1:], ids[1:])
    assert alone.scores[0, 0] == first.scores[1, 1]
    other_seed = create_model("random_prior", seed=1).predict_cases(pixels, prompts, ids)
    assert not torch.equal(other_seed.scores, first.scores)
    with pytest.raises(ValueError, match="case ids"):
        prior.predict_cases(pixels, prompts, ids[:1])
