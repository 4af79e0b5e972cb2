"""Faithfulness tables with the perturbations made on the model's device and every finding's (case, finding) pairs in
one stream of batches: the same values as the per-finding NumPy construction."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench.datasets import load_dataset
from xbench.explain.faithfulness import faithfulness_table
from xbench.explain.methods import black_baseline
from xbench.metrics.faithfulness import pixel_order, road_gap
from xbench.models import create_model

pytestmark = pytest.mark.usefixtures("phantom_cache")
CASES, STEPS = 6, 4


def _numpy_curve(score, images, saliency, mode, steps, baseline):
    """A deletion / insertion curve as the metrics built it before: per image, per step, NumPy copies."""
    n, c, h, w = images.shape
    order = pixel_order(saliency, (h, w))
    counts = [int(np.floor(round(f * h * w, 9))) for f in np.linspace(0, 1, steps + 1)]
    batch = np.empty((n, steps + 1, c, h * w), np.float32)
    for i in range(n):
        base = np.broadcast_to(baseline, (c, h, w)).reshape(c, -1)
        src, dst = (images[i].reshape(c, -1), base) if mode == "deletion" else (base, images[i].reshape(c, -1))
        for k, m in enumerate(counts):
            x = src.copy()
            x[:, order[i, :m]] = dst[:, order[i, :m]]
            batch[i, k] = x
    scores = np.concatenate([score(b) for b in np.array_split(batch.reshape(-1, c, h, w), max(1, n))])
    return np.trapezoid(scores.reshape(n, steps + 1), np.linspace(0, 1, steps + 1), axis=1)


def test_batched_table_equals_the_per_finding_numpy_construction(monkeypatch):
    torch.set_num_threads(2)
    phantom = load_dataset("phantom", split="test", cases=CASES)
    model = create_model("ref_xattn")
    calls = []
    predict = type(model).predict

    def counted(self, pixels, prompts):
        calls.append(len(pixels))
        return predict(self, pixels, prompts)

    monkeypatch.setattr(type(model), "predict", counted)
    table = faithfulness_table(model, phantom, steps=STEPS, road=True, road_fractions=(0.5,), randomise=False,
                               batch_size=16)
    prompts = [phantom.prompts[f] for f in phantom.findings]
    labels = phantom.labels()[:CASES]
    pixels = torch.stack([model.preprocess(phantom[i].image()) for i in range(CASES)])
    with torch.no_grad():
        maps = predict(model, pixels, prompts).maps.float().numpy()
    base = black_baseline(model).numpy()
    images = pixels.numpy()
    expected = []
    for c, finding in enumerate(phantom.findings):
        idx = np.where(labels[:, c] == 1)[0]
        if not len(idx):
            continue

        def score(x, c=c):
            with torch.no_grad():
                return predict(model, torch.from_numpy(np.ascontiguousarray(x)), prompts).scores[:, c].numpy()

        dele = _numpy_curve(score, images[idx], maps[idx, c], "deletion", STEPS, base)
        ins = _numpy_curve(score, images[idx], maps[idx, c], "insertion", STEPS, base)
        road = road_gap(score, images[idx], maps[idx, c], fractions=(0.5,), seed=0, batch_size=16)
        expected += [(finding, d, s, r) for d, s, r in zip(dele, ins, road)]
    assert len(table) == len(expected) >= 8
    assert list(table["finding"]) == [e[0] for e in expected]
    for k, column in enumerate(("deletion_auc", "insertion_auc", "road_gap"), start=1):
        np.testing.assert_allclose(table[column], [e[k] for e in expected], rtol=1e-6, atol=1e-7, err_msg=column)
    # deletion and insertion scored every finding's pairs in one stream of batches of 16 inputs
    pairs, findings = len(table), table["finding"].nunique()
    stream = -(-pairs * (STEPS + 1) // 16)
    road_calls = sum(2 * -(-int(n) // 16) for n in table.groupby("finding").size())  # lerf, morf: per finding
    assert len(calls) == 1 + 2 * stream + road_calls, (len(calls), findings)
