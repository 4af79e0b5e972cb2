"""The adapter contract every model follows, and the one factory door.

An adapter wraps one model's *inference path* and exposes

* ``preprocess(image) -> (3, S, S) float tensor`` — the model's official
  resolution, normalisation and grey→RGB handling, from an XBench image
  (float32 ``(H, W)`` in [0, 1] at original size);
* ``predict(pixels, prompts) -> Prediction`` — class scores ``(B, C)`` and raw
  saliency maps ``(B, C, h, w)`` at the model's native grid, in one forward pass;
* ``scores`` / ``saliency`` — thin views of ``predict``;
* ``to_probability(scores)`` — how a score becomes a probability for F1 / accuracy
  (identity for probability heads, sigmoid for raw logits);
* metadata: ``name``, ``map_source`` (``"similarity"``, ``"cross-attention"`` or
  ``"prior"``), ``score_rule`` (``"probability"``, ``"logit"``, ``"constant"``,
  ``"random"``), ``input_size``, ``grid``, ``verified``, ``citation``,
  ``weight_files`` and ``weights_source``.

``prompts`` are the prompt names that a dataset manifest gives for its classes
(``"pleural effusion"``); each adapter turns them into its own official text
input (templates, entity lookup) and documents how it handles unseen classes.

Weights are local only: ``create_model(name, weights=DIR)``; without ``weights``
the folder ``$XBENCH_WEIGHTS/<name>`` is used. Checkpoints are read with
:mod:`xbench.models.checkpoint` (safetensors, ``torch.load(weights_only=True)`` or a restricted
unpickler), never by executing pickled code.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import CheckpointError, MissingFileError
from ..registry import import_target, model_config


@dataclass
class Prediction:
    """Output of :meth:`Adapter.predict`: ``scores (B, C)`` and ``maps (B, C, h, w)`` float32 on CPU."""

    scores: torch.Tensor
    maps: torch.Tensor


class Adapter(ABC):
    """Base class of model adapters (see the module docstring for the contract)."""

    name: ClassVar[str] = ""
    map_source: ClassVar[str] = ""
    score_rule: ClassVar[str] = "probability"
    verified: ClassVar[bool] = True
    citation: ClassVar[str] = ""

    def __init__(self, config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        self.config: dict[str, Any] = dict(config or {})
        self.device = torch.device(device)
        self.weights_label = "unknown"  # "official", "random-init", "xbench-reference", "user-checkpoint", "none"

    # -- contract --------------------------------------------------------------------
    input_size: int = 224
    grid: tuple[int, int] = (14, 14)

    @abstractmethod
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image (float32 ``(H, W)`` in [0, 1]) → model input ``(3, S, S)``."""

    @abstractmethod
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` and native-grid maps ``(B, C, h, w)`` for a batch of preprocessed images."""

    def scores(self, pixels: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.predict(pixels, prompts).scores

    def saliency(self, pixels: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.predict(pixels, prompts).maps

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """The part of an original ``(H, W)`` image that the model input — and so its map — covers.

        ``(y0, x0, y1, x1)`` in original pixels; it may reach outside the image where the
        official transform pads. Default: the whole image (plain resize). Adapters whose
        transform crops (CLIP, BiomedCLIP, CARZero) override it, and the evaluation places
        their maps into this window of the evaluation grid (:mod:`xbench.windows`).
        """
        return (0.0, 0.0, float(size[0]), float(size[1]))

    def to_probability(self, scores: torch.Tensor | np.ndarray) -> np.ndarray:
        """Scores → probabilities in [0, 1] (sigmoid for ``score_rule == "logit"``)."""
        s = np.asarray(scores, dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-s)) if self.score_rule == "logit" else s

    def describe(self) -> dict[str, Any]:
        """Metadata row for README / tables."""
        return {
            "model": self.name,
            "map_source": self.map_source,
            "score_rule": self.score_rule,
            "input_size": self.input_size,
            "grid": f"{self.grid[0]}x{self.grid[1]}",
            "weights": self.weights_label,
            "verified": self.verified,
        }


def resize_crop_window(size: tuple[int, int], crop: int, mode: str = "shortest") -> tuple[float, float, float, float]:
    """Window of torchvision/open_clip ``Resize`` + ``CenterCrop(crop)`` in original pixels.

    ``mode`` as open_clip's ``resize_mode``: ``"shortest"`` (shorter side to ``crop``, then centre
    crop: the window is a centred square of the shorter side), ``"longest"`` (longer side to
    ``crop``, then centre pad: a centred square of the longer side, reaching into the padding) or
    ``"squash"`` (both sides to ``crop``: the whole image). Crop offsets use torchvision's
    ``int(round((resized - crop) / 2))`` in resized pixels.
    """
    h, w = float(size[0]), float(size[1])
    if mode == "squash":
        return (0.0, 0.0, h, w)
    side = min(h, w) if mode == "shortest" else max(h, w)
    if mode not in ("shortest", "longest"):
        raise ValueError(f"resize mode must be shortest, longest or squash, got {mode!r}")
    out = []
    for extent in (h, w):
        resized = int(crop * extent / side) if extent != side else crop
        offset = int(round((resized - crop) / 2.0)) * extent / resized if resized else 0.0
        out.append(offset)
    y0, x0 = out
    return (y0, x0, y0 + side, x0 + side)


def check_pixels(pixels: torch.Tensor, size: int, name: str) -> None:
    """``ValueError`` naming the model, the expected ``(B, 3, size, size)`` and the shape received."""
    shape = tuple(getattr(pixels, "shape", ()))
    if len(shape) != 4 or shape[1:] != (3, size, size) or shape[0] < 1:
        raise ValueError(f"{name} predict expects preprocessed pixels of shape (B, 3, {size}, {size}) "
                         f"(the output of {name}.preprocess, stacked), got {shape}")


# -- weights ---------------------------------------------------------------------------
def weights_dir(name: str, weights: str | Path | None) -> Path | None:
    """The local weights folder for ``name``: ``weights`` if given, else ``$XBENCH_WEIGHTS/<name>`` if it exists."""
    if weights is not None:
        return Path(weights)
    root = os.environ.get("XBENCH_WEIGHTS")
    if root and (Path(root) / name).exists():
        return Path(root) / name
    return None


def require_file(folder: Path, relative: str, what: str, source: str | None) -> Path:
    """``folder/relative`` if it exists, else :class:`MissingFileError` naming it and its publisher."""
    path = folder / relative
    if not path.exists():
        raise MissingFileError(path, what, source)
    return path


def weight_file(folder: str | Path, config: Mapping[str, Any], key: str, default_path: str, what: str,
                default_source: str | None = None) -> Path:
    """The file ``weights.<key>`` of a model config inside ``folder`` (the config's ``path`` and ``source``
    win over the defaults); absent → :class:`MissingFileError` naming it and its publisher."""
    entry = (config.get("weights") or {}).get(key) or {}
    return require_file(Path(folder), entry.get("path", default_path), what, entry.get("source", default_source))


def load_checkpoint(path: str | Path) -> Any:
    """Load a ``.pt/.pth/.ckpt/.bin`` or ``.safetensors`` file on CPU without running any code from it.

    Delegates to :func:`xbench.models.checkpoint.read_checkpoint`: safetensors, else
    ``torch.load(weights_only=True)``, else the restricted unpickler (numpy scalars, ``Namespace``,
    config objects as inert placeholders, reported by a warning). A file that cannot be read safely
    raises :class:`CheckpointError` naming it.
    """
    from .checkpoint import read_checkpoint

    return read_checkpoint(path)


def load_state_strict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """``load_state_dict(strict=True)`` with an error that lists missing / unexpected / mis-shaped keys.

    A non-string key or a non-tensor value raises :class:`CheckpointError` naming ``where`` and the key.
    """
    from .checkpoint import require_tensor_state

    state = require_tensor_state(state, where)
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        def cut(items: list[str]) -> str:
            return ", ".join(items[:8]) + (f" … (+{len(items) - 8})" if len(items) > 8 else "")
        raise CheckpointError(
            f"{where}: checkpoint does not match the architecture — "
            f"missing {len(missing)} [{cut(missing)}]; unexpected {len(unexpected)} [{cut(unexpected)}]; "
            f"shape mismatches {len(shapes)} [{cut(shapes)}]"
        )
    module.load_state_dict(state, strict=True)


# -- factory ---------------------------------------------------------------------------
def create_model(name: str, weights: str | Path | None = None, device: str | torch.device = "cpu", **params: Any) -> Adapter:
    """Build a registered model: the one door (``xbench.create_model("kad", weights="/w/kad")``).

    ``name`` is a file stem of ``xbench/configs/models``; ``params`` override the
    config's ``params`` section. Each adapter class provides
    ``from_config(config, weights_dir, device) -> Adapter``.
    """
    cfg = model_config(name)
    cls = import_target(cfg["class"])
    config = {**cfg, "params": {**cfg.get("params", {}), **params}}
    return cls.from_config(config, weights_dir(name, weights), device)
