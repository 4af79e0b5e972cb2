"""Known answers on the phantom (issue 24, item 3): the reference models' maps are faithful and change when the
weights are randomised; the centre prior's map is unfaithful by construction and survives randomisation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench.datasets import load_dataset
from xbench.explain.faithfulness import faithfulness_table, score_function
from xbench.explain.methods import black_baseline
from xbench.metrics.faithfulness import deletion_auc
from xbench.models import create_model

pytestmark = pytest.mark.usefixtures("phantom_cache")
CASES = 8


@pytest.fixture(scope="module")
def phantom():
    return load_dataset("phantom", split="test", cases=CASES)


@pytest.mark.parametrize("name", ["ref_xattn", "ref_patchsim"])
def test_reference_maps_are_faithful_and_fail_randomisation(phantom, name):
    torch.set_num_threads(2)
    table = faithfulness_table(create_model(name), phantom, steps=5, road=name == "ref_xattn",
                               road_fractions=(0.5,))
    assert len(table) >= 8 and table["score"].mean() > 0.6  # positive cases the model recognises
    # deleting the map's most salient pixels first removes the evidence faster than inserting them restores it
    assert (table["insertion_auc"] - table["deletion_auc"]).mean() > 0.15
    # weights randomised: the maps change (rank correlation far from 1)
    assert table["randomisation_similarity"].median() < 0.5
    if name == "ref_xattn":
        assert table["road_gap"].mean() > 0.1  # the same, with ROAD's in-distribution imputation


def test_reference_map_beats_its_own_reversal(phantom):
    """Deletion in the map's order hurts more than deletion in the reverse order (same pixels, same model)."""
    model = create_model("ref_patchsim")
    prompts = [phantom.prompts[f] for f in phantom.findings]
    c = phantom.findings.index("Cardiomegaly")
    rows = np.where(phantom.labels()[:, c] == 1)[0]
    pixels = torch.stack([model.preprocess(phantom[int(i)].image()) for i in rows])
    maps = model.predict(pixels, prompts).maps[:, c].numpy()
    fn, base = score_function(model, prompts, c), black_baseline(model).numpy()
    own = deletion_auc(fn, pixels.numpy(), maps, steps=5, baseline=base)
    reverse = deletion_auc(fn, pixels.numpy(), -maps, steps=5, baseline=base)
    assert len(rows) >= 2 and (own < reverse).all()


def test_centre_prior_is_unfaithful_and_passes_randomisation_unchanged(phantom):
    table = faithfulness_table(create_model("center_prior"), phantom, steps=5, road_fractions=(0.5,))
    # a constant score: removing or inserting pixels changes nothing, whatever the map
    np.testing.assert_allclose(table["deletion_auc"], 0.5)
    np.testing.assert_allclose(table["insertion_auc"], 0.5)
    np.testing.assert_allclose(table["road_gap"], 0.0)
    # no learned weights: the randomised model is the model, the map does not change (the sanity check fails)
    np.testing.assert_allclose(table["randomisation_similarity"], 1.0)
