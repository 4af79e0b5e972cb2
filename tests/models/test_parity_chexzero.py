"""CheXzero adapter: parity with the official code (tests/fixtures/parity/chexzero) and its own conventions.

The synthetic official checkpoint (a plain ViT-B/32 CLIP state dict) is built from ``schema.json`` with the parity
recipe, written to a ``.pt`` file and read back through the adapter's own loader (``create_model`` with a weights
folder, XBench's restricted unpickler). Preprocessing, tokens, text/image embeddings, the cosine logits, the scores
and the maps are compared with the tensors the official code produced (``README.md`` of the fixture folder).

Tolerances: scores ``atol 2e-5`` (they differ by ≥ 9.4e-3 between classes), embeddings, cosines and maps
``atol 1e-4``, pixels ``atol 1e-5`` (observed maxima in the fixture README).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from parity_recipe import build_state, load_fixture

from conftest import shared_path
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.datasets.images import read_image
from xbench.models.base import create_model
from xbench.models.chexzero import CheXzeroAdapter, pad_to_square

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "parity" / "chexzero"
CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
IMAGES = ["00000001_000.png", "00027426_000.png"]
COSINE = {"atol": 1e-4, "rtol": 0}  # observed max 2.4e-5 (patch tokens; float32 order noise, see the README)
SCORE = {"atol": 2e-5, "rtol": 0}  # observed max 1.8e-6; the scores of different classes differ by >= 9.4e-3


@pytest.fixture(scope="module")
def case():
    return load_fixture(FIXTURE)


@pytest.fixture(scope="module")
def weights_dir(case, tmp_path_factory):
    """A weights folder holding the synthetic official checkpoint under the YAML's file name."""
    folder = tmp_path_factory.mktemp("chexzero")
    torch.save(build_state(case["schema"]["state_dict"]), folder / "chexzero.pt")
    return folder


@pytest.fixture(scope="module")
def adapter(weights_dir, test_device):
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield create_model("chexzero", weights=weights_dir, device=test_device)
    torch.set_num_threads(previous)


def test_schema_is_the_openai_vit_b32_layout(case):
    schema = case["schema"]
    assert schema["recipe"] == "xbench-parity-recipe-v1" and schema["crc_collisions"] == 0
    state = schema["state_dict"]
    assert len(state) == schema["n_keys"] == 302
    assert state["visual.conv1.weight"]["shape"] == [768, 3, 32, 32]
    assert state["visual.positional_embedding"]["shape"] == [50, 768]
    assert state["token_embedding.weight"]["shape"] == [49408, 512]


def test_checkpoint_loads_strictly_through_the_adapter(adapter, case, weights_dir):
    assert isinstance(adapter, CheXzeroAdapter) and adapter.weights_label == "official"
    expected = build_state(case["schema"]["state_dict"])
    own = adapter.model.state_dict()
    assert all(torch.equal(own[k].cpu(), v) for k, v in expected.items())
    state = dict(expected)
    del state["visual.ln_post.weight"]
    with pytest.raises(CheckpointError, match=r"missing 1 \[visual\.ln_post\.weight\]"):
        CheXzeroAdapter.from_checkpoint({f"module.{k}": v for k, v in state.items()})


@pytest.mark.parametrize("index", [0, 1])
def test_preprocessing_matches_official(adapter, case, index):
    t = case["tensors"]
    image = read_image(shared_path("samples", IMAGES[index]))
    np.testing.assert_array_equal(pad_to_square(np.round(image * 255).astype(np.uint8), 320),
                                  t["image_320_uint8"][index].numpy())
    torch.testing.assert_close(adapter.preprocess(image), t["pixel_values"][index], atol=1e-5, rtol=0)  # observed 0


def test_prompts_tokenize_to_the_stored_ids(adapter, case):
    t = case["tensors"]
    for role, key in (("positive", "text_input_ids_pos"), ("negative", "text_input_ids_neg")):
        ids = adapter.tokenizer([adapter.templates[role].format(c) for c in CLASSES])
        assert torch.equal(ids, t[key]), role


def test_text_and_image_embeddings(adapter, case):
    t = case["tensors"]
    pos, neg = adapter.text_embeddings(CLASSES)
    torch.testing.assert_close(pos.cpu(), t["text_emb_pos"], **COSINE)
    torch.testing.assert_close(neg.cpu(), t["text_emb_neg"], **COSINE)
    with torch.no_grad():
        image, patches = adapter.image_features(t["pixel_values"].to(adapter.device))
    torch.testing.assert_close(image.cpu(), t["image_emb"], **COSINE)
    torch.testing.assert_close(patches.cpu(), t["patch_tokens"], **COSINE)


def test_scores_and_maps(adapter, case):
    t = case["tensors"]
    pred = adapter.predict(t["pixel_values"], CLASSES)
    assert pred.scores.shape == (2, 4) and pred.maps.shape == (2, 4, 7, 7)
    torch.testing.assert_close(pred.scores, t["scores"], **SCORE)
    torch.testing.assert_close(pred.maps, t["map_grid"], **COSINE)
    # the official rule on the stored cosines: exp(pos) / (exp(pos) + exp(neg)), no logit scale
    pos, neg = t["logits_pos"].double(), t["logits_neg"].double()
    torch.testing.assert_close(pred.scores.double(), pos.exp() / (pos.exp() + neg.exp()), atol=2e-5, rtol=0)
    # the fixture discriminates: classes and images differ by far more than the tolerance
    assert min((t["scores"][:, a] - t["scores"][:, b]).abs().max() for a in range(4) for b in range(a + 1, 4)) > 5e-3


def test_input_window_covers_the_padded_square(adapter):
    assert adapter.input_window((512, 512)) == (0.0, 0.0, 512.0, 512.0)
    # 400 x 500: 256 x 320 pasted 32 rows down; the input covers 320 rows of 1.5625 original pixels each
    assert adapter.input_window((400, 500)) == (-50.0, 0.0, 450.0, 500.0)


def test_missing_weights_name_the_file_and_the_source(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match=r"chexzero\.pt.*drive\.google\.com/drive/folders/1makFLiEMbSleYltaRxw81aBhEDMpVwno"):
        create_model("chexzero", weights=tmp_path)
