"""KAD: Knowledge-enhanced Auto Diagnosis (KAD-224, KAD-512, KAD-1024).

Citation
    Zhang, Wu, Zhang, Wang, Xie. "Knowledge-enhanced visual-language pre-training on chest
    radiology images". Nature Communications 14, 4542 (2023).
Official code
    https://github.com/xiaoman-zhang/KAD (read at 591d999e; ``A3_CLIP/models/clip_tqn.py``,
    ``A3_CLIP/models/transformer_decoder.py``, ``A3_CLIP/test_chestxray14.py``,
    ``A3_CLIP/plot_visualize_512.py``). Nothing is copied; the modules below are re-written from
    the facts in those files.
Weights
    ``best_valid.pt`` of each variant from the authors' Google Drive folder
    (https://drive.google.com/drive/folders/1xWVVJRfnm_wIgUpbn9ftsW4K5XKU0i0-) and the Med-KEBERT
    tokenizer files (``vocab.txt``, ``tokenizer_config.json``, ...) from
    https://huggingface.co/xmcmic/Med-KEBERT, placed in one local folder (nothing is downloaded).

Variants (``trunk`` parameter)
    * KAD-224 (registry ``kad``, the base model of the paper and of the official zero-shot test
      scripts, which build ``ModelRes``): ResNet-50 conv1..layer3 (1024 channels, stride 16),
      input 224, grid 14x14.
    * KAD-512 / KAD-1024 (``kad_512``, ``kad_1024``; ``ModelRes512``): conv1..layer4 (2048 channels,
      stride 32), input 512 / 1024, grid 16x16 / 32x32. Same checkpoint layout.

Architecture
    Image tokens: trunk features flattened row-major to ``(B, HW, C)`` -> ``res_l1`` -> ReLU ->
    ``res_l2`` -> ``(B, HW, 768)``. Text: Med-KEBERT (``BertModel``, bert-base uncased) pooler
    output -> ``mlp_embed`` (Linear, exact-erf GELU, Linear) -> ``(Q, 768)``. Query network (TQN):
    one LayerNorm ``decoder_norm`` applied to the image tokens and to the text queries, 4 pre-norm
    decoder layers (self-attention among the Q queries, cross-attention to the HW tokens, FFN
    768->1024->768 with ReLU; 4 heads), ``decoder_norm`` again as the final norm, ``mlp_head``
    Linear(768, 2) -> logits ``(B, Q, 2)``. All prompts of one call are decoded together (the
    queries self-attend), so the class set and its order change the outputs slightly, as in the
    official code.

Score
    ``softmax(logits, -1)[..., 1]`` (``test_chestxray14.py``): already a probability
    (``score_rule = "probability"``).
Map
    ``plot_visualize_512.py``: the decoder returns only the **last** layer's cross-attention,
    averaged over the 4 heads (softmax over the HW tokens); the class row is reshaped row-major to
    ``(h, w)`` (the script's ``rearrange('(w h) -> w h')`` is a plain reshape of tokens that were
    flattened row-major) and divided by its maximum (the script then multiplies by 255 for display
    and resizes with ``cv2.INTER_LINEAR``). :meth:`KADAdapter.predict` returns that max-normalised
    native-grid map (values in (0, 1], maximum exactly 1); upsampling is left to the metrics.
    The visualiser runs one image per forward pass while ``predict`` runs a batch: nothing in KAD
    mixes images of a batch (batch-norm is in eval mode, attention is per image), so the batched
    map equals the batch-of-1 map up to float32 reduction-order noise (in the parity fixtures the
    official batched and batch-of-1 attentions are bit-identical, and this batched ``predict``
    matches the official max-normalised maps within 2e-5).
Text input
    The prompt name itself, no template (official practice; ``do_lower_case=True`` tokenizer,
    ``max_length=256`` padded to the maximum length). Names that the official ChestX-ray14 test
    spells differently are mapped to its spelling (:data:`OFFICIAL_TEXT`, e.g. ``"mass"`` ->
    ``"lung mass"``). Unseen classes: the name is passed as is (KAD is open-vocabulary; the paper
    evaluates unseen PadChest names this way).
Preprocessing
    8-bit image (``np.round(image * 255)``) -> ``Resize([S, S], BICUBIC)`` (PIL) -> ``ToTensor`` ->
    ImageNet ``Normalize``; grey replicated to 3 channels. The official test dataset resizes the
    shorter side (``Resize(S)``), which is the same for square images; non-square images are
    squashed to ``S x S`` as in the official visualiser, so every input has the native grid.
Deviations
    ``pad_to_max_length=True`` (removed from ``transformers``) is written
    ``padding="max_length", truncation=True``; names never reach 256 tokens.
    ``bert_model.embeddings.position_ids`` in files saved with transformers < 4.31 is dropped
    before the strict load (modern ``BertModel`` keeps it as a constructed buffer).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from transformers import BertConfig, BertModel

from ..core.errors import CheckpointError, MissingFileError
from ._common import (HashWordTokenizer, PromptCache, build_uninitialised, check_inputs, normalize_uint8, resize_uint8,
                      seeded_build)
from .base import Adapter, Prediction, load_checkpoint, load_state_strict
from .layers import QueryNetwork

MAX_LENGTH = 256  # official --max_length
EMBED_DIM = 768

# Spellings of the official ChestX-ray14 zero-shot test (test_chestxray14.py, ``text_list``) for the
# label names that differ from it; every other prompt name is used verbatim.
OFFICIAL_TEXT = {
    "effusion": "pleural effusion",
    "mass": "lung mass",
    "nodule": "lung nodule",
    "pleural thickening": "pleural thicken",
}

# torchvision ResNet-50 child name -> index in ``nn.Sequential(*resnet.children())`` (the official
# ``res_features``); the checkpoint stores every trunk tensor under both names.
_RESNET_CHILDREN = {"conv1": 0, "bn1": 1, "relu": 2, "maxpool": 3, "layer1": 4, "layer2": 5, "layer3": 6, "layer4": 7}
_TRUNKS = {"layer3": (7, 1024, 16), "layer4": (8, 2048, 32)}  # children kept, channels, stride


# -- image encoder -------------------------------------------------------------------------
class KADImageEncoder(nn.Module):
    """ResNet-50 trunk + token MLP (official ``ModelRes`` / ``ModelRes512``).

    Parameters
    ----------
    trunk : {"layer3", "layer4"}
        ``"layer3"``: conv1..layer3, 1024 channels, stride 16 (KAD-224);
        ``"layer4"``: conv1..layer4, 2048 channels, stride 32 (KAD-512 / KAD-1024).

    Notes
    -----
    State-dict keys: ``res_features.{0,1,4,5,6[,7]}.*`` (the trunk as ``nn.Sequential`` of the
    ResNet children), ``res_l1.*``, ``res_l2.*``. The official module also registers the whole
    ResNet as ``resnet.*`` (aliases, plus the unused ``fc`` and, for layer3, ``layer4``);
    :func:`canonical_image_state` folds those keys away.
    """

    def __init__(self, trunk: str = "layer4"):
        super().__init__()
        if trunk not in _TRUNKS:
            raise ValueError(f"trunk must be one of {sorted(_TRUNKS)}, got {trunk!r}")
        keep, channels, self.stride = _TRUNKS[trunk]
        resnet = torchvision.models.resnet50(weights=None)
        self.res_features = nn.Sequential(*list(resnet.children())[:keep])
        self.res_l1 = nn.Linear(channels, channels)
        self.res_l2 = nn.Linear(channels, EMBED_DIM)

    def trunk(self, pixels: torch.Tensor) -> torch.Tensor:
        """ResNet features ``(B, C, S/stride, S/stride)`` of ``pixels (B, 3, S, S)``."""
        return self.res_features(pixels)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image tokens ``(B, HW, 768)`` in row-major patch order (decoder memory before the norm)."""
        tokens = self.trunk(pixels).flatten(2).transpose(1, 2)
        return self.res_l2(F.relu(self.res_l1(tokens)))


# -- text encoder --------------------------------------------------------------------------
class KADTextEncoder(nn.Module):
    """Med-KEBERT + MLP (official ``CLP_clinical``); ``forward`` = ``encode_text``.

    Keys: ``bert_model.*`` (``BertModel`` with pooler), ``mlp_embed.{0,2}.*``, ``logit_scale``
    (training temperature, unused at inference, kept so the checkpoint loads strictly).
    """

    def __init__(self, bert_config: BertConfig | None = None):
        super().__init__()
        self.bert_model = BertModel(bert_config or BertConfig(vocab_size=30522), add_pooling_layer=True)
        self.mlp_embed = nn.Sequential(nn.Linear(EMBED_DIM, EMBED_DIM), nn.GELU(), nn.Linear(EMBED_DIM, EMBED_DIM))
        self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Text features ``(Q, 768)``: ``mlp_embed(pooler_output)``; no ``token_type_ids`` (zeros).

        Trailing columns that are padding in every row are cut before BERT: masked keys get zero
        attention weight and positions are absolute, so the pooled output is unchanged (up to float
        reduction order) while 256-token inputs of short names cost a few tokens.
        """
        used = attention_mask.bool().any(dim=0).nonzero()
        length = int(used.max()) + 1 if used.numel() else 1
        input_ids, attention_mask = input_ids[:, :length], attention_mask[:, :length]
        pooled = self.bert_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return self.mlp_embed(pooled)


def bert_config_from_state(state: Mapping[str, torch.Tensor], prefix: str = "bert_model.") -> BertConfig:
    """A bert-base ``BertConfig`` whose vocabulary, positions, token types and depth match ``state``.

    Med-KEBERT is bert-base uncased (vocab 30522, 512 positions, 12 layers); reading the sizes from
    the checkpoint keeps a differently sized file loadable instead of failing on shapes.
    """
    emb = prefix + "embeddings."
    needed = [emb + "word_embeddings.weight", emb + "position_embeddings.weight", emb + "token_type_embeddings.weight"]
    missing = [k for k in needed if k not in state]
    if missing:
        raise CheckpointError(f"text encoder state lacks {missing}: not a Med-KEBERT/CLP_clinical state dict")
    layers = {int(k[len(prefix + "encoder.layer."):].split(".")[0]) for k in state if k.startswith(prefix + "encoder.layer.")}
    return BertConfig(
        vocab_size=state[needed[0]].shape[0],
        max_position_embeddings=state[needed[1]].shape[0],
        type_vocab_size=state[needed[2]].shape[0],
        num_hidden_layers=max(layers) + 1 if layers else 12,
    )


# -- query network -------------------------------------------------------------------------
class TQN(QueryNetwork):
    """KAD's query network (official ``TQN_Model``), shared by DeViDe: :class:`~xbench.models.layers.QueryNetwork`
    with self-attending queries and a one-layer ``mlp_head``.

    Parameters
    ----------
    layers, heads, ffn : int
        Decoder depth (4), attention heads (4) and FFN width (1024) of the released models.
    outputs : int
        Width of ``mlp_head`` (2 for KAD: absent / present).

    Notes
    -----
    Keys: ``logit_scale`` (unused), ``decoder_norm.*``, ``decoder.layers.*``, ``mlp_head.0.*``. The
    official file also holds ``decoder.norm.*``, the same LayerNorm registered twice;
    :func:`canonical_tqn_state` folds it into ``decoder_norm``.
    """

    def __init__(self, layers: int = 4, heads: int = 4, ffn: int = 1024, outputs: int = 2, d_model: int = EMBED_DIM):
        super().__init__(lambda: nn.Sequential(nn.Linear(d_model, outputs)), layers, heads, ffn, d_model)


# -- checkpoint ----------------------------------------------------------------------------
def _fold_alias(state: dict[str, torch.Tensor], alias: str, target: str, where: str) -> None:
    """Move ``state[alias]`` to ``state[target]`` (if absent) or check both hold the same values."""
    value = state.pop(alias)
    if target not in state:
        state[target] = value
    elif state[target].shape != value.shape or not torch.equal(state[target], value):
        raise CheckpointError(f"{where}: {alias!r} must equal {target!r} (one shared tensor in the official file), but differs")


def canonical_image_state(state: Mapping[str, torch.Tensor], trunk: str,
                          where: str = "checkpoint['image_encoder']") -> dict[str, torch.Tensor]:
    """Official ``image_encoder`` state -> :class:`KADImageEncoder` keys.

    ``resnet.<child>.*`` keys are aliases of ``res_features.<index>.*``: they fill a missing
    ``res_features`` key (a file whose shared tensors were de-duplicated still loads) or must equal
    it; ``resnet`` children outside the trunk (``fc``, ``avgpool`` and, for layer3, ``layer4``) are
    unused by the official forward and dropped.
    """
    keep = _TRUNKS[trunk][0]
    out = dict(state)
    for key in [k for k in out if k.startswith("resnet.")]:
        child, _, rest = key[len("resnet."):].partition(".")
        index = _RESNET_CHILDREN.get(child)
        if index is None or index >= keep:
            del out[key]
        else:
            _fold_alias(out, key, f"res_features.{index}.{rest}", where)
    return out


def canonical_tqn_state(state: Mapping[str, torch.Tensor], where: str = "checkpoint['model']") -> dict[str, torch.Tensor]:
    """Official ``model`` (TQN) state -> :class:`TQN` keys (``decoder.norm.*`` folded into ``decoder_norm.*``)."""
    out = dict(state)
    for key in [k for k in out if k.startswith("decoder.norm.")]:
        _fold_alias(out, key, "decoder_norm." + key[len("decoder.norm."):], where)
    return out


def canonical_text_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official ``text_encoder`` state -> :class:`KADTextEncoder` keys (drops the legacy ``position_ids`` buffer)."""
    return {k: v for k, v in state.items() if k != "bert_model.embeddings.position_ids"}


def checkpoint_containers(checkpoint: Any, names: Sequence[str] = ("image_encoder", "text_encoder", "model"),
                          ) -> dict[str, dict[str, torch.Tensor]]:
    """The state-dict containers of a KAD-style checkpoint dict, with a clear error when one is absent."""
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"expected a checkpoint dict with keys {list(names)}, got {type(checkpoint).__name__}")
    missing = [n for n in names if n not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint lacks container(s) {missing}; found top-level keys {sorted(map(str, checkpoint))}")
    return {n: dict(checkpoint[n]) for n in names}


class KADNetwork(nn.Module):
    """Image encoder + text encoder + TQN; attribute names follow the checkpoint containers."""

    def __init__(self, trunk: str = "layer4", bert_config: BertConfig | None = None):
        super().__init__()
        self.trunk_name = trunk
        self.image_encoder = KADImageEncoder(trunk)
        self.text_encoder = KADTextEncoder(bert_config)
        self.model = TQN()

    def load_official(self, checkpoint: Any) -> None:
        """Strictly load an official ``{'image_encoder', 'text_encoder', 'model', ...}`` dict (other entries ignored)."""
        parts = checkpoint_containers(checkpoint)
        image_state = canonical_image_state(parts["image_encoder"], self.trunk_name)
        load_state_strict(self.image_encoder, image_state, "KAD checkpoint['image_encoder']")
        load_state_strict(self.text_encoder, canonical_text_state(parts["text_encoder"]), "KAD checkpoint['text_encoder']")
        load_state_strict(self.model, canonical_tqn_state(parts["model"]), "KAD checkpoint['model']")


# -- preprocessing and text ----------------------------------------------------------------
def prompt_text(name: str) -> str:
    """Text KAD reads for prompt ``name``: the official ChestX-ray14 spelling (:data:`OFFICIAL_TEXT`) or the name itself."""
    return OFFICIAL_TEXT.get(name.strip().lower(), name.strip())


class MedKEBERTTokenizer:
    """The official tokenizer (``AutoTokenizer``, i.e. ``BertTokenizerFast``) from a local Med-KEBERT folder,
    ``do_lower_case=True``, 256 tokens; every published folder layout is accepted
    (:func:`xbench.models.text.load_bert_tokenizer`: vocab-only, with or without ``tokenizer_config.json``)."""

    def __init__(self, folder: str | Path, max_length: int = MAX_LENGTH):
        from .text import load_bert_tokenizer

        self.max_length = max_length
        self.tokenizer = load_bert_tokenizer(folder, fast=True, do_lower_case=True, source="https://huggingface.co/xmcmic/Med-KEBERT")

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.tokenizer(list(texts), add_special_tokens=True, max_length=self.max_length,
                             padding="max_length", truncation=True, return_tensors="pt")
        return out["input_ids"], out["attention_mask"]


def random_init_tokenizer(params: Mapping[str, Any]) -> MedKEBERTTokenizer | HashWordTokenizer:
    """Tokenizer of a random-init build: Med-KEBERT from ``params.tokenizer`` (a folder) if given, else the
    hash stand-in (:class:`~xbench.models._common.HashWordTokenizer`, 256 tokens)."""
    folder = params.get("tokenizer")
    if folder is None:
        return HashWordTokenizer(MAX_LENGTH)
    if not Path(folder).exists():
        raise MissingFileError(Path(folder), "Med-KEBERT tokenizer folder (params.tokenizer)")
    return MedKEBERTTokenizer(folder)


def max_normalised_maps(attention: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Cross-attention ``(B, Q, HW)`` -> maps ``(B, Q, h, w)`` (row-major) divided by each map's maximum.

    Attention rows are softmax outputs, so every map is positive and its maximum becomes exactly 1.
    """
    maps = attention.reshape(attention.shape[0], attention.shape[1], *grid)
    return maps / maps.amax(dim=(-2, -1), keepdim=True)


# -- adapter -------------------------------------------------------------------------------
class KADPromptFeatures:
    """``encode_prompts`` for adapters with KAD's text side (KAD, DeViDe): the prompt names mapped by
    :func:`prompt_text`, tokenised by ``self.tokenizer``, encoded by ``self.encode_text_ids`` and kept for the last
    prompt list (``self._text_cache``, a :class:`PromptCache`), so a dataset's batches share one encoding."""

    _text_cache: PromptCache[torch.Tensor]
    tokenizer: Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]]
    encode_text_ids: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def encode_prompts(self, prompts: Sequence[str]) -> torch.Tensor:
        """Text features of ``prompts``, cached for the last prompt list."""
        return self._text_cache.get(
            tuple(prompts), lambda: self.encode_text_ids(*self.tokenizer([prompt_text(p) for p in prompts])))


class KADAdapter(KADPromptFeatures, Adapter):
    """XBench adapter for KAD-224 / 512 / 1024 (see the module docstring for every convention).

    Parameters
    ----------
    network : KADNetwork
        Built (and loaded) network, moved to ``device`` and put in eval mode here.
    tokenizer : callable
        ``texts -> (input_ids, attention_mask)``, both ``(Q, 256)`` int64.
    config : mapping, optional
        Model config (``input_size``; ``params``).
    device : str or torch.device
    """

    gpu_preprocess = "square"  # :meth:`preprocess` as a GPU kernel (:mod:`xbench.inference.gpu_preprocess`)

    config_name = "kad"

    def __init__(self, network: KADNetwork, tokenizer: Any, config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(config, device)
        self.network = network.to(self.device).eval()
        self.tokenizer = tokenizer
        stride = self.network.image_encoder.stride
        if self.input_size % stride:
            raise ValueError(f"input_size {self.input_size} is not a multiple of the trunk stride {stride}")
        side = self.input_size // stride
        self.check_fact("grid", (side, side), f"input_size {self.input_size} over the trunk's stride {stride}")
        self._text_cache: PromptCache[torch.Tensor] = PromptCache()

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> KADAdapter:
        """Official ``checkpoint`` (``best_valid.pt``) and the Med-KEBERT ``text_encoder`` tokenizer folder."""
        return cls.from_checkpoint(load_checkpoint(files["checkpoint"]),
                                            MedKEBERTTokenizer(files["text_encoder"]), config, device)

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> KADAdapter:
        """Full-size network seeded by ``params.seed`` (trunk ``params.trunk``) and :func:`random_init_tokenizer`."""
        params = config["params"]
        network = seeded_build(int(params.get("seed", 0)), lambda: KADNetwork(params.get("trunk", "layer4")))
        return cls(network, random_init_tokenizer(params), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, tokenizer: Any, config: Mapping[str, Any] | None = None,
                                 device: str | torch.device = "cpu") -> KADAdapter:
        """Adapter from a loaded official checkpoint dict (the path a user's ``best_valid.pt`` takes).

        The BERT size is read from ``checkpoint['text_encoder']``; ``params.trunk`` of ``config``
        selects layer3 (KAD-224) or layer4 (KAD-512/1024). Mismatching keys or shapes raise
        :class:`CheckpointError` listing them.
        """
        config = dict(config or {})
        trunk = config.get("params", {}).get("trunk", "layer4")
        text_state = checkpoint_containers(checkpoint, ("text_encoder",))["text_encoder"]
        bert_config = bert_config_from_state(text_state)
        network = build_uninitialised(lambda: KADNetwork(trunk, bert_config))
        network.load_official(checkpoint)
        adapter = cls(network, tokenizer, config, device)
        adapter.weights_label = "official"
        return adapter

    # -- contract --------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] -> ``(3, S, S)`` float32 (see module docstring)."""
        return normalize_uint8(resize_uint8(image, self.input_size))

    @torch.no_grad()
    def encode_text_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Text features ``(Q, 768)`` (queries before ``decoder_norm``) from token ids ``(Q, L)``."""
        return self.network.text_encoder(input_ids.to(self.device), attention_mask.to(self.device))

    @torch.no_grad()
    def forward_features(self, pixels: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits ``(B, Q, 2)`` and the per-layer cross-attention (each ``(B, Q, HW)``) for ``pixels (B, 3, S, S)``."""
        tokens = self.network.image_encoder(pixels.to(self.device, torch.float32))
        return self.network.model(tokens, text_features.to(self.device))

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``softmax(logits)[..., 1]`` ``(B, C)`` and max-normalised last-layer maps ``(B, C, h, w)``."""
        check_inputs(pixels, prompts, self.input_size)
        logits, attention = self.forward_features(pixels, self.encode_prompts(prompts))
        scores = logits.softmax(dim=-1)[..., 1]
        maps = max_normalised_maps(attention[-1], self.grid)
        return Prediction(scores=scores.float().cpu(), maps=maps.float().cpu())
