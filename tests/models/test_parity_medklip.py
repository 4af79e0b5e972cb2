"""MedKLIP adapter vs the official-code fixture ../shared/parity/medklip.

The synthetic official checkpoint (``{'model': recipe state}``, keys with ``module.``) and the synthetic
Bio_ClinicalBERT (``text_schema.json``) go through the adapter's own loaders; the entity book is
computed by the adapter's text path from the stored token ids (real vocabularies are unavailable, so
tokenizer parity is not covered).  Scores and maps come from the public ``predict`` path.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import shared_path
from parity_recipe import build_state, load_fixture, strict
from xbench.datasets.images import read_image

import xbench
from xbench.core.errors import CheckpointError, MissingFileError, UnknownNameError, XBenchWarning
from xbench.models.medklip import (ENTITIES, MedKLIPAdapter, bert_from_state, canonical_class, read_descriptions,
                                   resize_uint8, toy_token_ids)
from xbench.spec.registry import model_config

CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
SAMPLES = ["00000001_000.png", "00027426_000.png"]


@pytest.fixture(scope="module")
def run(test_device):
    torch.set_num_threads(1)  # 2 threads are slower on the shared CI machine
    folder = shared_path("parity", "medklip")
    fixture = load_fixture(folder)
    fx, case, schema, text_schema = (fixture[k] for k in ("tensors", "json", "schema", "text_schema"))
    checkpoint = {"model": build_state(schema["state_dict"])}
    adapter = MedKLIPAdapter.from_official_checkpoint(checkpoint, bert_from_state(build_state(text_schema["state_dict"])),
                                                      device=test_device)
    book = adapter.encode_text_ids(fx["disease_input_ids"], fx["disease_attention_mask"]).cpu()
    adapter.set_entity_book(book)
    pixels = torch.stack([adapter.preprocess(read_image(shared_path("samples", s))) for s in SAMPLES])
    prediction = adapter.predict(pixels, CLASSES)
    features = {k: v.cpu() for k, v in adapter.forward_features(fx["pixel_values"], book).items()}
    return SimpleNamespace(fx=fx, case=case, schema=schema, checkpoint=checkpoint, adapter=adapter, book=book,
                           pixels=pixels, prediction=prediction, features=features)


# -- fixture facts the adapter relies on ----------------------------------------------------
@pytest.mark.shared
def test_fixture_entities_and_classes_match_adapter(run):
    assert tuple(run.case["entities"]) == ENTITIES
    assert [ENTITIES.index(canonical_class(c)) for c in CLASSES] == run.fx["class_indices"].tolist()


# -- preprocessing ----------------------------------------------------------------------------
@pytest.mark.shared
def test_preprocess_matches_official_transform(run):
    for i, sample in enumerate(SAMPLES):
        image = read_image(shared_path("samples", sample))
        assert np.array_equal(resize_uint8(image), run.fx["image_uint8"][i].numpy())
    torch.testing.assert_close(run.pixels, run.fx["pixel_values"], atol=1e-6, rtol=0)


# -- intermediates ----------------------------------------------------------------------------
@pytest.mark.shared
def test_text_path_reproduces_disease_book_and_queries(run):
    torch.testing.assert_close(run.book, run.fx["disease_book"], atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        queries = run.adapter.net.disease_embedding_layer(run.book.to(run.adapter.device)).cpu()
    torch.testing.assert_close(queries, run.fx["query_embed"], atol=1e-4, rtol=1e-4)


@pytest.mark.shared
def test_image_path_reproduces_trunk_and_tokens(run):
    with torch.no_grad():
        pixels = run.fx["pixel_values"].to(run.adapter.device)
        trunk = run.adapter.net.res_features(pixels[:1])[0].cpu()
        tokens = run.adapter.net.image_tokens(pixels).cpu()
    torch.testing.assert_close(trunk, run.fx["trunk_features_img0"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tokens, run.fx["image_tokens"], atol=1e-4, rtol=1e-4)


@pytest.mark.shared
def test_cross_attention_layers_and_logits(run):
    idx = run.fx["class_indices"]
    torch.testing.assert_close(run.features["attention"][:, :, idx], run.fx["cross_attn_layers"], **strict(run.case, "cross_attn_layers"))
    torch.testing.assert_close(run.features["logits"], run.fx["logits_all"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run.features["scores"], run.fx["scores_all"], **strict(run.case, "scores_all"))


# -- outputs through the public predict path -------------------------------------------------
@pytest.mark.shared
def test_predict_scores_match_official(run):
    assert run.prediction.scores.shape == (2, 4) and run.prediction.scores.dtype == torch.float32
    torch.testing.assert_close(run.prediction.scores, run.fx["scores"], **strict(run.case, "scores"))
    # the two images differ by ~3e-3, far above the tolerance: the check is discriminative
    assert (run.fx["scores"][0] - run.fx["scores"][1]).abs().min() > 100 * strict(run.case, "scores")["atol"]


@pytest.mark.shared
def test_predict_maps_match_official_grid_and_upsampled_map(run):
    maps = run.prediction.maps
    assert maps.shape == (2, 4, 14, 14) and maps.dtype == torch.float32
    torch.testing.assert_close(maps, run.fx["map_grid"], **strict(run.case, "map_grid"))
    # official final heatmap: nearest x16 repetition of the raw grid, no normalisation
    upsampled = maps.repeat_interleave(16, dim=2).repeat_interleave(16, dim=3)
    torch.testing.assert_close(upsampled, run.fx["map_224"], **strict(run.case, "map_224"))


# -- checkpoint loading -----------------------------------------------------------------------
@pytest.mark.shared
def test_truncated_checkpoint_names_missing_key(run):
    state = dict(run.checkpoint["model"])
    del state["module.decoder.layers.2.linear1.weight"]
    with pytest.raises(CheckpointError, match=r"missing 1 \[decoder\.layers\.2\.linear1\.weight\]"):
        MedKLIPAdapter.from_official_checkpoint({"model": state}, run.adapter.text_encoder)


@pytest.mark.shared
def test_wrong_checkpoint_names_unexpected_and_misshaped_keys(run):
    state = dict(run.checkpoint["model"])
    state["module.temp"] = torch.zeros(9)
    state["module.classifier.weight"] = torch.zeros(3, 256)
    with pytest.raises(CheckpointError) as err:
        MedKLIPAdapter.from_official_checkpoint({"model": state}, run.adapter.text_encoder)
    assert "unexpected 1 [temp]" in str(err.value)
    assert "classifier.weight: checkpoint (3, 256) vs model (2, 256)" in str(err.value)


@pytest.mark.shared
def test_unprefixed_state_dict_loads_the_same_weights(run):
    bare = {k.removeprefix("module."): v for k, v in run.checkpoint["model"].items()}
    adapter = MedKLIPAdapter.from_official_checkpoint(bare, run.adapter.text_encoder, device=run.adapter.device)
    assert adapter.weights_label == "official"
    assert torch.equal(adapter.net.classifier.weight, run.adapter.net.classifier.weight)


# -- prompts and unseen classes -----------------------------------------------------------------
def test_canonical_class_applies_official_synonyms():
    assert canonical_class(" Pleural Effusion ") == "effusion"
    assert canonical_class("Infiltration") == "infiltrate"
    assert canonical_class("Pleural Thickening") == "thicken"
    assert canonical_class("Fibrosis") == "tail_abnorm_obs"
    assert canonical_class("COVID-19 pneumonia") == "covid19"
    assert canonical_class("tail_abnorm_obs") == "tail_abnorm_obs"


@pytest.mark.shared
def test_resolve_appends_described_unseen_class_and_falls_back_for_others(run):
    queries, cols = run.adapter.resolve(["covid-19", "pneumonia", "Covid"])
    assert len(queries) == 76 and queries[75] == "covid19" and cols == [75, 20, 75]
    with pytest.warns(XBenchWarning, match="tail_abnorm_obs"):
        queries, cols = run.adapter.resolve(["aortic enlargement"])
    assert queries == list(ENTITIES) and cols == [ENTITIES.index("tail_abnorm_obs")]
    strict = MedKLIPAdapter(run.adapter.net, run.adapter.text_encoder, config={"params": {"unseen_fallback": None}},
                            device=run.adapter.device)
    with pytest.raises(UnknownNameError, match="aortic enlargement"):
        strict.resolve(["aortic enlargement"])


@pytest.mark.shared
def test_unseen_class_adds_a_query_that_shifts_the_others(run):
    pred = run.adapter.predict(run.fx["pixel_values"], ["covid-19", "pneumonia"])
    assert pred.scores.shape == (2, 2) and pred.maps.shape == (2, 2, 14, 14)
    # a 76th self-attending query changes the pneumonia output a little, but not a lot
    delta = (pred.scores[:, 1] - run.fx["scores"][:, 0]).abs()
    assert delta.max() > 0 and delta.max() < 0.05
    assert not torch.allclose(pred.maps[:, 0], pred.maps[:, 1])


def test_read_descriptions_maps_misspelt_pneumonia_and_reports_missing(tmp_path):
    book = {e: f"about {e}" for e in ENTITIES}
    book["eumonia"] = book.pop("pneumonia")  # the official file's spelling
    path = tmp_path / "observation explanation.json"
    path.write_text(json.dumps(book))
    assert read_descriptions(path)["pneumonia"] == "about pneumonia"
    del book["edema"]
    path.write_text(json.dumps(book))
    with pytest.raises(xbench.core.errors.FormatError, match="missing entity descriptions: edema"):
        read_descriptions(path)


def test_toy_token_ids_follow_the_fixture_rule():
    ids, mask = toy_token_ids(["Pleural effusion!", ""])
    assert ids.shape == (2, 64) and ids[0, 0] == 101 and ids[0, 3] == 102 and ids[1, :2].tolist() == [101, 102]
    import zlib
    assert ids[0, 1] == 1000 + zlib.crc32(b"pleural") % 27000
    assert mask.sum(1).tolist() == [4, 2]


# -- construction without official files ------------------------------------------------------
def test_missing_weights_name_the_files_and_publisher(tmp_path):
    config = model_config("medklip")
    with pytest.raises(MissingFileError, match="XBENCH_WEIGHTS") as err:
        MedKLIPAdapter.from_config(config, None)
    assert "github.com/MediaBrain-SJTU/MedKLIP" in str(err.value)
    with pytest.raises(MissingFileError, match="checkpoint_final.pth"):
        MedKLIPAdapter.from_config(config, tmp_path)


@pytest.fixture(scope="module")
def random_model(test_device):
    torch.set_num_threads(1)
    return xbench.create_model("medklip", device=test_device, random_init=True, seed=0)


def test_random_init_text_response_and_determinism(random_model):  # shapes: tests/models/test_contract.py
    assert random_model.weights_label == "random-init"
    rng = np.random.default_rng(0)
    pixels = torch.stack([random_model.preprocess(rng.random((300, 260), dtype=np.float32)) for _ in range(2)])
    first = random_model.predict(pixels, ["pneumonia", "cardiomegaly", "pleural effusion"])
    assert torch.all((first.scores > 0) & (first.scores < 1))
    torch.testing.assert_close(first.maps.sum(dim=(2, 3)), torch.ones(2, 3), atol=1e-5, rtol=0)  # layer-mean of softmaxes
    assert not torch.allclose(first.maps[:, 0], first.maps[:, 1])  # maps respond to the text
    second = random_model.predict(pixels, ["pneumonia", "cardiomegaly", "pleural effusion"])
    assert torch.equal(first.scores, second.scores) and torch.equal(first.maps, second.maps)


def test_unseen_fallback_must_be_an_entity(random_model):
    with pytest.raises(UnknownNameError, match="tail_abnormal"):
        MedKLIPAdapter(random_model.net, random_model.text_encoder, config={"params": {"unseen_fallback": "tail_abnormal"}})
