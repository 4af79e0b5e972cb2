"""Faithfulness / sanity metrics (xbench.metrics.faithfulness) against Quantus 0.6 on the same inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench.metrics.faithfulness import (deletion_auc, insertion_auc, noisy_linear_imputation, perturbation_curve,
                                         randomisation_similarity, road_curve, road_gap)

quantus = pytest.importorskip(
    "quantus", reason="the Quantus cross-checks need quantus==0.6.0: `make setup` installs it; after `pip install -e .[dev]` run "
    "`pip install --no-deps quantus==0.6.0` (--no-deps: it declares opencv-python, the GUI build; pyproject.toml [dev])")


class Toy(torch.nn.Module):
    """A fixed 2-class linear model on 1x8x8 inputs (softmax applied where the test says)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 2)

    def forward(self, x):
        return self.fc(x.reshape(len(x), -1))


def _data(n: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 1, 8, 8)).astype(np.float32)
    a = rng.random((n, 1, 8, 8))  # no ties: Quantus' argsort is not stable
    return x, a


def _score(model, y, softmax=False):
    def fn(batch):
        with torch.no_grad():
            out = model(torch.from_numpy(batch))
            out = out.softmax(-1) if softmax else out
        return out.numpy()[:, y]
    return fn


def test_deletion_curve_equals_quantus_pixel_flipping():
    model, (x, a) = Toy().eval(), _data()
    y = np.array([0, 1, 0])
    pf = quantus.PixelFlipping(features_in_step=8, perturb_baseline=0.0, normalise=False, abs=False,
                               disable_warnings=True, display_progressbar=False)
    theirs = np.asarray(pf(model=model, x_batch=x, y_batch=y, a_batch=a, device="cpu", softmax=False,
                           channel_first=True))
    for i in range(len(x)):
        f, ours = perturbation_curve(_score(model, y[i]), x[i:i + 1], a[i:i + 1, 0], steps=8, baseline=0.0)
        # Quantus has no point for the unperturbed input; the rest is the same curve
        np.testing.assert_allclose(ours[0, 1:], theirs[i], rtol=1e-5, atol=1e-6)
        # its AUC is np.trapz(curve, dx=1) over the 8 points; ours is over the fraction axis with the first point
        assert deletion_auc(_score(model, y[i]), x[i:i + 1], a[i:i + 1, 0], steps=8)[0] == pytest.approx(
            np.trapezoid(ours[0], f))


def test_insertion_is_deletion_from_the_baseline():
    model, (x, a) = Toy().eval(), _data(1)
    base = np.full_like(x[0], 0.3)
    fn = _score(model, 1)
    f, ins = perturbation_curve(fn, x, a[:, 0], mode="insertion", steps=4, baseline=base)
    _, dele = perturbation_curve(fn, base[None], a[:, 0], mode="deletion", steps=4, baseline=x[0])
    np.testing.assert_allclose(ins, dele)
    assert insertion_auc(fn, x, a[:, 0], steps=4, baseline=base)[0] == pytest.approx(np.trapezoid(ins[0], f))
    assert ins[0, -1] == pytest.approx(fn(x)[0])  # all pixels inserted: the image itself


def test_noisy_linear_imputation_equals_quantus():
    from quantus.functions.perturb_func import noisy_linear_imputation as theirs

    rng = np.random.default_rng(1)
    img = rng.random((3, 9, 7))
    pixels = rng.choice(63, size=25, replace=False)
    np.testing.assert_allclose(noisy_linear_imputation(img, pixels, noise=0.0),
                               theirs(img.copy(), pixels, noise=0.0), rtol=1e-10, atol=1e-12)


def test_road_agrees_with_quantus_road_on_argmax():
    """Quantus' ROAD records whether the arg-max class survives; ours records the class score. With a 2-class
    softmax model and noise 0, 'score of y > 0.5' is exactly Quantus' record."""
    model, (x, a) = Toy().eval(), _data(4, seed=3)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).argmax(-1).numpy()
    percentages = [10, 30, 50, 70]
    road = quantus.ROAD(noise=0.0, percentages=percentages, disable_warnings=True, display_progressbar=False,
                        normalise=False, abs=False)
    theirs = road(model=model, x_batch=x, y_batch=y, a_batch=a, device="cpu", softmax=True, channel_first=True)
    ours = np.stack([road_curve(_score(model, y[i], softmax=True), x[i:i + 1], a[i:i + 1, 0],
                                fractions=[p / 100 for p in percentages], noise=0.0)[0] for i in range(len(x))])
    # Quantus returns, per percentage, the fraction of inputs whose arg-max survived
    assert list(theirs) == percentages
    np.testing.assert_allclose((ours > 0.5).mean(0), [theirs[p] for p in percentages])
    assert 0 < (ours > 0.5).mean() < 1  # the check is not vacuous: some inputs flip


def test_road_gap_sign():
    """A map pointing at the pixels a model sums has a positive gap; its reverse a negative one."""
    x = np.zeros((1, 1, 6, 6), np.float32)
    x[0, 0, 2:4, 2:4] = 1.0
    w = np.zeros((6, 6)); w[2:4, 2:4] = 1.0  # noqa: E702

    def fn(batch):
        return (batch[:, 0] * w).sum((1, 2))

    good, bad = w[None] + 0.01 * np.arange(36).reshape(1, 6, 6) / 36, -w[None]
    assert road_gap(fn, x, good, fractions=[0.2, 0.5], noise=0.0)[0] > 0.5
    assert road_gap(fn, x, bad, fractions=[0.2, 0.5], noise=0.0)[0] < 0


@pytest.mark.parametrize("measure, quantus_name", [("spearman", "correlation_spearman"),
                                                     ("pearson", "correlation_pearson")])
def test_randomisation_similarity_equals_quantus(measure, quantus_name):
    rng = np.random.default_rng(2)
    a, b = rng.random((4, 7, 7)), rng.random((4, 7, 7))
    b[1] = a[1] * 2 + 1
    ref = getattr(quantus.similarity_func, quantus_name)
    ours = randomisation_similarity(a, b, measure=measure)
    np.testing.assert_allclose(ours, [ref(p.ravel(), q.ravel()) for p, q in zip(a, b)], rtol=1e-10)
    assert ours[1] == pytest.approx(1.0)


def test_bad_inputs_raise():
    fn = _score(Toy(), 0)
    x, a = _data(2)
    with pytest.raises(ValueError, match=r"saliency must be \(N, h, w\) with N = 2"):
        deletion_auc(fn, x, a[:1, 0])
    with pytest.raises(ValueError, match="mode must be"):
        perturbation_curve(fn, x, a[:, 0], mode="sideways")
    with pytest.raises(ValueError, match="non-finite"):
        deletion_auc(fn, x, np.full((2, 8, 8), np.nan))
    with pytest.raises(ValueError, match="same shape"):
        randomisation_similarity(a[:, 0], a[:1, 0])
    assert np.isnan(randomisation_similarity(np.ones((1, 2, 2)), np.eye(2)[None]))[0]
