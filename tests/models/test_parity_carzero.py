"""CARZero adapter: parity with the official code (../shared/parity/carzero) and its own conventions.

The synthetic official checkpoint is built with the parity recipe (README §1–2) and loaded through
the adapter's own loader; preprocessing, tokenisation, text/image embeddings, both fusion
directions, the per-layer cross-attention and the maps are compared with the stored tensors.
"""
from __future__ import annotations

import math
import re
import sys
import types

import numpy as np
import pytest
import torch
from parity_recipe import build_state, load_fixture, strict
from transformers import BertTokenizer

from conftest import shared_path
from xbench.datasets.images import read_image
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.models.base import create_model, load_checkpoint
from xbench.models.checkpoint import CheckpointWarning
from xbench.models.carzero import (
    CARZeroAdapter,
    FusionModule,
    aggregate_word_pieces,
    clean_text,
    load_carzero_checkpoint,
    load_official_checkpoint,
    official_state,
    preprocess_stages,
    prompt_text,
    read_vocab,
    resize_and_pad,
    resize_area,
    seeded_build,
)

CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
IMAGES = ["00000001_000.png", "00027426_000.png"]
DEFAULT = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def case():
    return load_fixture(shared_path("parity", "carzero"))


@pytest.fixture(scope="module")
def checkpoint(case):
    """The synthetic Lightning checkpoint dict of README §2."""
    schema = case["schema"]
    return {"state_dict": build_state(schema["state_dict"]), "hyper_parameters": schema["hyper_parameters"]}


@pytest.fixture(scope="module")
def adapter(case, checkpoint, threads, test_device):
    tokenizer = BertTokenizer.from_pretrained(str(case["dir"]), local_files_only=True)
    return CARZeroAdapter.from_official_checkpoint(checkpoint, tokenizer, read_vocab(case["dir"] / "vocab.txt"),
                                                   device=test_device)


@pytest.fixture(scope="module")
def outputs(adapter, case):
    """One forward pass through the public pieces: prompts -> text, stored pixels -> image, fusion (results on the CPU)."""
    words, sentence = adapter.encode_prompts(CLASSES)
    tokens = adapter.encode_image(case["tensors"]["pixel_values"])
    out = adapter.forward_features(tokens, words, sentence)
    return {"words": words.cpu(), "sentence": sentence.cpu(), "tokens": tokens.cpu(),
            "out": type(out)(**{k: v.cpu() for k, v in vars(out).items()})}


# -- parity ---------------------------------------------------------------------------------------
def test_checkpoint_has_the_official_layout(case, checkpoint):
    state = official_state(checkpoint)
    assert len(state) == case["schema"]["n_keys"] == 434
    assert all(not k.startswith("CARZero.") for k in state)
    assert torch.equal(state["fusion_module.decoder.norm.weight"], state["fusion_module.decoder_norm.weight"])


def test_prompts_tokenize_to_the_stored_ids(adapter, case):
    t = case["tensors"]
    for cls in case["json"]["classes"]:
        assert clean_text(prompt_text(cls["name"])) == clean_text(cls["prompt"]) == cls["prompt"].lower()
    ids, mask, types_ = adapter.tokenize([prompt_text(c) for c in CLASSES])
    assert torch.equal(ids, t["text_input_ids"])
    assert torch.equal(mask, t["text_attention_mask"])
    assert torch.equal(types_, t["text_token_type_ids"])


@pytest.mark.parametrize("index", [0, 1])
def test_preprocessing_matches_official(adapter, case, index):
    t = case["tensors"]
    image = read_image(shared_path("samples", IMAGES[index]))
    stages = preprocess_stages(image)
    np.testing.assert_array_equal(stages["resized_padded"], t["image_resized_padded_uint8"][index].numpy())
    np.testing.assert_array_equal(stages["cropped"], t["image_uint8"][index].numpy())
    pixels = adapter.preprocess(image)
    assert pixels.shape == (3, 224, 224) and pixels.dtype == torch.float32
    torch.testing.assert_close(pixels, t["pixel_values"][index], atol=1e-6, rtol=0)


def test_text_embeddings(case, outputs):
    """Text from the prompt path (ids equal to the stored ones, see above) vs the stored embeddings."""
    t, words, sentence = case["tensors"], outputs["words"], outputs["sentence"]
    assert words.shape == (4, 768, 97) and sentence.shape == (4, 768)
    torch.testing.assert_close(sentence, t["text_emb_global"], **DEFAULT)
    torch.testing.assert_close(words[:, :, :8], t["text_emb_words_first8"], **DEFAULT)
    # "there is pleural effusion" is the longest: [CLS] there is pleural effusion [SEP] = 6 word slots
    assert torch.count_nonzero(words[:, :, 6:]) == 0


def test_image_embeddings(case, outputs):
    t, tokens = case["tensors"], outputs["tokens"]
    assert tokens.shape == (2, 197, 768)
    torch.testing.assert_close(tokens[:, 0], t["image_emb_global"], **DEFAULT)
    torch.testing.assert_close(tokens[0, 1:].T.reshape(768, 14, 14), t["image_emb_local_img0"], **DEFAULT)


def test_scores(case, outputs):
    t, out = case["tensors"], outputs["out"]
    for name in ("score_i2t", "score_t2i", "scores"):
        torch.testing.assert_close(getattr(out, name), t[name], **DEFAULT)
    torch.testing.assert_close(out.scores, (out.score_i2t + out.score_t2i) / 2, atol=0, rtol=0)


def test_cross_attention_and_maps(case, outputs):
    t, out = case["tensors"], outputs["out"]
    torch.testing.assert_close(out.attention, t["cross_attn_layers"], **strict(case["json"], "cross_attn_layers"))
    torch.testing.assert_close(out.maps, t["map_grid"], **strict(case["json"], "map_grid"))
    official_224 = out.maps.repeat_interleave(16, dim=2).repeat_interleave(16, dim=3)
    torch.testing.assert_close(official_224, t["map_224"], **strict(case["json"], "map_224"))
    # no renormalisation after dropping the CLS key: each map sums to less than 1
    assert (out.maps.sum(dim=(-2, -1)) < 1).all()


def test_predict_matches_fixture_and_is_deterministic(adapter, case, outputs):
    t = case["tensors"]
    pred = adapter.predict(t["pixel_values"], CLASSES)
    assert pred.scores.shape == (2, 4) and pred.maps.shape == (2, 4, 14, 14)
    assert pred.scores.dtype == torch.float32 and pred.maps.dtype == torch.float32
    torch.testing.assert_close(pred.scores, t["scores"], **DEFAULT)
    torch.testing.assert_close(pred.maps, t["map_grid"], **strict(case["json"], "map_grid"))
    # a second run of the same pieces (the ``outputs`` fixture) gives identical numbers
    assert torch.equal(pred.scores, outputs["out"].scores) and torch.equal(pred.maps, outputs["out"].maps)


def test_maps_and_scores_respond_to_the_text(outputs):
    maps, scores = outputs["out"].maps, outputs["out"].scores
    for a in range(4):
        for b in range(a + 1, 4):
            assert (maps[:, a] - maps[:, b]).abs().max() > 1e-3
            assert (scores[:, a] - scores[:, b]).abs().max() > 1e-3


def test_to_probability_is_sigmoid_of_the_logit(adapter, case):
    scores = case["tensors"]["scores"].numpy().astype(np.float64)
    grid = np.concatenate([scores.ravel(), [-2.0, 0.0, 3.0]])
    probs = adapter.to_probability(grid)
    np.testing.assert_allclose(probs, 1 / (1 + np.exp(-grid)))
    np.testing.assert_array_equal(probs >= 0.5, grid >= 0)
    assert adapter.score_rule == "logit" and adapter.weights_label == "official"


def test_seeded_build_is_reproducible_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = seeded_build(3, FusionModule), seeded_build(3, FusionModule), seeded_build(4, FusionModule)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.mlp_head[0].weight, c.mlp_head[0].weight)
    assert torch.equal(torch.random.get_rng_state(), state)


# -- checkpoint handling --------------------------------------------------------------------------
def test_truncated_or_wrong_checkpoint_lists_the_keys(adapter, checkpoint):
    state = dict(checkpoint["state_dict"])
    del state["CARZero.fusion_module.mlp_head.9.bias"]
    with pytest.raises(CheckpointError, match=r"missing 1 \[fusion_module\.mlp_head\.9\.bias\]"):
        load_official_checkpoint(adapter.model, {"state_dict": state})
    state["CARZero.fusion_module.mlp_head.9.bias"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=r"fusion_module\.mlp_head\.9\.bias: checkpoint \(2,\) vs model \(1,\)"):
        load_official_checkpoint(adapter.model, {"state_dict": state})
    with pytest.raises(CheckpointError, match="state_dict"):
        load_official_checkpoint(adapter.model, {"model": checkpoint["state_dict"]})


def _small_checkpoint(checkpoint, hyper):
    keys = [k for k in checkpoint["state_dict"] if ".mlp_head." in k or "decoder_norm" in k or "logit_scale" in k]
    return {"state_dict": {k: checkpoint["state_dict"][k] for k in keys}, "hyper_parameters": hyper, "epoch": 7}


def test_checkpoint_file_round_trip(tmp_path, checkpoint, case):
    saved = _small_checkpoint(checkpoint, case["schema"]["hyper_parameters"])
    path = tmp_path / "CARZero_best_model.ckpt"
    torch.save(saved, path)
    loaded = load_carzero_checkpoint(path)
    assert loaded["hyper_parameters"] == saved["hyper_parameters"]
    assert list(loaded["state_dict"]) == list(saved["state_dict"])
    assert all(torch.equal(loaded["state_dict"][k], v) for k, v in saved["state_dict"].items())


def test_lightning_file_with_an_omegaconf_object_loads_without_running_it(tmp_path, checkpoint, monkeypatch):
    """The real file pickles an OmegaConf DictConfig; it must load with omegaconf absent and nothing executed."""
    package = types.ModuleType("omegaconf")
    module = types.ModuleType("omegaconf.dictconfig")

    class DictConfig:
        def __init__(self, content):
            self._content = content

        def __setstate__(self, state):  # would run on a plain unpickle
            raise AssertionError("pickled code ran")

    DictConfig.__module__, DictConfig.__qualname__ = "omegaconf.dictconfig", "DictConfig"
    module.DictConfig = DictConfig
    package.dictconfig = module
    path = tmp_path / "lightning.ckpt"
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "omegaconf", package)
        patch.setitem(sys.modules, "omegaconf.dictconfig", module)
        saved = _small_checkpoint(checkpoint, DictConfig({"model": {"fusion": {"N": 4}}}))
        torch.save(saved, path)
    assert sys.modules.get("omegaconf") is not package
    with pytest.warns(CheckpointWarning, match=r"omegaconf\.dictconfig\.DictConfig"):
        loaded = load_checkpoint(path)  # the shared safe reader: the config object becomes a reported placeholder
    assert type(loaded["hyper_parameters"]).__module__ == "omegaconf.dictconfig"
    assert loaded["hyper_parameters"].pickled_state == {"_content": {"model": {"fusion": {"N": 4}}}}
    assert loaded["epoch"] == 7
    assert all(torch.equal(loaded["state_dict"][k], v) for k, v in saved["state_dict"].items())


def test_unreadable_file_raises_checkpoint_error(tmp_path):
    path = tmp_path / "broken.ckpt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="broken.ckpt"):
        load_carzero_checkpoint(path)


def test_missing_weights_name_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match=r"CARZero_best_model\.ckpt.*drive\.google\.com"):
        create_model("carzero")
    with pytest.raises(MissingFileError, match=re.escape(str(tmp_path / "CARZero_best_model.ckpt"))):
        create_model("carzero", weights=tmp_path)
    (tmp_path / "CARZero_best_model.ckpt").write_bytes(b"")
    with pytest.raises(MissingFileError, match=r"BioClinicalMPBERT.*huggingface\.co/Laihaoran/BioClinicalMPBERT"):
        create_model("carzero", weights=tmp_path)


# -- random init ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_adapter(threads, test_device):
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("XBENCH_WEIGHTS", raising=False)
        return create_model("carzero", device=test_device, random_init=True, seed=3)


def test_random_init_predicts_full_size_outputs(random_adapter):
    assert random_adapter.weights_label == "random-init"
    assert random_adapter.describe()["grid"] == "14x14"
    n_params = sum(p.numel() for p in random_adapter.model.parameters())
    assert n_params > 190_000_000  # ViT-B/16 + bert-base + fusion decoder
    pixels = random_adapter.preprocess(read_image(shared_path("samples", IMAGES[0]))).unsqueeze(0)
    with pytest.raises(ValueError, match="expected pixels of shape"):
        random_adapter.predict(pixels[:, :, :100], ["pneumonia"])
    pred = random_adapter.predict(pixels, ["pneumonia", "pneumothorax", "COVID-19"])
    # shapes, dtypes, finite values: tests/models/test_contract.py
    assert (pred.maps > 0).all() and (pred.maps.sum(dim=(-2, -1)) < 1).all()
    # the maps and scores respond to the text (queries never interact, so this is per prompt)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert (pred.maps[0, a] - pred.maps[0, b]).abs().max() > 1e-6
        assert pred.scores[0, a] != pred.scores[0, b]


# -- pure helpers (hand-computed) -------------------------------------------------------------------
def test_resize_area_rounding_rules():
    # 2x2 blocks round half up ((sum + 2) >> 2): sums 6 -> 2, 2 -> 1
    two = np.array([[1, 2, 0, 1], [2, 1, 0, 1]], np.uint8)
    np.testing.assert_array_equal(resize_area(two, 1, 2), [[2, 1]])
    # 4x4 blocks: rint(sum / 16), half to even: 8/16 -> 0, 24/16 -> 2
    four = np.zeros((4, 8), np.uint8)
    four[:2, :4] = 1
    four[:, 4:] = [[2, 2, 2, 2]] * 2 + [[1, 1, 1, 1]] * 2
    np.testing.assert_array_equal(resize_area(four, 1, 2), [[0, 2]])
    # 3 -> 2 columns (scale 1.5): out0 = 2/3 a + 1/3 b, out1 = 1/3 b + 2/3 c
    np.testing.assert_array_equal(resize_area(np.array([[30, 60, 90]], np.uint8), 1, 2), [[40, 80]])
    constant = np.full((300, 257), 77, np.uint8)
    np.testing.assert_array_equal(resize_area(constant, 256, 219), np.full((256, 219), 77))
    with pytest.raises(ValueError, match="only downscales"):
        resize_area(constant, 301, 257)


def test_resize_and_pad_centres_the_short_side():
    landscape = np.full((99, 400), 200, np.uint8)  # short side int(99 * 256 / 400) = 63, pad 193 = 96 + 97
    out = resize_and_pad(landscape)
    assert out.shape == (256, 256)
    assert (out[:96] == 0).all() and (out[96:159] == 200).all() and (out[159:] == 0).all()
    portrait = resize_and_pad(landscape.T.copy())
    np.testing.assert_array_equal(portrait, out.T)


def test_clean_text_follows_process_text():
    assert clean_text("1. There is a mass.\n2. Effusion. No pneumothorax") == "there is a mass no pneumothorax"
    assert clean_text("There is Ödema") == "there is dema"
    assert prompt_text("mass") == "There is Pulmonary Mass"
    assert prompt_text("COVID-19") == "There is COVID-19"
    assert clean_text(prompt_text("COVID-19")) == "there is covid 19"


def test_word_pieces_are_summed_and_padding_is_zero():
    vocab = ["[CLS]", "a", "##b", "##c", "[SEP]", "[PAD]", "d"]
    ids = torch.tensor([[0, 1, 2, 3, 6, 4, 5, 5]])
    hidden = torch.arange(1.0, 9.0).reshape(1, 1, 8, 1)  # (n, layers, L, D)
    agg = aggregate_word_pieces(hidden, ids, vocab)
    assert agg.shape == (1, 1, 8, 1)
    assert agg.flatten().tolist() == [1.0, 2 + 3 + 4, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0]
    assert math.isclose(agg.mean(dim=2).item(), 21 / 8)  # the sentence mean counts the zero slots
