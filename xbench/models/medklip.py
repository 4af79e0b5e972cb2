"""MedKLIP: knowledge-enhanced entity queries decoded against ResNet-50 patch tokens.

Citation
    Wu, Zhang, Zhang, Wang, Xie. "MedKLIP: Medical Knowledge Enhanced Language-Image
    Pre-Training in Radiology", ICCV 2023 (arXiv 2301.02228).
Official code
    https://github.com/MediaBrain-SJTU/MedKLIP (snapshot 8e60b035): model and decoder from
    ``Sample_Zero-Shot_Grounding_RSNA/models/{model_MedKLIP.py,transformer.py}``, map from that
    folder's ``test.py``, score from ``Sample_zero-shot_Classification_CXR14/test.py``, transform
    from ``Sample_zero-shot_Classification_CXR14/dataset/dataset.py``.
Weights (local only, never downloaded), in one folder:
    ``checkpoint_final.pth`` (released checkpoint, link in the repo's ``checkpoints/``),
    ``observation explanation.json`` (the 75 entity descriptions of the official repo) and
    ``Bio_ClinicalBERT/`` (a local copy of https://huggingface.co/emilyalsentzer/Bio_ClinicalBERT).

Architecture
    ResNet-50 ``children()[:-3]`` (conv1 … layer3, 1024 channels, stride 16) → per patch
    ``res_l1`` Linear 1024→1024, ReLU, ``res_l2`` Linear 1024→256 → 196 image tokens, no positional
    encoding.  Queries: ``disease_embedding_layer`` (Linear 768→256) of the *entity book*, the
    Bio_ClinicalBERT ``last_hidden_state[:, 0]`` ([CLS]) of each entity description (BERT is not in
    the checkpoint; the book is computed once and cached on the adapter).  A 4-layer pre-norm
    DETR decoder (d 256, 4 heads, FFN 1024, self-attention among the queries, cross-attention to the
    image tokens, final LayerNorm) and ``classifier`` Linear 256→2 per query.
Input
    224×224, 3 channels.  ``preprocess``: ``round(image·255)`` to uint8 (exact for 8-bit sources),
    PIL bilinear resize to 224×224 (PIL's antialiasing filter, aspect ratio *not* kept, as
    torchvision ``Resize([224, 224])`` on a PIL image), ``/255``, grey replicated to RGB, ImageNet
    mean/std normalisation.  RSNA DICOM histogram equalisation of the official grounding script is
    a dataset step and is not applied here.
Native grid
    14×14 (row-major patches: patch ``p`` is row ``p // 14``, column ``p % 14``).
Score
    ``softmax(logits, -1)[..., 1]`` (the "present" attribute) of the prompt's query: a probability.
Map
    Cross-attention of each of the 4 decoder layers (``nn.MultiheadAttention`` head average, softmax
    over the 196 patches), averaged over the layers, reshaped to 14×14; no normalisation.  The
    official script then repeats each cell 16× (nearest) to 224×224; XBench's metrics upsample the
    raw grid themselves.
Prompts and unseen classes
    The query set is always the 75 official entities in the official order (they self-attend, so the
    set and order are part of the computation).  A prompt name is mapped to an entity through
    :data:`SYNONYMS` (official mappings of the MedKLIP/MAVL test scripts, plus a few marked XBench
    choices).  A class that is not an entity (COVID-19) follows the official practice of the MAVL
    repository's MedKLIP COVID-Rural config: its description is appended as an extra query
    (``original_class.append('covid19')``); the description comes from the descriptions file when it
    has the key, else from :data:`UNSEEN_DESCRIPTIONS`.  Appending a query slightly changes every
    other query's output.  A class with neither an entity nor a description falls back to the
    ``tail_abnorm_obs`` entity ("Some very rare diseases"), the official treatment of fibrosis in
    the CXR14 zero-shot script, with an :class:`~xbench.errors.XBenchWarning`
    (``params.unseen_fallback: null`` raises instead).
Checkpoint
    ``{'model': state_dict, 'optimizer', ...}`` saved from ``nn.DataParallel``: every key starts with
    ``module.``; the prefix is stripped and the 342 keys are loaded strictly (``cl_fc`` is kept
    although only pre-training uses it).
Text encoder
    ``BertModel.from_pretrained(<weights>/Bio_ClinicalBERT, local_files_only=True)`` and its
    ``BertTokenizer`` (``padding='max_length', max_length=64, truncation=True``).  The official code
    uses a copy of ALBEF's BertTokenizer with that vocabulary; tokenizer parity could not be
    checked here (no real vocabulary available), only the computation from token ids on.
Random init (``params.random_init: true``)
    Full-size ResNet/decoder/BERT with seeded random weights and no vocabulary: descriptions are the
    entity names themselves, turned into ids by :func:`toy_token_ids` (the word-hash rule of the
    XBench parity fixtures).  For pipeline tests only.
Deviations
    None on the inference path (checked against the XBench parity fixture built from the official
    code).  Long texts are encoded in length-sorted chunks trimmed to their longest row, which
    leaves the [CLS] output unchanged up to float32 reduction noise.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch import nn

from ..errors import FormatError, UnknownNameError, XBenchWarning
from . import _common
from ._common import HashWordTokenizer, check_inputs, normalize_uint8, seeded_build
from .base import Adapter, Prediction, load_checkpoint, load_state_strict

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

# Descriptions of classes outside the 75 entities; covid19 is the entry of the MAVL repository's
# Zero-shot_*/observation explanation.json that its MedKLIP COVID config appends.
UNSEEN_DESCRIPTIONS: dict[str, str] = {
    "covid19": ("It is a contagious disease caused by a virus. Ground-glass opacities, consolidation, "
                "thickening, pleural effusions commonly appear in infection."),
}

TAIL_ENTITY = "tail_abnorm_obs"
INPUT_SIZE = 224  # the official transform's size (the YAML's input_size); the trunk has stride 16
GRID = (14, 14)
TEXT_LENGTH = 64  # official tokenizer: padding='max_length', max_length=64, truncation=True
D_MODEL = 256
BERT_VOCAB = 28996  # Bio_ClinicalBERT (BERT-base cased vocabulary)


# -- preprocessing ------------------------------------------------------------------------
# XBench image (float32 ``(H, W)`` in [0, 1]) → ``(size, size)`` uint8, the official pre-ToTensor image:
# ``round(image · 255)`` then PIL ``BILINEAR`` resize (antialiased; aspect ratio not kept). Resizing the grey image
# equals resizing each identical channel of the official ``convert('RGB')`` image.
resize_uint8 = partial(_common.resize_uint8, size=INPUT_SIZE, resample=Image.BILINEAR)


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

    bert = seeded_build(seed, lambda: BertModel(BertConfig(vocab_size=BERT_VOCAB)))
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


def read_descriptions(path: str | Path) -> dict[str, str]:
    """The official ``observation explanation.json`` → ``{entity: description}``.

    The official file misspells the pneumonia key as ``'eumonia'``; it is read as ``pneumonia``
    (the official code takes the values in file order, which is the entity order).  Extra keys
    (e.g. ``covid19`` in the MAVL copy) are kept for unseen classes.  Missing entities raise
    :class:`FormatError`.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise FormatError(path, "expected a JSON object of {entity: description string}")
    book = {("pneumonia" if k == "eumonia" else k): v for k, v in data.items()}
    missing = [e for e in ENTITIES if e not in book]
    if missing:
        raise FormatError(path, f"missing entity descriptions: {', '.join(missing)}")
    return book


def canonical_class(prompt: str) -> str:
    """Prompt name → entity or unseen-class key: lower case, ``SYNONYMS`` applied (``"Pleural Effusion"`` → ``"effusion"``)."""
    key = " ".join(prompt.strip().lower().split())
    if key in ENTITIES:
        return key
    key = key.replace("_", " ")
    return SYNONYMS.get(key, key)


# -- network ---------------------------------------------------------------------------------
class DecoderLayer(nn.Module):
    """Pre-norm DETR decoder layer on sequence-first tensors (official ``normalize_before=True``).

    ``x += SelfAttn(norm1(x))``; ``x += CrossAttn(norm2(x), memory, memory)``;
    ``x += linear2(relu(linear1(norm3(x))))``.  Returns the new queries and the cross-attention
    weights ``(B, Q, T)`` (head average, softmax over the ``T`` memory tokens).  Dropout is inactive
    in eval mode.
    """

    def __init__(self, d_model: int = D_MODEL, heads: int = 4, ffn: int = 1024, dropout: float = 0.1):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
        self.linear1 = nn.Linear(d_model, ffn)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ffn, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm1(x)
        x = x + self.dropout1(self.self_attn(h, h, h)[0])
        h, weights = self.multihead_attn(self.norm2(x), memory, memory)
        x = x + self.dropout2(h)
        x = x + self.dropout3(self.linear2(self.dropout(F.relu(self.linear1(self.norm3(x))))))
        return x, weights


class QueryDecoder(nn.Module):
    """``layers`` pre-norm decoder layers and a final LayerNorm; returns queries and every layer's cross-attention."""

    def __init__(self, layers: int = 4, d_model: int = D_MODEL):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d_model) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        attention = []
        for layer in self.layers:
            queries, weights = layer(queries, memory)
            attention.append(weights)
        return self.norm(queries), attention


class MedKLIPNet(nn.Module):
    """The checkpoint's modules, named as in the official state dict (without ``module.``)."""

    def __init__(self) -> None:
        super().__init__()
        resnet = torchvision.models.resnet50(weights=None)
        self.res_features = nn.Sequential(*list(resnet.children())[:-3])  # conv1 … layer3
        self.res_l1 = nn.Linear(1024, 1024)
        self.res_l2 = nn.Linear(1024, D_MODEL)
        self.disease_embedding_layer = nn.Linear(768, D_MODEL)
        self.cl_fc = nn.Linear(D_MODEL, 768)  # pre-training only; kept for the strict load
        self.decoder = QueryDecoder()
        self.dropout_feas = nn.Dropout(0.1)
        self.classifier = nn.Linear(D_MODEL, 2)

    def image_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(B, 3, 224, 224)`` → ``(B, 196, 256)`` tokens in row-major patch order."""
        trunk = self.res_features(pixels)
        tokens = trunk.flatten(2).transpose(1, 2)
        return self.res_l2(F.relu(self.res_l1(tokens)))

    def forward(self, pixels: torch.Tensor, entity_book: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, Q, 2)`` and the 4 layers' cross-attention ``(B, Q, 196)`` for a ``(Q, 768)`` entity book."""
        memory = self.image_tokens(pixels).transpose(0, 1)
        queries = self.disease_embedding_layer(entity_book).unsqueeze(1).repeat(1, pixels.shape[0], 1)
        out, attention = self.decoder(queries, memory)
        return self.classifier(self.dropout_feas(out)).transpose(0, 1), attention


def official_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The released file's object (``{'model': sd, ...}`` or a bare state dict) → un-prefixed state dict."""
    state = checkpoint.get("model", checkpoint)
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint['model'] must be a state dict, got {type(state).__name__}")
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def layer_mean(attention: Sequence[torch.Tensor]) -> torch.Tensor:
    """Official map: ``(ws[-4] + ws[-3] + ws[-2] + ws[-1]) / 4`` (summed in this order)."""
    total = attention[0]
    for weights in attention[1:]:
        total = total + weights
    return total / len(attention)


# -- adapter -------------------------------------------------------------------------------
class MedKLIPAdapter(Adapter):
    """MedKLIP behind the XBench adapter contract (see the module docstring for every convention)."""

    config_name = "medklip"

    def __init__(self, net: MedKLIPNet, text_encoder: nn.Module, tokenizer: Any = None,
                 descriptions: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(config, device)
        params = self.config.get("params", {})
        self.unseen_fallback: str | None = params.get("unseen_fallback", TAIL_ENTITY)
        if self.unseen_fallback is not None and self.unseen_fallback not in ENTITIES:
            raise UnknownNameError(f"{self.name} entity (params.unseen_fallback)", self.unseen_fallback, ENTITIES)
        self.net = net.eval().to(self.device)
        self.text_encoder = text_encoder.eval().to(self.device)
        self.tokenizer = tokenizer
        # Without a description file (random init) each entity is described by its own name.
        self.descriptions = dict(descriptions) if descriptions is not None else {e: e.replace("_", " ") for e in ENTITIES}
        self._entity_book: torch.Tensor | None = None
        self._extra_book: dict[str, torch.Tensor] = {}

    # -- construction --------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> MedKLIPAdapter:
        """Released ``checkpoint``, entity ``descriptions`` and the Bio_ClinicalBERT ``text_encoder`` folder."""
        bert, tokenizer = load_text_encoder(files["text_encoder"], config["weights"]["text_encoder"].get("source"))
        return cls.from_official_checkpoint(load_checkpoint(files["checkpoint"]), bert, tokenizer=tokenizer,
                                            descriptions=read_descriptions(files["descriptions"]), config=config,
                                            device=device)

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> MedKLIPAdapter:
        """Full-size networks seeded by ``params.seed``; entity names as descriptions, :data:`toy_token_ids`."""
        seed = int(config["params"].get("seed", 0))
        return cls(seeded_build(seed, MedKLIPNet), bert_from_state(seed=seed), None, None, config, device)

    @classmethod
    def from_official_checkpoint(cls, checkpoint: Mapping[str, Any], text_encoder: nn.Module, *, tokenizer: Any = None,
                                 descriptions: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None,
                                 device: str | torch.device = "cpu") -> "MedKLIPAdapter":
        """Build from the loaded released checkpoint object (``module.`` prefix stripped, strict load).

        A wrong or truncated checkpoint raises :class:`~xbench.errors.CheckpointError` listing the
        missing / unexpected keys.
        """
        net = MedKLIPNet()
        load_state_strict(net, official_state_dict(checkpoint), "MedKLIP checkpoint")
        adapter = cls(net, text_encoder, tokenizer, descriptions, config, device)
        adapter.weights_label = "official"
        return adapter

    # -- text ----------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts → ``(input_ids, attention_mask)`` ``(N, 64)``: the local tokenizer (official settings) or, without one, :func:`toy_token_ids`."""
        if self.tokenizer is None:
            return toy_token_ids(texts)
        enc = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=TEXT_LENGTH, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    def encode_text_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """BERT [CLS] embeddings ``(N, 768)`` of tokenised descriptions (the official ``disease_book`` rule)."""
        return encode_cls(self.text_encoder, input_ids, attention_mask)

    def set_entity_book(self, book: torch.Tensor) -> None:
        """Cache the ``(75, 768)`` entity book (e.g. computed from stored token ids)."""
        if tuple(book.shape) != (len(ENTITIES), 768):
            raise ValueError(f"entity book must have shape ({len(ENTITIES)}, 768), got {tuple(book.shape)}")
        self._entity_book = book.to(self.device, torch.float32)

    @property
    def entity_book(self) -> torch.Tensor:
        """``(75, 768)`` [CLS] embeddings of the entity descriptions, computed once and cached."""
        if self._entity_book is None:
            self.set_entity_book(self.encode_text_ids(*self.tokenize([self.descriptions[e] for e in ENTITIES])))
        return self._entity_book

    def _unseen_embedding(self, key: str) -> torch.Tensor:
        if key not in self._extra_book:
            text = self.descriptions.get(key, UNSEEN_DESCRIPTIONS.get(key))
            self._extra_book[key] = self.encode_text_ids(*self.tokenize([text]))[0]
        return self._extra_book[key]

    def resolve(self, prompts: Sequence[str]) -> tuple[list[str], list[int]]:
        """Prompt names → (query names: the 75 entities + appended unseen classes, query index per prompt).

        Unseen classes with a description are appended in first-appearance order; others map to
        ``tail_abnorm_obs`` with an :class:`XBenchWarning`, or raise :class:`UnknownNameError`
        when ``params.unseen_fallback`` is null.
        """
        queries = list(ENTITIES)
        columns = []
        for prompt in prompts:
            key = canonical_class(prompt)
            if key not in ENTITIES and key not in self.descriptions and key not in UNSEEN_DESCRIPTIONS:
                if self.unseen_fallback is None:
                    raise UnknownNameError("MedKLIP class", prompt, [*ENTITIES, *SYNONYMS, *UNSEEN_DESCRIPTIONS])
                warnings.warn(f"MedKLIP: {prompt!r} is neither an entity nor a described class; "
                              f"scored with the {self.unseen_fallback!r} entity", XBenchWarning, stacklevel=3)
                key = self.unseen_fallback
            if key not in queries:
                queries.append(key)
            columns.append(queries.index(key))
        return queries, columns

    def query_book(self, queries: Sequence[str]) -> torch.Tensor:
        """``(Q, 768)`` text embeddings of the query names (the cached entity book first)."""
        extra = [self._unseen_embedding(q) for q in queries[len(ENTITIES):]]
        return torch.cat([self.entity_book, *(e[None] for e in extra)]) if extra else self.entity_book

    # -- image ---------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image → ``(3, 224, 224)`` float32 (see :func:`resize_uint8`, :func:`normalize_uint8`)."""
        return normalize_uint8(resize_uint8(image, size=self.input_size))

    def forward_features(self, pixels: torch.Tensor, book: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the network: ``logits (B, Q, 2)``, ``scores (B, Q)``, ``attention (4, B, Q, 196)``, ``maps (B, Q, 14, 14)``."""
        with torch.no_grad():
            logits, attention = self.net(pixels.to(self.device, torch.float32), book.to(self.device))
            maps = layer_mean(attention).reshape(logits.shape[0], logits.shape[1], *self.grid)
            return {"logits": logits, "scores": torch.softmax(logits, dim=-1)[..., 1],
                    "attention": torch.stack(attention), "maps": maps}

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (probabilities) and raw 14×14 layer-mean cross-attention maps ``(B, C, 14, 14)``."""
        check_inputs(pixels, prompts, self.input_size)
        queries, columns = self.resolve(prompts)
        out = self.forward_features(pixels, self.query_book(queries))
        index = torch.tensor(columns, device=out["scores"].device)
        return Prediction(scores=out["scores"][:, index].float().cpu(), maps=out["maps"][:, index].float().cpu())
