"""The MedKLIP / MAVL family: entity queries decoded against ResNet-50 patch tokens.

MAVL is built on MedKLIP's code base; both adapters share what is written here once: the 75 entities and
their prompt synonyms, the transform (:func:`resize_uint8`), the Bio_ClinicalBERT text side (:func:`encode_cls`,
:func:`bert_from_state`, :func:`load_text_encoder`, :data:`toy_token_ids`), the 4-layer query decoder
(:class:`QueryDecoder` over :class:`~xbench.models.layers.PreNormDecoderLayer`), the layer-mean map rule and
:class:`EntityQueryAdapter`, the adapter base (entity book, unseen classes, preprocessing, construction).
What differs (network, checkpoint keys, texts per entity, score rule) stays in :mod:`xbench.models.medklip` and
:mod:`xbench.models.mavl`, whose docstrings describe each model.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..core.errors import UnknownNameError, XBenchWarning
from ..spec.registry import model_config
from . import _common
from ._common import (HashWordTokenizer, build_uninitialised, check_inputs, normalize_uint8, seeded_build,
                      seeded_or_uninitialised)
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, with_yaml_facts
from .layers import PreNormDecoderLayer

# The 75 entities, in the order of `original_class` / `disease_name` of the official code and of
# the official `observation explanation.json` (MedKLIP test.py, model_MedKLIP.py).
ENTITIES: tuple[str, ...] = (
    "normal", "clear", "sharp", "sharply", "unremarkable", "intact", "stable", "free",
    "effusion", "opacity", "pneumothorax", "edema", "atelectasis", "tube", "consolidation", "process",
    "abnormality", "enlarge", "tip", "low", "pneumonia", "line", "congestion", "catheter", "cardiomegaly",
    "fracture", "air", "tortuous", "lead", "disease", "calcification", "prominence", "device",
    "engorgement", "picc", "clip", "elevation", "expand", "nodule", "wire", "fluid", "degenerative",
    "pacemaker", "thicken", "marking", "scar", "hyperinflate", "blunt", "loss", "widen", "collapse",
    "density", "emphysema", "aerate", "mass", "crowd", "infiltrate", "obscure", "deformity", "hernia",
    "drainage", "distention", "shift", "stent", "pressure", "lesion", "finding", "borderline",
    "hardware", "dilation", "chf", "redistribution", "aspiration", "tail_abnorm_obs", "excluded_obs",
)

# Prompt name (lower case) -> entity (or unseen-class key).  Official: MedKLIP CXR14 test.py
# (infiltration, pleural thickening, fibrosis), MAVL classification test.py (CheXpert list, PadChest
# 'pleural effusion', 'covid19').  Entries marked "XBench" have no official mapping.
SYNONYMS: dict[str, str] = {
    "pleural effusion": "effusion",
    "infiltration": "infiltrate",
    "pleural thickening": "thicken",
    "fibrosis": "tail_abnorm_obs",
    "no finding": "normal",
    "enlarged cardiomediastinum": "enlarge",
    "lung opacity": "opacity",
    "airspace opacity": "opacity",
    "lung lesion": "lesion",
    "pleural other": "abnormality",
    "support devices": "device",
    "covid-19": "covid19",
    "covid 19": "covid19",
    "covid": "covid19",
    "covid-19 pneumonia": "covid19",
    "pulmonary fibrosis": "tail_abnorm_obs",  # XBench: as official 'fibrosis'
    "mediastinal shift": "shift",  # XBench: the 'shift' description is the mediastinal shift
    "rib fracture": "fracture",  # XBench: the 'fracture' description is a rib fracture
    "clavicle fracture": "fracture",  # XBench
    "other lesion": "lesion",  # XBench
    "nodule or mass": "nodule",  # XBench (VinDr-CXR 'Nodule/Mass')
    "nodule/mass": "nodule",  # XBench
    "diffuse nodules": "nodule",  # XBench (ChestX-Det 'Diffuse Nodule')
    "diffuse nodule": "nodule",  # XBench
}

TAIL_ENTITY = "tail_abnorm_obs"
TEXT_LENGTH = 64  # official tokenizer: padding='max_length', max_length=64, truncation=True
D_MODEL = 256
BERT_VOCAB = 28996  # Bio_ClinicalBERT (BERT-base cased vocabulary)


# -- preprocessing ------------------------------------------------------------------------
RESAMPLE = Image.BILINEAR  # the official Resize([S, S]) on a PIL image (antialiased)


def bilinear_resize(image: np.ndarray, size: int | None = None) -> np.ndarray:
    """XBench image (float32 ``(H, W)`` in [0, 1]) → ``(size, size)`` uint8, the official pre-ToTensor image.

    ``round(image · 255)`` then PIL ``BILINEAR`` resize (antialiased; aspect ratio not kept). Resizing the grey
    image equals resizing each identical channel of the official ``convert('RGB')`` image. ``size`` defaults to
    the ``input_size`` of ``xbench/configs/models/medklip.yaml`` (the adapters pass their own).
    """
    return _common.resize_uint8(image, int(size or model_config("medklip")["input_size"]), RESAMPLE)


resize_uint8 = bilinear_resize  # the family's name for it (MedKLIP's and MAVL's ``resize_uint8``): no copy of the helper


# -- text -------------------------------------------------------------------------------------
# Vocabulary-free ids for random-init models: ``[CLS]=101``, ``1000 + crc32(word) % 27000`` per ``[a-z0-9]+``
# word (lower-cased, truncated to ``length − 2``), ``[SEP]=102``, 0-padded; ``toy_token_ids(texts)`` returns
# ``input_ids`` and ``attention_mask``, both int64 ``(len(texts), 64)``.
toy_token_ids = HashWordTokenizer(TEXT_LENGTH, r"[a-z0-9]+")


def encode_cls(bert: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """``bert(input_ids, attention_mask).last_hidden_state[:, 0]`` for every row → ``(N, hidden)`` float32.

    Rows are encoded in length-sorted chunks, each trimmed to its longest row (padding keys are
    masked, so [CLS] is unchanged up to float32 noise); no ``token_type_ids`` (zeros), as official.
    """
    device = next(bert.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    lengths = attention_mask.sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    out = torch.empty(len(input_ids), bert.config.hidden_size, device=device)
    with torch.no_grad():
        for start in range(0, len(order), chunk):
            rows = order[start:start + chunk]
            width = max(int(lengths[rows].max()), 1)
            hidden = bert(input_ids=input_ids[rows, :width], attention_mask=attention_mask[rows, :width]).last_hidden_state
            out[rows] = hidden[:, 0, :]
    return out


def bert_from_state(state: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> nn.Module:
    """Bio_ClinicalBERT-sized ``BertModel`` (vocab 28996, BERT-base) in eval mode.

    ``state`` (un-prefixed ``BertModel`` keys) is loaded strictly; without it the weights are the
    seeded transformers initialisation (global RNG state is restored afterwards).
    """
    from transformers import BertConfig, BertModel

    bert = seeded_or_uninitialised(lambda: BertModel(BertConfig(vocab_size=BERT_VOCAB)), seed if state is None else None)
    if state is not None:
        load_state_strict(bert, state, "Bio_ClinicalBERT text encoder")
    return bert.eval()


def load_text_encoder(folder: str | Path, source: str | None = None) -> tuple[nn.Module, Any]:
    """Local Bio_ClinicalBERT folder → (``BertModel`` in eval mode, ``BertTokenizer``); never calls a hub.

    The encoder is loaded strictly (:func:`xbench.models.text.load_bert_folder`: a missing or unexpected
    weight is an error naming it; the unused pooler is not built); the tokenizer accepts every published
    folder layout (:func:`xbench.models.text.load_bert_tokenizer`).
    """
    from .text import load_bert_folder, load_bert_tokenizer

    return (load_bert_folder(folder, use_pooler=False, source=source),
            load_bert_tokenizer(folder, source=source))


def canonical_class(prompt: str) -> str:
    """Prompt name → entity or unseen-class key: lower case, ``SYNONYMS`` applied (``"Pleural Effusion"`` → ``"effusion"``)."""
    key = " ".join(prompt.strip().lower().split())
    if key in ENTITIES:
        return key
    key = key.replace("_", " ")
    return SYNONYMS.get(key, key)


# -- network ---------------------------------------------------------------------------------
class QueryDecoder(nn.Module):
    """``layers`` pre-norm decoder layers (:class:`~xbench.models.layers.PreNormDecoderLayer`: d 256, 4 heads,
    FFN 1024, self-attention, official dropout 0.1) and a final LayerNorm; returns queries and every layer's
    cross-attention ``(B, Q, T)``."""

    def __init__(self, layers: int = 4, d_model: int = D_MODEL):
        super().__init__()
        self.layers = nn.ModuleList(PreNormDecoderLayer(d_model, 4, 1024, dropout=0.1) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        attention = []
        for layer in self.layers:
            queries, weights = layer(queries, memory)
            attention.append(weights)
        return self.norm(queries), attention


def layer_mean(attention: Sequence[torch.Tensor]) -> torch.Tensor:
    """Official map: ``(ws[-4] + ws[-3] + ws[-2] + ws[-1]) / 4`` (summed in this order)."""
    total = attention[0]
    for weights in attention[1:]:
        total = total + weights
    return total / len(attention)


def strip_state(checkpoint: Mapping[str, Any], rename: Callable[[str], str],
                keep: Callable[[str], bool] = lambda key: True) -> dict[str, torch.Tensor]:
    """The released object (``{'model': sd, ...}`` or a bare state dict) → ``{rename(k): tensor}`` of the kept keys."""
    state = checkpoint.get("model", checkpoint)
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint['model'] must be a state dict, got {type(state).__name__}")
    return {rename(k): v for k, v in state.items() if keep(k) and isinstance(v, torch.Tensor)}


# -- adapter base ----------------------------------------------------------------------------
class EntityQueryAdapter(Adapter):
    """Shared behaviour of the MedKLIP and MAVL adapters (their module docstrings give every convention).

    Each entity (and each appended unseen class) has a list of texts: ``texts[name][0]`` its description, then, for
    MAVL, its 8 aspect strings. The *book* holds the BERT [CLS] embedding of every text, entity-major; the 75
    entities are always decoded, in the official order, and prompts select their columns (:meth:`resolve`).
    Subclasses set :attr:`network` (the checkpoint's modules) and implement :meth:`official_state`,
    :meth:`read_texts` (the YAML's text files → texts), :meth:`forward_features` and :meth:`select_scores`.

    Parameters
    ----------
    net : nn.Module
        The network (weights loaded), moved to ``device`` and put in eval mode.
    text_encoder : nn.Module
        Bio_ClinicalBERT ``BertModel``.
    tokenizer : callable, optional
        Its ``BertTokenizer``; without one (random init), :data:`toy_token_ids`.
    texts : mapping, optional
        ``{name: [description, ...]}``; without it (random init), :meth:`name_texts`.
    config : mapping, optional
        Model config (``params.unseen_fallback``: the entity of classes without texts, null raises).
    device : str or torch.device
    """

    gpu_preprocess = "square"  # :meth:`preprocess` as a GPU kernel (:mod:`xbench.inference.gpu_preprocess`)

    network: ClassVar[Callable[..., nn.Module]]
    texts_per_entity: ClassVar[int] = 1

    def __init__(self, net: nn.Module, text_encoder: nn.Module, tokenizer: Any = None,
                 texts: Mapping[str, Sequence[str]] | None = None, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(config, device)
        params = self.config.get("params", {})
        self.unseen_fallback: str | None = params.get("unseen_fallback", TAIL_ENTITY)
        if self.unseen_fallback is not None and self.unseen_fallback not in ENTITIES:
            raise UnknownNameError(f"{self.name} entity (params.unseen_fallback)", self.unseen_fallback, ENTITIES)
        self.net = net.eval().to(self.device)
        self.text_encoder = text_encoder.eval().to(self.device)
        self.tokenizer = tokenizer
        self.texts = ({k: list(v) for k, v in texts.items()} if texts is not None else
                      {e: self.name_texts(e.replace("_", " ")) for e in ENTITIES})
        self._entity_book: torch.Tensor | None = None
        self._extra_book: dict[str, torch.Tensor] = {}

    # -- construction --------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device
              ) -> EntityQueryAdapter:
        """Released ``checkpoint``, the text files of the YAML (:meth:`read_texts`) and the Bio_ClinicalBERT
        ``text_encoder`` folder."""
        bert, tokenizer = load_text_encoder(files["text_encoder"], config["weights"]["text_encoder"].get("source"))
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]), bert, tokenizer=tokenizer,
                                   texts=cls.read_texts(files), config=config, device=device)

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device
                ) -> EntityQueryAdapter:
        """Full-size networks seeded by ``params.seed``; texts from the entity names, :data:`toy_token_ids`."""
        seed = int(config["params"].get("seed", 0))
        return cls(seeded_build(seed, lambda: cls.build_network(config)), bert_from_state(seed=seed), None, None,
                   config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], text_encoder: nn.Module, *, tokenizer: Any = None,
                        texts: Mapping[str, Sequence[str]] | None = None, config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu") -> EntityQueryAdapter:
        """Build from the loaded released checkpoint object (official key handling, :meth:`official_state`;
        strict load). A wrong or truncated checkpoint raises :class:`~xbench.core.errors.CheckpointError` listing the
        missing / unexpected keys."""
        net = build_uninitialised(lambda: cls.build_network(with_yaml_facts(cls.config_name, config)))
        load_state_strict(net, cls.official_state(checkpoint), f"{cls.__name__.removesuffix('Adapter')} checkpoint")
        adapter = cls(net, text_encoder, tokenizer, texts, config, device)
        adapter.weights_label = "official"
        return adapter

    @classmethod
    def build_network(cls, config: Mapping[str, Any]) -> nn.Module:
        """The network (:attr:`network`) for a config with its YAML facts."""
        return cls.network()

    @staticmethod
    def official_state(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The released object → the network's state dict."""
        raise NotImplementedError

    @staticmethod
    def read_texts(files: Mapping[str, Path]) -> dict[str, list[str]]:
        """The resolved text files of the YAML → ``{name: [description, ...]}``."""
        raise NotImplementedError

    @staticmethod
    def name_texts(name: str) -> list[str]:
        """Texts of an entity without text files (random init): its name."""
        return [name]

    # -- text ----------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts → ``(input_ids, attention_mask)`` ``(N, 64)``: the local tokenizer (official settings) or, without
        one, :data:`toy_token_ids`."""
        if self.tokenizer is None:
            return toy_token_ids(texts)
        enc = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=TEXT_LENGTH,
                             return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    def encode_text_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """BERT [CLS] embeddings ``(N, 768)`` of tokenised texts (the official book rule)."""
        return encode_cls(self.text_encoder, input_ids, attention_mask)

    def book_for(self, names: Sequence[str]) -> torch.Tensor:
        """``(len(names) · texts_per_entity, 768)`` book rows of ``names`` (descriptions only here)."""
        return self.encode_text_ids(*self.tokenize([self.texts[n][0] for n in names]))

    def set_entity_book(self, book: torch.Tensor) -> None:
        """Cache the book of the 75 entities (e.g. computed from stored token ids)."""
        shape = (len(ENTITIES) * self.texts_per_entity, 768)
        if tuple(book.shape) != shape:
            raise ValueError(f"{self.name} entity book must have shape {shape}, got {tuple(book.shape)}")
        self._entity_book = book.to(self.device, torch.float32)

    @property
    def entity_book(self) -> torch.Tensor:
        """The book of the 75 entities, computed once and cached."""
        if self._entity_book is None:
            self.set_entity_book(self.book_for(ENTITIES))
        return self._entity_book

    def resolve(self, prompts: Sequence[str]) -> tuple[list[str], list[int]]:
        """Prompt names → (query names: the 75 entities + appended unseen classes, query index per prompt).

        Unseen classes with texts are appended in first-appearance order; others map to ``params.unseen_fallback``
        with an :class:`XBenchWarning`, or raise :class:`UnknownNameError` when it is null.
        """
        names = list(ENTITIES)
        columns = []
        for prompt in prompts:
            key = canonical_class(prompt)
            if key not in ENTITIES and key not in self.texts:
                if self.unseen_fallback is None:
                    raise UnknownNameError(f"{self.name} class", prompt, [*ENTITIES, *SYNONYMS, *self.texts])
                warnings.warn(f"{self.name}: {prompt!r} is neither an entity nor a class with texts; "
                              f"scored with the {self.unseen_fallback!r} entity", XBenchWarning, stacklevel=3)
                key = self.unseen_fallback
            if key not in names:
                names.append(key)
            columns.append(names.index(key))
        return names, columns

    def query_book(self, names: Sequence[str]) -> torch.Tensor:
        """The book of the query names (the cached entity book first, then each appended class's rows)."""
        extra = list(names[len(ENTITIES):])
        for name in extra:
            if name not in self._extra_book:
                self._extra_book[name] = self.book_for([name])
        return torch.cat([self.entity_book, *(self._extra_book[n] for n in extra)])

    # -- image and forward ---------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image → ``(3, S, S)`` float32 (:func:`resize_uint8`, ImageNet :func:`normalize_uint8`)."""
        return normalize_uint8(resize_uint8(image, size=self.input_size))

    def forward_features(self, pixels: torch.Tensor, book: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the network for a book; at least ``maps (B, Q, h, w)``."""
        raise NotImplementedError

    def select_scores(self, out: Mapping[str, torch.Tensor], columns: Sequence[int]) -> torch.Tensor:
        """Scores ``(B, C)`` of the prompts' query columns."""
        raise NotImplementedError

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (probabilities) and raw layer-mean cross-attention maps ``(B, C, h, w)``."""
        check_inputs(pixels, prompts, self.input_size)
        names, columns = self.resolve(prompts)
        out = self.forward_features(pixels, self.query_book(names))
        index = torch.tensor(columns, device=out["maps"].device)
        return Prediction(scores=self.select_scores(out, columns).float().cpu(),
                          maps=out["maps"][:, index].float().cpu())
