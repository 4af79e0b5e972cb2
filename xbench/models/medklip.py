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
    the CXR14 zero-shot script, with an :class:`~xbench.core.errors.XBenchWarning`
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from ..core.errors import FormatError
from ._common import normalize_uint8
from .entity_queries import (  # the family's shared code; these names stay importable from here
    BERT_VOCAB, D_MODEL, ENTITIES, SYNONYMS, TAIL_ENTITY, TEXT_LENGTH, EntityQueryAdapter, QueryDecoder,
    bert_from_state, canonical_class, encode_cls, layer_mean, load_text_encoder, resize_uint8, strip_state,
    toy_token_ids,
)

__all__ = [
    "BERT_VOCAB", "D_MODEL", "ENTITIES", "SYNONYMS", "TAIL_ENTITY", "TEXT_LENGTH", "UNSEEN_DESCRIPTIONS",
    "MedKLIPAdapter", "MedKLIPNet", "QueryDecoder", "bert_from_state", "canonical_class", "encode_cls", "layer_mean",
    "load_text_encoder", "normalize_uint8", "official_state_dict", "read_descriptions", "resize_uint8",
    "toy_token_ids",
]

# Descriptions of classes outside the 75 entities; covid19 is the entry of the MAVL repository's
# Zero-shot_*/observation explanation.json that its MedKLIP COVID config appends.
UNSEEN_DESCRIPTIONS: dict[str, str] = {
    "covid19": ("It is a contagious disease caused by a virus. Ground-glass opacities, consolidation, "
                "thickening, pleural effusions commonly appear in infection."),
}



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


# -- network ---------------------------------------------------------------------------------
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
    return strip_state(checkpoint, lambda key: key.removeprefix("module."))


# -- adapter -------------------------------------------------------------------------------
class MedKLIPAdapter(EntityQueryAdapter):
    """MedKLIP behind the XBench adapter contract (see the module docstring for every convention).

    ``texts`` is ``{name: [description]}`` (:func:`read_descriptions`); classes of :data:`UNSEEN_DESCRIPTIONS`
    are described too unless ``texts`` has them.
    """

    config_name = "medklip"
    network = MedKLIPNet

    def __init__(self, net: MedKLIPNet, text_encoder: nn.Module, tokenizer: Any = None,
                 texts: Mapping[str, Sequence[str]] | None = None, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(net, text_encoder, tokenizer, texts, config, device)
        self.texts = {**{k: [v] for k, v in UNSEEN_DESCRIPTIONS.items()}, **self.texts}

    @staticmethod
    def official_state(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """:func:`official_state_dict`."""
        return official_state_dict(checkpoint)

    @staticmethod
    def read_texts(files: Mapping[str, Path]) -> dict[str, list[str]]:
        """``files["descriptions"]`` (:func:`read_descriptions`) → ``{name: [description]}``."""
        return {k: [v] for k, v in read_descriptions(files["descriptions"]).items()}

    def forward_features(self, pixels: torch.Tensor, book: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the network: ``logits (B, Q, 2)``, ``scores (B, Q)``, ``attention (4, B, Q, 196)``, ``maps (B, Q, h, w)``."""
        with torch.no_grad():
            logits, attention = self.net(pixels.to(self.device, torch.float32), book.to(self.device))
            maps = layer_mean(attention).reshape(logits.shape[0], logits.shape[1], *self.grid)
            return {"logits": logits, "scores": torch.softmax(logits, dim=-1)[..., 1],
                    "attention": torch.stack(attention), "maps": maps}

    def select_scores(self, out: Mapping[str, torch.Tensor], columns: Sequence[int]) -> torch.Tensor:
        """The "present" probability of each prompt's query."""
        return out["scores"][:, torch.tensor(columns, device=out["scores"].device)]
