"""DeViDe (**unverified** re-construction): ViT-B/16 + Med-KEBERT + KAD-style query network.

Citation
    Luo et al. "DeViDe: Faceted medical knowledge for improved medical vision-language
    pre-training". arXiv 2404.03618 (2024).
Official code and weights
    **None public** (checked: no DeViDe repository in the code index). This adapter is built from the
    paper's description and the working assumption of XBench's research notes; every choice the
    paper leaves open is a config parameter. ``verified = False``; constructing it emits an
    :class:`~xbench.core.errors.XBenchWarning`. Its numbers are not comparable to the paper's until a
    real checkpoint and the authors' code confirm the layout.

Architecture (assumed)
    * Image encoder: ViT-B/16 at 224 (paper: "ViT-B"), torchvision ``vit_b_16`` layout (chosen
      over ``transformers.ViTModel`` because its state-dict names are stable across library
      versions), classification head removed; image tokens = the 196 patch tokens after the
      encoder's final LayerNorm (eps 1e-6), row-major 14x14, as KAD's ``ModelViT224`` takes
      ``last_hidden_state[:, 1:]``.
    * Text encoder: Med-KEBERT + ``mlp_embed`` (paper: the KAD text encoder), reused from
      :class:`xbench.models.kad.KADTextEncoder`.
    * Fusion: KAD's query network, reused from :class:`xbench.models.kad.TQN` (768-d, 4 layers,
      4 heads, FFN 1024, shared ``decoder_norm``), head width ``params.head_outputs``.
Score
    ``head_outputs: 2`` (default, KAD-style): ``softmax(logits)[..., 1]``; ``head_outputs: 1``:
    ``sigmoid(logit)``. Both are probabilities (``score_rule = "probability"``).
Map
    KAD's rule (also the first author's visualiser for TQN models): last decoder layer's
    cross-attention, head-averaged, row for the class, reshaped row-major to 14x14, divided by its max.
Text input, unseen classes, preprocessing
    As KAD-224 (:mod:`xbench.models.kad`): the prompt name (ChestX-ray14 spellings of
    :data:`~xbench.models.kad.OFFICIAL_TEXT`), Med-KEBERT tokenizer, 256 tokens; 8-bit image ->
    ``Resize([224, 224], BICUBIC)`` -> ``ToTensor`` -> ``Normalize(params.image_mean, params.image_std)``
    (default ImageNet statistics, KAD's pipeline).
Checkpoint layout (user-supplied; KAD-like containers, no prefix)
    ``{'image_encoder': {'vit.class_token', 'vit.conv_proj.{weight,bias}', 'vit.encoder.pos_embedding',
    'vit.encoder.layers.encoder_layer_{0..11}.{ln_1, self_attention.{in_proj_weight, in_proj_bias,
    out_proj}, ln_2, mlp.0, mlp.3}.*', 'vit.encoder.ln.*'}, 'text_encoder': KAD's (``bert_model.*``,
    ``mlp_embed.{0,2}.*``, ``logit_scale``), 'model': KAD's TQN (``decoder.norm.*`` aliases accepted)}``.
    ``vit.heads.*`` (an unused classifier) is ignored. Other top-level entries are ignored.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from torch import nn
from transformers import BertConfig

from ..core.errors import XBenchWarning
from ._common import (IMAGENET_MEAN, IMAGENET_STD, PromptCache, build_uninitialised, check_inputs, normalize_uint8,
                      resize_uint8, seeded_build)
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, with_yaml_facts
from .kad import (TQN, KADPromptFeatures, KADTextEncoder, MedKEBERTTokenizer, bert_config_from_state,
                  canonical_text_state, canonical_tqn_state, checkpoint_containers, max_normalised_maps,
                  random_init_tokenizer)


class DeViDeImageEncoder(nn.Module):
    """ViT-B/16 (torchvision layout under ``vit.``) returning the patch tokens ``(B, (S/16)², 768)``.

    ``image_size`` is the YAML's ``input_size`` (its positional embedding fixes it).
    """

    def __init__(self, image_size: int):
        super().__init__()
        self.vit = torchvision.models.vit_b_16(weights=None, image_size=image_size)
        self.vit.heads = nn.Identity()  # unused classifier; no parameters, no keys

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Patch tokens after the final LayerNorm, row-major, for ``pixels (B, 3, 224, 224)``."""
        patches = self.vit.conv_proj(pixels).flatten(2).transpose(1, 2)
        cls = self.vit.class_token.expand(pixels.shape[0], -1, -1)
        return self.vit.encoder(torch.cat([cls, patches], dim=1))[:, 1:]


class DeViDeNetwork(nn.Module):
    """Image encoder + text encoder + TQN; attribute names follow the checkpoint containers."""

    def __init__(self, image_size: int, head_outputs: int = 2, bert_config: BertConfig | None = None,
                 tqn_layers: int = 4, tqn_heads: int = 4, tqn_ffn: int = 1024):
        super().__init__()
        self.image_encoder = DeViDeImageEncoder(image_size)
        self.text_encoder = KADTextEncoder(bert_config)
        self.model = TQN(layers=tqn_layers, heads=tqn_heads, ffn=tqn_ffn, outputs=head_outputs)

    def load_checkpoint_dict(self, checkpoint: Any) -> None:
        """Strictly load ``{'image_encoder', 'text_encoder', 'model'}`` in the layout of the module docstring."""
        parts = checkpoint_containers(checkpoint)
        image = {k: v for k, v in parts["image_encoder"].items() if not k.startswith("vit.heads.")}
        load_state_strict(self.image_encoder, image, "DeViDe checkpoint['image_encoder']")
        load_state_strict(self.text_encoder, canonical_text_state(parts["text_encoder"]), "DeViDe checkpoint['text_encoder']")
        load_state_strict(self.model, canonical_tqn_state(parts["model"]), "DeViDe checkpoint['model']")


class DeViDeAdapter(KADPromptFeatures, Adapter):
    """XBench adapter for the assumed DeViDe architecture (**unverified**; see the module docstring).

    Parameters
    ----------
    network : DeViDeNetwork
    tokenizer : callable
        ``texts -> (input_ids, attention_mask)``.
    config : mapping, optional
        ``params``: ``head_outputs`` (2 or 1), ``image_mean``, ``image_std``, ``tqn_layers``,
        ``tqn_heads``, ``tqn_ffn``, ``seed``, ``random_init``.
    device : str or torch.device
    """

    gpu_preprocess = "square"  # :meth:`preprocess` as a GPU kernel (:mod:`xbench.inference.gpu_preprocess`)

    config_name = "devide"

    def __init__(self, network: DeViDeNetwork, tokenizer: Any, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(config, device)
        if not self.verified:  # devide.yaml: verified: false
            warnings.warn(f"{self.config.get('title', self.name)}: no public code or weights; this adapter is an "
                          "unverified re-construction from the paper (ViT-B/16 + Med-KEBERT + KAD-style query "
                          "network)", XBenchWarning, stacklevel=2)
        params = self.config.get("params", {})
        self.mean = tuple(params.get("image_mean", IMAGENET_MEAN))
        self.std = tuple(params.get("image_std", IMAGENET_STD))
        self.network = network.to(self.device).eval()
        self.tokenizer = tokenizer
        self._text_cache: PromptCache[torch.Tensor] = PromptCache()

    @classmethod
    def _network_kwargs(cls, config: Mapping[str, Any]) -> dict[str, int]:
        config = with_yaml_facts(cls.config_name, config)
        params = config.get("params", {})
        if int(params.get("head_outputs", 2)) not in (1, 2):
            raise ValueError(f"params.head_outputs must be 1 (sigmoid) or 2 (softmax), got {params['head_outputs']!r}")
        return {"image_size": int(config["input_size"]), "head_outputs": int(params.get("head_outputs", 2)),
                "tqn_layers": int(params.get("tqn_layers", 4)),
                "tqn_heads": int(params.get("tqn_heads", 4)), "tqn_ffn": int(params.get("tqn_ffn", 1024))}

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> DeViDeAdapter:
        """The user-supplied ``checkpoint`` and the Med-KEBERT ``text_encoder`` tokenizer folder."""
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]), MedKEBERTTokenizer(files["text_encoder"]),
                                   config, device)

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> DeViDeAdapter:
        """Network seeded by ``params.seed`` and :func:`~xbench.models.kad.random_init_tokenizer`."""
        network = seeded_build(int(config["params"].get("seed", 0)), lambda: DeViDeNetwork(**cls._network_kwargs(config)))
        return cls(network, random_init_tokenizer(config["params"]), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, tokenizer: Any, config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu") -> DeViDeAdapter:
        """Adapter from a loaded checkpoint dict; wrong keys or shapes raise :class:`CheckpointError` listing them."""
        config = dict(config or {})
        text_state = checkpoint_containers(checkpoint, ("text_encoder",))["text_encoder"]
        bert_config, kwargs = bert_config_from_state(text_state), cls._network_kwargs(config)
        network = build_uninitialised(lambda: DeViDeNetwork(bert_config=bert_config, **kwargs))
        network.load_checkpoint_dict(checkpoint)
        adapter = cls(network, tokenizer, config, device)
        adapter.weights_label = "user-checkpoint"
        return adapter

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] -> ``(3, 224, 224)`` float32."""
        return normalize_uint8(resize_uint8(image, self.input_size), self.mean, self.std)

    @torch.no_grad()
    def encode_text_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Text features ``(Q, 768)`` from token ids ``(Q, L)``."""
        return self.network.text_encoder(input_ids.to(self.device), attention_mask.to(self.device))

    @torch.no_grad()
    def forward_features(self, pixels: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, Q, head_outputs)`` and per-layer cross-attention (each ``(B, Q, 196)``)."""
        tokens = self.network.image_encoder(pixels.to(self.device, torch.float32))
        return self.network.model(tokens, text_features.to(self.device))

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (softmax index 1, or sigmoid for one output) and max-normalised 14x14 maps."""
        check_inputs(pixels, prompts, self.input_size)
        logits, attention = self.forward_features(pixels, self.encode_prompts(prompts))
        scores = logits.softmax(dim=-1)[..., 1] if logits.shape[-1] == 2 else logits[..., 0].sigmoid()
        return Prediction(scores=scores.float().cpu(), maps=max_normalised_maps(attention[-1], self.grid).float().cpu())
