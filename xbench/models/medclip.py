"""MedCLIP (Swin-tiny variant): decoupled image–text contrastive model, zero-shot scores and patch–prompt cosine maps.

Citation
    Wang, Wu, Agarwal, Sun. "MedCLIP: Contrastive Learning from Unpaired Medical Images and Text". EMNLP 2022.
Official code
    https://github.com/RyanWangZf/MedCLIP (read at 9c3396f2; ``medclip/modeling_medclip.py``: ``MedCLIPModel``,
    ``MedCLIPVisionModelViT``, ``MedCLIPTextModel``, ``PromptClassifier``; ``medclip/dataset.py``:
    ``MedCLIPFeatureExtractor``, ``MedCLIPProcessor``; ``medclip/prompts.py``; ``medclip/constants.py``); PyPI
    ``medclip`` 0.0.3 is the same code. Nothing is copied; the modules below are re-written from those facts.
Variant
    ``MedCLIPVisionModelViT`` (Swin-tiny, ``microsoft/swin-tiny-patch4-window7-224``): the variant the official
    README's zero-shot ``PromptClassifier`` example builds (``MedCLIPModel(vision_cls=MedCLIPVisionModelViT)``,
    ``from_pretrained()``). The paper reports both image encoders; which one gives its best zero-shot numbers was not
    checked here (the paper text was not available offline). The ResNet-50 variant is not registered.
Why re-implemented, not a dependency
    ``medclip`` pins ``transformers>=4.23.1,<=4.24.0`` (XBench needs >= 4.36; the device image has 5.x), subclasses
    ``CLIPFeatureExtractor`` (removed in transformers 5), calls ``.cuda()`` unconditionally, downloads weights with
    ``wget`` and ``torch.load``s them, and pulls ``nltk``, ``textaugment`` and ``wget``. Its inference path is a
    ``SwinModel``, a ``BertModel`` and two bias-free linear projections.
Weights
    ``pytorch_model.bin`` of the released zip (the URL is read from ``medclip/medclip_vit_weight.txt`` of the official
    repository), one state dict: ``vision_model.model.*`` (HF ``SwinModel`` with its pooler), ``vision_model
    .projection_head.weight`` (512x768), ``text_model.model.*`` (HF ``BertModel``, Bio_ClinicalBERT, pooler
    included), ``text_model.projection_head.weight`` (512x768), ``logit_scale``. Swin keys of transformers 4.x
    (``attention.self.query``, ``intermediate.dense``, ...) are renamed to the installed transformers' names where
    those differ (5.x: ``attention.q_proj``, ``mlp.fc1``, ...); integer buffers stored by transformers 4
    (``position_ids``, ``relative_position_index``) are dropped where the installed modules construct them.
    Tokenizer: ``Bio_ClinicalBERT/`` (``vocab.txt``; https://huggingface.co/emilyalsentzer/Bio_ClinicalBERT).

Architecture
    * Image: ``SwinModel`` (patch 4, window 7, depths 2-2-6-2, dims 96-768), grey input copied to 3 channels;
      ``last_hidden_state`` (after the final LayerNorm) ``(B, 49, 768)`` row-major over the 7x7 grid; global
      embedding = ``projection_head(pooler_output)`` (mean of the 49 tokens), L2-normalised.
    * Text: ``BertModel`` with ``output_hidden_states``; embedding = mean over the sequence (**padding positions
      included**, as official) of the hidden states of layer 1, layer 2 and the last layer, averaged over the three,
      ``projection_head`` (768->512, no bias), L2-normalised.
Score (``score_rule: logit``)
    ``PromptClassifier(ensemble=True)``: per class, ``exp(clamp(logit_scale, 0, 4.6052)) * cos(image, prompt)``
    averaged over the class's prompts; the official evaluator turns a class logit into a probability with a sigmoid
    (binary / multilabel mode), which is :meth:`Adapter.to_probability`.
Prompts (``params.prompt_sets``)
    The official prompt components (``constants.CHEXPERT_CLASS_PROMPTS``, ``RSNA_CLASS_PROMPTS``,
    ``COVID_CLASS_PROMPTS``) joined as ``generate_*_class_prompts`` joins them (every combination, in loop order,
    separated by single spaces; ``n=None``: all of them, where the README samples 10 at random). Classes without
    official prompts use their name as the one prompt. Each class's prompts are tokenised as one batch
    (``padding=True``, ``truncation=True``, ``model_max_length = 77``), as ``process_class_prompts`` does: the
    padding length enters the text embedding (padding is averaged in).
Map (``map_source: similarity``; MedCLIP publishes none)
    Each of the 49 ``last_hidden_state`` tokens through the same ``projection_head`` (the global embedding is
    their mean, so the map decomposes the score's image side), L2-normalised, cosine with each of the class's
    prompt embeddings, averaged over the prompts (= the cosine with their unnormalised mean), row-major 7x7.
Preprocessing (``MedCLIPFeatureExtractor``)
    8-bit image -> zero-pad to a square of side ``max(224, H, W)`` (pasted at ``int((side - W) / 2)``,
    ``int((side - H) / 2)``) -> PIL ``resize((224, 224), BICUBIC)`` -> centre crop 224 (no-op) -> float32
    ``x * float32(1/255)``, minus 0.5862785803043838, divided by 0.27950088968644304 (as float32) -> 3 channels.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import BertConfig, BertModel, SwinConfig, SwinModel

from ..core.errors import CheckpointError
from ._common import HashWordTokenizer, build_uninitialised, check_inputs, seeded_build
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, with_yaml_facts
from .checkpoint import require_tensor_state
from .inputs import to_uint8
from .text import load_bert_tokenizer

__all__ = ["MedCLIPAdapter", "MedCLIPNetwork", "class_prompts", "official_state"]

MEAN, STD = 0.5862785803043838, 0.27950088968644304  # constants.IMG_MEAN / IMG_STD
MAX_LENGTH = 77
MAX_LOGIT_SCALE = 4.6052  # compute_logits clamps logit_scale to [0, 4.6052]
_CONSTRUCTED = re.compile(r"(position_ids|relative_position_index)$")
_SWIN_V5 = [(r"attention\.self\.query\.", "attention.q_proj."), (r"attention\.self\.key\.", "attention.k_proj."),
            (r"attention\.self\.value\.", "attention.v_proj."), (r"attention\.output\.dense\.", "attention.o_proj."),
            (r"attention\.self\.relative_position_bias_table$",
             "attention.relative_position_bias.relative_position_bias_table"),
            (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2.")]


class _Vision(nn.Module):
    def __init__(self, config: SwinConfig | None = None) -> None:
        super().__init__()
        self.model = SwinModel(config or SwinConfig())
        self.projection_head = nn.Linear(768, 512, bias=False)


class _Text(nn.Module):
    def __init__(self, config: BertConfig | None = None) -> None:
        super().__init__()
        self.model = BertModel(config or BertConfig(vocab_size=28996))
        self.projection_head = nn.Linear(768, 512, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
        layers = torch.stack([hidden[1], hidden[2], hidden[-1]])  # (3, n, L, 768)
        return self.projection_head(layers.permute(1, 0, 2, 3).mean(2).mean(1))


class MedCLIPNetwork(nn.Module):
    """``MedCLIPModel(vision_cls=MedCLIPVisionModelViT)``: state-dict keys are the released file's."""

    def __init__(self, bert_config: BertConfig | None = None) -> None:
        super().__init__()
        self.vision_model = _Vision()
        self.text_model = _Text(bert_config)
        self.logit_scale = nn.Parameter(torch.log(torch.tensor(1 / 0.07)))

    def image_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm Swin tokens ``(B, 49, 768)``."""
        return self.vision_model.model(pixel_values=pixels).last_hidden_state


def official_state(checkpoint: Any, own: Mapping[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """The released state dict in :class:`MedCLIPNetwork`'s key names (module docstring): Swin keys renamed to the
    installed transformers' names, stored integer buffers that the modules construct dropped (and constructed ones
    the file lacks kept as built)."""
    state = require_tensor_state(checkpoint, where)
    if "state_dict" in state or not any(k.startswith("vision_model.model.") for k in state):
        raise CheckpointError(f"{where}: not a MedCLIP-ViT state dict (no 'vision_model.model.*' keys)")
    v5 = any(".attention.q_proj." in k for k in own)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key
        if v5 and key.startswith("vision_model.model."):
            for pattern, repl in _SWIN_V5:
                name = re.sub(pattern, repl, name)
        if _CONSTRUCTED.search(name) and name not in own:
            continue
        out[name] = value
    for key, value in own.items():
        if _CONSTRUCTED.search(key) and key not in out:
            out[key] = value
    return out


def class_prompts(name: str, prompt_sets: Mapping[str, Sequence[Sequence[str]]]) -> list[str]:
    """The official prompts of class ``name`` (``f"{a} {b} {c}"`` over the components in loop order), or ``[name]``.

    >>> class_prompts("edema", {"edema": [["", "mild"], ["pulmonary edema"], [""]]})
    [' pulmonary edema ', 'mild pulmonary edema ']
    >>> class_prompts("pneumothorax", {})
    ['pneumothorax']
    """
    parts = prompt_sets.get(name.lower())
    if not parts:
        return [name]
    return [" ".join(combo) for combo in product(*parts)]


class MedCLIPAdapter(Adapter):
    """XBench adapter for MedCLIP-ViT (see the module docstring for every convention).

    Parameters
    ----------
    network : MedCLIPNetwork
    tokenizer : callable
        Bio_ClinicalBERT's WordPiece tokenizer, or the random-init :class:`~xbench.models._common.HashWordTokenizer`.
    config : mapping, optional
        Model config (registry entry ``medclip``).
    device : str or torch.device
    """

    config_name = "medclip"

    def __init__(self, network: MedCLIPNetwork, tokenizer: Any, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(config, device)
        self.network = network.to(self.device).eval()
        self.tokenizer = tokenizer
        params = self.config.get("params") or {}
        self.prompt_sets: dict[str, list[list[str]]] = {str(k).lower(): [list(p) for p in v]
                                                        for k, v in (params.get("prompt_sets") or {}).items()}
        self._classes: dict[str, torch.Tensor] = {}  # class name -> its prompt embeddings (see encode_prompts)
        side = self.input_size // 32  # Swin: patch 4, three 2x patch mergings
        self.check_fact("grid", (side, side), f"input_size {self.input_size} through Swin's stride 32")

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> MedCLIPAdapter:
        """``checkpoint`` (``pytorch_model.bin``) and the ``text_encoder`` tokenizer folder (``vocab.txt``)."""
        source = config["weights"]["text_encoder"].get("source")
        tokenizer = load_bert_tokenizer(files["text_encoder"], source=source)
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]), tokenizer, config=config, device=device,
                                   where=str(files["checkpoint"]))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> MedCLIPAdapter:
        """Full-size network with torch's default initialisation seeded by ``params.seed`` and the
        :class:`~xbench.models._common.HashWordTokenizer` stand-in."""
        network = seeded_build(int(config["params"].get("seed", 0)), MedCLIPNetwork)
        return cls(network, HashWordTokenizer(MAX_LENGTH), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, tokenizer: Any, config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu", where: str = "MedCLIP checkpoint") -> MedCLIPAdapter:
        """Adapter from the loaded ``pytorch_model.bin`` state dict; strict load after :func:`official_state`
        (a mismatch raises :class:`CheckpointError` naming the keys). The BERT vocabulary size comes from the file."""
        raw = require_tensor_state(checkpoint, where)
        words = raw.get("text_model.model.embeddings.word_embeddings.weight")
        bert_config = BertConfig(vocab_size=int(words.shape[0]) if words is not None else 28996)
        network = build_uninitialised(lambda: MedCLIPNetwork(bert_config))
        load_state_strict(network, official_state(raw, network.state_dict(), where), where)
        adapter = cls(network, tokenizer, with_yaml_facts(cls.config_name, config), device)
        adapter.weights_label = "official"
        return adapter

    # -- inputs --------------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] -> ``(3, 224, 224)`` float32 (module docstring)."""
        grey = Image.fromarray(to_uint8(image))
        w, h = grey.size
        side = max(self.input_size, w, h)
        square = Image.new("L", (side, side), 0)
        square.paste(grey, (int((side - w) / 2), int((side - h) / 2)))
        resized = np.asarray(square.resize((self.input_size, self.input_size), Image.BICUBIC))
        x = (resized.astype(np.float32) * np.float32(1 / 255.0) - np.float32(MEAN)) / np.float32(STD)
        return torch.from_numpy(np.ascontiguousarray(x)).unsqueeze(0).repeat(3, 1, 1)

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """The zero-padded square (side ``max(224, H, W)``, image pasted at ``int(pad / 2)``), in original pixels."""
        h, w = int(size[0]), int(size[1])
        side = max(self.input_size, h, w)
        y0, x0 = -int((side - h) / 2), -int((side - w) / 2)
        return (float(y0), float(x0), float(y0 + side), float(x0 + side))

    # -- forward pieces --------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """One class's prompts as ``process_class_prompts`` tokenises them (padded to the longest)."""
        if isinstance(self.tokenizer, HashWordTokenizer):
            ids, mask = self.tokenizer(list(texts))
            width = int(mask.sum(1).max())
            return ids[:, :width], mask[:, :width]
        enc = self.tokenizer(list(texts), truncation=True, padding=True, max_length=MAX_LENGTH, return_tensors="pt")
        return enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)

    @torch.no_grad()
    def encode_class(self, name: str) -> torch.Tensor:
        """L2-normalised prompt embeddings ``(n, 512)`` of class ``name``."""
        ids, mask = self.tokenize(class_prompts(name, self.prompt_sets))
        return F.normalize(self.network.text_model(ids.to(self.device), mask.to(self.device)), dim=-1)

    def encode_prompts(self, prompts: Sequence[str]) -> list[torch.Tensor]:
        """:meth:`encode_class` of each class, kept per class: each class's prompts are one tokenised batch of their
        own, so a class shared by several datasets (Pneumonia: 312 official prompts) is encoded once per adapter."""
        for name in prompts:
            if name not in self._classes:
                self._classes[name] = self.encode_class(name)
        return [self._classes[name] for name in prompts]

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Ensemble logits ``(B, C)`` and patch–prompt cosine maps ``(B, C, 7, 7)``."""
        check_inputs(pixels, prompts, self.input_size)
        texts = self.encode_prompts(prompts)
        tokens = self.network.image_tokens(pixels.to(self.device, torch.float32))  # (B, 49, 768)
        head = self.network.vision_model.projection_head
        image = F.normalize(head(tokens.mean(dim=1)), dim=-1)
        patches = F.normalize(head(tokens), dim=-1)
        scale = self.network.logit_scale.clamp(0, MAX_LOGIT_SCALE).exp()
        scores = torch.stack([(scale * image @ t.T).mean(dim=1) for t in texts], dim=1)
        maps = torch.stack([(patches @ t.T).mean(dim=-1) for t in texts], dim=1)
        return Prediction(scores=scores.float().cpu(), maps=maps.reshape(*maps.shape[:2], *self.grid).float().cpu())
