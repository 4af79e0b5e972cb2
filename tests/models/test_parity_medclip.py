"""MedCLIP-ViT adapter vs the official-code fixture tests/fixtures/parity/medclip (RyanWangZf/MedCLIP at 9c3396f2).

The synthetic ``pytorch_model.bin`` (recipe ``xbench-parity-recipe-v1`` on the stored schema, transformers-4.24 key
names) is written with ``torch.save``, read back by XBench's bounded reader and loaded by the adapter's own loader
(Swin key renaming for the installed transformers, constructed integer buffers). The tokenizer is a BERT WordPiece
tokenizer on the fixture's synthetic vocabulary (case.json ``vocab``), as the official ``AutoTokenizer`` was given.
Tolerances and observed maxima: the fixture's NOTES.md.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import shared_path
from parity_recipe import fill, load_fixture, write_vocab

import xbench
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.models.base import load_checkpoint
from xbench.models.medclip import MedCLIPAdapter, class_prompts
from xbench.models.text import load_bert_tokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "parity" / "medclip"
CLASSES = ["pneumonia", "pneumothorax", "cardiomegaly", "pleural effusion"]
SAMPLES = ["00000001_000.png", "00027426_000.png"]
TOL = {"atol": 1e-4, "rtol": 1e-4}  # embeddings and intermediates (observed max 3.1e-6, Swin tokens)
SCORE_TOL = {"atol": 1e-6, "rtol": 0.0}  # observed max 6.7e-8; images differ by >= 2.6e-3, classes by >= 9.6e-3
MAP_TOL = {"atol": 1e-5, "rtol": 0.0}  # observed max 1.1e-7; classes / images differ by >= 2.0e-2


def _state(schema: dict) -> dict[str, torch.Tensor]:
    """The synthetic file: recipe values for every float entry; the stored integer buffers (``position_ids``,
    ``relative_position_index``) are left out, as a file saved by newer transformers has them (the loader keeps the
    constructed ones either way)."""
    entries = schema["containers"]["state_dict"]
    return {k: fill(k, e["shape"]) for k, e in entries.items() if e["role"] != "buffer_constructed"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, test_device):
    torch.set_num_threads(2)
    folder = tmp_path_factory.mktemp("medclip")
    fixture = load_fixture(FIXTURE)
    fx = fixture["tensors"]
    torch.save(_state(fixture["schema"]), folder / "pytorch_model.bin")
    write_vocab(folder, fixture["json"]["vocab"])
    tokenizer = load_bert_tokenizer(folder)
    adapter = MedCLIPAdapter.from_checkpoint(load_checkpoint(folder / "pytorch_model.bin"), tokenizer,
                                             device=test_device)
    captured: dict[str, object] = {}
    swin = adapter.network.vision_model.model
    hook = swin.register_forward_hook(lambda m, i, o: captured.__setitem__("swin", o))
    pixels = fx["pixel_values"].repeat(1, 3, 1, 1)
    prediction = adapter.predict(pixels, CLASSES)
    hook.remove()
    return SimpleNamespace(fx=fx, case=fixture["json"], schema=fixture["schema"], adapter=adapter, pixels=pixels,
                           prediction=prediction, tokenizer=tokenizer, swin=captured["swin"])


def test_preprocessing_matches_fixture(run):
    from xbench.datasets.images import read_image

    for i, file in enumerate(SAMPLES):
        image = read_image(shared_path("samples", file))
        torch.testing.assert_close(run.adapter.preprocess(image), run.pixels[i], atol=1e-6, rtol=0)


def test_official_prompts_and_token_ids(run):
    counts = run.case["n_prompts"]
    for c, name in enumerate(CLASSES):
        texts = class_prompts(name, run.adapter.prompt_sets)
        assert len(texts) == counts[name]
        ids, mask = run.adapter.tokenize(texts)
        assert torch.equal(ids, run.fx[f"input_ids_c{c}"]) and torch.equal(mask, run.fx[f"attention_mask_c{c}"])


def test_intermediates_match(run):
    fx = run.fx
    torch.testing.assert_close(run.swin.last_hidden_state.cpu(), fx["swin_last_hidden_state"], **TOL)
    torch.testing.assert_close(run.swin.pooler_output.cpu(), fx["swin_pooler_output"], **TOL)
    texts = run.adapter.encode_prompts(CLASSES)
    for c in range(4):
        torch.testing.assert_close(texts[c][:8].cpu(), fx[f"text_emb_first8_c{c}"], **TOL)
        torch.testing.assert_close(texts[c].mean(0).cpu(), fx["text_emb_mean"][c], **TOL)
    scale = run.adapter.network.logit_scale.clamp(0, 4.6052).exp().reshape(1).cpu()
    torch.testing.assert_close(scale, fx["logit_scale_exp"], atol=0, rtol=0)


def test_scores_and_maps_match(run):
    pred = run.prediction
    assert pred.scores.shape == (2, 4) and pred.maps.shape == (2, 4, 7, 7)
    torch.testing.assert_close(pred.scores, run.fx["scores"], **SCORE_TOL)
    torch.testing.assert_close(pred.maps, run.fx["map_grid"], **MAP_TOL)


def test_outputs_are_discriminative(run):
    pred = run.prediction
    for image in range(2):
        for a in range(4):
            for b in range(a + 1, 4):
                assert (pred.maps[image, a] - pred.maps[image, b]).abs().max() > 100 * MAP_TOL["atol"]
                assert abs(float(pred.scores[image, a] - pred.scores[image, b])) > 100 * SCORE_TOL["atol"]
    assert (pred.scores[0] - pred.scores[1]).abs().min() > 100 * SCORE_TOL["atol"]
    assert (pred.maps[0] - pred.maps[1]).abs().amax(dim=(-2, -1)).min() > 100 * MAP_TOL["atol"]


def test_single_image_forward_equals_batched(run):
    alone = run.adapter.predict(run.pixels[1:], CLASSES)
    torch.testing.assert_close(alone.scores, run.prediction.scores[1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(alone.maps, run.prediction.maps[1:], atol=1e-6, rtol=0)


def test_class_embeddings_are_kept_per_class(run, monkeypatch):
    """Each class is its own tokenised batch, so its embeddings are kept per class: another class list that shares
    classes (reordered, one new) encodes only the new class, and its columns equal the first prediction's."""
    encoded: list[str] = []
    original = run.adapter.encode_class
    monkeypatch.setattr(run.adapter, "encode_class", lambda name: encoded.append(name) or original(name))
    other = [CLASSES[2], "edema", CLASSES[0]]
    pred = run.adapter.predict(run.pixels, other)
    assert encoded == ["edema"]
    for column, name in ((0, CLASSES[2]), (2, CLASSES[0])):
        index = CLASSES.index(name)
        assert torch.equal(pred.scores[:, column], run.prediction.scores[:, index])
        assert torch.equal(pred.maps[:, column], run.prediction.maps[:, index])


def test_truncated_or_foreign_checkpoint_is_rejected(run):
    state = _state(run.schema)
    del state["vision_model.projection_head.weight"]
    with pytest.raises(CheckpointError, match=r"vision_model\.projection_head\.weight"):
        MedCLIPAdapter.from_checkpoint(state, run.tokenizer)
    with pytest.raises(CheckpointError, match="not a MedCLIP-ViT state dict"):
        MedCLIPAdapter.from_checkpoint({"encoder.encoder.conv1.weight": torch.zeros(64, 3, 7, 7)}, run.tokenizer)


def test_missing_weights_name_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match=r"pytorch_model\.bin.*RyanWangZf/MedCLIP"):
        xbench.create_model("medclip", weights=tmp_path)


def test_window_is_the_padded_square():
    adapter = xbench.create_model("medclip", random_init=True)
    assert adapter.input_window((300, 260)) == (0.0, -20.0, 300.0, 280.0)
    assert adapter.input_window((100, 120)) == (-62.0, -52.0, 162.0, 172.0)  # min side 224
    image = np.ones((300, 260), np.float32)
    pixels = adapter.preprocess(image)[0]  # the pad is black, the image white: columns 0..14 of 224 are pad
    assert pixels[:, :12].max() < 0 and pixels[:, 30:190].min() > 0


def test_transformers_4_file_keys_map_to_the_installed_names():
    from xbench.models.medclip import official_state

    w, index = torch.ones(2, 2), torch.arange(4).reshape(2, 2)
    block = "vision_model.model.encoder.layers.0.blocks.0."
    file = {block + "attention.self.query.weight": w, block + "attention.output.dense.bias": w[0],
            block + "intermediate.dense.weight": w, block + "output.dense.weight": w,
            block + "attention.self.relative_position_index": index + 7,  # stored by transformers 4: dropped
            block + "attention.self.relative_position_bias_table": w}
    new_names = {block + "attention.q_proj.weight": w, block + "attention.o_proj.bias": w[0], block + "mlp.fc1.weight": w,
                 block + "mlp.fc2.weight": w, block + "attention.relative_position_bias.relative_position_bias_table": w,
                 "text_model.model.embeddings.position_ids": index}  # a persistent buffer the file lacks: as built
    assert set(official_state(file, new_names, "f")) == set(new_names)
    assert torch.equal(official_state(file, new_names, "f")["text_model.model.embeddings.position_ids"], index)
    old_names = dict(file)
    kept = official_state(file, old_names, "f")  # transformers 4 names: nothing renamed, the stored index kept
    assert set(kept) == set(file) and torch.equal(kept[block + "attention.self.relative_position_index"], index + 7)
