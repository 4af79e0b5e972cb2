"""GLoRIA adapter: parity with the official code (tests/fixtures/parity/gloria) and its own conventions.

The synthetic Lightning checkpoint is built from ``schema.json`` with the parity recipe, written to
``chexpert_resnet50.ckpt`` next to a ``Bio_ClinicalBERT/`` folder holding the fixture's synthetic ``vocab.txt``, and
built by ``create_model("gloria", weights=folder)``: XBench's restricted unpickler and the adapter's own loader.
Preprocessing, token ids, text and image embeddings, both similarities, the scores, the word attention and the maps
are compared with the tensors the official code produced (``README.md`` of the fixture folder).

Tolerances (observed maxima in the fixture README): scores and similarities ``atol 2e-6`` (per class the two images'
scores differ by 4e-4 to 7.9e-4, two classes' by ≥ 5.3e-3), maps and word attention ``atol 1e-6`` (maps of two
classes differ by ≥ 1.1e-3, of the two images by ≥ 1.1e-3 per class), embeddings ``atol 1e-4``, pixels ``atol 1e-6``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from parity_recipe import build_state, load_fixture

from conftest import shared_path
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.datasets.images import read_image
from xbench.models.base import create_model
from xbench.models.carzero import preprocess_stages
from xbench.models.gloria import GLoRIAAdapter, gloria_state, word_slots

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "parity" / "gloria"
CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
IMAGES = ["00000001_000.png", "00027426_000.png"]
SCORE = {"atol": 2e-6, "rtol": 0}
ATTENTION = {"atol": 1e-6, "rtol": 0}
EMBEDDING = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def case():
    return load_fixture(FIXTURE)


@pytest.fixture(scope="module")
def checkpoint(case):
    return {"state_dict": build_state(case["schema"]["state_dict"]), "epoch": 0}


@pytest.fixture(scope="module")
def adapter(case, checkpoint, tmp_path_factory, test_device):
    folder = tmp_path_factory.mktemp("gloria")
    torch.save(checkpoint, folder / "chexpert_resnet50.ckpt")
    (folder / "Bio_ClinicalBERT").mkdir()
    shutil.copy(FIXTURE / "vocab.txt", folder / "Bio_ClinicalBERT" / "vocab.txt")
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield create_model("gloria", weights=folder, device=test_device)
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def outputs(adapter, case):
    t = case["tensors"]
    text = adapter.encode_texts([c["prompt"] for c in case["json"]["classes"]])
    image_global, image_local = adapter.encode_image(t["pixel_values"])
    out = adapter.forward_features(image_global, image_local, text)
    return {"text": text, "image_global": image_global.cpu(), "image_local": image_local.cpu(), "out": out}


def test_checkpoint_layout_and_loading(adapter, case, checkpoint):
    schema = case["schema"]
    assert schema["n_keys"] == len(schema["state_dict"]) == 521 and schema["crc_collisions"] == 0
    assert adapter.weights_label == "official" and isinstance(adapter, GLoRIAAdapter)
    state = gloria_state(checkpoint)
    assert "text_encoder.model.embeddings.position_ids" not in state and not any("gloria." in k for k in state)
    own = adapter.model.state_dict()
    assert all(torch.equal(own[k].cpu(), v) for k, v in state.items())
    broken = dict(checkpoint["state_dict"])
    del broken["gloria.img_encoder.local_embedder.weight"]
    with pytest.raises(CheckpointError, match=r"missing 1 \[img_encoder\.local_embedder\.weight\]"):
        GLoRIAAdapter.from_checkpoint({"state_dict": broken}, adapter.tokenizer, adapter.vocab)
    with pytest.raises(CheckpointError, match="state_dict"):
        gloria_state({"model": checkpoint["state_dict"]})


@pytest.mark.parametrize("index", [0, 1])
def test_preprocessing_matches_official(adapter, case, index):
    t = case["tensors"]
    image = read_image(shared_path("samples", IMAGES[index]))
    stages = preprocess_stages(image, 224, size=256, mean=0.5, std=0.5)
    np.testing.assert_array_equal(stages["resized_padded"], t["image_resized_padded_uint8"][index].numpy())
    torch.testing.assert_close(adapter.preprocess(image), t["pixel_values"][index], atol=1e-6, rtol=0)


def test_prompts_tokenize_to_the_stored_ids_and_slots(adapter, case):
    t, classes = case["tensors"], case["json"]["classes"]
    assert [c["prompt"] for c in classes] == [adapter.templates[0].format(c.title()) for c in CLASSES]
    ids, mask, types = adapter.tokenize([c["prompt"] for c in classes])
    assert torch.equal(ids, t["text_input_ids"]) and torch.equal(mask, t["text_attention_mask"])
    assert torch.equal(types, t["text_token_type_ids"])
    # the official slot count is the prompt's character count; the real words are the merged word pieces
    assert [word_slots(c["prompt"]) for c in classes] == [c["cap_len"] for c in classes] == [18, 21, 21, 25]
    assert adapter.real_words(ids) == [len(c["words"]) for c in classes] == [3, 3, 3, 4]
    with pytest.raises(ValueError, match="97"):
        word_slots("x" * 97)


def test_text_and_image_embeddings(case, outputs):
    t = case["tensors"]
    words, sentence, _, _ = outputs["text"]
    torch.testing.assert_close(sentence.cpu(), t["text_emb_global"], **EMBEDDING)
    torch.testing.assert_close(words[:, :, :8].cpu(), t["text_emb_words_first8"], **EMBEDDING)
    torch.testing.assert_close(outputs["image_global"], t["image_emb_global"], **EMBEDDING)
    torch.testing.assert_close(outputs["image_local"], t["image_emb_local"], **EMBEDDING)


def test_similarities_scores_and_maps(adapter, case, outputs):
    t, out = case["tensors"], outputs["out"]
    torch.testing.assert_close(out.global_.cpu(), t["similarity_global"], **SCORE)
    torch.testing.assert_close(out.local.cpu(), t["similarity_local"], **SCORE)
    torch.testing.assert_close(out.scores.cpu(), t["scores"], **SCORE)
    torch.testing.assert_close(out.maps.cpu(), t["map_grid"], **ATTENTION)
    pred = adapter.predict(t["pixel_values"], CLASSES)  # the template with each prompt name: the same texts
    assert pred.scores.shape == (2, 4) and pred.maps.shape == (2, 4, 19, 19)
    torch.testing.assert_close(pred.scores, t["scores"], **SCORE)
    torch.testing.assert_close(pred.maps, t["map_grid"], **ATTENTION)
    # the official z-score over the images of the call is a per-class transform of these scores
    z = (t["scores"] - t["scores"].mean(0)) / t["scores"].std(0, correction=0)  # numpy std, ddof 0
    torch.testing.assert_close(z, t["scores_zscored_official"], atol=1e-3, rtol=0)
    # each word's attention is a softmax over the 361 regions
    torch.testing.assert_close(pred.maps.sum(dim=(-2, -1)), torch.ones(2, 4), atol=1e-5, rtol=0)


def test_word_attention_of_the_first_slots(adapter, case, outputs):
    from xbench.models.gloria import local_similarity

    t = case["tensors"]
    words, _, slots, _ = outputs["text"]
    for c in range(4):
        _, attn = local_similarity(words[c, :, 1:slots[c] + 1], outputs["image_local"].to(words.device))
        torch.testing.assert_close(attn[:, :8].cpu(), t["word_attention_first8"][:, c], **ATTENTION)


def test_missing_weights_name_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match=r"chexpert_resnet50\.ckpt.*stanfordmedicine\.box\.com"):
        create_model("gloria", weights=tmp_path)
    (tmp_path / "chexpert_resnet50.ckpt").write_bytes(b"")
    with pytest.raises(MissingFileError, match=r"Bio_ClinicalBERT.*huggingface\.co/emilyalsentzer/Bio_ClinicalBERT"):
        create_model("gloria", weights=tmp_path)
