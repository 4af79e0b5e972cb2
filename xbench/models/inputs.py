"""How an XBench image becomes the 8-bit image each official pipeline starts from.

XBench readers give float32 ``(H, W)`` in [0, 1] at original size (:mod:`xbench.datasets.images`):
``v / 255`` for 8-bit files, ``v / 65535`` for 16-bit PNGs, and the windowed (modality + VOI LUT)
range scaled to [0, 1] for DICOM. The official pipelines start from a file instead:

* MedKLIP, MAVL, KAD: ``PIL.Image.open(path).convert('RGB')``. On a 16-bit PNG Pillow **clips**
  every value above 255 to 255 (checked with Pillow 13: ``[0, 100, 256, 40000] → [0, 100, 255, 255]``),
  so the official path would see an almost white image: the models were only ever run on 8-bit files.
* CARZero: ``cv2.imread(path, 0)``, which converts 16 bits to 8 by dropping the low byte, ``v >> 8``
  (checked with opencv-python-headless 5.0 on all 65,536 values of a 16-bit PNG).
* CLIP, BiomedCLIP: open_clip on a PIL RGB image (8-bit).

XBench's rule (:func:`to_uint8`), per source depth (:func:`source_levels`):

* 8-bit source: the file's own values, ``round(x · 255)`` (bit-exact with every official pipeline).
* 16-bit source: ``"linear"`` — ``round(v · 255 / 65535)``, the full range kept (MedKLIP, MAVL, KAD, CLIP,
  BiomedCLIP; a deliberate deviation from Pillow's clipping, which destroys the image) — or ``"opencv"``
  — ``v >> 8``, exactly what ``cv2.imread(path, 0)`` gives (CARZero). The two differ by at most one grey
  level, on 16,256 of the 65,536 possible values (24.8 %).
* DICOM (any other values): the windowed image as an 8-bit export, ``round(x · 255)``, for every model.
  The published pipelines read PNG/JPEG exports of the DICOM datasets; MedKLIP/MAVL's RSNA-specific
  ``pixel_array / 255`` + histogram equalisation is not applied (a documented difference).

The depth is read from the values, so it needs no extra field on ``Sample``: an image whose values are all
``k / 255`` came from an 8-bit file, all ``k / 65535`` (and not all ``k / 255``) from a 16-bit one. A 16-bit
file whose every value is a multiple of 257 (an 8-bit image stored in 16 bits) counts as 8-bit.
"""
from __future__ import annotations

import numpy as np

__all__ = ["RULES", "source_levels", "to_uint8"]

RULES = ("linear", "opencv")


def _on_levels(image: np.ndarray, levels: int, tolerance: float) -> bool:
    scaled = image.astype(np.float64) * levels
    return bool(np.all(np.abs(scaled - np.round(scaled)) < tolerance))


def source_levels(image: np.ndarray) -> int | None:
    """255 for an image whose values are all ``k/255``, 65535 for ``k/65535``, ``None`` otherwise (DICOM, resampled)."""
    image = np.asarray(image)
    # float32 keeps v/255 within 2e-5 and v/65535 within 5e-3 of a level; distinct levels are >= 1/257 and 1 apart
    if _on_levels(image, 255, 1e-3):
        return 255
    if _on_levels(image, 65535, 0.05):
        return 65535
    return None


def to_uint8(image: np.ndarray, rule: str = "linear") -> np.ndarray:
    """XBench grey image ``(H, W)`` in [0, 1] → the uint8 image an official pipeline starts from (module docstring).

    ``rule`` matters for 16-bit sources only: ``"linear"`` (``round(v·255/65535)``) or ``"opencv"``
    (``v >> 8``, as ``cv2.imread(path, 0)``).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 2:
        raise ValueError(f"expected a grey image of shape (H, W), got shape {image.shape}")
    image = np.clip(image, 0.0, 1.0)
    if rule == "opencv" and source_levels(image) == 65535:
        v16 = np.round(image.astype(np.float64) * 65535).astype(np.uint16)
        return (v16 >> 8).astype(np.uint8)
    return np.round(image * 255).astype(np.uint8)
