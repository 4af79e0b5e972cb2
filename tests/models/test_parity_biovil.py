"""BioViL adapter vs the official-code fixture tests/fixtures/parity/biovil (hi-ml-multimodal at b67c1d27).

The synthetic official files (recipe ``xbench-parity-recipe-v1``, ../shared/parity/README.md §1-2, on the schema
stored with the fixture) go through the adapter's own loader: the image file is written with ``torch.save`` and read
back by XBench's bounded reader (``load_checkpoint``), the CXR-BERT state is given in memory. The tokenizer is a
``BertTokenizer`` on the fixture's synthetic vocabulary (case.json ``vocab``), the one the official
``CXRBertTokenizer`` used; scores and maps come from the public ``predict`` path (one batch). Tolerances and the
observed maxima are in the fixture's NOTES.md.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import shared_path
from parity_recipe import build_state, load_fixture, write_vocab

import xbench
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.datasets.images import read_image
from xbench.models.base import load_checkpoint
from xbench.models.biovil import BioViLAdapter, cxr_bert_tokenizer, remap_to_uint8
from xbench.models.inputs import to_uint8

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "parity" / "biovil"
CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
SAMPLES = ["00000001_000.png", "00027426_000.png"]
TOL = {"atol": 1e-4, "rtol": 1e-4}  # embeddings and intermediates (observed max 3.5e-6)
SCORE_TOL = {"atol": 1e-6, "rtol": 0.0}  # observed max 2.0e-8; the two images' scores differ by >= 1.0e-4
MAP_TOL = {"atol": 1e-5, "rtol": 0.0}  # observed max 9.4e-8; maps of two classes / images differ by >= 7.5e-3


def _states(schema: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return build_state(schema["containers"]["image"]), build_state(schema["containers"]["text"])


@pytest.fixture(scope="module")
def run(tmp_path_factory, test_device):
    torch.set_num_threads(2)
    folder = tmp_path_factory.mktemp("biovil")
    fixture = load_fixture(FIXTURE)
    fx = fixture["tensors"]
    image_state, text_state = _states(fixture["schema"])
    torch.save(image_state, folder / "biovil_image_resnet50_proj_size_128.pt")
    write_vocab(folder, fixture["json"]["vocab"])
    tokenizer = cxr_bert_tokenizer(folder)
    adapter = BioViLAdapter.from_checkpoint(load_checkpoint(folder / "biovil_image_resnet50_proj_size_128.pt"),
                                            text_state, tokenizer, device=test_device)
    captured: dict[str, torch.Tensor] = {}
    hooks = [adapter.image_model.encoder.register_forward_hook(lambda m, i, o: captured.__setitem__("trunk", o)),
             adapter.image_model.register_forward_hook(lambda m, i, o: captured.__setitem__("patches", o))]
    pixels = fx["image_uint8"].float().div(255)[:, None].repeat(1, 3, 1, 1)
    prediction = adapter.predict(pixels, CLASSES)
    for hook in hooks:
        hook.remove()
    return SimpleNamespace(fx=fx, schema=fixture["schema"], adapter=adapter, pixels=pixels, prediction=prediction,
                           tokenizer=tokenizer, captured={k: v.detach().cpu() for k, v in captured.items()})


def test_preprocessing_matches_fixture(run):
    for i, file in enumerate(SAMPLES):
        image = read_image(shared_path("samples", file))
        assert np.array_equal(remap_to_uint8(to_uint8(image)), run.fx["image_remapped_uint8"][i].numpy())
        assert torch.equal(run.adapter.preprocess(image), run.pixels[i])  # Resize(512) no-op, CenterCrop(480)


def test_official_token_ids(run):
    pos, neg, phrase = run.adapter.prompt_texts(CLASSES)
    k = len(run.adapter.positive)
    for c in range(4):
        for side, texts in (("pos", pos[c * k:(c + 1) * k]), ("neg", neg[c * k:(c + 1) * k]), ("map", [phrase[c]])):
            enc = run.tokenizer(texts, padding="longest", return_tensors="pt")
            assert torch.equal(enc["input_ids"], run.fx[f"{side}_input_ids_c{c}"]), (side, c)
            assert torch.equal(enc["attention_mask"], run.fx[f"{side}_attention_mask_c{c}"]), (side, c)


def test_intermediates_match(run):
    fx, got = run.fx, run.captured
    torch.testing.assert_close(got["trunk"][0, :256], fx["trunk_features_img0_ch0_255"], **TOL)
    torch.testing.assert_close(got["trunk"].mean(dim=(2, 3)), fx["image_pool"], **TOL)
    patches = torch.nn.functional.normalize(got["patches"], dim=1)
    torch.testing.assert_close(patches[0].permute(1, 2, 0), fx["patch_emb_img0"], **TOL)
    glob = torch.nn.functional.normalize(got["patches"].mean(dim=(2, 3)), dim=-1)
    torch.testing.assert_close(glob, fx["image_global_emb"], **TOL)
    pos, neg, phrase = run.adapter.prompt_texts(CLASSES)
    emb = run.adapter.encode_text(pos + neg).cpu().reshape(2, 4, 4, -1)
    torch.testing.assert_close(emb[0], fx["pos_text_emb_raw"], **TOL)
    torch.testing.assert_close(emb[1], fx["neg_text_emb_raw"], **TOL)
    torch.testing.assert_close(run.adapter.encode_prompts(CLASSES)[2].cpu(), fx["map_text_emb"], **TOL)


def test_scores_and_maps_match(run):
    fx, pred = run.fx, run.prediction
    assert pred.scores.shape == (2, 4) and pred.maps.shape == (2, 4, 15, 15)
    assert pred.scores.dtype == torch.float32 and pred.maps.dtype == torch.float32
    torch.testing.assert_close(pred.scores, fx["scores"], **SCORE_TOL)
    pos, neg, _ = run.adapter.encode_prompts(CLASSES)
    glob = torch.nn.functional.normalize(run.captured["patches"].mean(dim=(2, 3)), dim=-1)
    torch.testing.assert_close(glob @ pos.cpu().T, fx["score_pos"], **SCORE_TOL)
    torch.testing.assert_close(glob @ neg.cpu().T, fx["score_neg"], **SCORE_TOL)
    torch.testing.assert_close(pred.maps, fx["map_grid"], **MAP_TOL)


def test_official_full_size_map_is_the_grid_in_the_window(run):
    # get_similarity_map_from_raw_data: nearest x32 onto the 480 crop, NaN in the 16-px margins of the 512 image
    full = run.fx["map_full_img0_c0"]
    y0, x0, y1, x1 = (int(v) for v in run.adapter.input_window((512, 512)))
    assert (y0, x0, y1, x1) == (16, 16, 496, 496)
    inside = run.prediction.maps[0, 0].repeat_interleave(32, 0).repeat_interleave(32, 1)
    torch.testing.assert_close(full[y0:y1, x0:x1], inside, **MAP_TOL)
    outside = full.clone()
    outside[y0:y1, x0:x1] = float("nan")
    assert torch.isnan(outside).all()


def test_outputs_are_discriminative(run):
    pred = run.prediction
    for image in range(2):  # maps respond to the text
        for a in range(4):
            for b in range(a + 1, 4):
                assert (pred.maps[image, a] - pred.maps[image, b]).abs().max() > 100 * MAP_TOL["atol"]
                assert (pred.scores[:, a] - pred.scores[:, b]).abs().min() > 100 * SCORE_TOL["atol"]
    assert (pred.maps[0] - pred.maps[1]).abs().amax(dim=(-2, -1)).min() > 100 * MAP_TOL["atol"]  # and to the image
    assert (pred.scores[0] - pred.scores[1]).abs().min() > 50 * SCORE_TOL["atol"]


def test_single_image_forward_equals_batched(run):
    alone = run.adapter.predict(run.pixels[1:], CLASSES)
    torch.testing.assert_close(alone.scores, run.prediction.scores[1:], atol=1e-6, rtol=0)
    torch.testing.assert_close(alone.maps, run.prediction.maps[1:], atol=1e-6, rtol=0)


def test_truncated_or_foreign_checkpoint_is_rejected(run):
    image_state, text_state = _states(run.schema)
    broken = {k: v for k, v in image_state.items() if k != "projector.model.1.running_var"}
    with pytest.raises(CheckpointError, match=r"projector\.model\.1\.running_var"):
        BioViLAdapter.from_checkpoint(broken, text_state, run.tokenizer)
    broken = {k: v for k, v in text_state.items() if k != "cls_projection_head.LayerNorm.weight"}
    with pytest.raises(CheckpointError, match=r"cls_projection_head\.LayerNorm\.weight"):
        BioViLAdapter.from_checkpoint(image_state, broken, run.tokenizer)
    with pytest.raises(CheckpointError, match="not a BioViL image state dict"):
        BioViLAdapter.from_checkpoint(text_state, image_state, run.tokenizer)  # files swapped


def test_missing_weights_name_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match=r"biovil_image_resnet50_proj_size_128\.pt"):
        xbench.create_model("biovil")
    with pytest.raises(MissingFileError, match=r"biovil_image_resnet50_proj_size_128\.pt.*BiomedVLP-CXR-BERT"):
        xbench.create_model("biovil", weights=tmp_path)
