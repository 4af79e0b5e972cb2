"""The committed reference models as known-answer tests of the pipeline (phantom test split, 60 cases)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

import xbench
from xbench.errors import CheckpointError, MissingFileError, XBenchWarning
from xbench.metrics import pointing_game
from xbench.models.reference import GRID, INPUT_SIZE, PatchSimAdapter, XAttnAdapter, preprocess, tokenize
from xbench.train_reference import centre_prior_map

LARGE = ["Cardiomegaly", "Pleural Effusion"]
SMALL_THIN = ["Nodule", "Pneumothorax"]


@pytest.fixture(scope="module")
def phantom(tmp_path_factory):
    return xbench.load_dataset("phantom", root=tmp_path_factory.mktemp("phantom"), split="test", cases=60)


@pytest.fixture(scope="module")
def pixels(phantom):
    return torch.stack([preprocess(s.image()) for s in phantom])


@pytest.fixture(scope="module", params=["ref_patchsim", "ref_xattn"])
def outputs(request, phantom, pixels):
    torch.set_num_threads(1)
    model = xbench.create_model(request.param)
    prompts = [phantom.prompts[f] for f in phantom.findings]
    return request.param, model, model.predict(pixels, prompts)


def _pointing(phantom, maps, finding):
    c = phantom.findings.index(finding)
    rows = np.flatnonzero(phantom.labels()[:, c] == 1)
    masks = np.stack([phantom[int(i)].mask(finding) for i in rows])
    return float(np.mean(pointing_game(maps[rows, c], masks)))


def test_contract_shapes_and_ranges(outputs, pixels):
    name, model, pred = outputs
    assert model.weights_label == "xbench-reference"
    assert pixels.shape[1:] == (3, INPUT_SIZE, INPUT_SIZE)
    assert pred.scores.shape == (60, 6) and pred.maps.shape == (60, 6, *GRID)
    assert pred.scores.dtype == torch.float32 and torch.isfinite(pred.maps).all()
    assert ((pred.scores >= 0) & (pred.scores <= 1)).all()
    if name == "ref_xattn":  # head- and layer-averaged softmax attention: each map sums to 1
        torch.testing.assert_close(pred.maps.sum((-1, -2)), torch.ones(60, 6))
    else:  # cosine similarities
        assert pred.maps.abs().max() <= 1.0 + 1e-5


def test_recognition_auc(outputs, phantom):
    _, _, pred = outputs
    labels = phantom.labels()
    aucs = [roc_auc_score(labels[:, c], pred.scores[:, c]) for c in range(len(phantom.findings))]
    assert np.mean(aucs) >= 0.8
    for c in (phantom.findings.index(f) for f in LARGE):
        assert aucs[c] >= 0.95


def test_grounding_beats_centre_prior_on_large_findings(outputs, phantom):
    _, _, pred = outputs
    prior = np.broadcast_to(centre_prior_map((256, 256)), (60, 6, 256, 256))
    model_large = np.mean([_pointing(phantom, pred.maps.numpy(), f) for f in LARGE])
    prior_large = np.mean([_pointing(phantom, prior, f) for f in LARGE])
    assert model_large >= prior_large + 0.1


def test_weaker_on_small_and_thin_findings(outputs, phantom):
    """The paper's finding 1: grounding degrades from large to small / thin findings."""
    _, _, pred = outputs
    large = np.mean([_pointing(phantom, pred.maps.numpy(), f) for f in LARGE + ["Consolidation"]])
    small = np.mean([_pointing(phantom, pred.maps.numpy(), f) for f in SMALL_THIN])
    assert large > small + 0.1


def test_maps_respond_to_the_prompt(outputs, pixels):
    _, model, _ = outputs
    pred = model.predict(pixels[:2], ["cardiomegaly", "nodule"])
    assert not torch.allclose(pred.maps[:, 0], pred.maps[:, 1])


def test_deterministic_and_batch_independent(outputs, pixels, phantom):
    _, model, pred = outputs
    again = model.predict(pixels[:3], [phantom.prompts[f] for f in phantom.findings])
    torch.testing.assert_close(again.scores, pred.scores[:3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again.maps, pred.maps[:3], atol=1e-5, rtol=1e-5)


def test_unseen_prompt_warns(outputs, pixels):
    _, model, _ = outputs
    with pytest.warns(XBenchWarning, match="outside its phantom vocabulary"):
        model.predict(pixels[:1], ["hernia"])


def test_tokenizer_by_hand():
    ids, unknown = tokenize(["Pleural effusion", "no hernia"])
    from xbench.models.reference import VOCAB

    assert ids[0, :3].tolist() == [VOCAB.index("pleural"), VOCAB.index("effusion"), 0]
    assert ids[1, :2].tolist() == [VOCAB.index("no"), 1] and unknown == [[], ["hernia"]]


def test_preprocess_resizes_and_normalises():
    image = np.full((300, 200), 0.75, np.float32)
    x = preprocess(image)
    assert x.shape == (3, 128, 128)
    torch.testing.assert_close(x, torch.full((3, 128, 128), 1.0))  # (0.75 - 0.5) / 0.25
    with pytest.raises(ValueError, match="shape"):
        preprocess(np.zeros((2, 3, 4), np.float32))


def test_truncated_checkpoint_lists_missing_keys():
    state = dict(XAttnAdapter.from_config({"params": {"random_init": True}}, None).model.state_dict())
    state.pop("head.weight")
    with pytest.raises(CheckpointError, match="head.weight"):
        XAttnAdapter.from_state_dict(state)


def test_missing_weights_folder(tmp_path):
    with pytest.raises(MissingFileError, match="model.safetensors"):
        xbench.create_model("ref_patchsim", weights=tmp_path)


def test_random_init_is_seeded_and_leaves_global_rng():
    before = torch.random.get_rng_state()
    a = PatchSimAdapter.from_config({"params": {"random_init": True, "seed": 3}}, None)
    b = PatchSimAdapter.from_config({"params": {"random_init": True, "seed": 3}}, None)
    assert a.weights_label == "random-init"
    assert torch.equal(torch.random.get_rng_state(), before)
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(v, w), k
