"""MAVL adapter vs the official-code fixture ../shared/parity/mavl.

The synthetic official checkpoint (``{'model': recipe state}``, ``module.`` keys plus ``module.temp``)
and the synthetic Bio_ClinicalBERT (``text_schema.json``) go through the adapter's own loaders; the
675-row concept book is computed by the adapter's text path from the stored token ids (real
vocabularies are unavailable, so tokenizer parity is not covered).  Both score modes ('feature' and
'text') and the map are compared; scores and maps come from the public ``predict`` path.
Encoding 675 texts with a full-size BERT on CPU dominates the runtime (~25 s of CPU), hence ``slow``.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import shared_path
from parity_recipe import build_state, load_fixture, strict
from xbench.datasets.images import read_image

import xbench
from xbench.core.errors import CheckpointError, FormatError, MissingFileError, XBenchWarning
from xbench.models.mavl import (ASPECTS, ENTITIES, MAVLAdapter, assemble_concept_book, bert_from_state,
                                canonical_class, read_texts, resize_uint8, text_mode_scores)
from xbench.spec.registry import model_config

CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
SAMPLES = ["00000001_000.png", "00027426_000.png"]


def _rows(diseases: list[int]) -> torch.Tensor:
    return torch.tensor([d * 9 + c for d in diseases for c in range(9)])


@pytest.fixture(scope="module")
def run(test_device):
    torch.set_num_threads(1)  # 2 threads are slower on the shared CI machine
    folder = shared_path("parity", "mavl")
    fixture = load_fixture(folder)
    fx, case, schema, text_schema = (fixture[k] for k in ("tensors", "json", "schema", "text_schema"))
    checkpoint = {"model": build_state(schema["state_dict"])}
    adapter = MAVLAdapter.from_official_checkpoint(checkpoint, bert_from_state(build_state(text_schema["state_dict"])),
                                                   device=test_device)
    book = assemble_concept_book(adapter.encode_text_ids(fx["disease_input_ids"], fx["disease_attention_mask"]),
                                 adapter.encode_text_ids(fx["concept_input_ids"], fx["concept_attention_mask"])).cpu()
    adapter.set_entity_book(book)
    pixels = torch.stack([adapter.preprocess(read_image(shared_path("samples", s))) for s in SAMPLES])
    prediction = adapter.predict(pixels, CLASSES)
    features = {k: v.cpu() for k, v in adapter.forward_features(fx["pixel_values"], book).items()}
    return SimpleNamespace(fx=fx, case=case, checkpoint=checkpoint, adapter=adapter, book=book, pixels=pixels,
                           prediction=prediction, features=features)


# -- fixture facts the adapter relies on ----------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_fixture_entities_and_classes_match_adapter(run):
    assert tuple(run.case["entities"]) == ENTITIES
    assert [ENTITIES.index(canonical_class(c)) for c in CLASSES] == run.fx["class_indices"].tolist()


@pytest.mark.shared
@pytest.mark.slow
def test_preprocess_matches_official_transform(run):
    for i, sample in enumerate(SAMPLES):
        assert np.array_equal(resize_uint8(read_image(shared_path("samples", sample))), run.fx["image_uint8"][i].numpy())
    torch.testing.assert_close(run.pixels, run.fx["pixel_values"], atol=1e-6, rtol=0)


# -- intermediates ----------------------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_concept_book_and_queries(run):
    selected = [0, 1, *run.fx["class_indices"].tolist()]
    torch.testing.assert_close(run.book[_rows(selected)], run.fx["concept_book_selected"], atol=1e-4, rtol=1e-4)
    queries = run.features["queries"][_rows(run.fx["class_indices"].tolist())]
    torch.testing.assert_close(queries, run.fx["query_embed_selected"], atol=1e-4, rtol=1e-4)


@pytest.mark.shared
@pytest.mark.slow
def test_image_branches(run):
    with torch.no_grad():
        trunk = run.adapter.net.backbone(run.fx["pixel_values"][:1].to(run.adapter.device))[0, :256].cpu()
    torch.testing.assert_close(trunk, run.fx["trunk_features_img0_ch0_255"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run.features["memory"], run.fx["image_tokens"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run.features["global"], run.fx["image_global"], atol=1e-4, rtol=1e-4)


@pytest.mark.shared
@pytest.mark.slow
def test_cross_attention_and_logits(run):
    idx = run.fx["class_indices"]
    attention = run.features["attention"].view(4, 2, 75, 9, 196)[:, :, idx]
    torch.testing.assert_close(attention, run.fx["cross_attn_layers"], **strict(run.case, "cross_attn_layers"))
    torch.testing.assert_close(run.features["logits"], run.fx["logits_all"], atol=1e-4, rtol=1e-4)


# -- both score modes ---------------------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_feature_mode_scores(run):
    torch.testing.assert_close(run.features["scores_feature"], run.fx["scores_all"], **strict(run.case, "scores_all"))
    torch.testing.assert_close(run.prediction.scores, run.fx["scores"], **strict(run.case, "scores"))


@pytest.mark.shared
@pytest.mark.slow
def test_text_mode_scores(run):
    torch.testing.assert_close(run.features["global_logits"], run.fx["global_logits"], **strict(run.case, "global_logits"))
    torch.testing.assert_close(run.features["scores_text"], run.fx["scores_text_mode_all"], **strict(run.case, "scores_text_mode_all"))
    text = MAVLAdapter(run.adapter.net, run.adapter.text_encoder, config={"params": {"score_mode": "text"}},
                       device=run.adapter.device)
    text.set_entity_book(run.book)
    pred = text.predict(run.fx["pixel_values"], CLASSES)
    torch.testing.assert_close(pred.scores, run.fx["scores_text_mode"], **strict(run.case, "scores_text_mode"))
    torch.testing.assert_close(pred.maps, run.prediction.maps)  # the map does not depend on the score mode


def test_text_mode_rule_by_hand():
    # one image, 2 concepts, 3 diseases (0 = normal, 1 = clear): p = mean_n softmax([g_n, g_d])[1], then mean over concepts
    g = torch.tensor([[[0.0, 1.0, 2.0], [0.5, 0.5, -1.0]]])
    expected = torch.empty(1, 3)
    for d in range(3):
        per_concept = [np.mean([1 / (1 + np.exp(g[0, c, n].item() - g[0, c, d].item())) for n in (0, 1)]) for c in range(2)]
        expected[0, d] = float(np.mean(per_concept))
    torch.testing.assert_close(text_mode_scores(g), expected, atol=1e-6, rtol=0)


# -- maps -------------------------------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_predict_maps_match_official_grid_and_upsampled_map(run):
    maps = run.prediction.maps
    assert maps.shape == (2, 4, 14, 14) and maps.dtype == torch.float32
    torch.testing.assert_close(maps, run.fx["map_grid"], **strict(run.case, "map_grid"))
    upsampled = F.interpolate(maps, size=(224, 224), mode="bilinear", align_corners=True)  # official final map
    torch.testing.assert_close(upsampled, run.fx["map_224"], **strict(run.case, "map_224"))
    # the two images' maps differ far beyond the tolerance: the check is discriminative
    assert (run.fx["map_grid"][0] - run.fx["map_grid"][1]).abs().amax() > 1e-3


# -- checkpoint loading -----------------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_official_loader_drops_temp_and_strips_prefix(run):
    assert "module.temp" in run.checkpoint["model"]
    assert run.adapter.weights_label == "official"


@pytest.mark.shared
@pytest.mark.slow
def test_truncated_checkpoint_names_missing_key(run):
    state = dict(run.checkpoint["model"])
    del state["module.pool.positional_embedding"]
    with pytest.raises(CheckpointError, match=r"missing 1 \[pool\.positional_embedding\]"):
        MAVLAdapter.from_official_checkpoint({"model": state}, run.adapter.text_encoder)


# -- prompts and unseen classes -----------------------------------------------------------------
@pytest.mark.shared
@pytest.mark.slow
def test_unseen_class_with_texts_is_appended_and_scored_in_text_mode(run):
    texts = {**run.adapter.texts, "covid19": ["covid description", *[f"{a}: covid" for a in ASPECTS]]}
    adapter = MAVLAdapter(run.adapter.net, run.adapter.text_encoder, texts=texts, device=run.adapter.device)
    adapter.set_entity_book(run.book)
    diseases, cols = adapter.resolve(["COVID-19", "pneumonia"])
    assert len(diseases) == 76 and cols == [75, 20]
    out = adapter.forward_features(run.fx["pixel_values"], adapter.concept_book(diseases))
    pred = adapter.predict(run.fx["pixel_values"], ["COVID-19", "pneumonia"])
    torch.testing.assert_close(pred.scores[:, 0], out["scores_text"][:, 75].cpu())  # auto: unseen -> text mode
    torch.testing.assert_close(pred.scores[:, 1], out["scores_feature"][:, 20].cpu())  # entity -> feature mode
    # without the texts the class falls back to tail_abnorm_obs with a warning
    with pytest.warns(XBenchWarning, match="tail_abnorm_obs"):
        assert run.adapter.resolve(["COVID-19"])[1] == [ENTITIES.index("tail_abnorm_obs")]


def test_read_texts_joins_descriptions_and_aspects(tmp_path):
    descriptions = {e: f"about {e}" for e in ENTITIES} | {"covid19": "a virus", "only_described": "x"}
    concepts = {e: [f"{a}: {e}" for a in ASPECTS] for e in ENTITIES} | {"covid19": [f"{a}: c" for a in ASPECTS]}
    (tmp_path / "d.json").write_text(json.dumps(descriptions))
    (tmp_path / "c.json").write_text(json.dumps(concepts))
    texts = read_texts(tmp_path / "d.json", tmp_path / "c.json")
    assert texts["covid19"] == ["a virus", *[f"{a}: c" for a in ASPECTS]] and "only_described" not in texts
    concepts["edema"] = concepts["edema"][:7]
    (tmp_path / "c.json").write_text(json.dumps(concepts))
    with pytest.raises(FormatError, match="edema"):
        read_texts(tmp_path / "d.json", tmp_path / "c.json")


def test_assemble_concept_book_is_disease_major():
    desc = torch.arange(2.0)[:, None].expand(2, 768)
    aspects = (10 + torch.arange(16.0))[:, None].expand(16, 768)
    book = assemble_concept_book(desc, aspects)
    assert book[:, 0].tolist() == [0, 10, 11, 12, 13, 14, 15, 16, 17, 1, 18, 19, 20, 21, 22, 23, 24, 25]


# -- construction without official files ------------------------------------------------------
def test_missing_weights_name_the_files_and_publisher(tmp_path):
    config = model_config("mavl")
    with pytest.raises(MissingFileError, match="XBENCH_WEIGHTS"):
        MAVLAdapter.from_config(config, None)
    with pytest.raises(MissingFileError, match="checkpoint_full_40.pth"):
        MAVLAdapter.from_config(config, tmp_path)


@pytest.mark.slow
def test_random_init_text_response_and_determinism(test_device):  # shapes: tests/models/test_contract.py
    torch.set_num_threads(1)
    model = xbench.create_model("mavl", device=test_device, random_init=True, seed=0)
    assert model.weights_label == "random-init"
    rng = np.random.default_rng(0)
    pixels = torch.stack([model.preprocess(rng.random((256, 300), dtype=np.float32)) for _ in range(2)])
    first = model.predict(pixels, ["pneumonia", "cardiomegaly", "pleural effusion"])
    assert torch.all((first.scores > 0) & (first.scores < 1))
    torch.testing.assert_close(first.maps.sum(dim=(2, 3)), torch.ones(2, 3), atol=1e-5, rtol=0)
    assert not torch.allclose(first.maps[:, 0], first.maps[:, 1])  # maps respond to the text
    second = model.predict(pixels, ["pneumonia", "cardiomegaly", "pleural effusion"])
    assert torch.equal(first.scores, second.scores) and torch.equal(first.maps, second.maps)
