"""BiomedCLIP adapter: full-size random build from a local folder (config dict + tiny vocab) with every hub entry
point patched to fail, key layout vs open_clip's own CustomTextCLIP, score/map rules by hand, determinism,
weights round trip through open_clip_pytorch_model.bin, and the missing-file / bad-checkpoint errors."""
from __future__ import annotations

import shutil

import huggingface_hub
import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
import transformers
import transformers.utils.hub as transformers_hub

import xbench.models.biomedclip as biomedclip_module
from xbench.core.errors import CheckpointError, FormatError, MissingFileError
from xbench.models.base import create_model
from xbench.models.biomedclip import BiomedCLIP, BiomedCLIPAdapter
from xbench.spec.registry import model_config
from biomedclip_folder import OPEN_CLIP_CONFIG, VOCAB, write_folder

PROMPTS = ["pneumonia", "pleural effusion", "cardiomegaly"]
WEIGHTS_SOURCE = model_config("biomedclip")["weights"]["checkpoint"]["source"]
HUB_FUNCTIONS = [  # (owner, attribute): every way the stack could reach the hub
    (transformers.AutoConfig, "from_pretrained"), (transformers.AutoModel, "from_pretrained"),
    (huggingface_hub, "hf_hub_download"), (huggingface_hub, "snapshot_download"),
    (huggingface_hub.file_download, "hf_hub_download"), (huggingface_hub.file_download, "get_hf_file_metadata"),
    (open_clip.pretrained, "download_pretrained_from_hf"),
    *[(transformers_hub, name) for name in ("hf_hub_download", "snapshot_download", "get_hf_file_metadata")
      if hasattr(transformers_hub, name)],
]


@pytest.fixture(scope="module")
def hub_calls():
    """Patch every hub entry point to record and fail, with HF_HUB_OFFLINE=1, for the whole module."""
    calls: list[str] = []

    def guard(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"hub function {name} called with {args!r}")
        return fail

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        for owner, attr in HUB_FUNCTIONS:
            patch.setattr(owner, attr, guard(f"{getattr(owner, '__name__', owner)}.{attr}"))
        yield calls


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("biomedclip"))


@pytest.fixture(scope="module")
def adapter(hub_calls, folder) -> BiomedCLIPAdapter:
    return create_model("biomedclip", weights=folder, random_init=True)


@pytest.fixture(scope="module")
def pixels(adapter) -> torch.Tensor:
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:256, 0:256]
    blob = np.exp(-((yy - 60) ** 2 + (xx - 190) ** 2) / 600.0).astype(np.float32)
    images = [np.clip(0.3 + 0.6 * blob, 0, 1), rng.random((230, 280), dtype=np.float32)]
    return torch.stack([adapter.preprocess(im) for im in images])


@pytest.fixture(scope="module")
def prediction(adapter, pixels):
    return adapter.predict(pixels, PROMPTS)


def test_offline_random_build(adapter, hub_calls):
    assert hub_calls == []
    row = adapter.describe()
    assert row["weights"] == "random-init" and row["grid"] == "14x14" and row["map_source"] == "similarity"
    assert adapter.tokenizer.context_length == 256


def test_state_dict_layout_is_the_published_one(adapter):
    keys = set(adapter.model.state_dict())
    assert len(keys) == 351  # the key count of open_clip's own random BiomedCLIP build (no BERT pooler)
    assert {"visual.head.proj.weight", "text.proj.0.weight", "text.proj.2.weight", "logit_scale",
            "visual.trunk.cls_token", "text.transformer.embeddings.word_embeddings.weight"} <= keys
    assert not any("pooler" in k for k in keys)
    assert adapter.model.state_dict()["text.proj.0.weight"].shape == (640, 768)
    assert adapter.model.state_dict()["visual.head.proj.weight"].shape == (512, 768)


def test_same_modules_as_open_clip_custom_text_clip(monkeypatch):
    """On a small config, :class:`BiomedCLIP` has open_clip CustomTextCLIP's keys and shapes and, with the same
    weights, the same image and text embeddings (AutoConfig.from_pretrained stubbed for open_clip only)."""
    small_bert = transformers.BertConfig(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: small_bert)
    cfg = {"embed_dim": 32,
           "vision_cfg": {"timm_model_name": "vit_tiny_patch16_224", "timm_model_pretrained": False, "timm_pool": "",
                          "timm_proj": "linear", "image_size": 224},
           "text_cfg": {"hf_model_name": "bert-like", "hf_model_pretrained": False, "hf_proj_type": "mlp",
                        "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 16}}
    ours = BiomedCLIP(cfg, small_bert).eval()
    theirs = open_clip.CustomTextCLIP(**cfg).eval()
    own_state, their_state = ours.state_dict(), theirs.state_dict()
    assert {k: tuple(v.shape) for k, v in own_state.items()} == {k: tuple(v.shape) for k, v in their_state.items()}
    theirs.load_state_dict(own_state)
    image = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[2, 5, 6, 9, 3, 0, 0, 0], [2, 7, 3, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(ours.visual(image), theirs.encode_image(image), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.encode_text(ids), theirs.encode_text(ids), rtol=1e-5, atol=1e-5)


def test_preprocess_grey_replication(pixels):  # shapes, dtypes, score range: tests/models/test_contract.py
    mean = torch.tensor(OPEN_CLIP_CONFIG["preprocess_cfg"]["mean"])[:, None, None]
    std = torch.tensor(OPEN_CLIP_CONFIG["preprocess_cfg"]["std"])[:, None, None]
    grey = pixels * std + mean
    torch.testing.assert_close(grey[:, 0], grey[:, 1], rtol=0, atol=1e-5)
    assert grey.min() >= -1e-5 and grey.max() <= 1 + 1e-5


def test_maps_are_cosines(prediction):
    assert torch.all(prediction.maps.abs() <= 1 + 1e-5)


def test_score_and_map_rules_by_hand(adapter, pixels, prediction):
    model = adapter.model
    with torch.no_grad():
        ids = adapter.tokenizer(["a chest x-ray showing cardiomegaly", "a chest x-ray with no cardiomegaly"])
        assert ids.shape == (2, 256) and ids[0, 0].item() == VOCAB.index("[CLS]")
        pos, neg = F.normalize(model.text(ids), dim=-1)
        image = F.normalize(model.visual(pixels), dim=-1)  # TimmModel.forward: CLS → head
        tokens = model.visual.trunk.forward_features(pixels)[:, 1:]
        patches = F.normalize(model.visual.head(tokens), dim=-1)
    scale = model.logit_scale.exp()
    torch.testing.assert_close(prediction.scores[:, 2], torch.sigmoid(scale * (image @ pos - image @ neg)),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(prediction.maps[:, 2], (patches @ pos).reshape(2, 14, 14), rtol=1e-4, atol=1e-5)


def test_maps_respond_to_text_and_image(prediction):
    assert (prediction.maps[:, 0] - prediction.maps[:, 1]).abs().max() > 1e-3
    assert (prediction.maps[0] - prediction.maps[1]).abs().max() > 1e-3


def test_deterministic_and_batch_independent(adapter, pixels, prediction):
    again = adapter.predict(pixels, PROMPTS)
    torch.testing.assert_close(again.maps, prediction.maps, rtol=0, atol=0)
    single = adapter.predict(pixels[:1], PROMPTS[1:])
    torch.testing.assert_close(single.maps[0], prediction.maps[0, 1:], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(single.scores[0], prediction.scores[0, 1:], rtol=1e-4, atol=1e-5)


def test_weights_round_trip(adapter, folder, pixels, prediction, hub_calls, tmp_path):
    target = tmp_path / "official"
    shutil.copytree(folder, target)
    state = dict(adapter.model.state_dict())
    state["text.transformer.embeddings.position_ids"] = torch.arange(512)[None]  # as saved by transformers < 4.31
    torch.save(state, target / "open_clip_pytorch_model.bin")
    loaded = create_model("biomedclip", weights=target, seed=1)  # other init seed: the file must win
    assert loaded.weights_label == "official" and hub_calls == []
    out = loaded.predict(pixels, PROMPTS)
    torch.testing.assert_close(out.maps, prediction.maps, rtol=0, atol=0)
    torch.testing.assert_close(out.scores, prediction.scores, rtol=0, atol=0)


def test_truncated_checkpoint_lists_missing_key(adapter, monkeypatch):
    # the strict check fails before anything is loaded, so the module's network can stand in for a fresh build
    monkeypatch.setattr(biomedclip_module, "build_biomedclip", lambda *args, **kwargs: adapter.model)
    state = dict(adapter.model.state_dict())
    del state["text.proj.2.weight"]
    state["visual.head.proj.weight"] = torch.zeros(512, 100)
    with pytest.raises(CheckpointError, match=r"missing 1 \[text\.proj\.2\.weight\].*visual\.head\.proj\.weight: "
                                              r"checkpoint \(512, 100\) vs model \(512, 768\)"):
        BiomedCLIPAdapter.from_checkpoint(state, OPEN_CLIP_CONFIG["model_cfg"], adapter.tokenizer)


@pytest.mark.parametrize("name", ["open_clip_config.json", "vocab.txt", "tokenizer_config.json",
                                  "open_clip_pytorch_model.bin"])
def test_missing_file_names_it_and_the_publisher(name, folder, tmp_path, hub_calls):
    target = tmp_path / "partial"
    shutil.copytree(folder, target)
    (target / "open_clip_pytorch_model.bin").write_bytes(b"")  # present unless it is the one removed
    (target / name).unlink()
    with pytest.raises(MissingFileError, match=name.replace(".", r"\.")) as err:
        create_model("biomedclip", weights=target)
    assert WEIGHTS_SOURCE in str(err.value)


def test_no_folder_and_bad_config(tmp_path, monkeypatch, hub_calls):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    with pytest.raises(MissingFileError, match="open_clip_config.json") as err:
        create_model("biomedclip", random_init=True)
    assert WEIGHTS_SOURCE in str(err.value) and "XBENCH_WEIGHTS" in str(err.value)
    write_folder(tmp_path)
    (tmp_path / "open_clip_config.json").write_text('{"model_cfg": {"embed_dim": 512}}')
    with pytest.raises(FormatError, match="timm_model_name"):
        create_model("biomedclip", weights=tmp_path, random_init=True)
    (tmp_path / "open_clip_config.json").write_text('{"model_cfg": ')
    with pytest.raises(FormatError, match="invalid JSON"):
        create_model("biomedclip", weights=tmp_path, random_init=True)
