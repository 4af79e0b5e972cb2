"""CheXzero: a CLIP ViT-B/32 trained on MIMIC-CXR reports; zero-shot scores and patch–text similarity maps.

Citation
    Tiu, Talius, Patel, Langlotz, Ng, Rajpurkar. "Expert-level detection of pathologies from unannotated chest
    X-ray images via self-supervised learning". Nature Biomedical Engineering 6, 1399–1406 (2022).
Official code
    https://github.com/rajpurkarlab/CheXzero (read at 5c341db): ``zero_shot.py`` (``make``, ``load_clip``,
    ``zeroshot_classifier``, ``predict``, ``run_softmax_eval``), ``data_process.py`` (``preprocess``,
    ``img_to_hdf5``), ``clip.py`` / ``model.py`` (OpenAI's CLIP code). Nothing is copied: the network is open_clip's
    ``ViT-B-32-quickgelu``, whose state-dict keys are those of OpenAI's ``model.py``.
Weights (local only, never downloaded)
    One checkpoint of the authors' Google Drive folder (the YAML's ``checkpoint`` entry): a plain
    ``torch.save(model.state_dict())`` of OpenAI's ViT-B/32 CLIP (no prefix; ``module.`` is stripped if present),
    read by XBench's restricted unpickler (:func:`xbench.models.base.load_checkpoint`). The official code averages
    an ensemble of such checkpoints; XBench runs the one file it is given.
Input
    The official pipeline: the 8-bit image (``cv2.imread``; :func:`xbench.models.inputs.to_uint8`, rule
    ``"opencv"``) → longest side to ``params.pad_size`` (320) with PIL ``LANCZOS`` (``Image.ANTIALIAS``), other
    side ``int(side · 320 / longest)``, pasted on a black 320×320 image at ``((320 − w) // 2, (320 − h) // 2)`` →
    float32 on the 0–255 scale → grey to 3 channels → ``Normalize(params.mean, params.std)`` (101.48761,
    83.43944) → ``Resize(224, bicubic)`` of the float tensor **without antialiasing** (what the pinned
    torchvision 0.11 did; current torchvision's default would antialias, a different input).
Native grid
    7×7 (patch 32 on 224).
Score rule (``score_rule: probability``)
    ``run_softmax_eval`` with the pair ``("{}", "no {}")`` (``params.templates``): per class, image and prompt
    embeddings L2-normalised, logit = their cosine (**no** logit scale, :meth:`CheXzeroAdapter.logit_scale` is 1);
    score = ``exp(pos) / (exp(pos) + exp(neg))``.
Map rule (``map_source: similarity``; the official code has none)
    As CLIP's ``"naive"`` variant (:class:`xbench.models.clip.CLIPAdapter`): output tokens of the **last**
    residual block of the visual transformer, CLS dropped, through ``ln_post`` and ``@ proj`` (768→512),
    L2-normalised, cosine with the class's L2-normalised **positive** prompt embedding, row-major 7×7; raw cosines.
    ``params.map_variant: maskclip`` gives MaskCLIP's value-path tokens instead.
Tokenizer
    OpenAI's BPE ``SimpleTokenizer`` (``bpe_simple_vocab_16e6.txt.gz``, context 77), the file open_clip ships
    (byte-identical to the one in the CheXzero repository).
Parity
    ``tests/models/test_parity_chexzero.py`` against ``tests/fixtures/parity/chexzero`` (official code run on the
    synthetic recipe checkpoint).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .base import load_checkpoint
from .clip import CLIPAdapter
from .inputs import to_uint8

__all__ = ["CheXzeroAdapter", "pad_to_square", "preprocess_stages"]


def pad_to_square(image_uint8: np.ndarray, size: int) -> np.ndarray:
    """Official ``data_process.preprocess``: longest side to ``size`` with PIL LANCZOS, zero-pad to ``size × size``.

    The new sides are ``int(side * (size / longest))`` (float64, as the official code); the resized image is pasted
    at ``((size - w) // 2, (size - h) // 2)``. PIL resamples each RGB channel alike, and the official RGB→L
    conversion of a grey image is exact, so resizing the grey image is the same. uint8 in, uint8 out.
    """
    h, w = image_uint8.shape
    ratio = float(size) / max(h, w)
    new_w, new_h = int(w * ratio), int(h * ratio)
    resized = Image.fromarray(np.ascontiguousarray(image_uint8)).resize((new_w, new_h), Image.LANCZOS)
    canvas = Image.new("L", (size, size))
    canvas.paste(resized, ((size - new_w) // 2, (size - new_h) // 2))
    return np.asarray(canvas)


def preprocess_stages(image: np.ndarray, pad_size: int, mean: float, std: float, input_size: int) -> dict[str, Any]:
    """Every stage of the official pipeline for one XBench image ``(H, W)`` float32 in [0, 1].

    Returns ``padded`` (``(pad_size, pad_size)`` uint8, the image the official h5 file stores) and
    ``pixel_values`` (``(3, input_size, input_size)`` float32): ``(padded − mean) / std`` in float32, then
    bicubic (``align_corners=False``, no antialias) to ``input_size`` as torchvision's tensor ``Resize`` computes it.
    """
    image = np.asarray(image)
    if image.ndim != 2:
        raise ValueError(f"expected a grey image of shape (H, W), got shape {image.shape}")
    padded = pad_to_square(to_uint8(image, "opencv"), pad_size)
    x = torch.from_numpy(padded.astype(np.float32)).unsqueeze(0).repeat(3, 1, 1)
    x = x.sub(torch.tensor(mean, dtype=torch.float32)).div(torch.tensor(std, dtype=torch.float32))
    if pad_size != input_size:
        x = F.interpolate(x.unsqueeze(0), size=(input_size, input_size), mode="bicubic", align_corners=False,
                          antialias=False).squeeze(0)
    return {"padded": padded, "pixel_values": x}


class CheXzeroAdapter(CLIPAdapter):
    """CheXzero adapter: CLIP's prompt-pair rules with CheXzero's network, input pipeline and unscaled cosines.

    Built like :class:`~xbench.models.clip.CLIPAdapter` (``model``: an open_clip ``ViT-B-32-quickgelu``); the
    module docstring states every convention.
    """

    gpu_preprocess = None  # resizes after normalising: its input is no per-pixel table of 8-bit codes (CPU only)

    config_name = "chexzero"
    architecture: ClassVar[str] = "ViT-B-32-quickgelu"  # OpenAI's ViT-B/32, what clip.load("ViT-B/32") builds

    def __init__(self, model: torch.nn.Module, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu", weights_label: str = "unknown"):
        super().__init__(model, config, device, weights_label)
        params = self.config.get("params", {})
        self.pad_size = int(params["pad_size"])
        self.mean, self.std = float(params["mean"]), float(params["std"])

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CheXzeroAdapter:
        """The official checkpoint: a plain state-dict file (a ``.pt`` here is never a TorchScript archive)."""
        path = files["checkpoint"]
        return cls.from_checkpoint(load_checkpoint(path), config, device, where=str(path))

    def logit_scale(self) -> float:
        """CheXzero compares raw cosines (``run_softmax_eval`` has no logit scale): 1."""
        return 1.0

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image → ``(3, 224, 224)`` float32 by the official pipeline (:func:`preprocess_stages`)."""
        return preprocess_stages(image, self.pad_size, self.mean, self.std, self.input_size)["pixel_values"]

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """Longest side to the input, the other zero-padded: a centred square of the longer side (into the padding).

        Offsets follow :func:`pad_to_square` (``(pad − new) // 2`` padded pixels before the image, in original pixels).
        """
        h, w = int(size[0]), int(size[1])
        ratio = float(self.pad_size) / max(h, w)
        window = []
        for extent in (h, w):
            new = int(extent * ratio)
            before = (self.pad_size - new) // 2
            scale = extent / new
            window.append((-before * scale, (self.pad_size - before) * scale))
        (y0, y1), (x0, x1) = window
        return (y0, x0, y1, x1)

