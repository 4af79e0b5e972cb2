"""BiomedCLIP (ViT-B/16 + PubMedBERT) from a local folder, with no hub call: zero-shot scores and similarity maps.

Score and map rules are CLIP's (:class:`xbench.models.clip.PromptPairCLIP`): copy ``clip.py`` along with this file.

Citation
    Zhang et al., "BiomedCLIP: a multimodal biomedical foundation model pretrained from fifteen million scientific
    image-text pairs", arXiv 2303.00915 (2023).
Official code and weights
    open_clip (https://github.com/mlfoundations/open_clip), model ``hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224``;
    files published at https://huggingface.co/microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224.
Weights folder (local only, never downloaded)
    ``open_clip_config.json`` (architecture and preprocessing), ``open_clip_pytorch_model.bin`` (a plain state dict:
    ``visual.trunk.*``, ``visual.head.proj.weight``, ``text.transformer.*``, ``text.proj.{0,2}.weight``,
    ``logit_scale``), and the tokenizer files ``vocab.txt`` and ``tokenizer_config.json``.
Building without the hub
    open_clip's ``CustomTextCLIP`` would call ``transformers.AutoConfig.from_pretrained(hf_model_name)`` inside
    ``HFTextEncoder.__init__`` even with ``pretrained=False`` (open_clip ``hf_model.py``). :class:`BiomedCLIP` assembles
    the same modules under the same key names instead: ``visual`` = open_clip ``TimmModel`` (timm
    ``vit_base_patch16_224``, ``pretrained=False`` always), ``text`` = open_clip ``HFTextEncoder`` given an explicit
    ``BertConfig`` (BERT-base sizes, as BiomedBERT-base; ``vocab_size`` read from the checkpoint's word embedding, 30522
    for random init), with the unused BERT pooling layer removed as open_clip does for every pooler but
    ``cls_pooler`` (``add_pooling_layer=False``), and a scalar ``logit_scale``. The tokenizer is
    ``AutoTokenizer.from_pretrained(<folder>, local_files_only=True, config=BertConfig())`` (the config keeps
    ``AutoTokenizer`` from calling ``AutoConfig.from_pretrained``) wrapped by open_clip's ``HFTokenizer``
    (whitespace cleaning, padding to the config's context length, 256), which is what ``open_clip.get_tokenizer``
    does for a ``local-dir:`` model.
    A checkpoint saved with older transformers may hold ``text.transformer.embeddings.position_ids`` (a buffer that
    current transformers no longer saves); it is dropped, as open_clip's ``load_checkpoint`` does.
Input
    224×224. The XBench image becomes 8-bit with ``np.round(image * 255)``, is replicated to RGB, then follows
    open_clip's validation transform with the folder's ``preprocess_cfg`` (official: ``Resize(224, bicubic)`` of the
    shorter side, ``CenterCrop(224)``, OpenAI mean/std).
Native grid
    14×14.
Score rule (``score_rule: probability``)
    Per class, ``softmax(exp(logit_scale) · [cos(img, pos), cos(img, neg)])`` over a positive and a negative prompt
    (config templates, default ``"a chest x-ray showing {}"`` / ``"a chest x-ray with no {}"``); the score is the
    positive prompt's probability. The scale is the model's own learned ``logit_scale``, as in BiomedCLIP's model-card
    zero-shot example. XBench's exact templates are not published; these are ours.
Map rule (``map_source: similarity``)
    Patch tokens of the last block after the trunk's final norm, ``visual.trunk.forward_features(x)[:, 1:]``, through
    ``visual.head`` (768→512, the same projection as the pooled CLS embedding), L2-normalised; cosine with the class's
    L2-normalised positive prompt embedding; reshaped row-major to 14×14. Raw cosines, not normalised.
Unseen classes
    None: open-vocabulary, every prompt name is put into the templates as is.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from open_clip.hf_model import HFTextEncoder
from open_clip.model import CLIPTextCfg, CLIPVisionCfg
from open_clip.timm_model import TimmModel
from open_clip.tokenizer import HFTokenizer
from transformers import BertConfig

from xbench.core.errors import CheckpointError, FormatError
from xbench.models._common import seeded_or_uninitialised
from xbench.models.base import load_checkpoint, load_state_strict, resize_crop_window
from xbench.models.checkpoint import require_tensor_state
from xbench.models.clip import PromptPairCLIP  # the shared prompt-pair score and similarity-map rules

DEFAULT_VOCAB_SIZE = 30522  # BiomedBERT-base uncased vocabulary size
WORD_EMBEDDING_KEY = "text.transformer.embeddings.word_embeddings.weight"
STALE_BUFFER_KEYS = ("text.transformer.embeddings.position_ids",)  # saved by transformers < 4.31, not a weight
LEGACY_TEXT_KEYS = {"proj": "hf_proj_type", "pooler_type": "hf_pooler_type"}  # pre-rename open_clip config keys


# -- network ----------------------------------------------------------------------------
def read_open_clip_config(path: str | Path) -> dict[str, Any]:
    """Parse ``open_clip_config.json``; return its dict (``model_cfg`` and ``preprocess_cfg``), checked."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    model_cfg = config.get("model_cfg") if isinstance(config, dict) else None
    if not isinstance(model_cfg, dict):
        raise FormatError(path, "missing the 'model_cfg' mapping", field="model_cfg")
    for section, key in (("vision_cfg", "timm_model_name"), ("text_cfg", "hf_model_name")):
        if not model_cfg.get(section, {}).get(key):
            raise FormatError(path, "BiomedCLIP needs a timm vision tower and an HF text tower; "
                                    f"{section}.{key} is absent", field=f"model_cfg.{section}.{key}")
    try:
        CLIPVisionCfg(**model_cfg["vision_cfg"])
        CLIPTextCfg(**{LEGACY_TEXT_KEYS.get(k, k): v for k, v in model_cfg["text_cfg"].items()})
    except TypeError as exc:  # a key open_clip's config dataclasses do not know
        raise FormatError(path, f"not an open_clip model config: {exc}", field="model_cfg") from exc
    return config


def bert_config(vocab_size: int = DEFAULT_VOCAB_SIZE) -> BertConfig:
    """BERT-base configuration of BiomedBERT-base (12 layers, 768 wide, 12 heads, 3072 MLP, 512 positions)."""
    return BertConfig(vocab_size=vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)


class BiomedCLIP(torch.nn.Module):
    """open_clip ``CustomTextCLIP`` layout (same state-dict keys), built from a config dict without any hub call.

    Parameters
    ----------
    model_cfg : dict
        The ``model_cfg`` of ``open_clip_config.json`` (``embed_dim``, ``vision_cfg``, ``text_cfg``).
    text_config : transformers.BertConfig
        Configuration of the text transformer (see :func:`bert_config`).
    """

    def __init__(self, model_cfg: Mapping[str, Any], text_config: BertConfig):
        super().__init__()
        embed_dim = int(model_cfg["embed_dim"])
        vision = CLIPVisionCfg(**model_cfg["vision_cfg"])
        text = CLIPTextCfg(**{LEGACY_TEXT_KEYS.get(k, k): v for k, v in model_cfg["text_cfg"].items()})
        self.visual = TimmModel(
            vision.timm_model_name, embed_dim=embed_dim, image_size=vision.image_size, pool=vision.timm_pool,
            proj=vision.timm_proj, proj_bias=vision.timm_proj_bias, drop=vision.timm_drop,
            drop_path=vision.timm_drop_path, pretrained=False)
        self.text = HFTextEncoder(text.hf_model_name, output_dim=embed_dim, config=text_config,
                                  pooler_type=text.hf_pooler_type, proj_type=text.hf_proj_type, pretrained=False)
        if text.hf_pooler_type != "cls_pooler":  # open_clip builds these with add_pooling_layer=False
            self.text.transformer.pooler = None
        self.logit_scale = torch.nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))  # CustomTextCLIP's init
        self.context_length = int(text.context_length)

    def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``(N, L)`` (padding id = BERT's pad id) → text embeddings ``(N, embed_dim)``, not normalised."""
        return self.text(input_ids)


def build_biomedclip(model_cfg: Mapping[str, Any], vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int | None = 0
                     ) -> BiomedCLIP:
    """Full network from ``model_cfg`` in eval mode: with seeded random weights (global RNG untouched), or with
    ``seed=None`` uninitialised for a strict load (:func:`~xbench.models._common.build_uninitialised`)."""
    def network() -> BiomedCLIP:
        return BiomedCLIP(model_cfg, bert_config(vocab_size))

    return seeded_or_uninitialised(network, seed).eval()


def biomedclip_state_dict(checkpoint: Mapping[str, Any], where: str = "BiomedCLIP checkpoint") -> dict[str, torch.Tensor]:
    """A loaded ``open_clip_pytorch_model.bin`` object → state dict for :class:`BiomedCLIP` (float32).

    Unwraps ``{"state_dict": ...}``, strips ``module.`` and drops the stale ``position_ids`` buffer. A non-string key
    or a value that is not a tensor → :class:`CheckpointError` naming ``where`` (the file) and the entry.
    """
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"{where}: expected a state dict (mapping), got {type(checkpoint).__name__}")
    state = require_tensor_state(checkpoint.get("state_dict", checkpoint), where)
    return {key.removeprefix("module."): value.float() if value.is_floating_point() else value
            for key, value in state.items() if key.removeprefix("module.") not in STALE_BUFFER_KEYS}


# -- adapter ----------------------------------------------------------------------------
class BiomedCLIPAdapter(PromptPairCLIP):
    """BiomedCLIP adapter; see the module docstring for files, score and map rules.

    Parameters
    ----------
    model : BiomedCLIP
        The network (weights loaded).
    tokenizer : open_clip.tokenizer.HFTokenizer
        Returns padded ``input_ids`` ``(N, context_length)``.
    preprocess_cfg : dict
        ``preprocess_cfg`` of ``open_clip_config.json`` (``mean``, ``std``, optional ``interpolation`` and
        ``resize_mode``).
    config : dict, optional
        The model config; ``params.templates`` overrides the prompt templates.
    device : str or torch.device, default="cpu"
    weights_label : str, default="unknown"
    """

    config_name = "biomedclip"

    def __init__(self, model: BiomedCLIP, tokenizer: HFTokenizer, preprocess_cfg: Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu",
                 weights_label: str = "unknown"):
        super().__init__(config, device)
        self._set_templates()
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.check_fact("input_size", int(self.model.visual.image_size[0]), "the folder's open_clip_config.json")
        self.check_fact("grid", tuple(self.model.visual.trunk.patch_embed.grid_size), "the folder's open_clip_config.json")
        pre = dict(preprocess_cfg or {})
        self.transform = open_clip.image_transform(
            self.input_size, is_train=False,
            mean=tuple(pre.get("mean", open_clip.OPENAI_DATASET_MEAN)),
            std=tuple(pre.get("std", open_clip.OPENAI_DATASET_STD)),
            resize_mode=pre.get("resize_mode"), interpolation=pre.get("interpolation"))
        self.resize_mode = pre.get("resize_mode") or "shortest"
        self.weights_label = weights_label

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def _parts(cls, files: Mapping[str, Path]) -> tuple[dict[str, Any], HFTokenizer]:
        """The folder's ``open_clip_config.json`` (checked) and tokenizer (no hub call)."""
        open_clip_config = read_open_clip_config(files["config"])
        return open_clip_config, cls.load_tokenizer(files["vocab"].parent, open_clip_config["model_cfg"])

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any],
              device: str | torch.device) -> BiomedCLIPAdapter:
        """Config, tokenizer and checkpoint from the folder (``"official"``)."""
        open_clip_config, tokenizer = cls._parts(files)
        path = files["checkpoint"]
        return cls.from_checkpoint(load_checkpoint(path), open_clip_config["model_cfg"], tokenizer,
                                   open_clip_config.get("preprocess_cfg"), config, device, where=str(path))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any],
                device: str | torch.device) -> BiomedCLIPAdapter:
        """Config and tokenizer from the folder (the YAML marks them ``random: required``), seeded random
        weights; the checkpoint is not read."""
        open_clip_config, tokenizer = cls._parts(files)
        model = build_biomedclip(open_clip_config["model_cfg"], seed=int(config["params"].get("seed", 0)))
        return cls(model, tokenizer, open_clip_config.get("preprocess_cfg"), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], model_cfg: Mapping[str, Any], tokenizer: HFTokenizer,
                        preprocess_cfg: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu", where: str = "BiomedCLIP checkpoint") -> BiomedCLIPAdapter:
        """Adapter from a loaded checkpoint object (the path the official file takes); labelled ``"official"``.

        The text vocabulary size is read from the checkpoint's word embedding; a mismatching checkpoint raises
        :class:`~xbench.core.errors.CheckpointError` listing missing / unexpected / mis-shaped keys.
        """
        state = biomedclip_state_dict(checkpoint, where)
        words = state.get(WORD_EMBEDDING_KEY)
        vocab_size = int(words.shape[0]) if words is not None else DEFAULT_VOCAB_SIZE
        model = build_biomedclip(model_cfg, vocab_size=vocab_size, seed=None)  # every parameter is loaded next
        load_state_strict(model, state, where)
        return cls(model, tokenizer, preprocess_cfg, config, device, weights_label="official")

    @staticmethod
    def load_tokenizer(folder: str | Path, model_cfg: Mapping[str, Any]) -> HFTokenizer:
        """open_clip ``HFTokenizer`` over ``AutoTokenizer.from_pretrained(folder, local_files_only=True)``.

        A ``BertConfig`` is passed so that ``AutoTokenizer`` does not look for a model config (it would call
        ``AutoConfig.from_pretrained`` on the folder, which has none); the class comes from ``tokenizer_config.json``.
        """
        text_cfg = model_cfg["text_cfg"]
        return HFTokenizer(str(folder), context_length=int(text_cfg.get("context_length", 256)),
                           local_files_only=True, config=bert_config(), **(text_cfg.get("tokenizer_kwargs") or {}))

    def logit_scale(self) -> torch.Tensor:
        """The checkpoint's learned scale, ``exp(logit_scale)``."""
        return self.model.logit_scale.exp()

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """open_clip's validation resize/crop (``resize_mode`` of the config; default shortest side + centre crop)."""
        return resize_crop_window(size, self.input_size, self.resize_mode)

    def image_features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled image embedding ``(B, 512)`` and projected patch tokens ``(B, h·w, 512)``, both L2-normalised.

        One trunk pass: ``forward_features`` (final norm applied) → CLS via ``forward_head`` and patch tokens
        ``[:, num_prefix_tokens:]``, both through ``visual.head``. Patch order is row-major over the grid.
        """
        trunk, head = self.model.visual.trunk, self.model.visual.head
        tokens = trunk.forward_features(pixels)
        pooled = head(trunk.forward_head(tokens))
        patches = head(tokens[:, trunk.num_prefix_tokens:])
        return F.normalize(pooled, dim=-1), F.normalize(patches, dim=-1)
