"""GLoRIA: global and local (word–subregion) image–text representations; zero-shot scores and word attention maps.

Citation
    Huang, Shen, Lungren, Yeung. "GLoRIA: A Multimodal Global-Local Representation Learning Framework for
    Label-efficient Medical Image Recognition". ICCV 2021.
Official code
    https://github.com/marshuang80/gloria (read at 416466a): ``gloria/gloria.py`` (``load_gloria``,
    ``get_similarities``, ``zero_shot_classification``), ``gloria/models/gloria_model.py`` (``process_img``,
    ``_resize_img``, ``process_text``, ``get_global_similarities``, ``get_local_similarities``),
    ``gloria/models/vision_model.py`` (``ImageEncoder``), ``gloria/models/text_model.py`` (``BertEncoder``),
    ``gloria/loss/gloria_loss.py`` (``attention_fn``, ``cosine_similarity``), ``configs/chexpert_pretrain_config.yaml``.
    Nothing is copied; the modules below are written from the facts in those files.
Weights
    ``chexpert_resnet50.ckpt`` (PyTorch-Lightning file; keys ``gloria.`` + model key, BERT included) from the authors'
    Box folder, and the tokenizer files of ``emilyalsentzer/Bio_ClinicalBERT`` (``vocab.txt``), which the official
    code fetches from the hub at build time. Read by XBench's restricted unpickler; the file's OmegaConf
    ``hyper_parameters`` become an inert placeholder (the architecture is fixed to the released configuration).

Architecture
    * Image (``ImageEncoder``): the input is upsampled to 299×299 (bilinear, ``align_corners=True``) inside the model;
      torchvision ResNet-50 ``conv1 … layer3`` → local features ``(B, 1024, 19, 19)``; ``layer4`` → average pool →
      ``(B, 2048)``; ``global_embedder`` Linear 2048→768 and ``local_embedder`` 1×1 conv 1024→768 without bias.
    * Text (``BertEncoder``, as CARZero's, which inherited it: :class:`~xbench.models.carzero.CARZeroTextEncoder`):
      hidden states of the last 4 BERT layers, word pieces merged into words, words = sum over the layers
      ``(n, 768, 97)`` (zero slots after ``[SEP]``), sentence = mean over all 97 slots then sum over the layers.
Score (``get_similarities(similarity_type="both")``, ``score_rule: logit``)
    ``global = cos(image global, sentence)``; ``local``: for the word slots ``1 … L`` of the prompt (see "Text
    input" for ``L``), ``attention_fn`` with ``temp1 = 4``: region–word products, softmax **over the L words** for
    each region, then softmax over the 361 regions of ``4 ×`` that; each word's attention-weighted region feature;
    ``local = log(max over the L words of exp(5 · cos(word, weighted feature)))``; score = ``(local + global) / 2``.
    Several prompts per class (``params.templates``): the maximum over them, as ``zero_shot_classification``.
    The official function then z-scores each class over the images of the call; XBench keeps the per-image score
    (a z-score over a batch would make a case's score depend on its batch; per class it is monotone, so AUROC is
    unchanged). The score is a similarity in about [-3, 3]; :meth:`Adapter.to_probability` applies a sigmoid
    (uncalibrated, as CARZero's).
Map (``map_source: cross-attention``; the zero-shot code returns none)
    The ``attention_fn`` weights of the score, ``(B, L, 19, 19)`` (softmax over regions), averaged over the prompt's
    **real** words (aggregated slots between ``[CLS]`` and ``[SEP]``; ``[SEP]`` and zero slots left out); for several
    prompts, the map of the prompt that gives the class score. Raw values at the native 19×19 grid of ``layer3``.
Text input
    ``params.templates`` (default ``["There is {}"]``, XBench's choice: the official prompts exist for five CheXpert
    classes only) with the prompt name; cleaned by :func:`~xbench.models.carzero.clean_text` (official
    ``process_text``) and tokenised to 97 tokens. ``L`` follows the official ``process_text``, which counts the
    **characters** of the raw prompt that are not ``"["`` (it iterates a string): "There is Pneumonia" gives
    ``L = 18`` word slots (3 words, ``[SEP]``, 14 zero slots, whose cosine is 0). Prompts longer than 96
    characters, which the official code cannot run, raise ``ValueError``.
Preprocessing (``process_img``)
    As CARZero's (:func:`~xbench.models.carzero.preprocess_stages`): 8-bit image (``cv2.imread(path, 0)``), longest
    side to ``params.resize`` (256) with ``INTER_AREA``, zero pad, ``CenterCrop(224)``, ``ToTensor``,
    ``Normalize(params.mean, params.std)`` = 0.5, 0.5 (``transforms.norm: half``).
Deviations
    BERT runs on the real token positions only (as CARZero's encoder); the file's ``position_ids`` buffer
    (transformers 4.2) is dropped before the strict load.
Parity
    ``tests/models/test_parity_gloria.py`` against ``tests/fixtures/parity/gloria``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from transformers import BertConfig

from ..core.errors import CheckpointError
from ._common import build_uninitialised, check_inputs, seeded_build
from .base import Prediction, load_checkpoint, load_state_strict
from .carzero import (
    CARZeroTextEncoder,
    WordPieceAdapter,
    bert_config_from_state,
    pad_crop_window,
    preprocess_stages,
)
from .checkpoint import require_tensor_state

__all__ = ["GLoRIAAdapter", "GLoRIAModel", "GLoRIAOutput", "gloria_state", "local_similarity", "word_slots"]

UPSAMPLE = 299  # ImageEncoder.resnet_forward: fixed-size input of the ResNet
MAX_WORDS = 97  # cfg.data.text.word_num
TEMP_ATTENTION, TEMP_WORDS = 4.0, 5.0  # attention_fn temp1 and get_local_similarities' 5.0
POSITION_IDS = "text_encoder.model.embeddings.position_ids"


class GLoRIAImageEncoder(nn.Module):
    """Official ``ImageEncoder`` (attribute names = checkpoint keys after ``img_encoder.``)."""

    def __init__(self, dim: int = 768):
        super().__init__()
        self.model = torchvision.models.resnet50(weights=None)
        self.model.fc = nn.Identity()
        self.global_embedder = nn.Linear(2048, dim)
        self.local_embedder = nn.Conv2d(1024, dim, kernel_size=1, stride=1, padding=0, bias=False)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``pixels (B, 3, S, S)`` → global ``(B, 768)`` and local ``(B, 768, 19, 19)`` embeddings."""
        m = self.model
        x = F.interpolate(pixels, size=(UPSAMPLE, UPSAMPLE), mode="bilinear", align_corners=True)
        x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
        local = m.layer3(m.layer2(m.layer1(x)))
        pooled = torch.flatten(m.avgpool(m.layer4(local)), 1)
        return self.global_embedder(pooled), self.local_embedder(local)


class GLoRIAModel(nn.Module):
    """The GLoRIA network with the official attribute names (checkpoint keys minus ``gloria.``)."""

    def __init__(self, bert_config: BertConfig | None = None):
        super().__init__()
        self.text_encoder = CARZeroTextEncoder(bert_config)
        self.img_encoder = GLoRIAImageEncoder()


def gloria_state(checkpoint: Any, where: str = "GLoRIA checkpoint") -> dict[str, torch.Tensor]:
    """``checkpoint['state_dict']`` with keys cut as ``load_gloria`` does (``k.split('gloria.')[-1]``) and BERT's
    ``position_ids`` buffer dropped. A missing ``state_dict`` or a non-tensor entry raises :class:`CheckpointError`."""
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("state_dict"), Mapping):
        got = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheckpointError(f"{where}: expected a Lightning dict with a 'state_dict' mapping "
                              f"(chexpert_resnet50.ckpt), got {got}")
    state = require_tensor_state(checkpoint["state_dict"], f"{where}['state_dict']")
    state = {k.split("gloria.")[-1]: v for k, v in state.items()}
    state.pop(POSITION_IDS, None)
    return state


def word_slots(prompt: str) -> int:
    """Word slots ``L`` the official local similarity uses for ``prompt``: its characters other than ``"["``."""
    slots = sum(1 for ch in prompt if ch != "[")
    if slots + 1 > MAX_WORDS:
        raise ValueError(f"GLoRIA prompt {prompt!r} has {slots} characters; the official local similarity takes that "
                         f"many word slots and fails above {MAX_WORDS - 1}")
    return slots


def local_similarity(words: torch.Tensor, regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Official ``get_local_similarities`` for one prompt and every image.

    ``words (768, L)`` (slots ``1 … L``), ``regions (B, 768, h, w)`` → local similarity ``(B,)`` and the word
    attention ``(B, L, h, w)`` (softmax over the regions).
    """
    b, dim, h, w = regions.shape
    context = regions.reshape(b, dim, h * w)
    query = words.unsqueeze(0).expand(b, -1, -1)
    attn = torch.bmm(context.transpose(1, 2), query).softmax(dim=-1)  # (B, hw, L): over the words
    attn = (attn.transpose(1, 2) * TEMP_ATTENTION).softmax(dim=-1)  # (B, L, hw): over the regions
    weighted = torch.bmm(context, attn.transpose(1, 2))  # (B, 768, L)
    dot = (query * weighted).sum(dim=1)
    cos = dot / (query.norm(dim=1) * weighted.norm(dim=1)).clamp(min=1e-8)
    local = torch.log(torch.exp(cos * TEMP_WORDS).max(dim=1).values)
    return local, attn.reshape(b, -1, h, w)


@dataclass
class GLoRIAOutput:
    """One forward pass for ``B`` images and ``n`` prompt texts: ``global_``, ``local``, ``scores`` ``(B, n)``
    (``scores = (local + global) / 2``) and ``maps`` ``(B, n, 19, 19)`` (mean word attention over the real words)."""

    global_: torch.Tensor
    local: torch.Tensor
    scores: torch.Tensor
    maps: torch.Tensor


class GLoRIAAdapter(WordPieceAdapter):
    """XBench adapter for GLoRIA (the module docstring states every convention).

    Parameters
    ----------
    model : GLoRIAModel
        Built (and loaded) network; moved to ``device`` and put in eval mode here.
    tokenizer : callable
        ``tokenizer(texts, truncation=True, padding="max_length", max_length=97)`` (``BertTokenizer``), or the
        :class:`~xbench.models._common.HashWordTokenizer` stand-in of a random-init build.
    vocab : sequence of str
        Id → token string of the tokenizer, for the word-piece merging.
    config : mapping, optional
    device : str or torch.device
    """

    gpu_preprocess = "gloria"  # :meth:`preprocess` as a GPU kernel (:mod:`xbench.inference.gpu_preprocess`)

    config_name = "gloria"
    vocab_name = "Bio_ClinicalBERT vocabulary"
    max_words = MAX_WORDS

    def __init__(self, model: GLoRIAModel, tokenizer: Any, vocab: Sequence[str],
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(model, tokenizer, vocab, config, device)
        params = self.config.get("params", {})
        self.templates: list[str] = list(params.get("templates") or ["There is {}"])
        if not all("{}" in t for t in self.templates):
            raise ValueError(f"GLoRIA params.templates must each contain '{{}}', got {self.templates!r}")
        self.resize, self.mean, self.std = int(params["resize"]), float(params["mean"]), float(params["std"])
        side = UPSAMPLE
        for _ in range(4):  # conv1 (k7 s2 p3), maxpool (k3 s2 p1), layer2 and layer3 (k3 s2 p1): each halves, rounding up
            side = (side + 1) // 2
        self.check_fact("grid", (side, side), f"ResNet-50 layer3 on the {UPSAMPLE}x{UPSAMPLE} upsampled input")

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> GLoRIAAdapter:
        """The Lightning ``checkpoint`` and the ``text_encoder`` tokenizer folder (``vocab.txt``)."""
        tokenizer, vocab = cls._text_files(files, config)
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]), tokenizer, vocab, config, device,
                                   where=str(files["checkpoint"]))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> GLoRIAAdapter:
        """Full-size network seeded by ``params.seed`` (global RNG restored), the hash-word tokenizer stand-in and
        :func:`~xbench.models.carzero.synthetic_vocab`."""
        return cls._seeded(seeded_build(int(config["params"].get("seed", 0)), GLoRIAModel), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, tokenizer: Any, vocab: Sequence[str],
                        config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu",
                        where: str = "GLoRIA checkpoint") -> GLoRIAAdapter:
        """Adapter from a loaded checkpoint dict (the path ``chexpert_resnet50.ckpt`` takes); strict key and shape
        match, mismatches raise :class:`CheckpointError` listing the keys. BERT's vocabulary size is read from the
        checkpoint."""
        state = gloria_state(checkpoint, where)
        model = build_uninitialised(lambda: GLoRIAModel(bert_config_from_state(state)))
        load_state_strict(model, state, f"{where}['state_dict']")
        return cls._official(model, tokenizer, vocab, config, device)

    # -- inputs --------------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] → ``(3, 224, 224)`` float32 (official ``process_img``)."""
        return preprocess_stages(image, self.input_size, size=self.resize, mean=self.mean, std=self.std)["pixel_values"]

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """Longest side to 256, zero pad, centre crop 224 (:func:`~xbench.models.carzero.pad_crop_window`)."""
        return pad_crop_window(size, self.resize, self.input_size)

    def real_words(self, input_ids: torch.Tensor) -> list[int]:
        """Per text, the number of merged words between ``[CLS]`` and ``[SEP]`` (tokens not starting with ``##``)."""
        counts = []
        for ids in input_ids.tolist():
            tokens = [self.vocab[i] for i in ids]
            end = tokens.index("[SEP]") if "[SEP]" in tokens else len(tokens)
            counts.append(sum(1 for t in tokens[1:end] if not t.startswith("##")))
        return counts

    # -- forward pieces --------------------------------------------------------------------------
    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
        """Word embeddings ``(n, 768, 97)``, sentence embeddings ``(n, 768)``, word slots ``L`` and real-word counts."""
        slots = [word_slots(t) for t in texts]
        ids, mask, types = self.tokenize(texts)
        words, sentence = self.model.text_encoder(ids.to(self.device), mask.to(self.device), types.to(self.device),
                                                  self.vocab)
        return words, sentence, slots, self.real_words(ids)

    def prompt_texts(self, prompts: Sequence[str]) -> list[str]:
        """Prompt-major texts: ``[t.format(p) for p in prompts for t in templates]``."""
        return [t.format(p) for p in prompts for t in self.templates]

    @torch.no_grad()
    def encode_image(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Global ``(B, 768)`` and local ``(B, 768, 19, 19)`` image embeddings."""
        return self.model.img_encoder(pixels.to(self.device, torch.float32))

    @torch.no_grad()
    def forward_features(self, image_global: torch.Tensor, image_local: torch.Tensor,
                         text: tuple[torch.Tensor, torch.Tensor, list[int], list[int]]) -> GLoRIAOutput:
        """Similarities and maps of every image with every text (one column per text)."""
        words, sentence, slots, real = text
        global_ = F.normalize(image_global, dim=-1) @ F.normalize(sentence, dim=-1).T
        local, maps = [], []
        for i, (n_slots, n_real) in enumerate(zip(slots, real)):
            sim, attn = local_similarity(words[i, :, 1:n_slots + 1], image_local)
            local.append(sim)
            maps.append(attn[:, :n_real].mean(dim=1))
        local_t = torch.stack(local, dim=1)
        return GLoRIAOutput(global_=global_, local=local_t, scores=(local_t + global_) / 2, maps=torch.stack(maps, dim=1))

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (max over the class's templates of (local + global) / 2) and word-attention maps
        ``(B, C, 19, 19)`` of the template that gives the score."""
        prompts = list(prompts)
        check_inputs(pixels, prompts, self.input_size)
        text = self._text_cache.get(tuple(prompts), lambda: self.encode_texts(self.prompt_texts(prompts)))
        out = self.forward_features(*self.encode_image(pixels), text)
        b, n_t = len(pixels), len(self.templates)
        scores = out.scores.reshape(b, len(prompts), n_t)
        best = scores.argmax(dim=-1, keepdim=True)
        maps = out.maps.reshape(b, len(prompts), n_t, *self.grid)
        maps = maps.gather(2, best[..., None, None].expand(-1, -1, -1, *self.grid)).squeeze(2)
        return Prediction(scores=scores.max(dim=-1).values.float().cpu(), maps=maps.float().cpu())
