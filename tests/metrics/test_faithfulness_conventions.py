"""Faithfulness conventions against the cited methods: RISE's blurred insertion as an option of
``faithfulness_table``, and ``road_gap`` = 2 × pytorch-grad-cam's ``ROADCombined`` where their conventions coincide."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench.core.errors import XBenchError
from xbench.datasets import load_dataset
from xbench.explain.faithfulness import faithfulness_table, score_function
from xbench.explain.methods import black_baseline
from xbench.metrics.faithfulness import blurred, insertion_auc, road_gap
from xbench.models import create_model


def brightness(x: np.ndarray) -> np.ndarray:
    """A linear score: the sum of the input (so a curve is the start image's sum plus the revealed differences)."""
    return x.reshape(len(x), -1).sum(axis=1).astype(np.float64)


def test_insertion_from_a_blurred_start_follows_the_analytic_curve():
    """Insertion from RISE's blurred copy: at fraction f the ⌊f·P⌋ most salient pixels are the image's, the rest the
    blurred image's; with a linear score the area is the trapezoid of those sums (computed here by hand)."""
    rng = np.random.default_rng(0)
    img = rng.random((1, 1, 6, 6)).astype(np.float32)
    sal = rng.random((1, 6, 6))
    start = blurred(img)
    order = np.argsort(-sal.reshape(-1), kind="stable")
    f = np.linspace(0, 1, 5)
    counts = np.floor(np.round(f * 36, 9)).astype(int)  # 0, 9, 18, 27, 36
    curve = [float(start.sum() + (img - start).reshape(-1)[order[:m]].sum()) for m in counts]
    got = insertion_auc(brightness, img, sal, steps=4, baseline=start)[0]
    assert got == pytest.approx(np.trapezoid(curve, f), rel=1e-6)
    black = insertion_auc(brightness, img, sal, steps=4, baseline=0.0)[0]
    assert abs(got - black) > 0.1  # the start image matters: the blurred copy keeps the image's mean brightness


@pytest.mark.usefixtures("phantom_cache")
def test_faithfulness_table_inserts_from_a_blurred_image_on_request():
    phantom = load_dataset("phantom", split="test", cases=4)
    model = create_model("ref_patchsim")
    torch.set_num_threads(2)
    default = faithfulness_table(model, phantom, steps=4, road=False, randomise=False)
    rise = faithfulness_table(model, phantom, steps=4, road=False, randomise=False, insertion_start="blur")
    assert len(default) == len(rise) > 0
    np.testing.assert_array_equal(rise["deletion_auc"], default["deletion_auc"])  # deletion unchanged
    # insertion: the same metric from each image's blurred copy instead of the black baseline
    prompts = [phantom.prompts[f] for f in phantom.findings]
    expected = []
    for finding, group in rise.groupby("finding", sort=False):
        c = phantom.findings.index(finding)
        rows = [next(i for i in range(len(phantom)) if phantom[i].case_id == cid) for cid in group["case_id"]]
        pixels = torch.stack([model.preprocess(phantom[i].image()) for i in rows]).numpy()
        maps = model.predict(torch.from_numpy(pixels), prompts).maps[:, c].float().numpy()
        fn = score_function(model, prompts, c)
        expected.append(insertion_auc(fn, pixels, maps, steps=4, baseline=blurred(pixels), batch_size=32))
        default_again = insertion_auc(fn, pixels, maps, steps=4, baseline=black_baseline(model).numpy(), batch_size=32)
        np.testing.assert_allclose(default.loc[group.index, "insertion_auc"], default_again, atol=1e-6)
    np.testing.assert_allclose(rise["insertion_auc"], np.concatenate(expected), atol=1e-6)
    assert (rise["insertion_auc"] - default["insertion_auc"]).abs().max() > 1e-3
    with pytest.raises(XBenchError, match="insertion_start"):
        faithfulness_table(model, phantom, steps=4, road=False, randomise=False, insertion_start="zeros")


def test_road_gap_is_twice_pytorch_grad_cams_road_combined(monkeypatch):
    """Where the conventions coincide, road_gap = 2 × ROADCombined (which averages (LeRF − MoRF) / 2):

    * imputation noise 0 — pytorch-grad-cam's imputer adds 0.01 · torch.randn (its own unseeded draws; ROADCombined
      cannot set it), XBench 0.01 · numpy draws seeded by ``seed``; their imputed values are the same sparse system;
    * a pixel count at which its percentile thresholds (``np.percentile`` of the map, linear interpolation) remove
      the same number of pixels as XBench's ``⌊f·P⌋`` for f = 0.1 … 0.9 (10 × 10 pixels here; at 16 × 16 they
      differ by one pixel at some fractions), with distinct map values (no ties at a threshold);
    * the score is the same: the model's class logit (pytorch-grad-cam's ``ClassifierOutputTarget``)."""
    road = pytest.importorskip("pytorch_grad_cam.metrics.road",
                              reason="pytorch-grad-cam is not installed (pip install grad-cam): cross-check skipped")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    monkeypatch.setattr(road.NoisyLinearImputer.__init__, "__defaults__",
                        (0.0, *road.NoisyLinearImputer.__init__.__defaults__[1:]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    rng = np.random.default_rng(1)
    images = rng.random((3, 3, 10, 10)).astype(np.float32)
    cams = rng.permutation(300).reshape(3, 10, 10).astype(np.float32) / 300  # distinct values

    def score(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(x))[:, 1].numpy()

    ours = road_gap(score, images, cams, noise=0.0)
    theirs = road.ROADCombined()(torch.from_numpy(images), cams, [ClassifierOutputTarget(1)] * 3, model)
    np.testing.assert_allclose(ours, 2 * theirs, atol=2e-5)
    assert np.abs(ours).max() > 1e-3  # the maps matter to this model: the comparison is not 0 = 0
