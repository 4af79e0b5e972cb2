"""The one query-decoder layer of the fusion adapters, and the query network KAD and CARZero share.

MedKLIP / MAVL (``transformer.py`` of their repositories), KAD (``transformer_decoder.py``) and CARZero
(``transformer_decoder.py``, the ``WoSelfAtten`` variant) all decode text queries against image (or text)
tokens with the same pre-norm DETR decoder layer; only its width, its FFN size and whether the queries
self-attend differ. :class:`PreNormDecoderLayer` is that layer, written once; its state-dict keys
(``self_attn``, ``multihead_attn``, ``linear1``, ``linear2``, ``norm1``–``norm3``) are those of every
official checkpoint, and its parameters are created in the official order (a seeded random build is the
same as before this module existed).

:class:`QueryNetwork` is KAD's ``TQN_Model``, which CARZero's ``TQN_Model`` copies: one LayerNorm
``decoder_norm`` on memory and queries, the decoder layers, ``decoder_norm`` again as final norm, then
``mlp_head``. Dropout is identity at inference; no adapter trains these networks.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class PreNormDecoderLayer(nn.Module):
    """Pre-norm DETR decoder layer on sequence-first tensors (official ``normalize_before=True``).

    ``x += SelfAttn(norm1(x))`` (only when ``self_attention``); ``x += CrossAttn(norm2(x), memory, memory)``;
    ``x += linear2(relu(linear1(norm3(x))))``. ``self_attn`` and ``norm1`` exist either way (the checkpoints of
    the variant without self-attention store them too).

    Parameters
    ----------
    d_model, heads, ffn : int
        Width, attention heads and FFN width.
    self_attention : bool, default=True
        Whether the queries attend to each other first (MedKLIP, MAVL, KAD: yes; CARZero: no).
    dropout : float, default=0.0
        Dropout of the official training code (inactive in eval mode, the only mode XBench runs).

    Examples
    --------
    >>> layer = PreNormDecoderLayer(8, heads=2, ffn=16).eval()
    >>> out, weights = layer(torch.zeros(3, 2, 8), torch.randn(5, 2, 8))
    >>> tuple(out.shape), tuple(weights.shape), bool(torch.allclose(weights.sum(-1), torch.ones(2, 3)))
    ((3, 2, 8), (2, 3, 5), True)
    """

    def __init__(self, d_model: int, heads: int = 4, ffn: int = 1024, self_attention: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        self.self_attention = self_attention
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)
        self.linear1 = nn.Linear(d_model, ffn)
        self.linear2 = nn.Linear(ffn, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries (Q, B, D)``, ``memory (T, B, D)`` → new queries and head-averaged cross-attention ``(B, Q, T)``
        (softmax over the ``T`` memory tokens)."""
        if self.self_attention:
            x = self.norm1(queries)
            queries = queries + self.dropout(self.self_attn(x, x, x, need_weights=True)[0])
        attended, weights = self.multihead_attn(self.norm2(queries), memory, memory, need_weights=True)
        queries = queries + self.dropout(attended)
        ffn = self.linear2(self.dropout(F.relu(self.linear1(self.norm3(queries)))))
        return queries + self.dropout(ffn), weights


class DecoderLayers(nn.Module):
    """Holds the layers as ``layers`` (keys ``decoder.layers.{i}.*``) and, when given, the final ``norm``."""

    def __init__(self, layers: int, d_model: int, heads: int, ffn: int, self_attention: bool,
                 norm: nn.LayerNorm | None = None):
        super().__init__()
        self.layers = nn.ModuleList(PreNormDecoderLayer(d_model, heads, ffn, self_attention) for _ in range(layers))
        if norm is not None:
            self.norm = norm


class QueryNetwork(nn.Module):
    """KAD's ``TQN_Model`` (also CARZero's fusion module): ``forward(memory (N, T, D), queries (Q, D))``.

    Parameters
    ----------
    head : callable
        Builds ``mlp_head`` (applied to the decoded queries); called after the decoder is built, so that a
        seeded build creates the parameters in the official order.
    layers, heads, ffn, d_model : int
        Decoder depth, attention heads, FFN width and width.
    self_attention : bool
        Whether the queries self-attend (:class:`PreNormDecoderLayer`).
    final_norm_alias : bool
        Register ``decoder_norm`` a second time as ``decoder.norm`` (CARZero's checkpoints hold both keys;
        KAD's loader folds ``decoder.norm`` into ``decoder_norm`` instead).

    Notes
    -----
    ``logit_scale`` (training temperature) is kept only so the checkpoints load strictly.
    """

    def __init__(self, head: Callable[[], nn.Module], layers: int = 4, heads: int = 4, ffn: int = 1024, d_model: int = 768,
                 self_attention: bool = True, final_norm_alias: bool = False):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07), dtype=torch.float32))
        self.decoder_norm = nn.LayerNorm(d_model)
        self.decoder = DecoderLayers(layers, d_model, heads, ffn, self_attention,
                                     self.decoder_norm if final_norm_alias else None)
        self.mlp_head = head()

    def forward(self, memory: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``mlp_head`` outputs ``(N, Q, ·)`` and every layer's cross-attention, each ``(N, Q, T)``.

        ``memory`` is ``(N, T, D)`` (image or text tokens), ``queries`` ``(Q, D)``, shared by all ``N``.
        """
        batch = memory.shape[0]
        memory = self.decoder_norm(memory.transpose(0, 1))
        x = self.decoder_norm(queries.unsqueeze(1).repeat(1, batch, 1))
        attention = []
        for layer in self.decoder.layers:
            x, weights = layer(x, memory)
            attention.append(weights)
        return self.mlp_head(self.decoder_norm(x).transpose(0, 1)), attention
