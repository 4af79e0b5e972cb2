"""CARZero: Cross-Attention Alignment for Radiology Zero-Shot Classification.

Citation
    Lai, Yao, Jiang, Wang, He, Tao, Zhou. "CARZero: Cross-Attention Alignment for Radiology
    Zero-Shot Classification". CVPR 2024 (arXiv 2402.17417).
Official code
    https://github.com/laihaoran/CARZero (read at fa4e09cd): ``CARZero/CARZero.py``
    (``get_dqn_similarities``, ``get_grounding_map``, ``conve_attention_map``),
    ``CARZero/models/CARZero_model_dqn_wo_self_atten_gl_mlp.py`` (``process_img``, ``_resize_img``,
    ``process_text``), ``models/dqn_wo_self_atten_mlp.py``, ``models/transformer_decoder.py``,
    ``models/text_model.py``, ``models/transformer_backbones.py``. Nothing is copied; the modules
    below are re-written from the facts in those files.
Weights
    ``CARZero_best_model.ckpt`` (PyTorch-Lightning file) from the authors' Google Drive
    (https://drive.google.com/file/d/1kYF-k5otW5DHwz1En5d_ScV3zu2E27Ch) and the tokenizer files of
    ``Laihaoran/BioClinicalMPBERT`` (``vocab.txt``, ``tokenizer_config.json``, optional
    ``config.json``; https://huggingface.co/Laihaoran/BioClinicalMPBERT) in one local folder. The BERT
    weights themselves are inside the checkpoint (``CARZero.text_encoder.model.*``); the M3AE ViT init
    file read by the official constructor is fully overwritten by the checkpoint and is not needed.

Architecture
    * Image: MAE/M3AE ViT-B/16 (``patch_embed`` conv 16x16, ``cls_token``, learned ``pos_embed``
      added to every token, 12 pre-norm blocks with 12 heads and exact-erf GELU MLP, LayerNorm eps
      1e-6, final ``norm``). Tokens after the final norm: ``[CLS; 196 patches]`` ``(B, 197, 768)``,
      patches row-major over the 14x14 grid. Global embedding = CLS.
    * Text: ``BertModel`` (BioClinicalMPBERT, bert-base). Hidden states of the last 4 layers; word
      pieces are merged into words (:func:`aggregate_word_pieces`); words = sum over the 4 layers
      ``(n, 768, L)`` with ``L = 97`` slots (zero-padded after ``[SEP]``); sentence = mean over all
      ``L`` slots **including the zero padding**, then summed over the 4 layers ``(n, 768)``.
    * Fusion (``TQN_Model``): ``fusion(memory (N, T, 768), queries (q, 768))`` applies one LayerNorm
      ``decoder_norm`` to memory and queries, 4 pre-norm decoder layers **without self-attention**
      (``x += CrossAttn(norm2(x), M, M)``, ``x += FFN(norm3(x))``, FFN 768->1024->768 ReLU, 4 heads;
      ``self_attn`` / ``norm1`` exist in the checkpoint but are unused), the same ``decoder_norm`` as
      final norm (``decoder.norm``), ``mlp_head`` 768->1024->512->256->1 with ReLU -> ``(N, q, 1)``.

Score (``get_dqn_similarities``)
    ``i2t = fusion(M=[img CLS; 196 patches], Q=text sentence embeddings)`` and
    ``t2i = fusion(M=[text sentence; 97 word slots], Q=img CLS)``; ``score = (i2t + t2i) / 2``, a
    **raw logit** (``score_rule = "logit"``). :meth:`Adapter.to_probability` applies a sigmoid, so
    F1 / accuracy at ``sigmoid(logit) >= 0.5`` are the same as thresholding the logit at 0 (the model
    was trained with an in-batch cross-entropy over this matrix; the sigmoid is not calibrated).
    The queries of one fusion call never interact (no self-attention), so the official per-image
    loop and this batched forward agree up to float32 reduction-order noise.
Map (``get_grounding_map`` + ``conve_attention_map``)
    i2t cross-attention of all 4 decoder layers (head-averaged, softmax over the 197 keys); the
    image-CLS key is dropped **without renormalising**; mean of the 4 layers; row-major view to
    ``(B, n, 14, 14)``. :meth:`CARZeroAdapter.predict` returns this raw native-grid map (the official
    code then repeats each cell 16x to 224x224; the metrics upsample instead).
Text input
    ``"There is {name}"`` (official template); names that the official ChestX-ray14 prompt list
    spells differently are mapped to its spelling (:data:`OFFICIAL_NAMES`, e.g. ``"mass"`` ->
    ``"Pulmonary Mass"``). Unseen classes: the template with the name as given (CARZero is
    open-vocabulary; the authors prompt unseen findings the same way). The text is cleaned by
    :func:`clean_text` (official ``process_text``) and tokenised with ``padding="max_length",
    max_length=97, truncation=True``.
Preprocessing (``process_img``)
    8-bit image (``np.round(image * 255)``; a 16-bit PNG ``v >> 8`` as ``cv2.imread(path, 0)``,
    :mod:`xbench.models.inputs`) -> longest side to 256 with OpenCV ``INTER_AREA`` (other
    side ``int(side * 256 / longest)``), zero-pad the short side to 256 (floor half before, ceil half
    after) -> grey to RGB -> ``CenterCrop(224)`` -> ``ToTensor`` -> ``Normalize(0.4978, 0.2449)``.
    ``INTER_AREA`` is re-implemented without OpenCV (:func:`resize_area`), bit-exact to OpenCV's
    algorithm for downscaling; ground-truth regions must go through the same resize, pad and crop.
Deviations
    None on the computation. BERT runs on the real (unpadded) token positions only and the padding
    slots are filled afterwards (:class:`CARZeroTextEncoder`): identical up to float32 reduction
    order, ~10x cheaper than the 97-token official input. Images whose longest side is below 256 px (OpenCV would upsample with
    its area-weighted bilinear variant) raise ``ValueError``. The Lightning file's
    ``hyper_parameters`` (an OmegaConf object) is never executed (see
    :func:`load_carzero_checkpoint`); the architecture is fixed to the released configuration.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel

from ..core.errors import CheckpointError
from ..spec.registry import model_config
from ._common import HashWordTokenizer, PromptCache, build_uninitialised, check_inputs, seeded_build
from .base import Adapter, Prediction, load_checkpoint, load_state_strict, require_file, with_yaml_facts
from .checkpoint import require_tensor_state
from .inputs import to_uint8
from .layers import QueryNetwork
from .text import load_bert_tokenizer

__all__ = [
    "CARZeroAdapter",
    "CARZeroModel",
    "CARZeroOutput",
    "FusionModule",
    "HashWordTokenizer",
    "VisionTransformer",
    "WordPieceAdapter",
    "aggregate_word_pieces",
    "attention_maps",
    "bert_config_from_state",
    "clean_text",
    "load_carzero_checkpoint",
    "load_official_checkpoint",
    "official_state",
    "pad_crop_window",
    "preprocess_stages",
    "prompt_text",
    "read_vocab",
    "resize_and_pad",
    "resize_area",
    "seeded_build",
    "synthetic_vocab",
]

RESIZE = 256  # cfg.data.image.imsize
MEAN, STD = 0.4978, 0.2449  # cfg.transforms.norm == "CXR_MAE" (builder.build_transformation)
MAX_WORDS = 97  # cfg.data.text.word_num
EMBED_DIM = 768
LAST_LAYERS = 4  # cfg.model.text.last_n_layers
TEMPLATE = "There is {}"

# ChestX-ray14 prompt spellings of the official prompt file (``Dataset/ChestXray14/*_text.json``)
# for the label names that differ from it; every other name is used as given.
OFFICIAL_NAMES = {
    "effusion": "Pleural Effusion",
    "infiltration": "Pulmonary Infiltration",
    "mass": "Pulmonary Mass",
    "nodule": "Lung Nodule",
    "consolidation": "Pulmonary Consolidation",
    "edema": "Pulmonary Edema",
    "emphysema": "Pulmonary Emphysema",
}


# -- preprocessing -------------------------------------------------------------------------------
def _area_table(src: int, dst: int, scale: float) -> list[list[tuple[int, np.float32]]]:
    """Per output index, the ``(source index, float32 weight)`` pairs of OpenCV's area resampling.

    Same rule and float32 rounding as OpenCV's ``computeResizeAreaTab`` (``imgproc/resize.cpp``):
    a partial first cell, whole cells of weight ``1/cell``, a partial last cell, with 1e-3 slack.
    """
    table = []
    for d in range(dst):
        start = d * scale
        stop = start + scale
        cell = min(scale, src - start)
        first = math.ceil(start)
        last = min(math.floor(stop), src - 1)
        first = min(first, last)
        row = []
        if first - start > 1e-3:
            row.append((first - 1, np.float32((first - start) / cell)))
        row.extend((s, np.float32(1.0 / cell)) for s in range(first, last))
        if stop - last > 1e-3:
            row.append((last, np.float32(min(min(stop - last, 1.0), cell) / cell)))
        table.append(row)
    return table


def _table_passes(table: list[list[tuple[int, np.float32]]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Regroup an area table into passes: pass ``j`` holds the ``j``-th term of every output index.

    Accumulating pass by pass adds each output's terms in OpenCV's order, vectorised over outputs.
    """
    passes = []
    for j in range(max(len(row) for row in table)):
        outs = np.array([d for d, row in enumerate(table) if len(row) > j], dtype=np.int64)
        srcs = np.array([table[d][j][0] for d in outs], dtype=np.int64)
        weights = np.array([table[d][j][1] for d in outs], dtype=np.float32)
        passes.append((outs, srcs, weights))
    return passes


def resize_area(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Downscale a uint8 grey image like ``cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)``.

    Parameters
    ----------
    image : numpy.ndarray
        ``(H, W)`` uint8.
    height, width : int
        Output size, each ``<=`` the input size (downscaling only).

    Returns
    -------
    numpy.ndarray
        ``(height, width)`` uint8, bit-exact to OpenCV's ``INTER_AREA`` (checked against
        opencv-python-headless 5.0 on square, portrait, landscape, integer and fractional scales).

    Notes
    -----
    OpenCV's algorithm (``imgproc/resize.cpp``), written with numpy:

    * same size: a copy;
    * integer factors ``kx, ky`` (``|scale - round(scale)| < DBL_EPSILON``): block sums; 2x2 blocks
      round half up, ``(sum + 2) >> 2`` (OpenCV's vectorised and scalar 2x2 paths); other factors
      ``rint(float32(sum) * float32(1 / (kx * ky)))`` (round half to even);
    * otherwise: float32 area weights; each source row is accumulated horizontally, then rows are
      accumulated vertically in source order; ``rint`` (half to even) and clip to [0, 255].

    Raises
    ------
    ValueError
        For a non-2-D / non-uint8 input or an output larger than the input (OpenCV would switch to
        its bilinear-like area upsampling, which CARZero never needs for radiographs >= 256 px).
    """
    if image.ndim != 2 or image.dtype != np.uint8:
        raise ValueError(f"resize_area expects a 2-D uint8 image, got shape {image.shape} dtype {image.dtype}")
    in_h, in_w = image.shape
    if height < 1 or width < 1 or height > in_h or width > in_w:
        raise ValueError(f"resize_area only downscales: input {in_h}x{in_w}, requested {height}x{width}")
    if (height, width) == (in_h, in_w):
        return image.copy()
    scale_x, scale_y = 1.0 / (width / in_w), 1.0 / (height / in_h)  # as OpenCV: 1 / inv_scale
    kx, ky = round(scale_x), round(scale_y)
    eps = np.finfo(np.float64).eps
    if abs(scale_x - kx) < eps and abs(scale_y - ky) < eps:
        sums = image[: height * ky, : width * kx].astype(np.int64).reshape(height, ky, width, kx).sum(axis=(1, 3))
        if kx == 2 and ky == 2:
            return ((sums + 2) >> 2).astype(np.uint8)
        values = sums.astype(np.float32) * np.float32(1.0 / (kx * ky))
        return np.clip(np.rint(values), 0, 255).astype(np.uint8)
    source = image.astype(np.float32)
    rows = np.zeros((in_h, width), np.float32)
    for outs, srcs, weights in _table_passes(_area_table(in_w, width, scale_x)):
        rows[:, outs] += source[:, srcs] * weights
    out = np.zeros((height, width), np.float32)
    for j, (outs, srcs, weights) in enumerate(_table_passes(_area_table(in_h, height, scale_y))):
        term = rows[srcs] * weights[:, None]
        if j == 0:
            out[outs] = term
        else:
            out[outs] += term
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def resize_and_pad(image: np.ndarray, size: int = RESIZE) -> np.ndarray:
    """Official ``_resize_img``: longest side to ``size`` (INTER_AREA), zero-pad the other side to ``size``.

    The short side becomes ``int(short * (size / longest))`` (float64 as in the official code; a
    square image counts as "taller"); padding puts ``floor(pad / 2)`` zero rows/columns before and
    ``ceil(pad / 2)`` after. Input and output are uint8; output is ``(size, size)``.
    """
    h, w = image.shape
    if h >= w:
        new_h, new_w = size, int(float(w) * float(size / float(h)))
    else:
        new_h, new_w = int(float(h) * float(size / float(w))), size
    resized = resize_area(image, new_h, new_w)
    pad_h, pad_w = size - new_h, size - new_w
    return np.pad(resized, [(pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2)], constant_values=0)


def pad_crop_window(size: tuple[int, int], resize: int, crop: int) -> tuple[float, float, float, float]:
    """``(y0, x0, y1, x1)`` in original pixels of :func:`resize_and_pad` to ``resize`` then ``CenterCrop(crop)``."""
    h, w = int(size[0]), int(size[1])
    longest = max(h, w)
    top = int(round((resize - crop) / 2.0))
    window = []
    for extent in (h, w):
        resized = resize if extent == longest else int(float(extent) * float(resize / float(longest)))
        pad_before = (resize - resized) // 2
        start = (top - pad_before) * extent / resized
        window.append((start, start + crop * extent / resized))
    (y0, y1), (x0, x1) = window
    return (y0, x0, y1, x1)


def crop_size() -> int:
    """``CenterCrop`` size of the official test transform (``cfg.transforms.random_crop.crop_size``): the model input,
    the ``input_size`` of ``xbench/configs/models/carzero.yaml``."""
    return int(model_config("carzero")["input_size"])


def preprocess_stages(image: np.ndarray, crop: int | None = None, *, size: int = RESIZE, mean: float = MEAN,
                      std: float = STD) -> dict[str, Any]:
    """All stages of the official ``process_img`` for one XBench image (GLoRIA's, which CARZero inherited, with its
    own ``mean`` / ``std``: :mod:`xbench.models.gloria`).

    Parameters
    ----------
    image : numpy.ndarray
        ``(H, W)`` float32 in [0, 1] at original size; converted to the 8-bit image the official
        ``cv2.imread(path, 0)`` reads by :func:`xbench.models.inputs.to_uint8` (rule ``"opencv"``):
        ``np.round(image * 255)`` for 8-bit sources and DICOM, ``v >> 8`` for 16-bit PNGs.

    Returns
    -------
    dict
        ``resized_padded`` ``(256, 256)`` uint8, ``cropped`` ``(224, 224)`` uint8 (``CenterCrop(224)``:
        offset ``round((256 - 224) / 2) = 16``), and ``pixel_values`` ``(3, 224, 224)`` float32 =
        ``(u8 / 255 - 0.4978) / 0.2449`` in float32 as torchvision computes it, grey copied to 3 channels.
    """
    image = np.asarray(image)
    if image.ndim != 2:
        raise ValueError(f"expected a grey image of shape (H, W), got shape {image.shape}")
    u8 = to_uint8(image, "opencv")  # cv2.imread(path, 0): 8-bit files exact, 16-bit PNGs v >> 8
    padded = resize_and_pad(u8, size)
    crop = int(crop or crop_size())
    top = int(round((size - crop) / 2.0))
    cropped = padded[top: top + crop, top: top + crop]
    x = torch.from_numpy(np.ascontiguousarray(cropped)).to(torch.float32).div(255)
    x = x.unsqueeze(0).repeat(3, 1, 1)
    x = x.sub(torch.tensor(mean, dtype=torch.float32)).div(torch.tensor(std, dtype=torch.float32))
    return {"resized_padded": padded, "cropped": cropped, "pixel_values": x}


# -- text ----------------------------------------------------------------------------------------
def prompt_text(name: str) -> str:
    """Prompt sentence for class ``name``: ``"There is {name}"`` with the official ChestX-ray14 spelling."""
    name = name.strip()
    return TEMPLATE.format(OFFICIAL_NAMES.get(name.lower(), name))


def clean_text(text: str) -> str:
    """The official ``process_text`` cleaning, before tokenisation.

    Newlines become spaces; the text is split on numbered bullets (regex ``[0-9]+\\.``) and on
    ``"."``; each piece is lower-cased and split into ``\\w+`` tokens (nltk ``RegexpTokenizer``);
    pieces with at most one token are dropped; non-ASCII characters are removed from the tokens;
    tokens and pieces are joined with single spaces. ``"There is Pleural Effusion"`` ->
    ``"there is pleural effusion"``.
    """
    text = text.replace("\n", " ")
    pieces = [part for bullet in re.split(r"[0-9]+\.", text) for part in bullet.split(".")]
    sentences = []
    for piece in pieces:
        tokens = re.findall(r"\w+", piece.replace("\ufffd\ufffd", " ").lower())
        if len(tokens) <= 1:
            continue
        ascii_tokens = [t.encode("ascii", "ignore").decode("ascii") for t in tokens]
        sentences.append(" ".join(t for t in ascii_tokens if t))
    return " ".join(sentences)


def read_vocab(path: str | Path) -> list[str]:
    """Token strings of a BERT ``vocab.txt`` (line ``i`` = token of id ``i``)."""
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def synthetic_vocab(size: int) -> list[str]:
    """Id -> token strings for random-init models: ``[PAD]``, ``[unused1..99]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``, ``tok<i>``."""
    head = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return head + [f"tok{i}" for i in range(len(head), size)]


def aggregate_word_pieces(hidden: torch.Tensor, input_ids: torch.Tensor, vocab: Sequence[str], slots: int | None = None) -> torch.Tensor:
    """Merge word pieces into words, per layer (official ``BertEncoder.aggregate_tokens``).

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n, layers, T, D)`` hidden states of the first ``T`` tokens.
    input_ids : torch.Tensor
        ``(n, T)`` token ids.
    vocab : sequence of str
        Id -> token string (``vocab.txt`` order).
    slots : int, optional
        Number of word slots of the output (the padded length, 97); default ``T``.

    Returns
    -------
    torch.Tensor
        ``(n, layers, slots, D)``: per sentence, tokens are walked in order; a token starting with
        ``##`` is summed into the current word, any other token starts a new word (``[CLS]`` is the
        first word); at ``[SEP]`` the current word is flushed, the ``[SEP]`` vector itself is
        appended and the walk stops. Remaining slots are zeros. (Without ``[SEP]`` the last open word
        is not flushed, as in the official loop.)
    """
    n, layers, length, dim = hidden.shape
    slots = length if slots is None else slots
    per_token = hidden.permute(0, 2, 1, 3)  # (n, T, layers, D)
    sentences = []
    for embs, ids in zip(per_token, input_ids.tolist()):
        words: list[torch.Tensor] = []
        bank: list[torch.Tensor] = []
        for emb, token_id in zip(embs, ids):
            token = vocab[token_id]
            if token == "[SEP]":
                words.append(torch.stack(bank).sum(dim=0))
                words.append(emb)
                break
            if token.startswith("##"):
                bank.append(emb)
            else:
                if bank:
                    words.append(torch.stack(bank).sum(dim=0))
                bank = [emb]
        agg = torch.stack(words)
        pad = torch.zeros(slots - len(agg), layers, dim, dtype=agg.dtype, device=agg.device)
        sentences.append(torch.cat([agg, pad]))
    return torch.stack(sentences).permute(0, 2, 1, 3)


# -- networks ------------------------------------------------------------------------------------
class _ViTAttention(nn.Module):
    """timm ``Attention``: fused ``qkv`` projection (with bias), scaled dot-product attention, ``proj``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class _ViTMlp(nn.Module):
    """timm ``Mlp``: ``fc1`` -> exact-erf GELU -> ``fc2``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _ViTBlock(nn.Module):
    """timm ``Block`` (pre-norm): ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; LayerNorm eps 1e-6."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _ViTAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _ViTMlp(dim, dim * mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _PatchEmbed(nn.Module):
    """timm ``PatchEmbed``: 16x16 stride-16 convolution, tokens flattened row-major."""

    def __init__(self, patch: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """The MAE/M3AE ViT-B/16 of CARZero (``MRM.image_encoder``), keys as in ``img_encoder.model.*``.

    ``forward(pixels (B, 3, 224, 224)) -> tokens (B, 197, 768)`` after the final norm: CLS first,
    then the 196 patches row-major. ``pos_embed`` is added to the patches and to the CLS token.
    """

    def __init__(self, image_size: int | None = None, patch: int = 16, dim: int = EMBED_DIM, depth: int = 12, heads: int = 12):
        super().__init__()
        self.patch = patch
        tokens = (int(image_size or crop_size()) // patch) ** 2
        self.patch_embed = _PatchEmbed(patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim), requires_grad=False)
        self.blocks = nn.ModuleList(_ViTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        nn.init.normal_(self.cls_token, std=0.02)  # random-init only; checkpoints overwrite both
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels) + self.pos_embed[:, 1:, :]
        cls = (self.cls_token + self.pos_embed[:, :1, :]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class CARZeroImageEncoder(nn.Module):
    """Holds the ViT as ``model`` (checkpoint prefix ``img_encoder.model.``); global/local embedders are identities."""

    def __init__(self, image_size: int | None = None):
        super().__init__()
        self.model = VisionTransformer(image_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixels)


class CARZeroTextEncoder(nn.Module):
    """Holds the ``BertModel`` as ``model`` (checkpoint prefix ``text_encoder.model.``).

    ``forward(input_ids, attention_mask, token_type_ids, vocab) -> (words (n, 768, L), sentence (n, 768))``
    (module docstring, "Text"). With right padding (the tokenizer's), BERT runs on the first
    ``max(attention_mask.sum(1))`` positions only: masked keys get exactly zero attention weight, so
    the real tokens' hidden states do not depend on the padding (only float32 reduction order
    changes), and every slot after ``[SEP]`` is a constructed zero anyway. This makes the 97-token
    official input ~10x cheaper.
    """

    def __init__(self, bert_config: BertConfig | None = None):
        super().__init__()
        self.model = BertModel(bert_config or BertConfig(vocab_size=28996), add_pooling_layer=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                vocab: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        slots = input_ids.shape[1]
        lengths = attention_mask.sum(dim=1)
        right_padded = torch.equal(attention_mask.bool(), torch.arange(slots, device=lengths.device) < lengths[:, None])
        used = int(lengths.max()) if right_padded else slots
        input_ids, attention_mask, token_type_ids = input_ids[:, :used], attention_mask[:, :used], token_type_ids[:, :used]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         output_hidden_states=True)
        hidden = torch.stack(out.hidden_states[-LAST_LAYERS:]).permute(1, 0, 2, 3)  # (n, 4, T, D)
        agg = aggregate_word_pieces(hidden, input_ids, vocab, slots)
        sentence = agg.mean(dim=2).sum(dim=1)  # zero padding included in the mean (official)
        words = agg.sum(dim=1).permute(0, 2, 1)
        return words, sentence


class FusionModule(QueryNetwork):
    """``TQN_Model`` of CARZero: ``forward(memory (N, T, D), queries (q, D)) -> (logits (N, q, 1), attention)``.

    KAD's query network (:class:`~xbench.models.layers.QueryNetwork`) with the ``TransformerDecoderWoSelfAttenLayer``
    variant of the one decoder layer (no self-attention; ``self_attn`` / ``norm1`` are in the checkpoint but unused),
    the final norm registered twice (``decoder_norm`` and ``decoder.norm``, as the checkpoint stores it) and a 4-layer
    ``mlp_head`` 768->1024->512->256->1 (Linear layers at indices 0, 3, 6, 9 as in the checkpoint). ``attention``
    is the list of the 4 layers' head-averaged cross-attention, each ``(N, q, T)``. ``logit_scale`` is stored in
    the checkpoint but unused at inference.
    """

    def __init__(self, layers: int = 4, dim: int = EMBED_DIM):
        super().__init__(lambda: nn.Sequential(
            nn.Linear(dim, 1024), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(1024, 512), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(512, 256), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(256, 1),
        ), layers, heads=4, ffn=1024, d_model=dim, self_attention=False, final_norm_alias=True)


class CARZeroModel(nn.Module):
    """The CARZero network with the official attribute names (checkpoint keys minus ``CARZero.``); ``image_size``
    (default :func:`crop_size`) sizes the ViT's positional embedding."""

    def __init__(self, bert_config: BertConfig | None = None, image_size: int | None = None):
        super().__init__()
        self.text_encoder = CARZeroTextEncoder(bert_config)
        self.img_encoder = CARZeroImageEncoder(image_size)
        self.fusion_module = FusionModule()


# -- checkpoint ----------------------------------------------------------------------------------
def load_carzero_checkpoint(path: str | Path) -> Any:
    """Read ``CARZero_best_model.ckpt`` safely: :func:`xbench.models.checkpoint.read_checkpoint`.

    The real Lightning file also pickles its OmegaConf training config (``hyper_parameters``) and
    Lightning bookkeeping; those become inert placeholders (reported by a warning, never run,
    ``omegaconf`` need not be installed); the tensors of ``state_dict`` are read exactly.
    Unreadable files raise :class:`CheckpointError` naming the file.
    """
    return load_checkpoint(path)


def official_state(checkpoint: Any, where: str = "CARZero checkpoint") -> dict[str, torch.Tensor]:
    """``checkpoint['state_dict']`` with keys stripped as the official loader does (``k.split('CARZero.')[-1]``).

    A non-string key or a non-tensor value raises :class:`CheckpointError` naming ``where`` (the file) and the key.
    """
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("state_dict"), Mapping):
        got = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheckpointError(f"{where}: expected a Lightning dict with a 'state_dict' mapping "
                              f"(CARZero_best_model.ckpt), got {got}")
    state = require_tensor_state(checkpoint["state_dict"], f"{where}['state_dict']")
    return {k.split("CARZero.")[-1]: v for k, v in state.items()}


def bert_config_from_state(state: Mapping[str, torch.Tensor], bert_config: BertConfig | None = None) -> BertConfig:
    """BERT config for the checkpoint: ``bert_config`` (or bert-base) with the vocabulary size read from ``word_embeddings``."""
    config = BertConfig.from_dict(bert_config.to_dict()) if bert_config is not None else BertConfig()
    words = state.get("text_encoder.model.embeddings.word_embeddings.weight")
    config.vocab_size = int(words.shape[0]) if words is not None else 28996
    return config


def load_official_checkpoint(model: CARZeroModel, checkpoint: Any, where: str = "CARZero checkpoint") -> None:
    """Load an official (or synthetic) CARZero checkpoint dict into ``model``.

    As the official ``load_CARZero``: strip everything up to ``CARZero.``, keep only keys the model
    has (drops e.g. ``position_ids`` of older transformers), then a strict load. Missing keys or
    shape mismatches raise :class:`CheckpointError` listing them (nothing is loaded then).
    """
    state = official_state(checkpoint, where)
    own = model.state_dict()
    load_state_strict(model, {k: v for k, v in state.items() if k in own}, f"{where}['state_dict']")


# -- adapter -------------------------------------------------------------------------------------
@dataclass
class CARZeroOutput:
    """Everything one CARZero forward pass gives for ``B`` images and ``n`` prompts.

    ``score_i2t``, ``score_t2i``, ``scores`` ``(B, n)`` raw logits (``scores = (i2t + t2i) / 2``);
    ``attention`` ``(4, B, n, 197)`` i2t cross-attention per decoder layer (key 0 = image CLS);
    ``maps`` ``(B, n, 14, 14)`` the official native-grid map (:func:`attention_maps`).
    """

    score_i2t: torch.Tensor
    score_t2i: torch.Tensor
    scores: torch.Tensor
    attention: torch.Tensor
    maps: torch.Tensor


def attention_maps(attention: Sequence[torch.Tensor], grid: tuple[int, int]) -> torch.Tensor:
    """Official map: drop key 0 (image CLS) of the last 4 layers **without renormalising**, average, reshape row-major.

    ``attention``: per layer ``(B, n, 1 + h*w)``; returns ``(B, n, h, w)``. The sum runs in the
    official order ``((l-4 + l-3) + l-2) + l-1`` before dividing by 4.
    """
    a = [layer[:, :, 1:] for layer in attention[-4:]]
    mean = (a[0] + a[1] + a[2] + a[3]) / 4
    return mean.reshape(mean.shape[0], mean.shape[1], *grid)


class WordPieceAdapter(Adapter):
    """What CARZero and GLoRIA share (CARZero's text side is GLoRIA's): a network with a ``text_encoder`` BERT, a
    word-piece tokenizer (the :class:`~xbench.models._common.HashWordTokenizer` stand-in in a random-init build)
    and its vocabulary (id → token string, for the word-piece merging); prompts tokenized as the official
    ``process_text`` does (:meth:`tokenize`). Subclasses name their vocabulary (:attr:`vocab_name`)."""

    vocab_name = "BERT vocabulary"  #: what a missing ``text_encoder/vocab.txt`` is called in the error
    max_words = MAX_WORDS  #: token slots of a prompt (``cfg.data.text.word_num``)

    def __init__(self, model: nn.Module, tokenizer: Any, vocab: Sequence[str],
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(config, device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.vocab = list(vocab)
        vocab_size = self.model.text_encoder.model.config.vocab_size
        if len(self.vocab) < vocab_size:
            raise ValueError(f"vocab has {len(self.vocab)} tokens but the text encoder has {vocab_size} embeddings")
        self._text_cache: PromptCache[Any] = PromptCache()

    @classmethod
    def _text_files(cls, files: Mapping[str, Path], config: Mapping[str, Any]) -> tuple[Any, list[str]]:
        """The ``text_encoder`` folder's tokenizer and its ``vocab.txt`` (a missing one names the publisher)."""
        tok_dir = files["text_encoder"]
        source = config["weights"]["text_encoder"].get("source")
        vocab_path = require_file(tok_dir, "vocab.txt", cls.vocab_name, source)
        return load_bert_tokenizer(tok_dir, source=source), read_vocab(vocab_path)

    @classmethod
    def _seeded(cls, model: nn.Module, config: Mapping[str, Any], device: str | torch.device) -> Any:
        """The adapter of a seeded random-init ``model``: the hash-word tokenizer and :func:`synthetic_vocab`."""
        vocab = synthetic_vocab(model.text_encoder.model.config.vocab_size)
        return cls(model, HashWordTokenizer(cls.max_words), vocab, config, device)

    @classmethod
    def _official(cls, model: nn.Module, tokenizer: Any, vocab: Sequence[str], config: Mapping[str, Any] | None,
                  device: str | torch.device) -> Any:
        """The adapter of a ``model`` loaded from the official checkpoint, labelled ``"official"``."""
        adapter = cls(model, tokenizer, vocab, config, device)
        adapter.weights_label = "official"
        return adapter

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Official ``process_text``: :func:`clean_text`, then ``(input_ids, attention_mask, token_type_ids)``
        ``(n, max_words)`` int64."""
        texts = [clean_text(t) for t in texts]
        if isinstance(self.tokenizer, HashWordTokenizer):  # random init: (ids, mask), no token types
            ids, mask = self.tokenizer(texts)
            return ids, mask, torch.zeros_like(ids)
        enc = self.tokenizer(texts, truncation=True, padding="max_length", max_length=self.max_words)
        ids = torch.as_tensor(enc["input_ids"], dtype=torch.int64)
        mask = torch.as_tensor(enc["attention_mask"], dtype=torch.int64)
        types = torch.as_tensor(enc["token_type_ids"], dtype=torch.int64) if "token_type_ids" in enc else torch.zeros_like(ids)
        return ids, mask, types


class CARZeroAdapter(WordPieceAdapter):
    """XBench adapter for CARZero (see the module docstring for every convention).

    Parameters
    ----------
    model : CARZeroModel
        Built (and loaded) network; moved to ``device`` and put in eval mode here.
    tokenizer : callable
        ``tokenizer(texts, truncation=True, padding="max_length", max_length=97)`` returning
        ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) lists, e.g. ``BertTokenizer``.
    vocab : sequence of str
        Id -> token string of the tokenizer (``vocab.txt``), for the word-piece merging.
    config : mapping, optional
        Model config (registry entry).
    device : str or torch.device
    """

    gpu_preprocess = "carzero"  # :meth:`preprocess` as a GPU kernel (:mod:`xbench.inference.gpu_preprocess`)

    config_name = "carzero"
    vocab_name = "BioClinicalMPBERT vocabulary"

    def __init__(self, model: CARZeroModel, tokenizer: Any, vocab: Sequence[str],
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(model, tokenizer, vocab, config, device)
        side = self.input_size // self.model.img_encoder.model.patch
        self.check_fact("grid", (side, side), f"input_size {self.input_size} over the ViT's 16-pixel patches")

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CARZeroAdapter:
        """Official ``checkpoint`` and the ``text_encoder`` tokenizer folder (``vocab.txt``; its ``config.json``
        is used when present)."""
        tok_dir = files["text_encoder"]
        tokenizer, vocab = cls._text_files(files, config)
        bert_config = BertConfig.from_json_file(str(tok_dir / "config.json")) if (tok_dir / "config.json").exists() else None
        return cls.from_checkpoint(load_carzero_checkpoint(files["checkpoint"]), tokenizer, vocab, bert_config, config,
                                   device, where=str(files["checkpoint"]))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CARZeroAdapter:
        """Full-size network with torch's default initialisation seeded by ``params.seed`` (global RNG restored),
        the :class:`~xbench.models._common.HashWordTokenizer` stand-in and :func:`synthetic_vocab`."""
        return cls._seeded(seeded_build(int(config["params"].get("seed", 0)),
                                        lambda: CARZeroModel(image_size=config["input_size"])), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, tokenizer: Any, vocab: Sequence[str], bert_config: BertConfig | None = None,
                                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu",
                                 where: str = "CARZero checkpoint") -> CARZeroAdapter:
        """Adapter from a loaded checkpoint dict (the path a user's ``CARZero_best_model.ckpt`` takes).

        The BERT vocabulary size is read from the checkpoint; other BERT sizes come from
        ``bert_config`` (bert-base when ``None``). Mismatches raise :class:`CheckpointError`.
        """
        image_size = with_yaml_facts(cls.config_name, config)["input_size"]
        bert_config = bert_config_from_state(official_state(checkpoint, where), bert_config)
        model = build_uninitialised(lambda: CARZeroModel(bert_config, image_size))  # every parameter loaded next
        load_official_checkpoint(model, checkpoint, where)
        return cls._official(model, tokenizer, vocab, config, device)

    # -- inputs --------------------------------------------------------------------------------
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image ``(H, W)`` float32 in [0, 1] -> ``(3, 224, 224)`` float32 (:func:`preprocess_stages`)."""
        return preprocess_stages(image, self.input_size)["pixel_values"]

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """Window of :func:`resize_and_pad` + ``CenterCrop(224)`` in original pixels.

        The longer side becomes 256 and the shorter one is zero-padded to 256, so the 224 crop
        covers a centred square of ``224/256`` of the longer side (7/8), reaching into the padding
        along the shorter side of a non-square image.
        """
        return pad_crop_window(size, RESIZE, self.input_size)

    # -- forward pieces (shared by predict and the parity test) --------------------------------
    @torch.no_grad()
    def encode_text_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Word embeddings ``(n, 768, L)`` and sentence embeddings ``(n, 768)`` from token ids ``(n, L)``."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.model.text_encoder(input_ids.to(self.device), attention_mask.to(self.device),
                                       token_type_ids.to(self.device), self.vocab)

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Text embeddings of ``prompts`` (via :func:`prompt_text`), cached for the last prompt list."""
        return self._text_cache.get(
            tuple(prompts), lambda: self.encode_text_ids(*self.tokenize([prompt_text(p) for p in prompts])))

    @torch.no_grad()
    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """ViT tokens ``(B, 197, 768)`` after the final norm (CLS first) for ``pixels (B, 3, 224, 224)``."""
        return self.model.img_encoder(pixels.to(self.device, torch.float32))

    @torch.no_grad()
    def forward_features(self, image_tokens: torch.Tensor, words: torch.Tensor, sentence: torch.Tensor) -> CARZeroOutput:
        """Both fusion directions for all images and prompts at once (see :class:`CARZeroOutput`).

        ``image_tokens (B, 197, 768)``, ``words (n, 768, L)``, ``sentence (n, 768)``.
        """
        fusion = self.model.fusion_module
        i2t, attention = fusion(image_tokens, sentence)  # memory [img CLS; patches], queries = sentences
        text_memory = torch.cat([sentence.unsqueeze(1), words.permute(0, 2, 1)], dim=1)
        t2i, _ = fusion(text_memory, image_tokens[:, 0])  # memory [sentence; words], queries = img CLS
        i2t, t2i = i2t.squeeze(-1), t2i.squeeze(-1).transpose(0, 1)
        return CARZeroOutput(score_i2t=i2t, score_t2i=t2i, scores=(i2t + t2i) / 2,
                             attention=torch.stack(attention), maps=attention_maps(attention, self.grid))

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Raw-logit scores ``(B, C)`` and native-grid cross-attention maps ``(B, C, 14, 14)``."""
        check_inputs(pixels, prompts, self.input_size)
        words, sentence = self.encode_prompts(prompts)
        out = self.forward_features(self.encode_image(pixels), words, sentence)
        return Prediction(scores=out.scores.float().cpu(), maps=out.maps.float().cpu())
