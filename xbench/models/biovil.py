"""BioViL: ResNet-50 image encoder + CXR-BERT, zero-shot scores and patch–text similarity maps.

Citation
    Boecking, Usuyama, Bannur, Castro, Schwaighofer, Hyland, Wetscherek, Naumann, Nori, Alvarez-Valle, Poon,
    Oktay. "Making the Most of Text Semantics to Improve Biomedical Vision-Language Processing". ECCV 2022.
Official code
    https://github.com/microsoft/hi-ml (read at b67c1d27; ``hi-ml-multimodal/src/health_multimodal``:
    ``image/model/{model,encoder,modules,resnet,pretrained}.py``, ``image/data/{io,transforms}.py``,
    ``image/utils.py``, ``text/model/modelling_cxrbert.py``, ``text/{inference_engine,data/io}.py``,
    ``vlp/inference_engine.py``, ``test_multimodal/vlp/test_zero_shot_classification.py``); PyPI
    ``hi-ml-multimodal`` 0.2.2 is the same code. Nothing is copied; the modules below are re-written from those facts.
Why re-implemented, not a dependency
    ``hi-ml-multimodal`` pins nothing (``torch``, ``transformers``, ``timm`` unpinned) but pulls ``SimpleITK``,
    ``pydicom``, ``scikit-image`` and ``matplotlib`` for its I/O and plots, imports the deprecated
    ``timm.models.layers``, and its text engine calls ``batch_encode_plus``, which transformers 5 removed (the
    parity fixture needed a shim for it). Its builders download from the hub and ``torch.load`` the image file.
    The inference path is ~100 lines (a torchvision ResNet-50, a 1x1-conv projector, ``BertModel`` plus a
    projection head), so XBench re-implements it and reads both files with its own bounded loader.
Weights
    From https://huggingface.co/microsoft/BiomedVLP-CXR-BERT-specialized (revision ``v1.1``, the revision the
    official builder pins): ``biovil_image_resnet50_proj_size_128.pt`` (the image model's state dict, keys
    ``encoder.encoder.*`` = torchvision ResNet-50 incl. its unused ``fc``, ``projector.model.{0,1,3}.*``) and the
    CXR-BERT folder (``config.json``, ``pytorch_model.bin`` with ``bert.*``, the unused masked-LM head ``cls.*`` and
    ``cls_projection_head.*``; ``vocab.txt``). The folder's ``config.json`` declares the custom ``cxr-bert`` type
    with remote code: only its numbers are read, no code runs.

Architecture
    * Image (``ImageModel``, ``ImageEncoderType.RESNET50``): ResNet-50 conv1..layer4, no dilation, ``(B, 2048,
      15, 15)`` for a 480 input; projector ``Conv1x1(2048->128, no bias) -> BatchNorm2d -> ReLU -> Conv1x1(128->128)``
      -> projected patch embeddings ``(B, 128, 15, 15)``. Global embedding = spatial mean of the projected patch
      embeddings (not of normalised ones).
    * Text (``CXRBertModel``): bert-base (``BertForMaskedLM`` body, no pooler); the ``[CLS]`` vector of the last
      layer -> ``cls_projection_head`` = Linear(768->128) -> exact-erf GELU -> LayerNorm(eps 1e-12) ->
      Linear(128->128).

Score (``score_rule: logit``)
    The official zero-shot rule (``get_similarity_score_from_raw_data`` as the zero-shot example uses it): per class
    a set of positive and a set of negative prompts (``params.templates``; the example's pneumonia prompts with
    ``{}`` for the class name); each set's text embedding is the L2-normalised mean of its prompts' **unnormalised**
    projected embeddings; score = ``cos(img, pos) - cos(img, neg)`` with the L2-normalised global image embedding.
    The example decides "present" when ``cos(img, pos) > cos(img, neg)``, i.e. score > 0, which is
    ``sigmoid(score) >= 0.5`` (:meth:`Adapter.to_probability`); the sigmoid is not calibrated.
Map (``map_source: similarity``)
    ``get_similarity_map_from_raw_data`` for the single phrase ``params.map_template`` (``{}`` = class name):
    L2-normalised projected patch embeddings (layer4 -> projector, 15x15 grid, row-major) times the L2-normalised
    projected text embedding (cosine), then ``scipy.ndimage.gaussian_filter(sigma=1.5)`` (reflect borders, truncate
    4) on the grid. :meth:`BioViLAdapter.predict` returns this smoothed 15x15 grid; the official code then
    upsamples it (``nearest``) onto the 480 crop and pads the crop's margins with NaN — the evaluation places the
    grid into :meth:`input_window` instead.
Text input
    Templates filled with the prompt name as given; ``rstrip("!?.")`` as the official ``TextInput``; the CXR-BERT
    WordPiece tokenizer (uncased). All prompts of one call are tokenised in one padded batch (the official engine
    pads per call; padding changes nothing but float32 reduction order).
Preprocessing (``load_image`` + ``create_chest_xray_transform_for_inference(512, 480)``, ``ImageModelType.BIOVIL``)
    8-bit image (:func:`xbench.models.inputs.to_uint8`) -> official ``remap_to_uint8``: float64, minus its minimum,
    divided by its (new) maximum, times 255, truncated to uint8 -> ``Resize(512)`` of the shorter side (PIL
    bilinear) -> ``CenterCrop(480)`` -> ``ToTensor`` -> grey copied to 3 channels. No mean/std normalisation.
Decode-once feed
    The min-max remap depends on the whole image, so no per-grey-level table rebuilds the input
    (:func:`xbench.inference.calibration.model_input` finds none): BioViL's inputs are kept as float32 ``(3, 480, 480)``
    (2.8 MB per image) where the other models keep 8-bit codes.
Deviations
    The official reader remaps the file's own values (16-bit PNGs at 16 bits, DICOM ``pixel_array`` raw); XBench
    remaps its 8-bit image (:mod:`xbench.models.inputs`), which equals the official input for 8-bit files.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms.functional as TF
from PIL import Image
from scipy import ndimage
from torch import nn
from transformers import BertConfig, BertModel

from ..core.errors import CheckpointError, FormatError
from ._common import HashWordTokenizer, PromptCache, build_uninitialised, check_inputs, seeded_build
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, require_file, with_yaml_facts
from .checkpoint import require_tensor_state
from .inputs import to_uint8
from .text import bert_state_from_file, read_json

__all__ = ["BioViLAdapter", "BioViLImageModel", "CXRBertEncoder", "cxr_bert_tokenizer", "remap_to_uint8",
           "text_config_from_file"]

RESIZE = 512  # TRANSFORM_RESIZE of image/utils.py
SIGMA = 1.5  # _get_similarity_map_from_embeddings
JOINT = 128  # JOINT_FEATURE_SIZE
HEAD = "cls_projection_head."


# -- networks ------------------------------------------------------------------------------------
class _Trunk(nn.Module):
    """``ImageEncoder``: holds the torchvision ResNet-50 as ``encoder`` (checkpoint keys ``encoder.encoder.*``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torchvision.models.resnet50()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        r = self.encoder
        x = r.maxpool(r.relu(r.bn1(r.conv1(pixels))))
        return r.layer4(r.layer3(r.layer2(r.layer1(x))))


class _Projector(nn.Module):
    """``MLP(2048, 128, hidden 128, use_1x1_convs=True)``: keys ``projector.model.{0,1,3}.*``."""

    def __init__(self, channels: int = 2048, joint: int = JOINT) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(channels, joint, 1, bias=False), nn.BatchNorm2d(joint),
                                   nn.ReLU(inplace=True), nn.Conv2d(joint, joint, 1, bias=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class BioViLImageModel(nn.Module):
    """The official ``ImageModel`` (RESNET50, joint size 128): ``forward`` gives projected patch embeddings
    ``(B, 128, h, w)``; its state-dict keys are the released file's."""

    def __init__(self, joint: int = JOINT) -> None:
        super().__init__()
        self.encoder = _Trunk()
        self.projector = _Projector(2048, joint)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(pixels))


class _ProjectionHead(nn.Module):
    """``BertProjectionHead``: dense_to_hidden -> GELU (erf) -> LayerNorm (eps 1e-12) -> dense_to_output."""

    def __init__(self, hidden: int, projection: int) -> None:
        super().__init__()
        self.dense_to_hidden = nn.Linear(hidden, projection)
        self.LayerNorm = nn.LayerNorm(projection, eps=1e-12)
        self.dense_to_output = nn.Linear(projection, projection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_to_output(self.LayerNorm(F.gelu(self.dense_to_hidden(x))))


class CXRBertEncoder(nn.Module):
    """CXR-BERT's inference path: ``bert`` (``BertModel`` without pooler) and ``cls_projection_head``; ``forward``
    gives the unnormalised projected ``[CLS]`` embeddings ``(n, projection)``."""

    def __init__(self, config: BertConfig, projection: int = JOINT) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls_projection_head = _ProjectionHead(config.hidden_size, projection)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.cls_projection_head(hidden[:, 0])


# -- files ----------------------------------------------------------------------------------------
_BERT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
              "type_vocab_size", "layer_norm_eps", "pad_token_id")


def text_config_from_file(path: Path) -> tuple[BertConfig, int]:
    """``(BertConfig, projection_size)`` from CXR-BERT's ``config.json``: only the BERT numbers and
    ``projection_size`` are read (its ``model_type: cxr-bert`` / ``auto_map`` remote code is ignored)."""
    data = read_json(path)
    config = BertConfig(**{k: data[k] for k in _BERT_KEYS if k in data})
    return config, int(data.get("projection_size", JOINT))


def _text_state(state: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    """A CXR-BERT file's state → :class:`CXRBertEncoder` keys (``bert.*`` kept, masked-LM ``cls.*`` and a stored
    ``position_ids`` dropped: :data:`xbench.models.text.IGNORED_KEYS`)."""
    state = require_tensor_state(state, where)
    head = {k: v for k, v in state.items() if k.startswith(HEAD)}
    bert = bert_state_from_file({k: v for k, v in state.items() if not k.startswith(HEAD)}, where, use_pooler=False)
    return {**{f"bert.{k}": v for k, v in bert.items()}, **head}


def _text_config_from_state(state: Mapping[str, torch.Tensor], config: BertConfig | None) -> tuple[BertConfig, int]:
    """``config`` (bert-base when None) with the vocabulary size and projection size read from the tensors."""
    config = BertConfig.from_dict(config.to_dict()) if config is not None else BertConfig()
    words = state.get("bert.embeddings.word_embeddings.weight")
    if words is not None:
        config.vocab_size = int(words.shape[0])
    head = state.get(HEAD + "dense_to_hidden.weight")
    return config, int(head.shape[0]) if head is not None else JOINT


def cxr_bert_tokenizer(folder: Path, source: str | None = None) -> Any:
    """``BertTokenizer`` from CXR-BERT's ``vocab.txt`` (``do_lower_case`` from ``tokenizer_config.json``, default
    True). Built from the vocabulary file alone: the folder's ``config.json`` declares the ``cxr-bert`` remote-code
    type, which :func:`xbench.models.text.load_bert_tokenizer` refuses and XBench never runs. A tokenizer that did not
    take every line of the file (transformers 5 ignores a ``vocab_file=`` argument) raises :class:`FormatError`."""
    from transformers import BertTokenizer

    vocab = require_file(folder, "vocab.txt", "CXR-BERT vocabulary", source)
    lower = True
    if (folder / "tokenizer_config.json").is_file():
        lower = bool(read_json(folder / "tokenizer_config.json").get("do_lower_case", True))
    try:
        tokenizer = BertTokenizer(vocab=str(vocab), do_lower_case=lower)  # transformers >= 5
    except TypeError:
        tokenizer = BertTokenizer(vocab_file=str(vocab), do_lower_case=lower)  # transformers 4
    lines = {t for t in vocab.read_text(encoding="utf-8").splitlines() if t.strip()}
    if len(tokenizer.get_vocab()) < len(lines):
        raise FormatError(vocab, f"{len(lines)} tokens in the file but the tokenizer holds {len(tokenizer.get_vocab())}")
    return tokenizer


def _encode(tokenizer: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(tokenizer, HashWordTokenizer):
        return tokenizer(texts)
    enc = tokenizer(texts, add_special_tokens=True, padding="longest", return_tensors="pt")
    return enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)


# -- preprocessing ---------------------------------------------------------------------------------
def remap_to_uint8(image: np.ndarray) -> np.ndarray:
    """Official ``remap_to_uint8`` without percentiles: float64, ``-= min``, ``/= max``, ``*= 255``, truncating cast.

    >>> remap_to_uint8(np.array([[10, 20], [30, 110]], np.uint8)).tolist()
    [[0, 25], [51, 255]]
    """
    array = image.astype(float)
    array -= array.min()
    peak = array.max()
    if peak > 0:  # a constant image: the official code divides 0 by 0 (NaN); XBench gives zeros
        array /= peak
    array *= 255
    return array.astype(np.uint8)


# -- adapter ---------------------------------------------------------------------------------------
class BioViLAdapter(Adapter):
    """XBench adapter for BioViL (see the module docstring for every convention).

    Parameters
    ----------
    image_model : BioViLImageModel
    text_model : CXRBertEncoder
    tokenizer : callable
        A BERT WordPiece tokenizer (CXR-BERT's ``vocab.txt``) or the random-init
        :class:`~xbench.models._common.HashWordTokenizer`.
    config : mapping, optional
        Model config (registry entry ``biovil``).
    device : str or torch.device
    """

    config_name = "biovil"

    def __init__(self, image_model: BioViLImageModel, text_model: CXRBertEncoder, tokenizer: Any,
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(config, device)
        self.image_model = image_model.to(self.device).eval()
        self.text_model = text_model.to(self.device).eval()
        self.tokenizer = tokenizer
        params = self.config.get("params") or {}
        templates = params.get("templates") or {}
        self.positive: list[str] = list(templates.get("positive") or [])
        self.negative: list[str] = list(templates.get("negative") or [])
        self.map_template: str = str(params.get("map_template", ""))
        self.resize = int(params.get("resize", RESIZE))
        if not self.positive or not self.negative or "{}" not in self.map_template:
            raise ValueError("biovil needs params.templates.positive / .negative (lists) and params.map_template "
                             "with '{}' in the model YAML")
        self._text: PromptCache[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = PromptCache()
        side = -(-self.input_size // 32)  # ResNet-50: five stride-2 stages with ceil-mode padding arithmetic
        self.check_fact("grid", (side, side), f"input_size {self.input_size} through ResNet-50's stride 32")

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> BioViLAdapter:
        """Image ``checkpoint`` and the CXR-BERT ``text_encoder`` folder (``config.json``, ``pytorch_model.bin``,
        ``vocab.txt``), all read by XBench's bounded loader; the tokenizer is a plain ``BertTokenizer``."""
        folder = files["text_encoder"]
        source = config["weights"]["text_encoder"].get("source")
        text_config, _ = text_config_from_file(require_file(folder, "config.json", "CXR-BERT config", source))
        weights = require_file(folder, "pytorch_model.bin", "CXR-BERT weights", source)
        tokenizer = cxr_bert_tokenizer(folder, source)
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]), load_checkpoint(weights), tokenizer, text_config,
                                   config=config, device=device, where=(str(files["checkpoint"]), str(weights)))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> BioViLAdapter:
        """Full-size networks with torch's default initialisation seeded by ``params.seed`` (global RNG restored)
        and the :class:`~xbench.models._common.HashWordTokenizer` stand-in."""
        seed = int(config["params"].get("seed", 0))
        image, text = seeded_build(seed, lambda: (BioViLImageModel(), CXRBertEncoder(BertConfig())))
        return cls(image, text, HashWordTokenizer(), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, text_checkpoint: Any, tokenizer: Any,
                        text_config: BertConfig | None = None, config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu",
                        where: tuple[str, str] = ("BioViL image checkpoint", "CXR-BERT checkpoint")) -> BioViLAdapter:
        """Adapter from the two loaded state dicts (``checkpoint``: the image file; ``text_checkpoint``: the CXR-BERT
        file); strict loads, a mismatch raises :class:`CheckpointError` naming the keys. The vocabulary and projection
        sizes come from the tensors."""
        image_state = require_tensor_state(checkpoint, where[0])
        if "state_dict" in image_state or not any(k.startswith("encoder.encoder.") for k in image_state):
            raise CheckpointError(f"{where[0]}: not a BioViL image state dict (no 'encoder.encoder.*' keys)")
        text_state = _text_state(text_checkpoint, where[1])
        bert_config, projection = _text_config_from_state(text_state, text_config)
        image_model = build_uninitialised(lambda: BioViLImageModel(int(image_state["projector.model.3.bias"].shape[0])
                                                                   if "projector.model.3.bias" in image_state else JOINT))
        load_state_strict(image_model, image_state, where[0])
        text_model = build_uninitialised(lambda: CXRBertEncoder(bert_config, projection))
        own = text_model.state_dict()
        for key in own:  # a persistent position_ids buffer (older transformers) keeps its constructed value
            if key not in text_state and re.search(r"position_ids$", key):
                text_state[key] = own[key]
        load_state_strict(text_model, text_state, where[1])
        adapter = cls(image_model, text_model, tokenizer, with_yaml_facts(cls.config_name, config), device)
        adapter.weights_label = "official"
        return adapter

    # -- inputs --------------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] -> ``(3, 480, 480)`` float32 in [0, 1] (module docstring)."""
        pil = Image.fromarray(remap_to_uint8(to_uint8(image))).convert("L")
        pil = TF.center_crop(TF.resize(pil, self.resize), [self.input_size, self.input_size])
        return TF.to_tensor(pil).repeat(3, 1, 1)

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """``Resize(512)`` of the shorter side then ``CenterCrop(480)``, in original pixels (torchvision's sizes:
        the longer side ``int(512 * long / short)``, crop offset ``int(round((resized - 480) / 2))``)."""
        h, w = int(size[0]), int(size[1])
        short = min(h, w)
        out = []
        for extent in (h, w):
            resized = self.resize if extent == short else int(self.resize * extent / short)
            offset = int(round((resized - self.input_size) / 2.0))
            scale = extent / resized
            out.append((offset * scale, (offset + self.input_size) * scale))
        (y0, y1), (x0, x1) = out
        return (y0, x0, y1, x1)

    def prompt_texts(self, prompts: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
        """Positive, negative (class-major, templates in YAML order) and map texts of ``prompts``."""
        fill = [lambda t, p=p: t.format(p).rstrip("!?.") for p in prompts]
        return ([f(t) for f in fill for t in self.positive], [f(t) for f in fill for t in self.negative],
                [f(self.map_template) for f in fill])

    # -- forward pieces --------------------------------------------------------------------------
    @torch.no_grad()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """Unnormalised projected ``[CLS]`` embeddings ``(n, 128)`` of ``texts`` (one tokenised batch)."""
        ids, mask = _encode(self.tokenizer, list(texts))
        return self.text_model(ids.to(self.device), mask.to(self.device))

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L2-normalised positive-set, negative-set and map-phrase embeddings, each ``(C, 128)``; cached."""
        def compute() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            pos, neg, phrase = self.prompt_texts(prompts)
            emb = self.encode_text(pos + neg + phrase)
            c = len(prompts)
            sets = emb[: c * (len(self.positive) + len(self.negative))]
            p = sets[: c * len(self.positive)].reshape(c, len(self.positive), -1).mean(1)
            n = sets[c * len(self.positive):].reshape(c, len(self.negative), -1).mean(1)
            return F.normalize(p, dim=-1), F.normalize(n, dim=-1), F.normalize(emb[-c:], dim=-1)
        return self._text.get(tuple(prompts), compute)

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``cos(img, pos) - cos(img, neg)`` ``(B, C)`` and smoothed patch–phrase cosine maps ``(B, C, 15, 15)``."""
        check_inputs(pixels, prompts, self.input_size)
        pos, neg, phrase = self.encode_prompts(prompts)
        patches = self.image_model(pixels.to(self.device, torch.float32))  # (B, 128, h, w)
        image = F.normalize(patches.mean(dim=(2, 3)), dim=-1)
        scores = image @ pos.T - image @ neg.T
        cosine = torch.einsum("bdhw,cd->bchw", F.normalize(patches, dim=1), phrase)
        smoothed = ndimage.gaussian_filter(cosine.detach().float().cpu().numpy(), sigma=(0, 0, SIGMA, SIGMA))
        return Prediction(scores=scores.float().cpu(), maps=torch.from_numpy(np.ascontiguousarray(smoothed)))
