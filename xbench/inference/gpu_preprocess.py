"""Model preprocessing as torch kernels on any device, bit-identical to the adapters' CPU ``preprocess``.

Why: a cold run spends 69–456 ms of CPU per image on decoding plus every model's own CPU resize
(docs/performance.md), while the models need ~5 ms of GPU per image. The resizes the adapters use are
integer or fixed-order float arithmetic, so they can run on the GPU and give the **same bytes**:

* **Pillow's 8-bit resampling** (``Image.resize`` on ``L``/``RGB`` images; bilinear: MedKLIP, MAVL; bicubic: KAD, DeViDe,
  CLIP, BiomedCLIP). Coefficients are computed in float64 exactly as Pillow's ``precompute_coeffs``
  does (same expressions, taps summed in order), then rounded to 22-bit fixed-point integers
  (``normalize_coeffs_8bpc``). Each pass is ``clip8((2^21 + Σ pixel·k) >> 22)``; the sums are
  integers below 2^31, so a float64 matrix product of the integer coefficients gives them exactly in
  any summation order (cuBLAS, CPU BLAS alike), and ``floor(s / 2^22)`` is the arithmetic shift.
  Horizontal pass then vertical, each rounded to 8 bit; Pillow ≥ 13 runs the vertical pass first when
  ``in_h - out_h > 0`` and ``in_h - out_h > 2 (in_w - out_w)`` (``../shared/research/pillow-resampling.md``),
  and this module follows the installed Pillow's rule, since the CPU path runs the installed Pillow.
* **OpenCV's INTER_AREA** as re-implemented for CARZero and GLoRIA (:func:`xbench.models.carzero.resize_area`):
  integer block sums, or float32 area weights accumulated term by term in OpenCV's order (one
  vectorised step per term, a multiply then an add, never fused), ``rint`` and clip.
* **Everything after the resize** (crop, grey → 3 channels, ``/255``, mean/std) depends only on the
  8-bit code of a pixel, so it is the gather through :class:`xbench.inference.calibration.ModelInput`'s table, which
  was computed by the adapter's own CPU code.

The per-model kernels produce the ``uint8 (S, S)`` **codes** that :mod:`xbench.inference.input_feed` stores; an
adapter without a kernel here (priors, reference models: float resizes in torch's CPU order) keeps its
CPU ``preprocess``. :func:`plan_for` builds the kernel an adapter's class declares (``gpu_preprocess``), :func:`check_plan` proves it on probe
images against the adapter's own ``preprocess`` before a run uses it and gives the code → value table.

The one upload (:func:`source_array`): an image whose values are all ``v / 65535`` (a 16-bit file) is
sent as ``uint16 v``; every other image as the ``uint8`` codes ``round(x · 255)`` that
:func:`xbench.models.inputs.to_uint8` gives. A model's 8-bit rule for 16-bit sources (``linear`` or
``opencv``) is then a 65,536-entry table computed by ``to_uint8`` itself.

Examples
--------
>>> import numpy as np, torch
>>> from PIL import Image
>>> img = np.random.default_rng(0).integers(0, 256, (37, 53), dtype=np.uint8)
>>> ref = np.asarray(Image.fromarray(img).resize((20, 31), Image.BICUBIC))
>>> out = resize_pillow(torch.from_numpy(img), (31, 20), Image.BICUBIC)
>>> bool(np.array_equal(out.numpy(), ref))
True
"""
from __future__ import annotations

import functools
import inspect
import math
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL
import torch
from PIL import Image

from ..core.errors import XBenchError
from ..models.inputs import source_levels, to_uint8

__all__ = ["CodePlan", "check_plan", "pillow_coefficients", "plan_for", "resize_area", "resize_pillow",
           "code_table", "preprocess_standins", "sixteen_bit_table", "source_array", "upload_array",
           "PILLOW_VERTICAL_FIRST"]

PRECISION_BITS = 22  # Pillow: 32 - 8 - 2
PILLOW_VERTICAL_FIRST = int(PIL.__version__.split(".")[0]) >= 13  # Pillow 13's pass-order rule (module docstring)


# -- Pillow's filters: the same double expressions as Resample.c --------------------------------
def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _box(x: np.ndarray) -> np.ndarray:
    return np.where((x > -0.5) & (x <= 0.5), 1.0, 0.0)


# hamming and lanczos call sin(); numpy's and the C library's sin may differ in the last bit, so they are
# not offered (no adapter uses them)
FILTERS: dict[int, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    int(Image.BICUBIC): (_bicubic, 2.0), int(Image.BILINEAR): (_bilinear, 1.0), int(Image.BOX): (_box, 0.5)}


@functools.lru_cache(maxsize=256)
def pillow_coefficients(in_size: int, out_size: int, resample: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for one axis.

    Returns ``xmin (out,)`` int64 (first source index of each output) and ``k (out, ksize)`` int64 fixed-point
    coefficients (zero past each output's own tap count).
    """
    if int(resample) not in FILTERS:
        raise ValueError(f"resample filter {resample} has no exact port (use BICUBIC, BILINEAR or BOX)")
    if in_size < 1 or out_size < 1:
        raise ValueError(f"sizes must be positive, got {in_size} -> {out_size}")
    fn, base_support = FILTERS[int(resample)]
    scale = float(np.float32(in_size)) / out_size  # (double)(in1 - in0) / outSize, box in float
    filterscale = max(scale, 1.0)
    support = base_support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    ss = 1.0 / filterscale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    w = fn(((taps[None, :] + xmin[:, None]).astype(np.float64) - center[:, None] + 0.5) * ss)
    w = np.where(taps[None, :] < xmax[:, None], w, 0.0)
    ww = np.zeros(out_size, np.float64)
    for x in range(ksize):  # in order, as the C loop sums them
        ww = ww + w[:, x]
    w = np.where(ww[:, None] != 0.0, w / np.where(ww == 0.0, 1.0, ww)[:, None], w)
    scaled = w * float(1 << PRECISION_BITS)
    k = np.where(w < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int64)
    return xmin, k


@functools.lru_cache(maxsize=256)
def _pillow_matrix_cpu(in_size: int, out_size: int, resample: int) -> torch.Tensor:
    xmin, k = pillow_coefficients(in_size, out_size, resample)
    cols = xmin[:, None] + np.arange(k.shape[1])[None, :]
    valid = (k != 0) & (cols < in_size)
    m = np.zeros((out_size, in_size), np.float64)
    rows = np.broadcast_to(np.arange(out_size)[:, None], k.shape)
    m[rows[valid], cols[valid]] = k[valid]
    return torch.from_numpy(m)


_MATRICES: dict[tuple[int, int, int, str], torch.Tensor] = {}


def _pillow_matrix(in_size: int, out_size: int, resample: int, device: torch.device) -> torch.Tensor:
    """``(out, in)`` float64 matrix of the integer coefficients, cached per device."""
    key = (in_size, out_size, int(resample), str(device))
    m = _MATRICES.get(key)
    if m is None:
        if len(_MATRICES) > 512:
            _MATRICES.clear()
        m = _MATRICES[key] = _pillow_matrix_cpu(in_size, out_size, int(resample)).to(device)
    return m


def _clip8(sums: torch.Tensor) -> torch.Tensor:
    """``clip8(2^21 + s)``: arithmetic shift by 22 (floor; exact power-of-two scaling), clamp to 0..255; in place
    (``sums`` is a fresh product)."""
    return sums.add_(float(1 << (PRECISION_BITS - 1))).mul_(1.0 / (1 << PRECISION_BITS)).floor_().clamp_(0, 255)


def resize_pillow(image: torch.Tensor, size: tuple[int, int], resample: int = Image.BICUBIC) -> torch.Tensor:
    """``Image.fromarray(image).resize((w, h), resample)`` for a uint8 ``(..., H, W)`` tensor, on its device.

    ``size`` is ``(h, w)`` (torch order). Leading dimensions are channels or images of one size, each resized
    alike (as Pillow resizes each band of an RGB image). Bit-identical to Pillow (module docstring).
    """
    if image.dtype != torch.uint8 or image.ndim < 2:
        raise ValueError(f"resize_pillow expects a uint8 (..., H, W) tensor, got {image.dtype} {tuple(image.shape)}")
    in_h, in_w = int(image.shape[-2]), int(image.shape[-1])
    out_h, out_w = int(size[0]), int(size[1])
    if (in_h, in_w) == (out_h, out_w):
        return image.clone()
    x = image.to(torch.float64)
    horizontal, vertical = in_w != out_w, in_h != out_h
    vertical_first = PILLOW_VERTICAL_FIRST and (in_h - out_h) > 0 and (in_h - out_h) > 2 * (in_w - out_w)

    def h_pass(t: torch.Tensor) -> torch.Tensor:
        return _clip8(t @ _pillow_matrix(in_w, out_w, resample, t.device).T)

    def v_pass(t: torch.Tensor) -> torch.Tensor:
        return _clip8(_pillow_matrix(in_h, out_h, resample, t.device) @ t)

    if vertical_first:
        x = h_pass(v_pass(x)) if horizontal else v_pass(x)
    else:
        if horizontal:
            x = h_pass(x)
        if vertical:
            x = v_pass(x)
    return x.to(torch.uint8)


# -- OpenCV INTER_AREA (CARZero's re-implementation) ----------------------------------------------
@functools.lru_cache(maxsize=256)
def _area_terms_cpu(src: int, dst: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sources, weights)``, each ``(J, dst)``: term ``j`` of every output index (``_table_passes``' pass ``j``),
    outputs with fewer than ``J`` terms padded with weight 0 at source 0. Adding ``+0.0`` to a non-negative float32
    sum leaves it unchanged, so summing the ``J`` rows in order gives every output its terms in OpenCV's order."""
    from ..models.carzero import _area_table, _table_passes

    passes = _table_passes(_area_table(src, dst, scale))
    sources = np.zeros((len(passes), dst), np.int64)
    weights = np.zeros((len(passes), dst), np.float32)
    for j, (outs, srcs, w) in enumerate(passes):
        sources[j, outs], weights[j, outs] = srcs, w
    return torch.from_numpy(sources), torch.from_numpy(weights)


_AREA: dict[tuple[int, int, float, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _area_terms(src: int, dst: int, scale: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_area_terms_cpu` on ``device``, cached (no host-to-device copies per image)."""
    key = (src, dst, scale, str(device))
    terms = _AREA.get(key)
    if terms is None:
        if len(_AREA) > 1024:
            _AREA.clear()
        terms = _AREA[key] = tuple(t.to(device) for t in _area_terms_cpu(src, dst, scale))
    return terms


_FACTORS: dict[tuple[int, str], torch.Tensor] = {}


def _area_factor(cells: int, device: torch.device) -> torch.Tensor:
    """``float32(1 / cells)`` as a 0-dim tensor on ``device``, made once per device.

    Made per call it would be a copy from pageable host memory. On CUDA such a copy first waits for everything queued
    on the stream, so the decoding thread would stop at every stack until the GPU had run its uploads and kernels.
    """
    key = (int(cells), str(device))
    factor = _FACTORS.get(key)
    if factor is None:
        factor = _FACTORS[key] = torch.tensor(np.float32(1.0 / cells), device=device)
    return factor


def _sum_in_order(terms: torch.Tensor, dim: int) -> torch.Tensor:
    """``terms`` summed along ``dim`` one index after another (float32 adds, never fused or reordered)."""
    total = terms.select(dim, 0)
    for j in range(1, terms.shape[dim]):
        total = total + terms.select(dim, j)
    return total


def resize_area(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """:func:`xbench.models.carzero.resize_area` (OpenCV ``INTER_AREA``, downscaling) on a uint8 ``(..., H, W)`` tensor.

    Same branches and float32 operations in the same order, so the result is the same bytes on any device. Leading
    dimensions are images of one size, each resized alike (every operation is elementwise or an integer sum per image).
    """
    if image.ndim < 2 or image.dtype != torch.uint8:
        raise ValueError(f"resize_area expects a uint8 (..., H, W) tensor, got {image.dtype} {tuple(image.shape)}")
    lead = tuple(image.shape[:-2])
    in_h, in_w = int(image.shape[-2]), int(image.shape[-1])
    if height < 1 or width < 1 or height > in_h or width > in_w:
        raise ValueError(f"resize_area only downscales: input {in_h}x{in_w}, requested {height}x{width}")
    if (height, width) == (in_h, in_w):
        return image.clone()
    scale_x, scale_y = 1.0 / (width / in_w), 1.0 / (height / in_h)
    kx, ky = round(scale_x), round(scale_y)
    eps = np.finfo(np.float64).eps
    if abs(scale_x - kx) < eps and abs(scale_y - ky) < eps:
        blocks = image[..., : height * ky, : width * kx].to(torch.int64).reshape(*lead, height, ky, width, kx)
        sums = blocks.sum(dim=(-3, -1))
        if kx == 2 and ky == 2:
            return ((sums + 2) >> 2).to(torch.uint8)
        factor = _area_factor(kx * ky, image.device)
        return torch.round(sums.to(torch.float32) * factor).clamp_(0, 255).to(torch.uint8)
    dev = image.device
    source = image.to(torch.float32)
    srcs, weights = _area_terms(in_w, width, scale_x, dev)  # (J, width)
    rows = _sum_in_order(source[..., srcs] * weights, -2)  # (..., in_h, J, width) -> (..., in_h, width)
    srcs, weights = _area_terms(in_h, height, scale_y, dev)  # (J, height)
    out = _sum_in_order(rows[..., srcs, :] * weights[..., None], -3)  # (..., J, height, width) -> (..., height, width)
    return torch.round(out).clamp_(0, 255).to(torch.uint8)


# -- the one upload and the 16-bit rules ------------------------------------------------------------
def source_array(image: np.ndarray) -> np.ndarray:
    """XBench float image ``(H, W)`` → what is uploaded: ``uint16 v`` for a 16-bit source (all values ``v/65535``
    and not all ``k/255``, :func:`xbench.models.inputs.source_levels`), else the ``uint8`` codes of
    :func:`xbench.models.inputs.to_uint8` (8-bit files, DICOM exports)."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 2:
        raise ValueError(f"expected a grey image of shape (H, W), got shape {image.shape}")
    if source_levels(image) == 65535:
        return np.round(np.clip(image, 0.0, 1.0).astype(np.float64) * 65535).astype(np.uint16)
    return to_uint8(image)


def upload_array(source: Any) -> np.ndarray:
    """:func:`source_array` of a :class:`~xbench.datasets.images.SourceImage`'s image, from its integers.

    The 8-/16-bit test and the rounding are run on the levels present in the image (elementwise, so the same
    answer as on every pixel), then one table lookup per pixel: no full-size float copy. An 8-bit file whose levels
    are ``k / 255`` is uploaded as its own bytes.
    """
    if source.levels is None:
        return source_array(source.values)
    levels = source.levels
    present = source.present()
    if source_levels(levels[present]) == 65535:
        table = np.round(np.clip(levels, 0.0, 1.0).astype(np.float64) * 65535).astype(np.uint16)
    else:
        table = to_uint8(levels.reshape(1, -1)).reshape(-1)
        if len(table) == 256 and source.values.dtype == np.uint8 and np.array_equal(table, np.arange(256)):
            return source.values
    return table[source.values]


@functools.lru_cache(maxsize=4)
def _sixteen_bit_table_cpu(rule: str) -> torch.Tensor:
    values = (np.arange(65536, dtype=np.float64) / 65535.0).astype(np.float32)  # what the reader returns
    # laid out as one row of a 16-bit image so that to_uint8 sees a 16-bit source, as for the whole image
    return torch.from_numpy(to_uint8(values.reshape(256, 256), rule).reshape(-1).copy())


_TABLES16: dict[tuple[str, str], torch.Tensor] = {}


def sixteen_bit_table(rule: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(65536,)`` uint8: ``to_uint8`` of a 16-bit source value ``v`` under ``rule`` (``linear`` / ``opencv``)."""
    key = (rule, str(device))
    if key not in _TABLES16:
        _TABLES16[key] = _sixteen_bit_table_cpu(rule).to(device)
    return _TABLES16[key]


def to_codes8(source: torch.Tensor, rule: str) -> torch.Tensor:
    """The uploaded array (uint8 codes or uint16 values) → the model's 8-bit image under ``rule``."""
    if source.dtype == torch.uint8:
        return source
    if source.dtype == torch.uint16 or source.dtype == torch.int32:
        return sixteen_bit_table(rule, source.device)[source.to(torch.int64)]
    raise ValueError(f"source must be uint8 or uint16, got {source.dtype}")


# -- per-model plans ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CodePlan:
    """How one adapter turns the uploaded image into its 8-bit input codes ``(S, S)``.

    ``kind``: ``"square"`` (Pillow resize to ``size × size``: bilinear for MedKLIP and MAVL, bicubic for KAD
    and DeViDe), ``"shortest"``
    (torchvision ``Resize(size)`` of the shorter side with Pillow, then ``CenterCrop(crop)``; CLIP,
    BiomedCLIP) or ``"carzero"`` (INTER_AREA longest side to ``size``, zero-pad, ``CenterCrop(crop)``).
    Equal plans give equal codes, so models that share one are computed once per image.
    """

    kind: str
    size: int
    crop: int
    resample: int
    rule: str

    def __call__(self, source: torch.Tensor) -> torch.Tensor:
        """Codes ``(..., S, S)`` of an uploaded ``(..., H, W)`` array; leading dimensions are images of one size."""
        u8 = to_codes8(source, self.rule)
        h, w = int(u8.shape[-2]), int(u8.shape[-1])
        if self.kind == "square":
            return resize_pillow(u8, (self.size, self.size), self.resample)
        if self.kind == "shortest":
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(self.size * long / short)  # torchvision _compute_resized_output_size
            new_h, new_w = (new_long, self.size) if w <= h else (self.size, new_long)
            x = u8 if (new_h, new_w) == (h, w) else resize_pillow(u8, (new_h, new_w), self.resample)
            top, left = int(round((new_h - self.crop) / 2.0)), int(round((new_w - self.crop) / 2.0))
            if top < 0 or left < 0:
                raise ValueError(f"CenterCrop({self.crop}) of a {new_h}x{new_w} image would pad: not ported")
            return x[..., top: top + self.crop, left: left + self.crop].contiguous()
        if self.kind == "carzero":
            size = self.size
            if h >= w:
                new_h, new_w = size, int(float(w) * float(size / float(h)))
            else:
                new_h, new_w = int(float(h) * float(size / float(w))), size
            small = resize_area(u8, new_h, new_w)
            padded = torch.zeros((*u8.shape[:-2], size, size), dtype=torch.uint8, device=u8.device)
            top, left = (size - new_h) // 2, (size - new_w) // 2
            padded[..., top: top + new_h, left: left + new_w] = small
            off = int(round((size - self.crop) / 2.0))
            return padded[..., off: off + self.crop, off: off + self.crop].contiguous()
        raise ValueError(f"unknown plan kind {self.kind!r}")


def _clip_plan(adapter: Any) -> CodePlan | None:
    """Plan of an open_clip-family adapter from its torchvision transform, or None if it is not the ported form."""
    from torchvision import transforms as T

    steps = list(getattr(getattr(adapter, "transform", None), "transforms", []))
    if len(steps) < 2 or not isinstance(steps[0], T.Resize) or not isinstance(steps[1], T.CenterCrop):
        return None
    resize, crop = steps[0], steps[1]
    size = resize.size[0] if isinstance(resize.size, (list, tuple)) and len(resize.size) == 1 else resize.size
    if not isinstance(size, int) or resize.max_size is not None:
        return None
    modes = {T.InterpolationMode.BICUBIC: int(Image.BICUBIC), T.InterpolationMode.BILINEAR: int(Image.BILINEAR)}
    if resize.interpolation not in modes or len(set(crop.size)) != 1:
        return None
    for step in steps[2:]:  # only per-pixel steps may follow (mode, to-tensor, normalise)
        if type(step).__name__ not in ("MaybeConvertMode", "MaybeToTensor", "ToTensor", "Normalize", "_convert_to_rgb"):
            return None
    return CodePlan("shortest", int(size), int(crop.size[0]), modes[resize.interpolation], "linear")


def _resample_of(resize: Any) -> int:
    """The Pillow filter a module's ``resize_uint8`` uses: a ``partial`` binding it, the ``RESAMPLE`` of the module
    that defines the function (the MedKLIP/MAVL family's BILINEAR), or the shared helper's default (BICUBIC: KAD,
    DeViDe)."""
    if isinstance(resize, functools.partial):
        if "resample" in resize.keywords:
            return int(resize.keywords["resample"])
        resize = resize.func
    if "RESAMPLE" in getattr(resize, "__globals__", {}):
        return int(resize.__globals__["RESAMPLE"])
    return int(inspect.signature(resize).parameters["resample"].default)


def _square_plan(adapter: Any, declared_in: type) -> CodePlan:
    """``normalize_uint8(resize_uint8(image, input_size))`` with the declaring class's module's ``resize_uint8``."""
    resample = _resample_of(sys.modules[declared_in.__module__].resize_uint8)
    return CodePlan("square", int(adapter.input_size), int(adapter.input_size), resample, "linear")


def _carzero_plan(adapter: Any, declared_in: type) -> CodePlan:
    from ..models.carzero import RESIZE

    return CodePlan("carzero", RESIZE, int(adapter.input_size), int(Image.BOX), "opencv")  # resample unused


def _gloria_plan(adapter: Any, declared_in: type) -> CodePlan:
    """CARZero's pipeline (inherited from GLoRIA) at the adapter's own ``resize``; its mean / std are in the table."""
    return CodePlan("carzero", int(adapter.resize), int(adapter.input_size), int(Image.BOX), "opencv")


PLANS: dict[str, Callable[[Any, type], CodePlan | None]] = {
    "square": _square_plan, "carzero": _carzero_plan, "gloria": _gloria_plan,
    "open_clip": lambda adapter, _: _clip_plan(adapter)}


def plan_for(adapter: Any) -> CodePlan | None:
    """The kernel of ``adapter``'s preprocessing, or None where it has none (priors, reference models).

    Read off the plan the adapter's class declares (:attr:`xbench.models.base.Adapter.gpu_preprocess`; the open_clip
    family's from its transform's steps), never guessed from its class: a declared plan is used only once
    :func:`check_plan` proves it equal to ``preprocess``. A name that is not a plan is an error naming the class.
    An adapter whose preprocessing is another's (``preprocess_delegate``: an explainer over a model) has that one's.
    """
    delegate = getattr(adapter, "preprocess_delegate", None)
    if delegate is not None:
        return plan_for(delegate)
    name = getattr(adapter, "gpu_preprocess", None)
    if name is None:
        return None
    if name not in PLANS:
        raise XBenchError(f"{type(adapter).__name__}.gpu_preprocess = {name!r} names no GPU preprocessing plan; "
                          f"known: {', '.join(sorted(PLANS))} (or None: preprocess on the CPU)")
    declared_in = next(c for c in type(adapter).__mro__ if "gpu_preprocess" in vars(c))
    return PLANS[name](adapter, declared_in)


class _PreprocessOnly:
    """An object whose ``preprocess`` is an adapter class's own function, with the attributes that function reads,
    and no network (tests and benchmarks of preprocessing without building models)."""

    def __init__(self, name: str, **attributes: Any):
        self.name = name
        self.__dict__.update(attributes)


def preprocess_standins() -> dict[str, Any]:
    """Preprocess-only stand-ins of every ported adapter: ``medklip``, ``mavl``, ``kad``, ``kad_512``, ``devide``
    (its own default mean/std are the ImageNet ones), ``clip`` (open_clip's validation transform, as CLIP and
    BiomedCLIP build it), ``carzero`` and ``gloria``. (CheXzero has no kernel: it resizes after normalising, so its
    input is not a per-pixel table of 8-bit codes; it keeps its CPU ``preprocess``.)"""
    import open_clip

    from ..models._common import IMAGENET_MEAN, IMAGENET_STD
    from ..spec.registry import model_config
    from ..models.carzero import CARZeroAdapter
    from ..models.clip import PromptPairCLIP
    from ..models.devide import DeViDeAdapter
    from ..models.gloria import GLoRIAAdapter
    from ..models.kad import KADAdapter
    from ..models.mavl import MAVLAdapter
    from ..models.medklip import MedKLIPAdapter

    def make(name: str, cls: type, fn: Callable[..., Any], **attributes: Any) -> Any:
        body = {"preprocess": fn, "gpu_preprocess": cls.gpu_preprocess, "__module__": cls.__module__}
        return type(f"{cls.__name__}Preprocess", (_PreprocessOnly,), body)(name, **attributes)

    transform = open_clip.image_transform(224, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN,
                                          std=open_clip.OPENAI_DATASET_STD)
    def size(name: str) -> int:  # the model YAML's input size (the one place it is written)
        return int(model_config(name)["input_size"])

    return {"medklip": make("medklip", MedKLIPAdapter, MedKLIPAdapter.preprocess, input_size=size("medklip")),
            "mavl": make("mavl", MAVLAdapter, MAVLAdapter.preprocess, input_size=size("mavl")),
            "kad": make("kad", KADAdapter, KADAdapter.preprocess, input_size=size("kad")),
            "kad_512": make("kad_512", KADAdapter, KADAdapter.preprocess, input_size=size("kad_512")),
            "devide": make("devide", DeViDeAdapter, DeViDeAdapter.preprocess, input_size=size("devide"),
                           mean=IMAGENET_MEAN, std=IMAGENET_STD),
            "clip": make("clip", PromptPairCLIP, PromptPairCLIP.preprocess, transform=transform),
            "carzero": make("carzero", CARZeroAdapter, CARZeroAdapter.preprocess, input_size=size("carzero")),
            "gloria": make("gloria", GLoRIAAdapter, GLoRIAAdapter.preprocess, input_size=size("gloria"),
                           **{k: model_config("gloria")["params"][k] for k in ("resize", "mean", "std")})}


def probe_images() -> list[np.ndarray]:
    """Images a plan is checked on before use: 8-bit noise (portrait, landscape, square), a 16-bit ramp, a
    windowed (DICOM-like) float image and a constant one, each ≥ 256 px (CARZero only downscales)."""
    rng = np.random.default_rng(20261126)
    ramp16 = (np.add.outer(np.arange(300) * 211, np.arange(277) * 97) % 65536).astype(np.float64)
    return [(rng.integers(0, 256, (301, 263)) / 255).astype(np.float32),
            (rng.integers(0, 256, (257, 389)) / 255).astype(np.float32),
            (rng.integers(0, 256, (256, 256)) / 255).astype(np.float32),
            (ramp16 / 65535.0).astype(np.float32),
            rng.random((283, 311), dtype=np.float32),
            np.full((260, 270), 0.5, np.float32)]


def code_table(adapter: Any, plan: CodePlan, device: torch.device | str = "cpu") -> np.ndarray | None:
    """``(3, 256)`` float32: the adapter's input value of each 8-bit code per channel, read off one ``preprocess``
    call on an image of the plan's own size (where every resize is the identity), or None when the adapter's
    output is not a per-code function of the plan's codes."""
    side = plan.size
    levels = (np.add.outer(np.arange(side), np.arange(side) * 97) % 256).astype(np.uint8)  # every code in any crop
    image = (levels / 255.0).astype(np.float32)
    x = torch.as_tensor(np.asarray(adapter.preprocess(image), dtype=np.float32))
    codes = plan(torch.from_numpy(source_array(image)).to(device)).cpu()
    if x.ndim != 3 or x.shape[0] != 3 or tuple(x.shape[1:]) != tuple(codes.shape):
        return None
    flat, values = codes.reshape(-1).long(), x.reshape(3, -1)
    table = torch.full((3, 256), float("nan"))
    table[:, flat] = values
    if torch.isnan(table).any() or not torch.equal(table[:, flat], values):
        return None
    return table.numpy()


def check_plan(adapter: Any, plan: CodePlan, device: torch.device | str = "cpu") -> np.ndarray | None:
    """The plan's :func:`code_table` if ``table[:, plan(image)]`` equals ``adapter.preprocess(image)`` exactly on
    every :func:`probe_images` image with the plan run on ``device``; None otherwise (then use the CPU path)."""
    table = code_table(adapter, plan, device)
    if table is None:
        return None
    lut = torch.from_numpy(table)
    for image in probe_images():
        want = torch.as_tensor(np.asarray(adapter.preprocess(image), dtype=np.float32))
        codes = plan(torch.from_numpy(source_array(image)).to(device)).cpu().long()
        if want.shape[1:] != codes.shape or not torch.equal(lut[:, codes], want):
            return None
    return table


_PROVEN: "weakref.WeakKeyDictionary[Any, dict[tuple[CodePlan, str], bool]]" = weakref.WeakKeyDictionary()


def candidate_table(adapter: Any) -> np.ndarray | None:
    """The 8-bit table of the adapter's declared plan read on the CPU (one ``preprocess`` call): a candidate that
    :func:`~xbench.inference.calibration.model_input` checks before it takes it; None without a plan."""
    plan = plan_for(adapter)
    return None if plan is None else code_table(adapter, plan, "cpu")


def proven_plan(adapter: Any, lut: np.ndarray | None, device: torch.device) -> CodePlan | None:
    """The adapter's declared plan when :func:`check_plan` proves it equal to its CPU path on ``device`` and its
    table equals ``lut`` (the adapter's calibrated table), else None. Proven once per adapter object and device, not
    once per dataset."""
    plan = plan_for(adapter) if lut is not None else None
    if plan is None:
        return None
    try:
        proven = _PROVEN.setdefault(adapter, {})
    except TypeError:  # not weak-referenceable: proven again when asked again
        proven = {}
    where = (plan, str(device))
    if where not in proven:
        table = check_plan(adapter, plan, device)
        proven[where] = table is not None and np.array_equal(table, lut)
    return plan if proven[where] else None
