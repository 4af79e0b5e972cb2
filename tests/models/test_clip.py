"""CLIP ViT-B/16 adapter on full-size random weights: preprocessing by hand, score rule by hand, maps vs open_clip's
``output_tokens`` path, MaskCLIP vs an independent attention-mask construction, determinism, weights round trips
(open_clip state dict and OpenAI-style TorchScript archive), and the error paths."""
from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import xbench.models.clip as clip_module
from xbench.core.errors import CheckpointError, MissingFileError
from xbench.models.base import create_model
from xbench.models.clip import CLIPAdapter, build_clip, read_clip_checkpoint
from xbench.spec.registry import model_config

WEIGHTS_SOURCE = model_config("clip")["weights"]["checkpoint"]["source"]

PROMPTS = ["pneumonia", "pleural effusion", "cardiomegaly"]
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def adapter() -> CLIPAdapter:
    return create_model("clip")  # config default: random_init true, seed 0


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:300, 0:260]
    blob = np.exp(-((yy - 90) ** 2 + (xx - 170) ** 2) / 900.0)
    first = np.clip(0.2 + 0.6 * blob + 0.05 * rng.random((300, 260)), 0, 1).astype(np.float32)
    second = np.clip(rng.random((240, 320)), 0, 1).astype(np.float32)
    return [first, second]


@pytest.fixture(scope="module")
def pixels(adapter, images) -> torch.Tensor:
    return torch.stack([adapter.preprocess(im) for im in images])


@pytest.fixture(scope="module")
def prediction(adapter, pixels):
    return adapter.predict(pixels, PROMPTS)


def _hand_preprocess(image: np.ndarray) -> np.ndarray:
    """8-bit → RGB → PIL bicubic resize of the shorter side to 224 → centre crop → OpenAI normalisation."""
    pil = Image.fromarray(np.round(image * 255).astype(np.uint8)).convert("RGB")
    w, h = pil.size
    scale = 224 / min(w, h)
    nw, nh = (224, int(h * scale)) if w <= h else (int(w * scale), 224)
    pil = pil.resize((nw, nh), Image.BICUBIC)
    left, top = int(round((nw - 224) / 2)), int(round((nh - 224) / 2))
    arr = np.asarray(pil.crop((left, top, left + 224, top + 224)), np.float32) / 255
    return ((arr - MEAN) / STD).transpose(2, 0, 1)


def test_random_init_metadata(adapter):
    row = adapter.describe()
    assert row["weights"] == "random-init" and row["map_source"] == "similarity" and row["grid"] == "14x14"
    assert adapter.score_rule == "probability" and adapter.map_variant == "naive"


def test_preprocess_matches_hand_pipeline(adapter, images, pixels):
    assert pixels.shape == (2, 3, 224, 224) and pixels.dtype == torch.float32
    for image, got in zip(images, pixels):
        np.testing.assert_allclose(got.numpy(), _hand_preprocess(image), rtol=0, atol=1e-5)
        grey = got.numpy() * STD[:, None, None] + MEAN[:, None, None]  # undo normalisation: channels equal
        np.testing.assert_allclose(grey[0], grey[1], atol=1e-5)
        np.testing.assert_allclose(grey[0], grey[2], atol=1e-5)


def test_maps_are_cosines(prediction):  # shapes, dtypes and score range: tests/models/test_contract.py
    assert torch.all(prediction.maps.abs() <= 1 + 1e-5)


def test_score_and_map_rules_by_hand(adapter, pixels, prediction):
    with torch.no_grad():
        ids = open_clip.get_tokenizer("ViT-B-16-quickgelu")(
            ["a chest x-ray showing pleural effusion", "a chest x-ray with no pleural effusion"])
        pos, neg = F.normalize(adapter.model.encode_text(ids), dim=-1)
        adapter.model.visual.output_tokens = True
        try:
            pooled, tokens = adapter.model.visual(pixels)  # = encode_image; tokens = ln_post(last block)[:, 1:]
        finally:
            adapter.model.visual.output_tokens = False
        image = F.normalize(pooled, dim=-1)
        patches = F.normalize(tokens @ adapter.model.visual.proj, dim=-1)
    expected_score = torch.sigmoid(100.0 * (image @ pos - image @ neg))  # 2-way softmax, positive's probability
    torch.testing.assert_close(prediction.scores[:, 1], expected_score, rtol=1e-4, atol=1e-5)
    expected_map = (patches @ pos).reshape(2, 14, 14)  # row-major over the grid
    torch.testing.assert_close(prediction.maps[:, 1], expected_map, rtol=1e-4, atol=1e-5)


def test_paper_sigmoid_score_rule_by_hand(adapter, pixels):
    """``score_mode: paper_sigmoid``: p_c = sigmoid(<h(x), g(t_c)>) on the normalised embeddings, one prompt per class
    in OpenAI CLIP's style (the YAML's paper_template); the map uses that prompt too."""
    params = {**model_config("clip")["params"], "score_mode": "paper_sigmoid"}
    paper = CLIPAdapter(adapter.model, {"params": params})
    out = paper.predict(pixels, PROMPTS)
    with torch.no_grad():
        ids = open_clip.get_tokenizer("ViT-B-16-quickgelu")(["a photo of a pleural effusion."])
        text = F.normalize(adapter.model.encode_text(ids), dim=-1)[0]
        image = F.normalize(adapter.model.encode_image(pixels), dim=-1)
    torch.testing.assert_close(out.scores[:, 1], torch.sigmoid(image @ text), rtol=1e-4, atol=1e-5)
    assert paper.templates == {"positive": "a photo of a {}."}
    with pytest.raises(ValueError, match="score_mode"):
        CLIPAdapter(adapter.model, {"params": {"score_mode": "sigmoid"}})


def test_maps_respond_to_text_and_image(prediction):
    assert (prediction.maps[:, 0] - prediction.maps[:, 1]).abs().max() > 1e-3
    assert (prediction.maps[0] - prediction.maps[1]).abs().max() > 1e-3


def test_deterministic_and_batch_independent(adapter, pixels, prediction):
    again = adapter.predict(pixels, PROMPTS)
    torch.testing.assert_close(again.maps, prediction.maps, rtol=0, atol=0)
    torch.testing.assert_close(again.scores, prediction.scores, rtol=0, atol=0)
    single = adapter.predict(pixels[1:], PROMPTS[::-1])
    torch.testing.assert_close(single.maps[0], prediction.maps[1].flip(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(single.scores[0], prediction.scores[1].flip(0), rtol=1e-4, atol=1e-5)


def test_text_embeddings_do_not_depend_on_the_other_prompts(adapter):
    """A prompt's embedding is the same whichever prompts came before it or with it (a run's other datasets, a
    rank's shard): multi-GPU stores are byte-identical to a one-GPU run (issue 16)."""
    adapter._text_cache.clear()
    adapter.text_embeddings(["cardiomegaly", "nodule", "pleural effusion"])
    after_others = adapter.text_embeddings(["nodule", "pneumothorax"])
    adapter._text_cache.clear()
    alone = adapter.text_embeddings(["nodule", "pneumothorax"])
    for a, b in zip(after_others, alone):
        assert torch.equal(a, b)
    adapter._text_cache.clear()


def test_maskclip_matches_identity_attention(adapter, pixels, prediction):
    """MaskCLIP's value path equals the last block's own nn.MultiheadAttention with each token attending only to
    itself (an additive mask of -inf off the diagonal), with residual and MLP dropped."""
    masked = CLIPAdapter(adapter.model, {"params": {"map_variant": "maskclip"}}, weights_label="random-init")
    out = masked.predict(pixels, PROMPTS)
    assert out.maps.shape == (2, 3, 14, 14)
    torch.testing.assert_close(out.scores, prediction.scores, rtol=0, atol=0)  # scores use the unmodified CLS
    assert (out.maps - prediction.maps).abs().max() > 1e-3

    visual = adapter.model.visual
    last = visual.transformer.resblocks[-1]

    def value_only(module, args, output):
        x = module.ln_1(args[0])
        n = x.shape[1]
        diagonal = torch.full((n, n), float("-inf")).fill_diagonal_(0.0)
        return module.attn(x, x, x, need_weights=False, attn_mask=diagonal)[0]

    handle = last.register_forward_hook(value_only)
    visual.output_tokens = True
    try:
        with torch.no_grad():
            _, tokens = visual(pixels)
    finally:
        visual.output_tokens = False
        handle.remove()
    with torch.no_grad():
        ids = open_clip.get_tokenizer("ViT-B-16-quickgelu")(["a chest x-ray showing pneumonia"])
        text = F.normalize(adapter.model.encode_text(ids), dim=-1)[0]
    expected = (F.normalize(tokens @ visual.proj, dim=-1) @ text).reshape(2, 14, 14)
    torch.testing.assert_close(out.maps[:, 0], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="map_variant"):
        CLIPAdapter(adapter.model, {"params": {"map_variant": "surgery"}})


def test_seeded_build_is_reproducible_and_leaves_global_rng(adapter):
    state = torch.get_rng_state()
    rebuilt = build_clip(seed=0)
    assert torch.equal(torch.get_rng_state(), state)
    for key in ("visual.proj", "token_embedding.weight", "visual.transformer.resblocks.11.attn.in_proj_weight"):
        assert torch.equal(rebuilt.state_dict()[key], adapter.model.state_dict()[key])


def test_weights_round_trip_state_dict(adapter, pixels, prediction, tmp_path):
    torch.save(adapter.model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    loaded = create_model("clip", weights=tmp_path, seed=1)  # a different init seed: the file must win
    assert loaded.weights_label == "official"
    out = loaded.predict(pixels, PROMPTS)
    torch.testing.assert_close(out.maps, prediction.maps, rtol=0, atol=0)
    torch.testing.assert_close(out.scores, prediction.scores, rtol=0, atol=0)


class _Archive(torch.nn.Module):
    """A TorchScript archive laid out like OpenAI's ``ViT-B-16.pt``: fp16 tensors under open_clip's key names."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_openai_torchscript_archive(adapter, tmp_path):
    """Reading the archive (a few of its tensors, to keep the file small): fp16 → float32, metadata dropped.
    The strict load of a full state dict is the path of ``test_weights_round_trip_state_dict``."""
    keys = ("visual.proj", "visual.transformer.resblocks.0.ln_1.weight", "logit_scale")
    weights = {k: adapter.model.state_dict()[k] for k in keys}
    state = {**{k: v.half() for k, v in weights.items()},
             "input_resolution": torch.tensor(224), "context_length": torch.tensor(77),
             "vocab_size": torch.tensor(49408)}
    root = _Archive()
    for key, value in state.items():
        *path, leaf = key.split(".")
        node = root
        for part in path:
            if part not in node._modules:
                node.add_module(part, torch.nn.Module())
            node = node._modules[part]
        node.register_buffer(leaf, value.clone())
    with pytest.warns((DeprecationWarning, FutureWarning, UserWarning)):
        torch.jit.save(torch.jit.trace(root, torch.zeros(1)), str(tmp_path / "ViT-B-16.pt"))
    got = read_clip_checkpoint(tmp_path / "ViT-B-16.pt")
    assert set(got) == set(keys)
    for key, value in weights.items():
        assert got[key].dtype == torch.float32
        assert torch.equal(got[key], value.half().float()), key


def test_truncated_checkpoint_lists_missing_key(adapter, monkeypatch):
    # the strict check fails before anything is loaded, so the module's network can stand in for a fresh build
    monkeypatch.setattr(clip_module, "build_clip", lambda seed=0, architecture=None: adapter.model)
    state = dict(adapter.model.state_dict())
    del state["visual.ln_post.weight"]
    state["visual.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"missing 1 \[visual\.ln_post\.weight\]; unexpected 1 \[visual\.extra\]"):
        CLIPAdapter.from_checkpoint(state)


def test_missing_weights(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match="open_clip_pytorch_model.bin") as err:
        create_model("clip", weights=tmp_path)
    assert WEIGHTS_SOURCE in str(err.value) and "ViT-B-16.pt" in str(err.value)
    with pytest.raises(MissingFileError, match="XBENCH_WEIGHTS"):
        create_model("clip", random_init=False)
    (tmp_path / "ViT-B-16.pt").write_bytes(b"not an archive")
    with pytest.raises(CheckpointError, match="TorchScript"):
        create_model("clip", weights=tmp_path)
