"""DeViDe adapter (unverified re-construction): build, shapes, text-dependent maps, checkpoint round trip, errors."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import xbench
import xbench.models.devide as devide_module
from xbench.core.errors import CheckpointError, MissingFileError, XBenchWarning
from xbench.models.devide import DeViDeAdapter
from xbench.models.kad import prompt_text

PROMPTS = ["pneumonia", "pleural effusion", "cardiomegaly"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "pneumonia", "pleural", "effusion", "cardio", "##megaly"]


def _tokenizer_folder(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer", "do_lower_case": true}')
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.set_num_threads(2)
    tok = _tokenizer_folder(tmp_path_factory.mktemp("devide") / "Med-KEBERT")
    with pytest.warns(XBenchWarning, match="unverified"):
        adapter = xbench.create_model("devide", random_init=True, seed=1, tokenizer=str(tok))
    return adapter


@pytest.fixture(scope="module")
def pixels(model):
    rng = np.random.default_rng(0)
    return torch.stack([model.preprocess(rng.random((256, 200), dtype=np.float32)) for _ in range(2)])


@pytest.fixture(scope="module")
def prediction(model, pixels):
    return model.predict(pixels, PROMPTS)


def test_metadata_marks_it_unverified(model):
    assert model.verified is False and model.describe()["verified"] is False  # from devide.yaml
    assert model.weights_label == "random-init" and model.map_source == "cross-attention"
    assert model.input_size == 224 and model.grid == (14, 14)
    assert "unverified" in devide_module.__doc__


def test_preprocess_normalisation_and_map_rule(model, pixels, prediction):  # shapes: tests/models/test_contract.py
    # a white pixel maps to (1 - mean) / std of ImageNet's red channel
    white = model.preprocess(np.ones((10, 10), np.float32))
    assert torch.allclose(white[0], torch.full((224, 224), (1 - 0.485) / 0.229))
    assert torch.all((prediction.scores > 0) & (prediction.scores < 1))
    assert torch.all(prediction.maps > 0)
    assert torch.allclose(prediction.maps.amax(dim=(-2, -1)), torch.ones(2, 3))


def test_maps_respond_to_text_and_are_deterministic(model, pixels, prediction):
    again = model.predict(pixels, PROMPTS)
    assert torch.equal(again.scores, prediction.scores) and torch.equal(again.maps, prediction.maps)
    assert (prediction.maps[:, 0] - prediction.maps[:, 1]).abs().max() > 1e-4
    other = model.predict(pixels[:1], ["cardiomegaly", "pneumonia"])
    assert (other.maps[0, 1] - prediction.maps[0, 0]).abs().max() > 0  # queries self-attend: the set matters


def test_a_prompt_list_is_encoded_once_and_batches_equal_the_uncached_path(pixels):
    """The text features of a prompt list are computed once and serve every batch (a dataset's prompts do not
    change between batches); each batch's outputs are the bytes of encoding the text again for it."""
    with pytest.warns(XBenchWarning, match="unverified"):
        fresh = xbench.create_model("devide", random_init=True, seed=1,
                                    tokenizer=str(_tokenizer_folder(Path(tempfile.mkdtemp()) / "Med-KEBERT")))
    calls = []
    encode = fresh.encode_text_ids
    fresh.encode_text_ids = lambda *a: (calls.append(1), encode(*a))[1]
    first, second = fresh.predict(pixels[:1], PROMPTS), fresh.predict(pixels[1:], PROMPTS)
    assert len(calls) == 1
    fresh.predict(pixels[1:], PROMPTS[:2])  # another prompt list is encoded for itself
    assert len(calls) == 2
    for got, rows in ((first, pixels[:1]), (second, pixels[1:])):
        logits, attention = fresh.forward_features(rows, encode(*fresh.tokenizer([prompt_text(p)
                                                                                     for p in PROMPTS])))
        assert torch.equal(got.scores, logits.softmax(dim=-1)[..., 1].float())
        assert torch.equal(got.maps, devide_module.max_normalised_maps(attention[-1], fresh.grid).float())


def _checkpoint(model) -> dict:
    net = model.network
    tqn = net.model.state_dict()
    tqn.update({"decoder.norm." + k.split(".")[-1]: v for k, v in tqn.items() if k.startswith("decoder_norm.")})
    text = net.text_encoder.state_dict()
    text["bert_model.embeddings.position_ids"] = torch.arange(512)[None]  # as files from transformers < 4.31 hold it
    return {"image_encoder": net.image_encoder.state_dict(), "text_encoder": text, "model": tqn, "epoch": 3}


def test_checkpoint_round_trip(model, pixels, prediction, tmp_path):
    ckpt = _checkpoint(model)
    assert "vit.encoder.layers.encoder_layer_11.self_attention.in_proj_weight" in ckpt["image_encoder"]
    _tokenizer_folder(tmp_path / "Med-KEBERT")
    torch.save(ckpt, tmp_path / "devide.pt")
    del ckpt
    with pytest.warns(XBenchWarning):
        loaded = xbench.create_model("devide", weights=tmp_path)
    assert loaded.weights_label == "user-checkpoint"
    out = loaded.predict(pixels, PROMPTS)
    torch.testing.assert_close(out.scores, prediction.scores, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.maps, prediction.maps, atol=1e-6, rtol=0)


def test_wrong_keys_are_listed(model):
    ckpt = _checkpoint(model)
    ckpt["image_encoder"]["vit.encoder.ln.gamma"] = ckpt["image_encoder"].pop("vit.encoder.ln.weight")
    with pytest.raises(CheckpointError, match=r"missing 1 \[vit\.encoder\.ln\.weight\].*unexpected 1 \[vit\.encoder\.ln\.gamma\]"):
        DeViDeAdapter.from_checkpoint(ckpt, model.tokenizer, {})
    ckpt = _checkpoint(model)
    del ckpt["text_encoder"]
    with pytest.raises(CheckpointError, match="text_encoder"):
        DeViDeAdapter.from_checkpoint(ckpt, model.tokenizer, {})


def test_missing_weights_and_bad_params(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match="no official release"):
        xbench.create_model("devide")
    with pytest.raises(MissingFileError, match="devide.pt"):
        xbench.create_model("devide", weights=tmp_path)
    with pytest.raises(ValueError, match="head_outputs"):
        DeViDeAdapter._network_kwargs({"params": {"head_outputs": 3}})
