"""MAVL: multi-aspect (description + 8 visual-aspect) entity queries decoded against ResNet-50 tokens.

Citation
    Phan, Nguyen, Nguyen, Nguyen, Tran, Rajpurkar, Nguyen. "Decomposing Disease Descriptions for
    Enhanced Pathology Detection: A Multi-Aspect Vision-Language Pre-training Framework" (MAVL),
    CVPR 2024.
Official code
    https://github.com/HieuPhan33/CVPR2024_MAVL (snapshot 6a5eacd0): ``Zero-shot_grounding/models/
    {model_MAVL.py,transformer.py}`` and ``Zero-shot_grounding/test.py`` (map),
    ``Zero-shot_classification/test.py`` (scores, ``mode`` feature/text),
    ``Zero-shot_classification/dataset/dataset.py`` (transform).
Weights (local only, never downloaded), in one folder:
    ``checkpoint_full_40.pth`` (grounding checkpoint; ``checkpoint_full_46.pth`` is the
    classification one, same layout; Google Drive folder of the repo's ``download.sh``),
    ``observation explanation.json`` (MAVL's copy: 75 entities + ``covid19``, looked up by name),
    ``gpt4_mimic.json`` (``Pretrain/concept_gen``: 8 aspect strings per entity, + ``covid19``) and
    ``Bio_ClinicalBERT/`` (local copy of https://huggingface.co/emilyalsentzer/Bio_ClinicalBERT).

Architecture
    ResNet-50 ``children()[:-3]`` (conv1 … layer3) as ``backbone`` → (B, 1024, 14, 14).  Local branch:
    ``res_l2(PReLU(res_l1.0(x)))`` 1×1 convolutions 1024→1024→256 → 196 tokens (row-major, no
    positional encoding, not normalised).  Global branch (``pool``): CLIP-style AttentionPool2d
    (mean token prepended, learned positional embedding (197, 1024) — which fixes the input to 224 —,
    8 heads, separate q/k/v projections, ``c_proj`` 1024→256, output at position 0).  Queries:
    ``disease_embedding_layer`` (Linear 768→256) of the *concept book* (9 rows per disease, disease-
    major: row ``d·9`` = [CLS] of the description, rows ``d·9+1+j`` = [CLS] of aspect ``j`` in file order
    border, fluid, location, opacity, other, patterns, shape, texture).  Decoder: 4 pre-norm layers
    (d 256, 4 heads, FFN 1024, self-attention on) + final LayerNorm over all ``9·D`` queries; the 9
    outputs of a disease are concatenated (2304) → ``classifier`` Linear 2304→2.
Input
    224×224, 3 channels; ``preprocess`` identical to MedKLIP's: ``round(image·255)`` uint8, PIL
    bilinear resize to 224×224 (aspect not kept), ``/255``, grey → RGB, ImageNet mean/std.
Native grid
    14×14, row-major patches.
Score (a probability in both modes)
    ``feature`` mode (every released config except COVID): ``softmax(logits, -1)[..., 1]``.
    ``text`` mode (COVID configs): ``g = normalize(global) · normalize(queries)ᵀ`` arranged
    (B, 9, D); for each normal entity ``n`` ∈ {0 ``normal``, 1 ``clear``}: ``softmax([g[:, :, n], g])[..., 1]``;
    mean over ``n``, then over the 9 concepts.  ``params.score_mode``: ``auto`` (default: ``text``
    for appended unseen classes, as the COVID configs do, ``feature`` for the 75 entities),
    ``feature`` or ``text`` for every class.
Map
    Per-layer cross-attention (head average, softmax over 196 patches), mean of the 4 layers, view
    (B, D, 9, 196), keep concepts [0, 6, 7, 8] (description, patterns, shape, texture), mean
    (config ``mode: avg``), reshape 14×14; no normalisation.  The official script upsamples with
    ``F.interpolate(bilinear, align_corners=True)`` to 224; XBench's metrics upsample the raw grid.
Prompts and unseen classes
    The 75 MedKLIP entities are always decoded, in the official order; prompt names map to entities
    through :data:`SYNONYMS` (official mappings of the MedKLIP/MAVL test scripts + marked XBench
    choices).  An unseen class is appended as a 76th… disease with its description and 8 aspects
    looked up by name in the two JSON files (``original_class.append('covid19')`` in the official
    COVID configs); appending changes the other diseases' outputs a little (self-attention).  A
    class without both texts falls back to ``tail_abnorm_obs`` with an
    :class:`~xbench.core.errors.XBenchWarning` (``params.unseen_fallback: null`` raises instead).
Checkpoint
    ``{'model': state_dict, ...}``: ``module.`` removed (``k.replace('module.', '')``), every key
    containing ``temp`` dropped (the pre-training ``temp`` (9,)), strict load of the 352 keys
    (``location_emb`` is kept although zero-shot inference does not use it).
Text encoder
    ``BertModel.from_pretrained(<weights>/Bio_ClinicalBERT, local_files_only=True)`` and its
    ``BertTokenizer`` (``padding='max_length', max_length=64, truncation=True``).  The official code
    uses a copy of ALBEF's BertTokenizer; tokenizer parity could not be checked here (no real
    vocabulary available), only the computation from token ids on.
Random init (``params.random_init: true``)
    Full-size networks with seeded random weights; descriptions are the entity names and aspects
    ``"<aspect>: <name>"``, tokenised by :func:`toy_token_ids`.  For pipeline tests only.
Deviations
    None on the inference path (checked against the XBench parity fixture built from the official
    code).  Texts are encoded in length-sorted chunks trimmed to their longest row ([CLS] unchanged
    up to float32 noise).
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
from ..spec.registry import model_config
from .entity_queries import (  # MAVL is built on MedKLIP's code base: the family's shared code
    D_MODEL, ENTITIES, SYNONYMS, TAIL_ENTITY, TEXT_LENGTH, EntityQueryAdapter, QueryDecoder, bert_from_state,
    canonical_class, encode_cls, layer_mean, load_text_encoder, resize_uint8, strip_state, toy_token_ids,
)

__all__ = [
    "ASPECTS", "D_MODEL", "ENTITIES", "MAP_CONCEPTS", "N_CONCEPTS", "NORMAL_ENTITIES", "SCORE_MODES", "SYNONYMS",
    "TAIL_ENTITY", "TEXT_LENGTH", "AttentionPool2d", "MAVLAdapter", "MAVLNet", "assemble_concept_book",
    "bert_from_state", "canonical_class", "encode_cls", "layer_mean", "load_text_encoder", "official_state_dict",
    "read_texts", "resize_uint8", "text_mode_scores", "toy_token_ids",
]

# Aspect order of gpt4_mimic.json (alphabetical); concept index c = 1 + aspect index.
ASPECTS: tuple[str, ...] = ("border", "fluid", "location", "opacity", "other", "patterns", "shape", "texture")
N_CONCEPTS = 1 + len(ASPECTS)
MAP_CONCEPTS = (0, 6, 7, 8)  # description, patterns, shape, texture (Zero-shot_grounding/test.py)
NORMAL_ENTITIES = (0, 1)  # 'normal', 'clear': references of the 'text' score mode


SCORE_MODES = ("auto", "feature", "text")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc


def read_texts(descriptions_path: str | Path, concepts_path: str | Path) -> dict[str, list[str]]:
    """MAVL's ``observation explanation.json`` + ``gpt4_mimic.json`` → ``{name: [description, 8 aspects]}``.

    Only names present in both files are kept; every one of the 75 entities must be there and have
    exactly 8 aspect strings (else :class:`FormatError` naming the file and entity).
    """
    descriptions_path, concepts_path = Path(descriptions_path), Path(concepts_path)
    descriptions, concepts = _read_json(descriptions_path), _read_json(concepts_path)
    if not isinstance(descriptions, dict) or not isinstance(concepts, dict):
        raise FormatError(descriptions_path if not isinstance(descriptions, dict) else concepts_path, "expected a JSON object")
    missing = [e for e in ENTITIES if e not in descriptions]
    if missing:
        raise FormatError(descriptions_path, f"missing entity descriptions: {', '.join(missing)}")
    missing = [e for e in ENTITIES if e not in concepts]
    if missing:
        raise FormatError(concepts_path, f"missing entity aspect lists: {', '.join(missing)}")
    texts = {}
    for name in descriptions.keys() & concepts.keys():
        aspects = concepts[name]
        if not (isinstance(aspects, list) and len(aspects) == len(ASPECTS) and all(isinstance(a, str) for a in aspects)):
            raise FormatError(concepts_path, f"expected a list of {len(ASPECTS)} aspect strings", field=name)
        texts[name] = [str(descriptions[name]), *aspects]
    return texts


def assemble_concept_book(description_cls: torch.Tensor, aspect_cls: torch.Tensor) -> torch.Tensor:
    """``(D, 768)`` description and ``(D·8, 768)`` aspect embeddings (disease-major) → ``(D·9, 768)`` book, row ``d·9 + c``."""
    d = description_cls.shape[0]
    if aspect_cls.shape[0] != d * len(ASPECTS):
        raise ValueError(f"expected {d * len(ASPECTS)} aspect rows for {d} diseases, got {aspect_cls.shape[0]}")
    return torch.cat([description_cls[:, None], aspect_cls.view(d, len(ASPECTS), -1)], dim=1).reshape(d * N_CONCEPTS, -1)


# -- network ---------------------------------------------------------------------------------
class AttentionPool2d(nn.Module):
    """CLIP-style attention pooling of a ``(B, C, h, w)`` map → ``(B, out)`` (position 0 of one MHA pass).

    Tokens are the ``h·w`` cells (row-major) with their mean prepended, plus ``positional_embedding``
    (``(h·w + 1, C)``, so the grid size is fixed); separate q/k/v projections with biases, ``c_proj``.
    """

    def __init__(self, spatial: int, dim: int = 1024, heads: int = 8, out: int = D_MODEL):
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.zeros(spatial * spatial + 1, dim))
        self.k_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.c_proj = nn.Linear(dim, out)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).permute(2, 0, 1)
        x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0) + self.positional_embedding[:, None, :].to(x.dtype)
        out, _ = F.multi_head_attention_forward(
            query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=self.heads,
            q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight, v_proj_weight=self.v_proj.weight,
            in_proj_weight=None, in_proj_bias=torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
            bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
            out_proj_weight=self.c_proj.weight, out_proj_bias=self.c_proj.bias,
            use_separate_proj_weight=True, training=self.training, need_weights=False,
        )
        return out[0]


class MAVLNet(nn.Module):
    """The checkpoint's modules, named as in the official grounding model's state dict.

    ``grid`` (the map grid, default: the ``grid`` of ``xbench/configs/models/mavl.yaml``) sizes the attention pool's
    positional embedding, which fixes the input size.
    """

    def __init__(self, grid: Sequence[int] | None = None) -> None:
        super().__init__()
        h, w = grid if grid is not None else model_config("mavl")["grid"]
        if h != w:
            raise ValueError(f"MAVL's attention pool needs a square grid, got {h}x{w}")
        resnet = torchvision.models.resnet50(weights=None)
        self.backbone = nn.Sequential(*list(resnet.children())[:-3])  # conv1 … layer3
        self.pool = AttentionPool2d(int(h), 1024, 8, D_MODEL)
        self.disease_embedding_layer = nn.Linear(768, D_MODEL)
        self.res_l1 = nn.Sequential(nn.Conv2d(1024, 1024, kernel_size=1), nn.PReLU())
        self.res_l2 = nn.Conv2d(1024, D_MODEL, kernel_size=1)
        self.location_emb = nn.Conv1d(D_MODEL, 768, kernel_size=N_CONCEPTS, stride=N_CONCEPTS)  # unused at inference
        self.decoder = QueryDecoder()  # the official Dropout2d on its output is inactive in eval: omitted
        self.classifier = nn.Linear(D_MODEL * N_CONCEPTS, 2)

    def encode_image(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, 3, 224, 224)`` → local memory ``(B, 256, 14, 14)`` and global vector ``(B, 256)``."""
        trunk = self.backbone(pixels)
        return self.res_l2(self.res_l1(trunk)), self.pool(trunk)

    def forward(self, pixels: torch.Tensor, concept_book: torch.Tensor) -> dict[str, Any]:
        """``concept_book`` ``(D·9, 768)`` → ``logits (B, D, 2)``, ``global_logits (B, 9, D)``, 4× attention ``(B, D·9, 196)``."""
        b = pixels.shape[0]
        memory, global_vec = self.encode_image(pixels)
        queries = self.disease_embedding_layer(concept_book)
        n_disease = queries.shape[0] // N_CONCEPTS
        sim = F.normalize(global_vec, dim=-1) @ F.normalize(queries, dim=-1).T
        global_logits = sim.view(b, n_disease, N_CONCEPTS).permute(0, 2, 1)
        tokens = memory.permute(0, 2, 3, 1).reshape(b, -1, memory.shape[1]).transpose(0, 1)
        out, attention = self.decoder(queries.unsqueeze(1).repeat(1, b, 1), tokens)
        out = out.permute(1, 0, 2).reshape(b, n_disease, -1)
        return {"logits": self.classifier(out), "global_logits": global_logits, "attention": attention,
                "memory": memory, "global": global_vec, "queries": queries}


def official_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Released object (``{'model': sd, ...}`` or a bare state dict) → state dict as the official loader
    makes it: ``k.replace('module.', '')`` and every key containing ``temp`` dropped."""
    return strip_state(checkpoint, lambda key: key.replace("module.", ""), lambda key: "temp" not in key)


def text_mode_scores(global_logits: torch.Tensor) -> torch.Tensor:
    """Official ``text`` score ``(B, D)`` from ``global_logits`` ``(B, 9, D)`` (see the module docstring)."""
    pairs = []
    for n in NORMAL_ENTITIES:
        normal = global_logits[:, :, [n]].expand_as(global_logits)
        pairs.append(torch.softmax(torch.stack([normal, global_logits], dim=-1), dim=-1))
    return torch.stack(pairs).mean(dim=0)[..., 1].mean(dim=1)


# -- adapter -------------------------------------------------------------------------------
class MAVLAdapter(EntityQueryAdapter):
    """MAVL behind the XBench adapter contract (see the module docstring for every convention).

    ``texts`` is ``{name: [description, 8 aspects]}`` (:func:`read_texts`); ``params.score_mode`` picks the score.
    """

    config_name = "mavl"
    network = MAVLNet
    texts_per_entity = N_CONCEPTS

    def __init__(self, net: MAVLNet, text_encoder: nn.Module, tokenizer: Any = None,
                 texts: Mapping[str, Sequence[str]] | None = None, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(net, text_encoder, tokenizer, texts, config, device)
        self.score_mode: str = self.config.get("params", {}).get("score_mode", "auto")
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"params.score_mode must be one of {SCORE_MODES}, got {self.score_mode!r}")

    @classmethod
    def build_network(cls, config: Mapping[str, Any]) -> MAVLNet:
        """The network, its attention pool sized by the config's ``grid``."""
        return MAVLNet(config["grid"])

    @staticmethod
    def official_state(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """:func:`official_state_dict`."""
        return official_state_dict(checkpoint)

    @staticmethod
    def read_texts(files: Mapping[str, Path]) -> dict[str, list[str]]:
        """``files["descriptions"]`` and ``files["concepts"]`` (:func:`read_texts`)."""
        return read_texts(files["descriptions"], files["concepts"])

    @staticmethod
    def name_texts(name: str) -> list[str]:
        """Random init: the name and ``"<aspect>: <name>"``."""
        return [name, *(f"{a}: {name}" for a in ASPECTS)]

    def book_for(self, names: Sequence[str]) -> torch.Tensor:
        """``(len(names)·9, 768)`` concept book rows (:func:`assemble_concept_book`)."""
        desc = self.encode_text_ids(*self.tokenize([self.texts[n][0] for n in names]))
        aspects = self.encode_text_ids(*self.tokenize([a for n in names for a in self.texts[n][1:]]))
        return assemble_concept_book(desc, aspects)

    def concept_book(self, diseases: Sequence[str]) -> torch.Tensor:
        """``(D·9, 768)`` concept book of the disease names (:meth:`query_book`)."""
        return self.query_book(diseases)

    def forward_features(self, pixels: torch.Tensor, book: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the network for a ``(D·9, 768)`` book.

        Returns ``logits (B, D, 2)``, ``scores_feature (B, D)``, ``global_logits (B, 9, D)``,
        ``scores_text (B, D)``, ``attention (4, B, D·9, 196)``, ``maps (B, D, h, w)``, ``memory
        (B, 256, h, w)``, ``global (B, 256)`` and ``queries (D·9, 256)``.
        """
        with torch.no_grad():
            out = self.net(pixels.to(self.device, torch.float32), book.to(self.device))
            b, n_disease = out["logits"].shape[:2]
            ws = layer_mean(out["attention"]).view(b, n_disease, N_CONCEPTS, -1)[:, :, list(MAP_CONCEPTS)].mean(2)
            out.update(scores_feature=torch.softmax(out["logits"], dim=-1)[..., 1],
                       scores_text=text_mode_scores(out["global_logits"]),
                       attention=torch.stack(out["attention"]), maps=ws.reshape(b, n_disease, *self.grid))
            return out

    def select_scores(self, out: Mapping[str, torch.Tensor], columns: Sequence[int]) -> torch.Tensor:
        """Per ``params.score_mode``: ``auto`` = text mode for appended unseen classes, feature mode otherwise."""
        index = torch.tensor(columns, device=out["maps"].device)
        if self.score_mode == "auto":
            text = torch.tensor([c >= len(ENTITIES) for c in columns], device=index.device)
            return torch.where(text, out["scores_text"][:, index], out["scores_feature"][:, index])
        return out[f"scores_{self.score_mode}"][:, index]
