"""Local BERT text encoders and WordPiece tokenizers, loaded strictly from the folders publishers ship.

* :func:`load_bert_tokenizer` — a BERT WordPiece tokenizer from a folder holding ``vocab.txt``, with or
  without ``tokenizer_config.json`` (with or without ``tokenizer_class``), ``special_tokens_map.json``
  and ``config.json`` (``model_type: bert``). ``AutoTokenizer`` needs a model type it can resolve
  and fails on a vocab-only folder; the BERT class is named here, so every layout loads. A folder
  that declares another tokenizer class or model type is refused with the file and field named.
* :func:`load_bert_folder` — a ``BertModel`` from ``config.json`` + ``model.safetensors`` /
  ``pytorch_model.bin`` (read by :func:`xbench.models.checkpoint.read_checkpoint`), loaded
  **strictly**: every encoder weight must be in the file and every weight in the file must be
  used. ``transformers``' ``from_pretrained`` instead re-initialises a missing weight at random with
  only a log line. The only keys allowed to differ are listed in :data:`IGNORED_KEYS` with the reason.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError, FormatError, MissingFileError
from ._common import build_uninitialised
from .base import load_checkpoint, load_state_strict

__all__ = ["BERT_TOKENIZER_CLASSES", "IGNORED_KEYS", "bert_state_from_file", "load_bert_folder", "load_bert_tokenizer",
           "read_json"]

BERT_TOKENIZER_CLASSES = ("BertTokenizer", "BertTokenizerFast")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

#: checkpoint keys that may be absent or extra in a publisher's folder, and why ignoring them is exact
IGNORED_KEYS = {
    r"^cls\.": "pre-training heads of BertForPreTraining / BertForMaskedLM (masked-LM, next sentence): not part of BertModel",
    r"^embeddings\.position_ids$": "buffer equal to arange(max_positions); older transformers saved it, current ones "
                                   "construct it (non-persistent)",
    r"^pooler\.": "the pooler (dense + tanh over [CLS]) when the adapter reads last_hidden_state only "
                  "(MedKLIP, MAVL): it is not built, so it can neither be missing nor wrong",
}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or :class:`FormatError` naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(path, f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise FormatError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def load_bert_tokenizer(folder: str | Path, *, fast: bool = False, source: str | None = None, **overrides: Any) -> Any:
    """BERT WordPiece tokenizer from a local folder in any published layout (module docstring).

    ``fast`` picks ``BertTokenizerFast`` (what ``AutoTokenizer`` gives, KAD) over ``BertTokenizer``
    (MedKLIP, MAVL, CARZero); on transformers ≥ 5 both are the same tokenizers-backed class.
    ``tokenizer_config.json`` settings apply as ``from_pretrained`` applies them; ``overrides`` win
    (e.g. KAD's ``do_lower_case=True``). Raises :class:`MissingFileError` without ``vocab.txt``,
    :class:`FormatError` for a folder declaring a non-BERT tokenizer or model type, and checks that
    every line of ``vocab.txt`` became a token.
    """
    from transformers import BertTokenizer, BertTokenizerFast

    folder = Path(folder)
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise MissingFileError(vocab, "BERT WordPiece vocabulary (vocab.txt) of the tokenizer folder", source)
    tok_config = folder / "tokenizer_config.json"
    if tok_config.is_file():
        declared = read_json(tok_config).get("tokenizer_class")
        if declared is not None and declared not in BERT_TOKENIZER_CLASSES:
            raise FormatError(tok_config, f"declares {declared!r}; a BERT WordPiece tokenizer "
                                          f"({' or '.join(BERT_TOKENIZER_CLASSES)}) is expected", field="tokenizer_class")
    model_config = folder / "config.json"
    if model_config.is_file():
        model_type = read_json(model_config).get("model_type")
        if model_type is not None and model_type != "bert":
            raise FormatError(model_config, f"model_type {model_type!r}; a BERT folder is expected", field="model_type")
    cls = BertTokenizerFast if fast else BertTokenizer
    try:
        tokenizer = cls.from_pretrained(str(folder), local_files_only=True, **overrides)
    except Exception as exc:
        raise FormatError(folder, f"cannot build a BERT WordPiece tokenizer ({type(exc).__name__}: {exc})") from exc
    lines = [t for t in vocab.read_text(encoding="utf-8").splitlines() if t.strip()]
    if len(tokenizer.get_vocab()) < len(set(lines)):
        raise FormatError(vocab, f"{len(set(lines))} tokens in the file but the tokenizer holds {len(tokenizer.get_vocab())}")
    return tokenizer


def bert_state_from_file(state: Mapping[str, Any], where: str, use_pooler: bool) -> dict[str, torch.Tensor]:
    """A publisher's BERT checkpoint → ``BertModel`` keys: ``bert.`` prefix stripped, legacy
    ``LayerNorm.gamma/beta`` renamed ``weight/bias`` (as transformers does), :data:`IGNORED_KEYS` dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{where}: key {key!r} is a {type(key).__name__}, not a string")
        name = key.removeprefix("bert.")
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))
        ignored = [p for p in IGNORED_KEYS if re.search(p, name) and (p != r"^pooler\." or not use_pooler)]
        if not ignored:
            out[name] = value
    return out


def load_bert_folder(folder: str | Path, *, use_pooler: bool = False, source: str | None = None) -> torch.nn.Module:
    """``BertModel`` (eval mode) from a local folder with ``config.json`` and a weights file, loaded strictly.

    A missing, unexpected or mis-shaped encoder weight raises :class:`CheckpointError` naming the key and
    the file. ``use_pooler=False`` builds the model without its pooler (MedKLIP and MAVL read
    ``last_hidden_state[:, 0]``); no weight is randomly initialised first (:func:`~xbench.models._common.build_uninitialised`).
    """
    from transformers import BertConfig, BertModel

    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise MissingFileError(config_path, "BERT model config (config.json) of the text-encoder folder", source)
    weights = next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None)
    if weights is None:
        raise MissingFileError(folder / WEIGHT_FILES[0], f"BERT weights ({' or '.join(WEIGHT_FILES)})", source)
    model_type = read_json(config_path).get("model_type", "bert")
    if model_type != "bert":
        raise FormatError(config_path, f"model_type {model_type!r}; a BERT folder is expected", field="model_type")
    config = BertConfig.from_json_file(str(config_path))
    state = bert_state_from_file(load_checkpoint(weights), str(weights), use_pooler)
    model = build_uninitialised(lambda: BertModel(config, add_pooling_layer=use_pooler))  # every weight loaded next
    for key, value in model.state_dict().items():  # a persistent position_ids buffer (older transformers): as constructed
        if key not in state and re.search(r"^embeddings\.position_ids$", key):
            state[key] = value
    load_state_strict(model, state, f"BERT text encoder {weights}")
    return model.eval()
