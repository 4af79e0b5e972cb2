"""XBench's two reference models: small CLIP-style models trained on the phantom.

They are known-answer checks of the whole pipeline (data → model → maps → metrics):
trained by ``python -m xbench.workflows.train_reference`` on the phantom training split with
**image-level labels only**, their weights are committed under
``xbench/reference_weights/<name>/`` (safetensors + ``train_config.yaml`` with the
seed and the exact command), so ``xbench.create_model("ref_xattn")`` works offline.

Both share a tiny text side and a small conv image encoder:

* **Tokenizer** (:func:`tokenize`): lower-case words (``[a-z0-9-]+``) looked up in
  the fixed vocabulary :data:`VOCAB` (the phantom's finding words + template
  words); out-of-vocabulary words become ``[unk]``; padded/truncated to
  :data:`MAX_TOKENS` with ``[pad]`` (id 0).
* **Text encoder** (:class:`TextEncoder`): word + position embeddings (width 64),
  one pre-norm transformer layer (4 heads), mean over non-pad tokens, linear to
  the joint width ``dim`` (96).
* **Image encoder** (:class:`ImageEncoder`): a 4x4 stride-4 patchify conv, then
  3 conv3x3-BN-ReLU layers (the first with stride 2) and a
  1x1 projection: ``(B, 3, 128, 128) → (B, dim, 16, 16)`` patch tokens (stride 8).
  Kept small (training takes minutes on 2 CPU cores) and *local*: the
  receptive field is 44 px at 128 (a quarter of the image); with dilated,
  near-global layers every patch carried the class and the maps did not localise.

Input and preprocessing (:func:`preprocess`): the XBench image (float32 ``(H, W)``
in [0, 1]) is resized to 128x128 with ``torch.nn.functional.interpolate``
(bilinear, ``antialias=True``, ``align_corners=False``), normalised by
``(x - 0.5) / 0.25`` and repeated to 3 channels. Native grid: 16x16.

``ref_patchsim`` (:class:`PatchSimModel`, map source "similarity")
    Each class has positive and negative prompt embeddings
    (:data:`POSITIVE_TEMPLATES` / :data:`NEGATIVE_TEMPLATES`; at inference the
    L2-normalised mean over templates, as in CLIP prompt ensembling). Each patch
    token ``p_n`` (L2-normalised) is compared with both prompts; each similarity
    is pooled over the 256 patches by log-mean-exp at the learned temperature
    ``s`` (a smooth maximum: multiple-instance pooling),
    ``pool(t) = log(mean_n exp(s * cos(p_n, t)))``, and the image logit is the
    CheXzero-style positive-vs-negative contrast ``pool(t_pos) - pool(t_neg)``;
    score = ``sigmoid`` of it. Map = ``cos(patch, t_pos)`` per patch, raw (in
    [-1, 1], no normalisation). Deviations from plain CLIP, on purpose: with a
    mean-pooled image embedding the map did not localise on the phantom
    (pointing 0.0 on effusion); pooling the per-patch *difference*
    ``s * (cos(p, t_pos) - cos(p, t_neg))`` localised only for some seeds
    (the evidence then lived in the difference, not in the positive
    similarity that the map shows). Pooling each prompt's similarity
    separately makes the patches that raise the score exactly those with the
    highest map values; with the recipe of :mod:`xbench.workflows.train_reference`
    (4,000 cases, 30 epochs) pointing on cardiomegaly and effusion was >= 0.85
    for each of seeds 0, 1 and 2 (300 test cases, CPU).

``ref_xattn`` (:class:`XAttnModel`, map source "cross-attention")
    MedKLIP/KAD-like query decoder: each prompt's text embedding (bare prompt, no
    template) is a query; 2 pre-norm decoder layers of cross-attention (4 heads)
    to the patch tokens (+ learned 2-D position embedding) and an FFN, without
    query self-attention (so a class's output does not depend on the other prompts
    asked). A 2-way head per query; score = ``softmax(logits)[..., 1]`` (MedKLIP's
    "present" index). Map = cross-attention weights averaged over heads
    (PyTorch's default) and then over the 2 layers (MedKLIP's mean of layers), at
    16x16; rows sum to 1, no further normalisation.

Scores are probabilities (``score_rule: probability``). Unseen classes: a prompt
whose words are not in :data:`VOCAB` is still encoded (its unknown words as
``[unk]``) and an :class:`~xbench.core.errors.XBenchWarning` says so — the output is
then meaningless by construction. The weights are XBench's own
(``weights_label = "xbench-reference"``); no official weights exist.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import FormatError, XBenchWarning
from ..spec.registry import model_config
from ._common import build_uninitialised, check_inputs, seeded_build
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, with_yaml_facts

VOCAB: tuple[str, ...] = (
    "[pad]", "[unk]", "a", "an", "the", "chest", "x-ray", "radiograph", "image", "showing", "shows", "with",
    "without", "of", "no", "there", "is", "evidence", "sign", "signs", "normal", "finding", "findings",
    "cardiomegaly", "enlarged", "heart", "pleural", "effusion", "consolidation", "nodule", "pulmonary",
    "pneumothorax", "interstitial", "pattern", "lung", "disease", "opacity",
)
MAX_TOKENS = 12
POSITIVE_TEMPLATES: tuple[str, ...] = ("{}", "chest x-ray showing {}", "there is {}", "evidence of {}")
NEGATIVE_TEMPLATES: tuple[str, ...] = ("no {}", "chest x-ray without {}", "there is no {}", "no evidence of {}")
NAMES = ("ref_patchsim", "ref_xattn")  # their YAMLs hold every fact (input size, grid, weights file)


def yaml_fact(key: str) -> Any:
    """Fact ``key`` of the reference models' YAMLs (:data:`NAMES`), which must agree: the phantom is preprocessed
    once for both (``input_size``) and :mod:`xbench.workflows.train_reference` writes one file name (``weights``)."""
    values = {name: model_config(name)[key] for name in NAMES}
    if len({repr(v) for v in values.values()}) != 1:
        raise FormatError(model_config(NAMES[0])["config_path"], f"the reference models' YAMLs disagree: {values}",
                          field=key)
    return values[NAMES[0]]


def weights_file() -> str:
    """The checkpoint file name of the YAMLs' ``weights.checkpoint.path`` (what train_reference writes)."""
    return str(yaml_fact("weights")["checkpoint"]["path"])


# -- text side ---------------------------------------------------------------------------------
def tokenize(texts: Sequence[str]) -> tuple[torch.Tensor, list[list[str]]]:
    """Token ids ``(T, MAX_TOKENS)`` (int64, ``[pad]`` = 0) and, per text, its out-of-vocabulary words."""
    index = {w: i for i, w in enumerate(VOCAB)}
    ids = torch.zeros(len(texts), MAX_TOKENS, dtype=torch.long)
    unknown: list[list[str]] = []
    for row, text in enumerate(texts):
        words = re.findall(r"[a-z0-9\-]+", text.lower())[:MAX_TOKENS]
        unknown.append([w for w in words if w not in index])
        ids[row, : len(words)] = torch.tensor([index.get(w, 1) for w in words], dtype=torch.long)
    return ids, unknown


class TextEncoder(nn.Module):
    """Embedding bag with one transformer layer: ids ``(T, L)`` → embeddings ``(T, dim)``."""

    def __init__(self, dim: int = 96, width: int = 64):
        super().__init__()
        self.words = nn.Embedding(len(VOCAB), width)
        self.positions = nn.Parameter(torch.zeros(MAX_TOKENS, width))
        self.layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.proj = nn.Linear(width, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.words.weight.device)  # tokenize() builds ids on the CPU
        pad = ids == 0
        x = self.layer(self.words(ids) + self.positions, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        return self.proj((x * keep).sum(1) / keep.sum(1).clamp(min=1.0))


# -- image side --------------------------------------------------------------------------------
def _conv(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class ImageEncoder(nn.Module):
    """Pixels ``(B, 3, 128, 128)`` → patch tokens ``(B, dim, 16, 16)`` (stride 8)."""

    stride = 8  # patchify 4, then one stride-2 layer

    def __init__(self, dim: int = 96, width: int = 64):
        super().__init__()
        stem = nn.Sequential(nn.Conv2d(3, 32, 4, 4, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.body = nn.Sequential(stem, _conv(32, width, 2), _conv(width, width), _conv(width, width))
        self.proj = nn.Conv2d(width, dim, 1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(self.body(pixels))


def preprocess(image: np.ndarray, size: int | None = None) -> torch.Tensor:
    """XBench image (float32 ``(H, W)`` in [0, 1]) → ``(3, S, S)`` float32 (see the module docstring); ``S = size``,
    default the YAMLs' ``input_size``."""
    size = int(size or yaml_fact("input_size"))
    x = torch.as_tensor(np.asarray(image, dtype=np.float32))
    if x.ndim != 2:
        raise ValueError(f"expected a grey image of shape (H, W), got shape {tuple(x.shape)}")
    x = F.interpolate(x[None, None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return ((x[0] - 0.5) / 0.25).expand(3, -1, -1).contiguous()


def _warn_unknown(prompts: Sequence[str], unknown: list[list[str]]) -> None:
    for prompt, words in zip(prompts, unknown):
        if words:
            warnings.warn(f"reference model: prompt {prompt!r} has words outside its phantom vocabulary {words}; "
                          "they are encoded as [unk] and its scores/maps are meaningless", XBenchWarning, stacklevel=3)


# -- the two architectures -----------------------------------------------------------------------
class PatchSimModel(nn.Module):
    """``ref_patchsim``: patch tokens vs positive/negative prompt embeddings, log-mean-exp pooled per prompt."""

    def __init__(self, dim: int = 96):
        super().__init__()
        self.image = ImageEncoder(dim)
        self.text = TextEncoder(dim)
        self.log_scale = nn.Parameter(torch.tensor(float(np.log(10.0))))

    def encode_text_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """L2-normalised text embeddings ``(T, dim)``."""
        return F.normalize(self.text(ids), dim=-1)

    def class_embeddings(self, prompts: Sequence[str], templates: Sequence[str]) -> torch.Tensor:
        """Template-ensembled, normalised embeddings ``(C, dim)`` of ``prompts``."""
        ids, _ = tokenize([t.format(p) for p in prompts for t in templates])
        emb = self.encode_text_ids(ids).view(len(prompts), len(templates), -1).mean(1)
        return F.normalize(emb, dim=-1)

    def forward_features(self, pixels: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(B, C)`` (before the sigmoid) and maps ``(B, C, 16, 16)`` for normalised text embeddings."""
        tokens = self.image(pixels)  # (B, D, h, w)
        b, d, h, w = tokens.shape
        patches = F.normalize(tokens.flatten(2).transpose(1, 2), dim=-1)  # (B, N, D)
        scale = self.log_scale.exp().clamp(max=100.0)
        positive_sim = patches @ positive.T  # (B, N, C) cosine = the map
        log_n = float(np.log(h * w))
        pooled_pos = torch.logsumexp(scale * positive_sim, dim=1) - log_n  # log-mean-exp over patches
        pooled_neg = torch.logsumexp(scale * (patches @ negative.T), dim=1) - log_n
        return pooled_pos - pooled_neg, positive_sim.transpose(1, 2).reshape(b, -1, h, w)


class _DecoderLayer(nn.Module):
    """Pre-norm cross-attention + FFN (no query self-attention); returns head-averaged attention.

    As in DETR's decoder, only the queries are normalised in each layer; the memory
    (patch tokens) is normalised once by the caller.
    """

    def __init__(self, dim: int, heads: int = 4):
        super().__init__()
        self.norm_q, self.norm_ff = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(inplace=True), nn.Linear(2 * dim, dim))

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = self.attn(self.norm_q(queries), memory, memory, need_weights=True, average_attn_weights=True)
        queries = queries + out
        return queries + self.ffn(self.norm_ff(queries)), weights


class XAttnModel(nn.Module):
    """``ref_xattn``: text queries cross-attend to patch tokens; 2-way head per query."""

    def __init__(self, dim: int = 64, layers: int = 2, grid: Sequence[int] | None = None):
        super().__init__()
        h, w = grid if grid is not None else model_config("ref_xattn")["grid"]
        self.image = ImageEncoder(dim)
        self.text = TextEncoder(dim)
        self.positions = nn.Parameter(torch.zeros(int(h) * int(w), dim))
        self.norm_memory = nn.LayerNorm(dim)
        self.query = nn.Linear(dim, dim)
        self.decoder = nn.ModuleList([_DecoderLayer(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)

    def encode_text_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Query embeddings ``(T, dim)`` of token ids."""
        return self.query(self.text(ids))

    def class_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        """Queries ``(C, dim)`` of the bare prompts (no template)."""
        return self.encode_text_ids(tokenize(list(prompts))[0])

    def forward_features(self, pixels: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """2-way logits ``(B, C, 2)`` and layer-averaged attention maps ``(B, C, 16, 16)``."""
        tokens = self.image(pixels)
        b, d, h, w = tokens.shape
        memory = self.norm_memory(tokens.flatten(2).transpose(1, 2) + self.positions)
        q = queries.unsqueeze(0).expand(b, -1, -1)
        maps = []
        for layer in self.decoder:
            q, weights = layer(q, memory)
            maps.append(weights)
        attention = torch.stack(maps).mean(0)  # (B, C, N)
        return self.head(self.norm(q)), attention.reshape(b, -1, h, w)


ARCHITECTURES: dict[str, type[nn.Module]] = {"ref_patchsim": PatchSimModel, "ref_xattn": XAttnModel}


# -- adapters ------------------------------------------------------------------------------------
class _ReferenceAdapter(Adapter):
    """Shared loading and preprocessing of the two reference adapters."""

    architecture: ClassVar[type[nn.Module]]

    def __init__(self, model: nn.Module, config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(config, device)
        self.model = model.to(self.device).eval()
        side = self.input_size // ImageEncoder.stride
        self.check_fact("grid", (side, side), f"input_size {self.input_size} over the image encoder's stride")

    @classmethod
    def build_architecture(cls, config: Mapping[str, Any] | None) -> nn.Module:
        """The network for ``config`` (its YAML facts filled in)."""
        return cls.architecture()

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu", where: str = "reference checkpoint") -> _ReferenceAdapter:
        """Build the adapter from a loaded state dict (the path a committed or user file takes).

        Raises :class:`~xbench.core.errors.CheckpointError` listing missing / unexpected / mis-shaped keys.
        """
        model = build_uninitialised(lambda: cls.build_architecture(with_yaml_facts(cls.config_name, config)))
        load_state_strict(model, checkpoint, where)
        adapter = cls(model, config, device)
        adapter.weights_label = "xbench-reference"
        return adapter

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device
              ) -> _ReferenceAdapter:
        """``files["checkpoint"]`` (the committed ``bundled_weights`` folder unless ``weights=DIR``)."""
        path = files["checkpoint"]
        return cls.from_checkpoint(load_checkpoint(path), config, device, where=str(path))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device
                ) -> _ReferenceAdapter:
        """Seeded random weights (``params.seed``), without touching the caller's RNG."""
        return cls(seeded_build(int(config["params"].get("seed", 0)), lambda: cls.build_architecture(config)), config,
                   device)

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        return preprocess(image, self.input_size)


class PatchSimAdapter(_ReferenceAdapter):
    """Adapter of ``ref_patchsim`` (see the module docstring)."""

    config_name = "ref_patchsim"
    architecture = PatchSimModel

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        check_inputs(pixels, prompts, self.input_size)
        _warn_unknown(prompts, tokenize(list(prompts))[1])
        positive = self.model.class_embeddings(prompts, POSITIVE_TEMPLATES)
        negative = self.model.class_embeddings(prompts, NEGATIVE_TEMPLATES)
        logits, maps = self.model.forward_features(pixels.to(self.device, torch.float32), positive, negative)
        return Prediction(torch.sigmoid(logits).float().cpu(), maps.float().cpu())


class XAttnAdapter(_ReferenceAdapter):
    """Adapter of ``ref_xattn`` (see the module docstring)."""

    config_name = "ref_xattn"
    architecture = XAttnModel

    @classmethod
    def build_architecture(cls, config: Mapping[str, Any] | None) -> nn.Module:
        """:class:`XAttnModel` with position embeddings for the config's ``grid``."""
        return XAttnModel(grid=(config or {}).get("grid"))

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        check_inputs(pixels, prompts, self.input_size)
        _warn_unknown(prompts, tokenize(list(prompts))[1])
        logits, maps = self.model.forward_features(pixels.to(self.device, torch.float32),
                                                   self.model.class_embeddings(prompts))
        return Prediction(torch.softmax(logits, dim=-1)[..., 1].float().cpu(), maps.float().cpu())
